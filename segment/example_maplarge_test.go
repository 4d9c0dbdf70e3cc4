package segment_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
)

// MapLarge maps a large range in handles larger than a page, cut from the
// start of the range: fewer driver calls than pages, each handle unmapped
// only whole.
func ExampleSegment_MapLarge() {
	drv := newDriver()
	const MiB = 1 << 20
	var c segment.Counters
	seg, err := segment.New(drv, segment.Config{
		Prop: backend.DeviceProp(0), Granule: 2 * MiB, PageSize: 20 * MiB, VASize: 400 * MiB,
		Cut: segment.CutFromStart, Counters: &c,
	})
	if err != nil {
		panic(err)
	}
	if err := seg.MapLarge(0, 150*MiB, 64*MiB); err != nil {
		panic(err)
	}
	for _, h := range seg.Handles() {
		fmt.Printf("handle [%d, %d) MiB\n", h.Off/MiB, (h.Off+h.Len)/MiB)
	}
	fmt.Printf("maps %d (150 MiB in 20 MiB pages: 8)\n", c.Maps)
	_ = seg.Destroy()
	// Output:
	// handle [0, 64) MiB
	// handle [64, 128) MiB
	// handle [128, 150) MiB
	// maps 3 (150 MiB in 20 MiB pages: 8)
}
