package segment

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// An expandable segment grows by mapping pages and shrinks by unmapping
// them; a handle cache keeps unmapped handles for the next growth.
func Example() {
	var drv backend.Driver = newFakeDriver() // any backend.Driver
	const page = 2 << 20
	var c Counters
	prop := backend.DeviceProp(0)
	cache := NewHandleCache(drv, page, prop, 8, &c)
	seg, err := New(drv, Config{Prop: prop, PageSize: page, VASize: 64 * page, Cache: cache, Counters: &c})
	if err != nil {
		panic(err)
	}
	stream, _ := drv.StreamCreate(0)

	_ = seg.Map(0, 4*page) // grow by 8 MiB
	_ = seg.Map(10*page, page)
	fmt.Println("mapped pages:", seg.MappedPages(), "runs:", seg.MappedRuns())

	// Shrink: wait for the stream's work, then unmap; handles go to the cache.
	done, _ := seg.Unmap(2*page, 2*page, stream)
	fmt.Println("unmapped bytes:", done, "cached handles:", cache.Len())

	_ = seg.Map(20*page, 2*page) // reuses the two cached handles
	fmt.Printf("created %d, reused %d\n", c.HandlesCreated, c.HandlesReused)

	_ = seg.Destroy(stream)
	_ = cache.Trim(0)
	fmt.Printf("maps %d, unmaps %d, freed %d\n", c.Maps, c.Unmaps, c.HandlesFreed)
	// Output:
	// mapped pages: 5 runs: [{0 8388608} {20971520 2097152}]
	// unmapped bytes: 4194304 cached handles: 2
	// created 5, reused 2
	// maps 7, unmaps 7, freed 5
}

// A classic segment is one handle mapped whole, like cudaMalloc.
func ExampleNewClassic() {
	var drv backend.Driver = newFakeDriver()
	seg, err := NewClassic(drv, 0, 3<<20, backend.DeviceProp(0))
	if err != nil {
		panic(err)
	}
	fmt.Println(seg.Classic(), seg.Size()>>20, "MiB,", seg.NumPages(), "page, mapped:", seg.IsMapped(0))
	fmt.Println(seg.Destroy())
	// Output:
	// true 4 MiB, 1 page, mapped: true
	// <nil>
}
