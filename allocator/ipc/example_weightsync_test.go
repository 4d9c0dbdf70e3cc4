package ipc_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// The weight-sync loop of RL frameworks with one Exporter for the
// allocator's life: each step's copy goes back to the device once its
// Export is closed, the allocator has freed it and the peer let go.
func ExampleExporter_weightSync() {
	dev, _ := emulated.New(emulated.WithCapacity(2 << 30))
	defer dev.Close()
	peer, _ := dev.Process(2000)
	a, _ := allocator.New(dev, allocator.DefaultConfig())
	defer a.Close()
	x, _ := ipc.NewExporter(a)
	defer x.Close()
	for step := 0; step < 20; step++ { // 20 copies of 256 MiB on a 2 GiB device
		p, err := a.Malloc(256<<20, 0)
		if err != nil {
			fmt.Println(err)
			return
		}
		exp, _ := x.Export(p, ipc.ExportOptions{Pids: []int32{peer.Pid()}})
		m, err := ipc.Import(peer, exp.Descriptor, 0) // in the peer process
		if err != nil {
			fmt.Println(err)
			return
		}
		_ = m.Close() // the peer has read the weights
		_ = exp.Close()
		_ = a.Free(p)
		_ = a.EmptyCache()
	}
	free, total, _ := dev.MemGetInfo(0)
	fmt.Println("exporter holds", x.Exported(), "handles; device memory in use:", total-free)
	// Output:
	// exporter holds 0 handles; device memory in use: 0
}
