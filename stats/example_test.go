package stats_test

import (
	"bufio"
	"bytes"
	"fmt"

	"github.com/vmmalloc/vmmalloc/stats"
)

// One 20 MiB allocation carved from a freshly mapped 20 MiB page of the
// large pool, as the allocator would count it.
func exampleStats() *stats.DeviceStats {
	var d stats.DeviceStats
	d.ReservedBytes.Add(stats.LargePool, 20<<20)
	d.Segment.Add(stats.LargePool, 1)
	d.NumDeviceAlloc++
	d.HandlesCreated++
	d.AllocatedBytes.Add(stats.LargePool, 20<<20)
	d.RequestedBytes.Add(stats.LargePool, 20<<20-4096)
	d.ActiveBytes.Add(stats.LargePool, 20<<20)
	d.Allocation.Add(stats.LargePool, 1)
	d.Active.Add(stats.LargePool, 1)
	return &d
}

func ExampleSummary() {
	fmt.Print(stats.Summary(exampleStats(), 0, true))
	// Output:
	// |==============================================================================|
	// |                     vmmalloc memory summary, device ID 0                     |
	// |------------------------------------------------------------------------------|
	// |            Device OOMs: 0            |           Alloc retries: 0            |
	// |==============================================================================|
	// |          Metric          | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
	// |------------------------------------------------------------------------------|
	// | Allocated memory         |     20 MiB |     20 MiB |     20 MiB |        0 B |
	// |------------------------------------------------------------------------------|
	// | Active memory            |     20 MiB |     20 MiB |     20 MiB |        0 B |
	// |------------------------------------------------------------------------------|
	// | Requested memory         |     20 MiB |     20 MiB |     20 MiB |        0 B |
	// |------------------------------------------------------------------------------|
	// | Device reserved memory   |     20 MiB |     20 MiB |     20 MiB |        0 B |
	// |------------------------------------------------------------------------------|
	// | Non-releasable memory    |        0 B |        0 B |        0 B |        0 B |
	// |------------------------------------------------------------------------------|
	// | Allocations              |          1 |          1 |          1 |          0 |
	// |------------------------------------------------------------------------------|
	// | Active allocs            |          1 |          1 |          1 |          0 |
	// |------------------------------------------------------------------------------|
	// | Device reserved segments |          1 |          1 |          1 |          0 |
	// |------------------------------------------------------------------------------|
	// | Non-releasable allocs    |          0 |          0 |          0 |          0 |
	// |------------------------------------------------------------------------------|
	// | Oversize allocations     |          0 |          0 |          0 |          0 |
	// |------------------------------------------------------------------------------|
	// | Oversize segments        |          0 |          0 |          0 |          0 |
	// |==============================================================================|
	// |                              Driver operations                               |
	// |------------------------------------------------------------------------------|
	// | Device maps              |          1 | Device unmaps           |          0 |
	// | Handles created          |          1 | Handles freed           |          0 |
	// | Handles reused           |          0 | Stream syncs            |          0 |
	// | All-stream syncs         |          0 | Max split size          |  unlimited |
	// |==============================================================================|
}

func ExampleFlatten() {
	m := stats.Flatten(exampleStats())
	for _, k := range []string{
		"allocated_bytes.all.current",
		"requested_bytes.large_pool.peak",
		"reserved_bytes.small_pool.current",
		"segment.all.allocated",
		"num_device_alloc",
		"handles_created",
		"num_ooms",
	} {
		fmt.Printf("%s = %d\n", k, m[k])
	}
	fmt.Println(len(m), "keys")
	// Output:
	// allocated_bytes.all.current = 20971520
	// requested_bytes.large_pool.peak = 20967424
	// reserved_bytes.small_pool.current = 0
	// segment.all.allocated = 1
	// num_device_alloc = 1
	// handles_created = 1
	// num_ooms = 0
	// 139 keys
}

func ExampleWriteJSON() {
	var buf bytes.Buffer
	if err := stats.WriteJSON(&buf, exampleStats()); err != nil {
		fmt.Println(err)
		return
	}
	// Print the first lines of the sorted, indented object.
	sc := bufio.NewScanner(&buf)
	for i := 0; i < 4 && sc.Scan(); i++ {
		fmt.Println(sc.Text())
	}
	// Output:
	// {
	//   "active.all.allocated": 1,
	//   "active.all.current": 1,
	//   "active.all.freed": 0,
}

func ExampleSegmentTable() {
	snap := stats.Snapshot{Segments: []stats.SegmentInfo{{
		Address: 0x7f0000000000, TotalSize: 90 << 30, MappedSize: 40 << 20, AllocatedSize: 20 << 20,
		Pool: stats.LargePool, IsExpandable: true, PageSize: 20 << 20,
		Blocks: []stats.BlockInfo{
			{Address: 0x7f0000000000, Size: 20 << 20, RequestedSize: 20 << 20, State: stats.BlockActiveAllocated},
			{Address: 0x7f0001400000, Size: 20 << 20, State: stats.BlockInactive},
			{Address: 0x7f0002800000, Size: 90<<30 - 40<<20, State: stats.BlockUnmapped},
		},
	}}}
	fmt.Print(stats.SegmentTable(snap))
	// Output:
	// Address             Device  Pool            Total     Mapped  Allocated  Blocks  Expandable
	// 0x7f0000000000           0  large_pool     90 GiB     40 MiB     20 MiB       3  yes
	// Total (1)                                  90 GiB     40 MiB     20 MiB       3
}

func ExampleHistory() {
	h := stats.NewHistory(2) // keep the newest two entries
	h.Record(stats.TraceEntry{Action: stats.TraceSegmentMap, Addr: 0x7f0000000000, Size: 20 << 20, TimeNs: 1})
	h.Record(stats.TraceEntry{Action: stats.TraceAlloc, Addr: 0x7f0000000000, Size: 4 << 20, TimeNs: 2})
	h.Record(stats.TraceEntry{Action: stats.TraceFreeRequested, Addr: 0x7f0000000000, Size: 4 << 20, TimeNs: 3})
	for _, e := range h.Entries() {
		fmt.Printf("t=%d %s %#x %d\n", e.TimeNs, e.Action, e.Addr, e.Size)
	}
	fmt.Println("len", h.Len(), "dropped", h.Dropped())
	// Output:
	// t=2 alloc 0x7f0000000000 4194304
	// t=3 free_requested 0x7f0000000000 4194304
	// len 2 dropped 1
}

// A HotCounters counts cache hits with fewer stores and settles to the
// exact record on read.
func ExampleHotCounters() {
	var c stats.HotCounters
	c.CountMalloc(stats.SmallPool, 4096, 4000)
	c.CountMalloc(stats.LargePool, 2<<20, 2<<20)
	c.CountFree(stats.SmallPool, 4096, 4000)
	s := c.Settled()
	fmt.Printf("%+v\n", s.AllocatedBytes[stats.AllPools])
	fmt.Printf("%+v\n", s.AllocatedBytes[stats.SmallPool])
	// Output:
	// {Current:2097152 Peak:2101248 Allocated:2101248 Freed:4096}
	// {Current:0 Peak:4096 Allocated:4096 Freed:4096}
}
