package benchmarks

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkLiveBlocksGC measures what live allocations cost the Go
// runtime, through the public API: the Go heap per live block (bytes/block:
// HeapAlloc after a full GC, less the same before the allocations, over
// the live blocks) and the duration of one full runtime.GC() with them
// live (gc-ms, and ns/op). Each iteration is one runtime.GC().
func BenchmarkLiveBlocksGC(b *testing.B) {
	const live = 1_000_000
	b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		a, _ := newAllocator(b, "")
		defer a.Close()
		for i := 0; i < live; i++ {
			if _, err := a.Malloc(512, 0); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		require.Equal(b, uint64(live*512), a.MemoryAllocated())
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			runtime.GC()
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1e3/float64(b.N), "gc-ms")
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/live, "bytes/block")
		runtime.KeepAlive(a)
	})
}
