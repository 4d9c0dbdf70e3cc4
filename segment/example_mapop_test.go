package segment_test

import (
	"fmt"
	"sync"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
)

// A map in three steps: BeginMap and EndMap under the caller's lock, the
// driver calls (MapOp.Run) without it, so that other work under that lock
// goes on while the driver maps.
func ExampleSegment_BeginMap() {
	drv := newDriver()
	const MiB = 1 << 20
	var mu sync.Mutex // the caller's lock: it guards the segment
	seg, err := segment.New(drv, segment.Config{
		Prop: backend.DeviceProp(0), Granule: 2 * MiB, PageSize: 20 * MiB, VASize: 200 * MiB,
	})
	if err != nil {
		panic(err)
	}
	mu.Lock()
	op, err := seg.BeginMap(0, 50*MiB)
	mu.Unlock()
	if err != nil {
		panic(err)
	}
	op.Run() // CreatePhysical, Map, SetAccess: no lock held
	mu.Lock()
	err = seg.EndMap(op)
	fmt.Println(err, seg.MappedBytes()/MiB, "MiB in", seg.HandleCount(), "handles")
	mu.Unlock()
	// Output: <nil> 50 MiB in 3 handles
}
