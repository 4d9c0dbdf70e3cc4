package benchmarks

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func newAllocator(b testing.TB, conf string) (*allocator.Allocator, *emulated.Emulator) {
	e, err := emulated.New()
	require.NoError(b, err)
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(b, err)
	a, err := allocator.New(e, cfg)
	require.NoError(b, err)
	return a, e
}

// BenchmarkMallocFree measures a cache-hit Malloc+Free pair with live
// blocks around it, on one goroutine.
func BenchmarkMallocFree(b *testing.B) {
	for _, live := range []int{0, 100, 10_000, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			a, e := newAllocator(b, "")
			defer a.Close()
			for i := 0; i < live; i++ {
				// Mixed sizes so the free lists hold varied classes.
				if _, err := a.Malloc(uint64(512*(1+i%7)), 0); err != nil {
					b.Fatal(err)
				}
			}
			p, err := a.Malloc(4096, 0)
			require.NoError(b, err)
			require.NoError(b, a.Free(p))
			calls, sim0 := e.CallCounts(), e.SimulatedTime()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := a.Malloc(4096, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := e.CallCounts()
			b.ReportMetric(float64((e.SimulatedTime()-sim0).Nanoseconds())/float64(b.N), "sim-driver-ns/op")
			var n int64
			for op := range after {
				n += after[op] - calls[op]
			}
			b.ReportMetric(float64(n)/float64(b.N), "driver-calls/op")
		})
	}
}

// BenchmarkMallocFreeHoles measures cache-hit pairs in a fragmented heap:
// n free 512-byte holes of one size between live blocks, the case where an
// address-ordered class list would walk every hole on each free.
func BenchmarkMallocFreeHoles(b *testing.B) {
	for _, holes := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("holes=%d", holes), func(b *testing.B) {
			a, _ := newAllocator(b, "")
			defer a.Close()
			ptrs := make([]uintptr, 2*holes)
			for i := range ptrs {
				p, err := a.Malloc(512, 0)
				require.NoError(b, err)
				ptrs[i] = p
			}
			for i := 0; i < len(ptrs); i += 2 {
				require.NoError(b, a.Free(ptrs[i]))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := a.Malloc(512, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMallocFreeParallel measures cache-hit pairs from all
// goroutines on one allocator (one device mutex).
func BenchmarkMallocFreeParallel(b *testing.B) {
	a, _ := newAllocator(b, "")
	defer a.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := a.Malloc(4096, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
