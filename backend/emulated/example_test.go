package emulated_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// The VMM lifecycle: reserve, create, map, set access, unmap, free,
// release. Addresses and handles are deterministic.
func Example() {
	e, err := emulated.New()
	if err != nil {
		panic(err)
	}
	defer e.Close()
	prop := backend.DeviceProp(0)
	g, _ := e.Granularity(prop, backend.GranularityRecommended)
	va, _ := e.ReserveAddress(4 * g)
	h, _ := e.CreatePhysical(2*g, prop)
	_ = e.Map(va, 2*g, h)
	_ = e.SetAccess(va, 2*g, []backend.AccessDesc{{Location: prop.Location, Flags: backend.AccessReadWrite}})
	base, size, _ := e.AddressRange(va + 100)
	fmt.Printf("granularity %d MiB, reserved %#x, handle %d\n", g>>20, va, h)
	fmt.Printf("range %#x +%d MiB\n", base, size>>20)

	// Release with a mapping still in it is rejected (R5) and changes nothing.
	err = e.ReleaseAddress(va, 4*g)
	var be *backend.Error
	fmt.Println(errors.As(err, &be), be.Rule, errors.Is(err, backend.ErrInvalidArgument))

	_ = e.Unmap(va, 2*g)
	_ = e.FreePhysical(h)
	_ = e.ReleaseAddress(va, 4*g)
	fmt.Println(e.Live().Handles, e.Calls(backend.OpRelease), e.SimulatedTime())
	// Output:
	// granularity 2 MiB, reserved 0x100000000000, handle 1
	// range 0x100000000000 +4 MiB
	// true R5 true
	// 0 2 297.358µs
}

// Freeing a mapped handle is deferred to the last unmap (R3).
func ExampleEmulator_FreePhysical() {
	e, _ := emulated.New(emulated.WithCapacity(64 << 20))
	va, _ := e.ReserveAddress(2 << 20)
	h, _ := e.CreatePhysical(2<<20, backend.DeviceProp(0))
	_ = e.Map(va, 2<<20, h)
	_ = e.FreePhysical(h)
	free, _, _ := e.MemGetInfo(0)
	fmt.Println("after free:", free>>20, "MiB free, pending:", e.Live().FreedPending)
	_ = e.Unmap(va, 2<<20)
	free, _, _ = e.MemGetInfo(0)
	fmt.Println("after unmap:", free>>20, "MiB free, handles:", e.Live().Handles)
	// Output:
	// after free: 62 MiB free, pending: 1
	// after unmap: 64 MiB free, handles: 0
}

// Held streams and Launch expose use-after-unmap bugs as violations.
func ExampleEmulator_Launch() {
	e, _ := emulated.New(emulated.WithManualCompletion())
	va, _ := e.ReserveAddress(2 << 20)
	h, _ := e.CreatePhysical(2<<20, backend.DeviceProp(0))
	_ = e.Map(va, 2<<20, h)
	_ = e.SetAccess(va, 2<<20, []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}})
	s, _ := e.StreamCreate(0)
	_ = e.Launch(s, va, 1<<20) // a kernel still running on the memory
	_ = e.Unmap(va, 2<<20)     // forgot to synchronize the stream
	for _, v := range e.Violations() {
		fmt.Println(v.Kind, v.Stream, v.Seq)
	}
	// Output:
	// unmap-in-use 1 1
}

// FailNth injects a failure into the n-th next call of a primitive.
func ExampleEmulator_FailNth() {
	e, _ := emulated.New()
	_ = e.FailNth(backend.OpCreate, 2, backend.ErrOutOfMemory)
	for i := 0; i < 3; i++ {
		_, err := e.CreatePhysical(2<<20, backend.DeviceProp(0))
		fmt.Println(i, errors.Is(err, backend.ErrOutOfMemory))
	}
	fmt.Println(e.Calls(backend.OpCreate), e.Failures(backend.OpCreate), len(e.Handles()))
	// Output:
	// 0 false
	// 1 true
	// 2 false
	// 3 1 2
}

// Process views share devices: one exports, another imports (R15–R17).
func ExampleEmulator_Process() {
	a, _ := emulated.New()
	b, _ := a.Process(2000)
	h, _ := a.CreatePhysical(2<<20, backend.DeviceProp(0))
	sh, _ := a.Export(h, backend.ShareDefault)
	_, err := b.Import(sh, 0)
	fmt.Println(errors.Is(err, backend.ErrNotPermitted))
	_ = a.SetPids(sh, []int32{b.Pid()})
	hb, err := b.Import(sh, 0)
	fmt.Println(hb, err)
	_ = a.FreePhysical(h)
	free, _, _ := a.MemGetInfo(0)
	fmt.Println((80<<30-free)>>20, "MiB still held by pid", b.Pid())
	// Output:
	// true
	// 2 <nil>
	// 2 MiB still held by pid 2000
}

// Other tenants take device memory away.
func ExampleEmulator_Occupy() {
	e, _ := emulated.New(emulated.WithCapacity(1 << 30))
	id, _ := e.Occupy(0, 768<<20)
	free, total, _ := e.MemGetInfo(0)
	fmt.Println(free>>20, total>>20)
	_ = e.Vacate(id)
	free, _, _ = e.MemGetInfo(0)
	fmt.Println(free >> 20)
	// Output:
	// 256 1024
	// 1024
}
