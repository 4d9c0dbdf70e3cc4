package allocator_test

import (
	"testing"
	"time"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// BenchmarkSleepWake: an offloaded 64 MiB pool slept and woken over the
// emulator's real memory, with kept pinned buffers. It reports sleep and
// wake throughput as a ratio to a raw pinned copy of the same bytes
// through the same Copier (goal ≥ 0.9), and driver unmaps+frees per GiB
// slept (one of each per handle: 20 MiB pages by default).
func BenchmarkSleepWake(b *testing.B) {
	const size = 64 << 20
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(256<<20))
	if err != nil {
		b.Skip(err)
	}
	a, err := allocator.New(e, allocator.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	pinned, err := host.New(e, host.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer pinned.Close()
	p, _ := a.NewPool(allocator.PoolOptions{Name: "weights"})
	w, err := p.Malloc(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	s := a.DefaultStream()
	hp, err := pinned.Malloc(size)
	if err != nil {
		b.Fatal(err)
	}
	buf := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&hp))), size)
	opts := allocator.SleepOptions{Mode: allocator.Offload, Host: pinned, KeepHostBuffers: true}
	if err := p.Sleep(opts); err != nil { // allocate the kept buffers
		b.Fatal(err)
	}
	if err := p.Wake(); err != nil {
		b.Fatal(err)
	}
	var raw, slept, woken time.Duration
	calls0 := e.Calls(backend.OpUnmap) + e.Calls(backend.OpFree)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := e.CopyDtoH(buf, w, s); err != nil {
			b.Fatal(err)
		}
		if err := e.CopyHtoD(w, buf, s); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := p.Sleep(opts); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := p.Wake(); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		raw += t1.Sub(t0)
		slept += t2.Sub(t1)
		woken += t3.Sub(t2)
	}
	b.StopTimer()
	calls := e.Calls(backend.OpUnmap) + e.Calls(backend.OpFree) - calls0
	b.ReportMetric(float64(raw)/2/float64(slept), "sleep_vs_raw")
	b.ReportMetric(float64(raw)/2/float64(woken), "wake_vs_raw")
	b.ReportMetric(float64(calls)/float64(b.N)/(float64(size)/(1<<30)), "unmap+free/GiB")
	b.ReportMetric(float64(size)*float64(b.N)/(1<<30)/slept.Seconds(), "sleep_GiB/s")
	b.ReportMetric(float64(size)*float64(b.N)/(1<<30)/woken.Seconds(), "wake_GiB/s")
	_ = pinned.Free(hp)
	_ = a.Free(w)
}

// BenchmarkWakeDiscard is the latency of Wake without backup (create,
// map and set access of 1 GiB in 20 MiB handles) on the emulator.
func BenchmarkWakeDiscard(b *testing.B) {
	e, _ := emulated.New(emulated.WithCapacity(4 << 30))
	a, err := allocator.New(e, allocator.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	p, _ := a.NewPool(allocator.PoolOptions{})
	w, err := p.Malloc(1<<30, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := p.Sleep(allocator.SleepOptions{Mode: allocator.Discard}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := p.Wake(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = a.Free(w)
}
