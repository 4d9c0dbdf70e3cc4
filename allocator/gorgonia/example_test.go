package gorgonia_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/vmmalloc/vmmalloc/allocator"
	vmgorgonia "github.com/vmmalloc/vmmalloc/allocator/gorgonia"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// Example computes y = x⊙x + w on tensors whose memory vmmalloc allocates
// over the emulator's real memory, then releases them all.
func Example() {
	drv, _ := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(64<<20))
	defer drv.Close()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	eng, _ := vmgorgonia.New(a, 0, vmgorgonia.Options{HostAccessible: true})

	scope := eng.Scope()
	newT := func(data ...float64) *tensor.Dense {
		t := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(2, 2), tensor.WithEngine(eng))
		copy(t.Data().([]float64), data)
		return t
	}
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(2, 2), G.WithName("x"), G.WithValue(newT(1, 2, 3, 4)))
	w := G.NewMatrix(g, G.Float64, G.WithShape(2, 2), G.WithName("w"), G.WithValue(newT(1, 0, 0, 1)))
	y := G.Must(G.Add(G.Must(G.Square(x)), w))
	vm := G.NewTapeMachine(g, G.WithEngine(eng))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(y.Value().Data())
	fmt.Println("engine allocations:", eng.Stats().Allocs, "allocator mallocs:", a.Stats().Allocation[0].Allocated)

	n, _ := scope.Release()
	_ = a.EmptyCache()
	fmt.Println("released", n, "allocated", a.MemoryAllocated(), "reserved", a.MemoryReserved())
	// Output:
	// [2 4 9 17]
	// engine allocations: 3 allocator mallocs: 3
	// released 3 allocated 0 reserved 0
}
