package allocator_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// ExampleOutOfMemoryError_Fragmented reads an out-of-memory error: errors.As finds
// the *OutOfMemoryError, and its figures tell a fragmented heap (free
// memory cached, none of it in one block large enough) from a full
// device. Here classic segments of 20 MiB hold 4 MiB blocks, every second
// one freed.
func ExampleOutOfMemoryError_Fragmented() {
	drv, _ := emulated.New(emulated.WithCapacity(60 << 20))
	defer drv.Close()
	cfg, _ := allocator.ParseConfig("expandable_segments:False")
	a, _ := allocator.New(drv, cfg)
	defer a.Close()

	var ps []uintptr
	for i := 0; i < 15; i++ {
		p, _ := a.Malloc(4<<20, 0)
		ps = append(ps, p)
	}
	for i := 1; i < len(ps); i += 2 {
		_ = a.Free(ps[i])
	}

	_, err := a.Malloc(12<<20, 0)
	var oom *allocator.OutOfMemoryError
	if errors.As(err, &oom) {
		fmt.Println("fragmented:", oom.Fragmented())
		fmt.Printf("largest free block %d MiB of %d MiB needed; %d MiB free but unusable; %d MiB of room\n",
			oom.Largest>>20, oom.Rounded>>20, oom.Unusable>>20, oom.Room()>>20)
		fmt.Println(oom.Advice)
	}
	// Output:
	// fragmented: true
	// largest free block 4 MiB of 12 MiB needed; 28 MiB free but unusable; 0 MiB of room
	// Advice: the free memory is fragmented; expandable_segments:True avoids most of it, max_split_size_mb keeps large blocks whole, and roundup_power2_divisions makes sizes repeat.
}
