package host_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// Example stages a host-to-device copy through a pinned buffer: the buffer
// is freed while the copy is still queued, and is reused only once the copy
// has completed.
func Example() {
	drv, _ := emulated.New(emulated.WithManualCompletion())
	// The size-class policy: the emulator's queued copies read MallocHost
	// memory. ParseConfig("") is expandable segments (see
	// ExampleAllocator_MallocWith); host.ConfigFromEnv() reads
	// $VMMALLOC_HOST_CONF.
	cfg, _ := host.ParseConfig("expandable_segments:False")
	a, _ := host.New(drv, cfg)
	defer a.Close()
	copies, _ := drv.StreamCreate(0)

	buf, _ := a.Malloc(100 << 10)        // 100 KiB, served from a 104 KiB class
	_ = drv.Launch(copies, buf, 100<<10) // the copy reads buf, queued on stream copies
	_ = a.RecordStream(buf, copies)
	_ = a.Free(buf) // returns at once; buf waits for the copy

	next, _ := a.Malloc(100 << 10)
	fmt.Println("reused while the copy is queued:", next == buf)
	_ = a.Free(next)

	_ = drv.Complete(copies) // the copy finishes
	again, _ := a.Malloc(100 << 10)
	fmt.Println("reused after the copy:", again == buf || again == next)
	st := a.Stats()
	fmt.Printf("blocks from the driver: %d, cache hits: %d, held: %d KiB\n",
		st.NumHostAlloc, st.CacheHits, st.ReservedBytes.Current>>10)
	// Output:
	// reused while the copy is queued: false
	// reused after the copy: true
	// blocks from the driver: 2, cache hits: 1, held: 208 KiB
}

// ExampleAllocator_Register pins memory the program already owns and gets
// its device address.
func ExampleAllocator_Register() {
	drv, _ := emulated.New()
	a, _ := host.New(drv, host.DefaultConfig())
	defer a.Close()

	const p = 0x7f0000000000 // an address the program owns, 4 KiB aligned
	fmt.Println(a.Register(p+100, 4096, 0))
	if err := a.Register(p, 1<<20, 0); err != nil { // 0 = HostRegisterMapped
		fmt.Println(err)
		return
	}
	d, _ := a.DevicePointer(p + 64)
	fmt.Println("device address found:", d != 0)
	fmt.Println(a.Unregister(p))
	// Output:
	// vmmalloc/host: address is not 4 KiB aligned: 0x7f0000000064
	// device address found: true
	// <nil>
}

// ExampleParseConfig reads the host allocator's configuration string.
func ExampleParseConfig() {
	cfg, err := host.ParseConfig("expandable_segments:False,pinned_use_host_register:True,pinned_roundup_power2_divisions:1,pinned_budget_mb:0")
	fmt.Println(cfg, err)
	_, err = host.ParseConfig("pinned_roundup_power2_divisions:3")
	fmt.Println(err)
	// Output:
	// expandable_segments:False,pinned_use_host_register:True,pinned_roundup_power2_divisions:1,pinned_budget_mb:0,pinned_release_on_grow:False <nil>
	// vmmalloc/host: invalid config: pinned_roundup_power2_divisions: bad value "3": want 1, 2, 4 or 8
}

// ExampleAllocator_MallocWith shares a pin budget between two allocators
// (expandable segments, the default): a request past the budget is
// refused with a *host.BudgetError, or served with pageable memory where
// the caller allows it.
func ExampleAllocator_MallocWith() {
	budget := host.NewPinBudget(0) // host.ProcessPinBudget() when Config.Budget is nil
	cfg, _ := host.ParseConfig("pinned_budget_mb:64")
	cfg.Budget = budget
	drv, _ := emulated.New()
	a, _ := host.New(drv, cfg)
	defer a.Close()
	b, _ := host.New(drv, cfg)
	defer b.Close()

	weights, _ := a.Malloc(60 << 20) // pins one 60 MiB chunk
	_, err := b.Malloc(8 << 20)
	var be *host.BudgetError
	fmt.Println(errors.As(err, &be), be.Limit>>20, "MiB")
	got, _ := b.MallocWith(8<<20, host.MallocOptions{AllowPageable: true})
	fmt.Println("pinned:", got.Pinned)
	_ = b.Free(got.Ptr)
	_ = a.Free(weights)
	_ = a.EmptyCache() // unmaps the chunk: its budget goes back
	fmt.Println("pinned now:", budget.Stats().Pinned)
	// Output:
	// true 64 MiB
	// pinned: false
	// pinned now: 0
}
