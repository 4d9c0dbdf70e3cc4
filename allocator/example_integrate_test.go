package allocator_test

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// These examples hold the snippets of docs/integration.md (the docs
// package's TestGoSnippetsCompiled checks that each snippet there is a run
// of lines of a tested file).

// Example_everyDevice opens one allocator per device of a driver.
func Example_everyDevice() {
	drv, _ := emulated.New(emulated.WithDevices(2), emulated.WithCapacity(1<<30))
	defer drv.Close()

	cfg, err := allocator.ConfigFromEnv() // $VMMALLOC_CONF
	if err != nil {
		fmt.Println(err)
		return
	}
	allocs := make([]*allocator.Allocator, drv.DeviceCount())
	for dev := range allocs {
		cfg.Device = dev
		if allocs[dev], err = allocator.New(drv, cfg); err != nil {
			fmt.Println(err)
			return
		}
		defer allocs[dev].Close()
	}
	fmt.Println(len(allocs), "allocators, device of the second:", allocs[1].Device())
	// Output: 2 allocators, device of the second: 1
}

// Example_streamPerGoroutine gives each goroutine its own stream: memory
// freed on a stream is reused by later work on that stream without any
// synchronisation. A block one goroutine hands to another stream is
// recorded there (RecordStream) before it is freed.
func Example_streamPerGoroutine() {
	drv, _ := emulated.New(emulated.WithCapacity(1 << 30))
	defer drv.Close()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for w := range errs {
		wg.Go(func() {
			s, err := drv.StreamCreate(a.Device()) // this goroutine's stream
			if err != nil {
				errs[w] = err
				return
			}
			for range 100 {
				p, err := a.Malloc(1<<20, s) // for work queued on s
				if err != nil {
					errs[w] = err
					return
				}
				// ... queue kernels on s using p ...
				if err := a.Free(p); err != nil { // reusable by s's next work at once
					errs[w] = err
					return
				}
			}
			// Hand the stream's cache back before destroying the stream.
			errs[w] = errors.Join(a.ReleaseStream(s), drv.StreamDestroy(s))
		})
	}
	wg.Wait()
	fmt.Println(errors.Join(errs...), a.MemoryAllocated())

	// A block made on s and used by work on other too:
	s, _ := drv.StreamCreate(0)
	other, _ := drv.StreamCreate(0)
	p, _ := a.Malloc(1<<20, s)
	_ = a.RecordStream(p, other) // its memory waits for other's work queued before Free
	_ = a.Free(p)
	_ = a.Synchronize(other)
	_ = errors.Join(a.ReleaseStream(s), a.ReleaseStream(other), drv.StreamDestroy(s), drv.StreamDestroy(other))
	// Output: <nil> 0
}

// ExampleOutOfMemoryError reacts to out of memory as a framework with
// caches of its own would: evict, then retry once.
func ExampleOutOfMemoryError() {
	drv, _ := emulated.New(emulated.WithCapacity(64 << 20))
	defer drv.Close()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	var cache []uintptr // the framework's own cache of device blocks
	for range 3 {
		p, _ := a.Malloc(20<<20, 0)
		cache = append(cache, p)
	}
	evict := func() {
		for _, p := range cache {
			_ = a.Free(p)
		}
		cache = nil
	}

	p, err := a.Malloc(32<<20, 0)
	var oom *allocator.OutOfMemoryError
	if errors.As(err, &oom) {
		fmt.Printf("out of memory: %d MiB asked, %d MiB allocated\n", oom.Requested>>20, oom.Allocated>>20)
		evict()                      // what the framework can let go of
		p, err = a.Malloc(32<<20, 0) // the ladder releases the cache itself
	}
	fmt.Println("retry:", err)
	_ = a.Free(p)
	// Output:
	// out of memory: 32 MiB asked, 60 MiB allocated
	// retry: <nil>
}

// ExampleAllocator_NewBuffer lets the garbage collector decide when device
// memory dies: a dropped Buffer is freed by its cleanup, and the
// out-of-memory ladder collects dropped Buffers before it gives up. Free
// returns a Buffer's memory at once, which is cheaper: use it where the
// lifetime is known.
func ExampleAllocator_NewBuffer() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 20))
	defer drv.Close()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()

	for range 100 { // 200 MiB through an 8 MiB device, never freed explicitly
		b, err := a.NewBuffer(2<<20, 0)
		if err != nil {
			fmt.Println(err)
			return
		}
		_ = b.Ptr() // ... queue work on b.Stream() ...; b is dropped here
	}
	kept, _ := a.NewBuffer(1<<20, 0)
	defer kept.Free() // explicit: freed now, not at the next collection

	_, _ = a.CollectBuffers() // or let the next out-of-memory do it
	st := a.Stats()
	fmt.Println("ladder collections:", st.NumOwnedCollections > 0, "owned now:", st.OwnedBytes>>20, "MiB")
	// Output: ladder collections: true owned now: 1 MiB
}

// ExampleAllocator_Stats feeds a framework's telemetry: the counters of
// torch.cuda.memory_stats(), and the segments for a memory viewer.
func ExampleAllocator_Stats() {
	drv, _ := emulated.New(emulated.WithCapacity(1 << 30))
	defer drv.Close()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	p, _ := a.Malloc(3<<20, 0)
	defer a.Free(p)

	st := a.Stats()
	fmt.Println("allocated:", st.AllocatedBytes[stats.AllPools].Current>>20, "MiB",
		"reserved:", st.ReservedBytes[stats.AllPools].Current>>20, "MiB")
	fmt.Println("peak:", st.AllocatedBytes[stats.AllPools].Peak>>20, "MiB")
	flat := stats.Flatten(&st) // "allocated_bytes.all.current" and the rest
	fmt.Println("flat keys:", len(flat) == stats.NumFlatKeys)
	snap := a.Snapshot() // segments and blocks, as torch.cuda.memory_snapshot()
	fmt.Println("segments:", len(snap.Segments))
	// Output:
	// allocated: 3 MiB reserved: 4 MiB
	// peak: 3 MiB
	// flat keys: true
	// segments: 1
}
