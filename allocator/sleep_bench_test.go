package allocator_test

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// sleepBenchShape is what an offloaded pool holds in BenchmarkSleepWake.
type sleepBenchShape struct {
	name  string
	sizes func() []uint64 // the allocations, in order
	gaps  int             // every gaps-th allocation is freed (0: none)
}

var sleepBenchShapes = []sleepBenchShape{
	{name: "1x64MiB", sizes: func() []uint64 { return []uint64{64 << 20} }},
	// Weights as a model holds them: 512 tensors of 4 KiB to 252 KiB
	// (about 64 MiB), every 16th freed, so the backups are 32 runs.
	{name: "512tensors", gaps: 16, sizes: func() []uint64 {
		out := make([]uint64, 512)
		for i := range out {
			out[i] = uint64(4<<10 + (i*7919)%(248<<10))
		}
		return out
	}},
}

// BenchmarkSleepWake: an offloaded pool slept and woken over the
// emulator's real memory, with pinned backups from allocator/host, kept
// (keep=true) or given back at each wake. It reports, per direction:
//
//   - sleep_vs_raw, wake_vs_raw: throughput as a ratio to a raw pinned copy
//     of the same bytes through the same Copier (CopyDtoH, CopyHtoD between
//     a pinned buffer and the pool's memory, mapped and resident);
//   - sleep_vs_floor, wake_vs_floor: the same ratio to the least driver work
//     a sleep or wake of these handles is (one copy of all the bytes, and
//     the unmap and free, or the create, map and set access, of handles of
//     the pool's sizes, made directly on the driver): what the allocator
//     adds over the driver;
//   - model_sleep_vs_raw, model_wake_vs_raw: the ratio in the emulator's
//     cost model (emulated.DefaultCostModel: a 25 GB/s host link, tens of
//     microseconds per create, map, unmap, free, pinned allocation), a
//     device's view where page faults of fresh memory do not exist;
//   - copies/sleep, host_mallocs/sleep, unmap+free/GiB: driver calls.
//
// The raw copy is one copy per live tensor, as a framework offloading
// tensor by tensor makes; the floor copies all the bytes at once.
func BenchmarkSleepWake(b *testing.B) {
	for _, shape := range sleepBenchShapes {
		for _, keep := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/keep=%v", shape.name, keep), func(b *testing.B) {
				benchSleepWake(b, shape, keep)
			})
		}
	}
}

func benchSleepWake(b *testing.B, shape sleepBenchShape, keep bool) {
	// A device's 2 MiB granule (the real-memory emulator's default is 64
	// KiB, which would give small blocks handles of a few granules).
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(512<<20), emulated.WithGranularity(2<<20))
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
	s := a.DefaultStream()
	type tensor struct {
		p uintptr
		n uint64
	}
	var live []tensor
	var freed []uintptr
	var bytes uint64
	for i, n := range shape.sizes() {
		x, err := p.Malloc(n, 0)
		if err != nil {
			b.Fatal(err)
		}
		if shape.gaps > 0 && i%shape.gaps == shape.gaps-1 {
			freed = append(freed, x)
			continue
		}
		live = append(live, tensor{x, n})
		bytes += n
	}
	for _, x := range freed {
		if err := a.Free(x); err != nil {
			b.Fatal(err)
		}
	}
	// The pool's handles, from a hook's catch-up: the floor makes handles
	// of the same sizes.
	var handles []uint64
	id, err := a.AddSegmentHook(allocator.SegmentHook{Mapped: func(r allocator.SegmentRange) error {
		for _, h := range r.Handles {
			handles = append(handles, h.Size)
		}
		return nil
	}})
	if err != nil {
		b.Fatal(err)
	}
	if err := a.RemoveSegmentHook(id); err != nil {
		b.Fatal(err)
	}
	var mapped uint64
	for _, h := range handles {
		mapped += h
	}
	hp, err := pinned.Malloc(bytes)
	if err != nil {
		b.Fatal(err)
	}
	buf := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&hp))), bytes)
	opts := allocator.SleepOptions{Mode: allocator.Offload, Host: pinned, KeepHostBuffers: keep}
	if err := p.Sleep(opts); err != nil { // the first sleep makes the buffers
		b.Fatal(err)
	}
	if err := p.Wake(); err != nil {
		b.Fatal(err)
	}
	floorVA, err := e.ReserveAddress(mapped)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = e.ReleaseAddress(floorVA, mapped) }()
	prop := backend.DeviceProp(0)
	access := []backend.AccessDesc{{Location: prop.Location, Flags: backend.AccessReadWrite}}

	var raw, slept, woken, floorSleep, floorWake time.Duration
	var simRaw, simSlept, simWoken time.Duration
	calls := func() int64 { return e.Calls(backend.OpUnmap) + e.Calls(backend.OpFree) }
	copies0, mallocs0 := e.Calls(backend.OpMemcpy), e.Calls(backend.OpMallocHost)
	var ownCopies, unmapFree int64
	hs := make([]backend.Handle, len(handles))
	b.ResetTimer()
	for range b.N {
		// Raw: the same bytes out and in, one copy per live tensor,
		// through the same Copier and one pinned buffer.
		sim0 := e.SimulatedTime()
		t0 := time.Now()
		off := uint64(0)
		for _, t := range live {
			if err := e.CopyDtoH(buf[off:off+t.n], t.p, s); err != nil {
				b.Fatal(err)
			}
			off += t.n
		}
		off = 0
		for _, t := range live {
			if err := e.CopyHtoD(t.p, buf[off:off+t.n], s); err != nil {
				b.Fatal(err)
			}
			off += t.n
		}
		raw += time.Since(t0)
		sim1 := e.SimulatedTime()
		ownCopies += int64(2 * len(live))

		c0 := calls()
		t3 := time.Now()
		if err := p.Sleep(opts); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		sim2 := e.SimulatedTime()
		unmapFree += calls() - c0
		if err := p.Wake(); err != nil {
			b.Fatal(err)
		}
		t5 := time.Now()
		sim3 := e.SimulatedTime()
		slept += t4.Sub(t3)
		woken += t5.Sub(t4)
		simRaw += sim1 - sim0
		simSlept += sim2 - sim1
		simWoken += sim3 - sim2

		// The floor: fresh handles of the pool's sizes created, mapped and
		// filled, then copied out, unmapped and freed, on the driver.
		t6 := time.Now()
		va := floorVA
		for i, n := range handles {
			h, err := e.CreatePhysical(n, prop)
			if err != nil {
				b.Fatal(err)
			}
			hs[i] = h
			if err := e.Map(va, n, h); err != nil {
				b.Fatal(err)
			}
			if err := e.SetAccess(va, n, access); err != nil {
				b.Fatal(err)
			}
			va += uintptr(n)
		}
		if err := e.CopyHtoD(floorVA, buf, s); err != nil {
			b.Fatal(err)
		}
		t7 := time.Now()
		if err := e.CopyDtoH(buf, floorVA, s); err != nil {
			b.Fatal(err)
		}
		va = floorVA
		for i, n := range handles {
			if err := e.Unmap(va, n); err != nil {
				b.Fatal(err)
			}
			if err := e.FreePhysical(hs[i]); err != nil {
				b.Fatal(err)
			}
			va += uintptr(n)
		}
		t8 := time.Now()
		ownCopies += 2
		floorWake += t7.Sub(t6)
		floorSleep += t8.Sub(t7)
	}
	b.StopTimer()
	n := float64(b.N)
	gib := float64(bytes) / (1 << 30)
	b.ReportMetric(float64(raw)/2/float64(slept), "sleep_vs_raw")
	b.ReportMetric(float64(raw)/2/float64(woken), "wake_vs_raw")
	b.ReportMetric(float64(floorSleep)/float64(slept), "sleep_vs_floor")
	b.ReportMetric(float64(floorWake)/float64(woken), "wake_vs_floor")
	b.ReportMetric(float64(simRaw)/2/float64(simSlept), "model_sleep_vs_raw")
	b.ReportMetric(float64(simRaw)/2/float64(simWoken), "model_wake_vs_raw")
	b.ReportMetric(gib*n/slept.Seconds(), "sleep_GiB/s")
	b.ReportMetric(gib*n/woken.Seconds(), "wake_GiB/s")
	b.ReportMetric(float64(e.Calls(backend.OpMemcpy)-copies0-ownCopies)/n/2, "copies/sleep")
	b.ReportMetric(float64(e.Calls(backend.OpMallocHost)-mallocs0)/n, "host_mallocs/sleep")
	b.ReportMetric(float64(unmapFree)/n/(float64(mapped)/(1<<30)), "unmap+free/GiB")
	_ = pinned.Free(hp)
	for _, t := range live {
		_ = a.Free(t.p)
	}
}

// BenchmarkWakeDiscard is the latency of Wake without backup: create, map
// and set access of 1 GiB in handles of the configured size, on the
// emulator (no real memory: the driver's bookkeeping and the allocator's
// own work), with the cost model's figure for a device beside it
// (model_µs) and the driver calls per GiB a sleep of it makes (one unmap
// and one free per handle).
func BenchmarkWakeDiscard(b *testing.B) {
	for _, mb := range []int{20, 64, 512} {
		b.Run(fmt.Sprintf("handle=%dMiB", mb), func(b *testing.B) {
			e, _ := emulated.New(emulated.WithCapacity(4 << 30))
			conf, err := allocator.ParseConfig(fmt.Sprintf("expandable_handle_mb:%d", mb))
			if err != nil {
				b.Fatal(err)
			}
			a, err := allocator.New(e, conf)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			p, _ := a.NewPool(allocator.PoolOptions{})
			w, err := p.Malloc(1<<30, 0)
			if err != nil {
				b.Fatal(err)
			}
			var sim time.Duration
			var calls int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				c0 := e.Calls(backend.OpUnmap) + e.Calls(backend.OpFree)
				if err := p.Sleep(allocator.SleepOptions{Mode: allocator.Discard}); err != nil {
					b.Fatal(err)
				}
				calls += e.Calls(backend.OpUnmap) + e.Calls(backend.OpFree) - c0
				s0 := e.SimulatedTime()
				b.StartTimer()
				if err := p.Wake(); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				sim += e.SimulatedTime() - s0
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(float64(sim.Microseconds())/float64(b.N), "model_µs")
			b.ReportMetric(float64(calls)/float64(b.N), "unmap+free/GiB")
			_ = a.Free(w)
		})
	}
}
