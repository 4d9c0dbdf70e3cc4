package allocator_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// ExamplePool_Sleep is vLLM's sleep mode with pools: the weights are
// offloaded to pinned host memory, the KV cache discarded, and both come
// back at the same addresses, the weights with their bytes. The lines
// from pinned to kv.Wake are docs/sleep.md's snippet.
func ExamplePool_Sleep() {
	drv, _ := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(1<<30))
	defer drv.Close()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	pinned, _ := host.New(drv, host.DefaultConfig()) // allocator/host: pinned backups
	defer pinned.Close()
	weights, _ := a.NewPool(allocator.PoolOptions{Name: "weights"})
	kv, _ := a.NewPool(allocator.PoolOptions{Name: "kv_cache"})
	w, _ := weights.Malloc(64<<20, 0) // the model's weights
	c, _ := kv.Malloc(128<<20, 0)     // its KV cache
	// ... rollout ...
	b, _ := drv.Bytes(w, 64<<20)
	copy(b, "model weights")
	_ = weights.Sleep(allocator.SleepOptions{Mode: allocator.Offload, Host: pinned, KeepHostBuffers: true})
	_ = kv.Sleep(allocator.SleepOptions{Mode: allocator.Discard})
	st := a.Stats()
	fmt.Println("asleep:", st.AsleepBytes>>20, "MiB, backed up:", st.HostBackupBytes>>20, "MiB")
	// ... training allocates in the memory given back ...
	if err := weights.Wake(); err != nil {
		fmt.Println(err) // *OutOfMemoryError: still asleep, backups intact; free memory and retry
	}
	_ = kv.Wake()
	b, _ = drv.Bytes(w, 64<<20)
	fmt.Printf("%s, at the same address\n", b[:13])
	_ = a.Free(w)
	_ = a.Free(c)
	// Output:
	// asleep: 192 MiB, backed up: 64 MiB
	// model weights, at the same address
}
