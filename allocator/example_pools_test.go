package allocator_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// ExampleAllocator_NewPool gives two tenants private pools
// (torch.cuda.MemPool): one's cached memory is never handed to the other,
// EmptyCache inside a pool returns only that pool's memory, and a pool
// with live allocations refuses to close.
func ExampleAllocator_NewPool() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()

	train, _ := a.NewPool(allocator.PoolOptions{Name: "train"})
	serve, _ := a.NewPool(allocator.PoolOptions{Name: "serve", MemoryLimit: 64 << 20})

	x, _ := train.Malloc(30<<20, 0) // like allocating inside use_mem_pool(train)
	_ = a.Free(x)                   // any pointer is freed with Allocator.Free
	y, _ := serve.Malloc(30<<20, 0)
	fmt.Println("serve reused train's block:", x == y)

	_, err := serve.Malloc(40<<20, 0)
	var oom *allocator.OutOfMemoryError
	fmt.Println("serve past its limit:", errors.As(err, &oom) && oom.PoolName == "serve")

	fmt.Printf("train reserves %d MiB\n", train.MemoryReserved()>>20)
	_ = train.EmptyCache() // empty_cache inside the pool
	fmt.Printf("after train.EmptyCache: train %d MiB, serve %d MiB\n", train.MemoryReserved()>>20, serve.MemoryReserved()>>20)

	fmt.Println("close serve:", errors.Is(serve.Close(), allocator.ErrPoolBusy))
	_ = a.Free(y)
	fmt.Println("close serve after the free:", serve.Close())
	// Output:
	// serve reused train's block: false
	// serve past its limit: true
	// train reserves 30 MiB
	// after train.EmptyCache: train 0 MiB, serve 30 MiB
	// close serve: true
	// close serve after the free: <nil>
}

// ExampleAllocator_AddSegmentHook registers mapped memory with a
// collective library, as NCCL's process group does through PyTorch's
// attachAllocatorTraceTracker: the hook sees memory mapped before it was
// attached (the catch-up), every range before a pointer into it is
// returned, and every range before it is unmapped.
func ExampleAllocator_AddSegmentHook() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())

	early, _ := a.Malloc(10<<20, 0)
	registered := map[uintptr]uint64{}
	id, _ := a.AddSegmentHook(allocator.SegmentHook{
		Mapped: func(r allocator.SegmentRange) error {
			registered[r.Addr] = r.Size // ncclCommRegister(r.Addr, r.Size)
			fmt.Printf("register %d MiB in %d handles\n", r.Size>>20, len(r.Handles))
			return nil
		},
		Unmapped: func(r allocator.SegmentRange) {
			// A release may unmap several registered ranges at once (or
			// a part of one): deregister every registration inside it.
			for addr := range registered {
				if addr >= r.Addr && addr < r.Addr+uintptr(r.Size) {
					delete(registered, addr) // ncclCommDeregister
				}
			}
			fmt.Printf("deregister %d MiB\n", r.Size>>20)
		},
	})
	p, _ := a.Malloc(100<<20, 0)
	_ = a.Free(p)
	_ = a.Free(early)
	_ = a.EmptyCache()
	_ = a.RemoveSegmentHook(id)
	_ = a.Close()
	fmt.Println("still registered:", len(registered))
	// Output:
	// register 10 MiB in 1 handles
	// register 100 MiB in 2 handles
	// deregister 110 MiB
	// still registered: 0
}
