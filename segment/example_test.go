package segment_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/segment"
)

func newDriver() backend.Driver {
	drv, err := emulated.New()
	if err != nil {
		panic(err)
	}
	return drv
}

// An expandable segment grows by mapping ranges and shrinks by unmapping
// whole handles; a handle cache keeps unmapped full-size handles for the
// next growth.
func Example() {
	drv := newDriver() // any backend.Driver
	const MiB = 1 << 20
	var c segment.Counters
	prop := backend.DeviceProp(0)
	cache := segment.NewHandleCache(drv, 20*MiB, prop, 8, &c)
	seg, err := segment.New(drv, segment.Config{
		Prop: prop, Granule: 2 * MiB, PageSize: 20 * MiB, VASize: 200 * MiB,
		Cache: cache, Counters: &c,
	})
	if err != nil {
		panic(err)
	}
	stream, _ := drv.StreamCreate(0)

	// Grow by 50 MiB: cut at the 20 MiB page boundaries.
	_ = seg.Map(6*MiB, 50*MiB)
	for _, h := range seg.Handles() {
		fmt.Printf("handle [%d, %d) MiB\n", h.Off/MiB, (h.Off+h.Len)/MiB)
	}

	// Shrink [10, 50) MiB: only whole handles can go.
	lo, hi := seg.WholeHandles(10*MiB, 40*MiB, ^uint64(0))
	done, _ := seg.Unmap(lo, hi-lo, stream) // waits for the stream's work first
	fmt.Printf("unmapped [%d, %d) MiB: %d MiB, cached handles: %d\n", lo/MiB, hi/MiB, done/MiB, cache.Len())

	_ = seg.Map(60*MiB, 20*MiB) // one full page: reuses the cached handle
	fmt.Printf("created %d, reused %d\n", c.HandlesCreated, c.HandlesReused)

	_ = seg.Destroy(stream)
	_ = cache.Trim(0)
	fmt.Printf("maps %d, unmaps %d, freed %d\n", c.Maps, c.Unmaps, c.HandlesFreed)
	// Output:
	// handle [6, 20) MiB
	// handle [20, 40) MiB
	// handle [40, 56) MiB
	// unmapped [20, 40) MiB: 20 MiB, cached handles: 1
	// created 3, reused 1
	// maps 4, unmaps 4, freed 3
}

// WholeHandles picks the handles a shrink can unmap, trimmed from the low
// side to the fewest that free at least limit bytes.
func ExampleSegment_WholeHandles() {
	const MiB = 1 << 20
	seg, err := segment.New(newDriver(), segment.Config{Prop: backend.DeviceProp(0), PageSize: 8 * MiB, VASize: 64 * MiB})
	if err != nil {
		panic(err)
	}
	_ = seg.Map(2*MiB, 30*MiB) // [2, 8) [8, 16) [16, 24) [24, 32)
	for _, limit := range []uint64{^uint64(0), 10 * MiB, 8 * MiB, 1} {
		lo, hi := seg.WholeHandles(4*MiB, 28*MiB, limit)
		fmt.Printf("limit %d MiB: [%d, %d) MiB\n", min(limit/MiB, 99), lo/MiB, hi/MiB)
	}
	start, size, _ := seg.HandleRange(5 * MiB)
	fmt.Printf("handle over 5 MiB: [%d, %d) MiB\n", start/MiB, (start+size)/MiB)
	// Output:
	// limit 99 MiB: [8, 32) MiB
	// limit 10 MiB: [16, 32) MiB
	// limit 8 MiB: [24, 32) MiB
	// limit 0 MiB: [24, 32) MiB
	// handle over 5 MiB: [2, 8) MiB
}

// A classic segment is one handle mapped whole, like cudaMalloc.
func ExampleNewClassic() {
	drv := newDriver()
	seg, err := segment.NewClassic(drv, 0, 3<<20, backend.DeviceProp(0))
	if err != nil {
		panic(err)
	}
	fmt.Println(seg.Classic(), seg.Size()>>20, "MiB,", seg.HandleCount(), "handle:", seg.Handles())
	fmt.Println(seg.Destroy())
	// Output:
	// true 4 MiB, 1 handle: [{0 4194304}]
	// <nil>
}
