package benchmarks

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// BenchmarkPoolMallocFree measures a cache-hit Malloc+Free pair inside a
// private pool (pool.Malloc, Allocator.Free) with live blocks around it,
// as BenchmarkMallocFree does for the default pool; other=N private pools
// hold live blocks beside it.
func BenchmarkPoolMallocFree(b *testing.B) {
	for _, c := range []struct{ live, other int }{{100, 0}, {100, 7}} {
		b.Run(fmt.Sprintf("live=%d/other=%d", c.live, c.other), func(b *testing.B) {
			a, _ := newAllocator(b, "")
			defer a.Close()
			p, err := a.NewPool(allocator.PoolOptions{Name: "bench"})
			require.NoError(b, err)
			for i := 0; i < c.other; i++ {
				q, err := a.NewPool(allocator.PoolOptions{})
				require.NoError(b, err)
				_, err = q.Malloc(4096, 0)
				require.NoError(b, err)
			}
			for i := 0; i < c.live; i++ {
				if _, err := p.Malloc(uint64(512*(1+i%7)), 0); err != nil {
					b.Fatal(err)
				}
			}
			ptr, err := p.Malloc(4096, 0)
			require.NoError(b, err)
			require.NoError(b, a.Free(ptr))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ptr, err := p.Malloc(4096, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(ptr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMultiTenantPools alternates a training phase and a serving
// phase, each in its own private pool, on a device too small for both
// peaks together: each phase allocates its working set, frees it, and
// leaves it cached in its pool. The phase that follows can grow only by
// taking the other pool's cached memory: under pressure it adopts that
// pool's idle handles where they are mapped. It reports the peak of
// device memory reserved against the sum and the max of the two pools'
// peaks, and the driver calls and simulated driver time per phase.
func BenchmarkMultiTenantPools(b *testing.B) {
	const (
		capacity = 768 << 20
		trainN   = 40
		trainSz  = 12 << 20 // 480 MiB
		serveN   = 30
		serveSz  = 15 << 20 // 450 MiB
	)
	e, err := emulated.New(emulated.WithCapacity(capacity))
	require.NoError(b, err)
	a, err := allocator.New(e, allocator.DefaultConfig())
	require.NoError(b, err)
	defer a.Close()
	train, err := a.NewPool(allocator.PoolOptions{Name: "train"})
	require.NoError(b, err)
	serve, err := a.NewPool(allocator.PoolOptions{Name: "serve"})
	require.NoError(b, err)
	ptrs := make([]uintptr, 0, trainN)
	phase := func(p *allocator.Pool, n int, size uint64) {
		ptrs = ptrs[:0]
		for i := 0; i < n; i++ {
			ptr, err := p.Malloc(size, 0)
			if err != nil {
				b.Fatal(err)
			}
			ptrs = append(ptrs, ptr)
		}
		for _, ptr := range ptrs {
			if err := a.Free(ptr); err != nil {
				b.Fatal(err)
			}
		}
	}
	phase(train, trainN, trainSz) // warm up both pools once
	phase(serve, serveN, serveSz)
	a.ResetPeakStats()
	calls := func() int64 {
		var n int64
		for _, c := range e.CallCounts() {
			n += c
		}
		return n
	}
	before, sim0 := calls(), e.SimulatedTime()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		phase(train, trainN, trainSz)
		phase(serve, serveN, serveSz)
	}
	b.StopTimer()
	after := calls()
	peak := a.Stats().ReservedBytes[stats.AllPools].Peak
	pt := train.Stats().ReservedBytes[stats.AllPools].Peak
	ps := serve.Stats().ReservedBytes[stats.AllPools].Peak
	b.ReportMetric(float64(peak)/(1<<20), "peak-reserved-MiB")
	b.ReportMetric(float64(pt+ps)/(1<<20), "sum-of-pool-peaks-MiB")
	b.ReportMetric(float64(max(pt, ps))/(1<<20), "max-pool-peak-MiB")
	b.ReportMetric(float64(after-before)/float64(2*b.N), "driver-calls/phase")
	b.ReportMetric(float64((e.SimulatedTime()-sim0).Microseconds())/float64(2*b.N), "sim-driver-µs/phase")
	require.NoError(b, a.Check())
}
