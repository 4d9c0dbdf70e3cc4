package allocator_test

import (
	"fmt"
	"runtime"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// Example allocates device memory on the emulated driver, frees it, and
// shows that the freed block is reused without another driver call.
func Example() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	cfg, _ := allocator.ParseConfig("expandable_segments:True")
	a, _ := allocator.New(drv, cfg)
	defer a.Close()

	p, _ := a.Malloc(3<<20, 0) // 3 MiB on the default stream
	fmt.Printf("allocated %d MiB, reserved %d MiB\n", a.MemoryAllocated()>>20, a.MemoryReserved()>>20)
	_ = a.Free(p)
	q, _ := a.Malloc(3<<20, 0)
	fmt.Println("reused:", p == q)
	_ = a.Free(q)
	_ = a.EmptyCache()
	fmt.Printf("after EmptyCache: reserved %d MiB\n", a.MemoryReserved()>>20)
	// Output:
	// allocated 3 MiB, reserved 4 MiB
	// reused: true
	// after EmptyCache: reserved 0 MiB
}

// ExampleParseConfig parses a PYTORCH_CUDA_ALLOC_CONF-style string.
func ExampleParseConfig() {
	cfg, err := allocator.ParseConfig("expandable_segments:False,max_split_size_mb:128")
	fmt.Println(cfg.ExpandableSegments, cfg.MaxSplitSize>>20, err)
	_, err = allocator.ParseConfig("max_split_size_mb:lots")
	fmt.Println(err)
	// Output:
	// false 128 <nil>
	// vmmalloc: invalid config: max_split_size_mb: bad value "lots": want a whole number of MiB
}

// ExampleAllocator_RecordHistory records alloc and free events with the
// Go call stack of each Malloc caller.
func ExampleAllocator_RecordHistory() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	_ = a.RecordHistory(allocator.HistoryOptions{MaxEntries: 1000, Stacks: true})

	p, _ := a.Malloc(1<<20, 0)
	_ = a.Free(p)

	h, _ := a.History()
	for _, e := range h.Entries {
		fmt.Println(e.Action, e.Size, e.Stack != 0)
	}
	f, _ := runtime.CallersFrames(h.Stacks[h.Entries[1].Stack-1]).Next()
	fmt.Println("allocated by", f.Function)
	// Output:
	// segment_map 2097152 false
	// alloc 1048576 true
	// free_requested 1048576 true
	// free_completed 1048576 false
	// allocated by github.com/vmmalloc/vmmalloc/allocator_test.ExampleAllocator_RecordHistory
}
