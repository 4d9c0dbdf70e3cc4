package allocator_test

import (
	"fmt"

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
