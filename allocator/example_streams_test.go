package allocator_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// ExampleAllocator_ReleaseStream hands a short-lived stream back before
// destroying it: its cached memory is returned and the allocator forgets
// it, so a program that creates a stream per request stays bounded.
func ExampleAllocator_ReleaseStream() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()

	for range 3 {
		s, _ := drv.StreamCreate(0)
		p, _ := a.Malloc(16<<20, s)
		// ... work on s uses p ...
		_ = a.Free(p)
		fmt.Printf("cached %d MiB; ", a.MemoryReserved()>>20)
		if err := a.ReleaseStream(s); err != nil {
			fmt.Println(err)
		}
		fmt.Printf("after ReleaseStream %d MiB\n", a.MemoryReserved()>>20)
		_ = drv.StreamDestroy(s)
		_, err := a.Malloc(1, s)
		if errors.Is(err, allocator.ErrInvalidStream) {
			fmt.Println("the destroyed stream is refused")
		}
	}
	// Output:
	// cached 16 MiB; after ReleaseStream 0 MiB
	// the destroyed stream is refused
	// cached 16 MiB; after ReleaseStream 0 MiB
	// the destroyed stream is refused
	// cached 16 MiB; after ReleaseStream 0 MiB
	// the destroyed stream is refused
}

// ExampleAllocator_Granularity shows that reserved memory and the size an
// out-of-memory error says was tried are multiples of the driver's mapping
// granularity.
func ExampleAllocator_Granularity() {
	drv, _ := emulated.New(emulated.WithCapacity(1 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()

	p, _ := a.Malloc(3<<20+1, 0)
	fmt.Printf("granularity %d MiB, reserved %d MiB\n", a.Granularity()>>20, a.MemoryReserved()>>20)
	_, err := a.Malloc(1023<<20, 0)
	var oom *allocator.OutOfMemoryError
	if errors.As(err, &oom) {
		fmt.Printf("tried %d MiB, a multiple of the granularity: %v\n", oom.Tried>>20, oom.Tried%a.Granularity() == 0)
	}
	_ = a.Free(p)
	// Output:
	// granularity 2 MiB, reserved 4 MiB
	// tried 1024 MiB, a multiple of the granularity: true
}
