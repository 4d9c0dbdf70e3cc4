package arena

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"
)

// liveHeap returns a heap with live Allocated 512-byte blocks at the low
// end of one region of pool 0 on one stream, followed by a 1.5 GiB + 5 MiB free
// tail (not a class boundary: taking 4 KiB off it keeps its size class).
func liveHeap(tb testing.TB, live int) (*Heap, StreamID) {
	tb.Helper()
	h, err := NewHeap(2)
	if err != nil {
		tb.Fatal(err)
	}
	sid, err := h.AddStream(1)
	if err != nil {
		tb.Fatal(err)
	}
	if _, _, err := h.AddRegion(1<<40, uint64(live)*unit+3<<29+5<<20, 0, Free, sid); err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < live; i++ {
		id := h.BestFit(sid, 0, unit)
		if err := h.Alloc(id, unit, unit); err != nil {
			tb.Fatal(err)
		}
	}
	return h, sid
}

// BenchmarkHeapAllocFree is the heap's share of a cache-hit Malloc+Free:
// best fit, split the request off the free block (the remainder takes the
// block's place in its class treap), then free it and merge it back, with
// live allocated blocks around it.
func BenchmarkHeapAllocFree(b *testing.B) {
	for _, live := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			h, sid := liveHeap(b, live)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := h.BestFit(sid, 0, 4096)
				if err := h.Alloc(id, 4096, 4000); err != nil {
					b.Fatal(err)
				}
				if _, err := h.Free(id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHeapAllocFitFreeAt is BenchmarkHeapAllocFree through the
// cache-hit calls the allocator makes: AllocFit (best fit and split, the
// split block keeping its record and treap slot) and FreeAt (lookup, free
// and merge back into that record).
func BenchmarkHeapAllocFitFreeAt(b *testing.B) {
	for _, live := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			h, sid := liveHeap(b, live)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id, addr, _ := h.AllocFit(sid, 0, 4096, 4000, math.MaxUint64, unit)
				if id == NoBlock {
					b.Fatal("AllocFit found no block")
				}
				if _, ok := h.FreeAt(addr); !ok {
					b.Fatal("FreeAt refused")
				}
			}
		})
	}
}

// BenchmarkHeapBestFitHoles allocates and frees exact fits among n free
// holes of one size (each between two allocated blocks): best fit, removal
// and reinsertion in a treap of n equal-sized blocks, no split or merge.
func BenchmarkHeapBestFitHoles(b *testing.B) {
	for _, holes := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("holes=%d", holes), func(b *testing.B) {
			h, sid := liveHeap(b, 0)
			var ids []BlockID
			for i := 0; i < holes; i++ {
				for _, n := range []uint64{8192, unit} {
					id := h.BestFit(sid, 0, n)
					if err := h.Alloc(id, n, n); err != nil {
						b.Fatal(err)
					}
					ids = append(ids, id)
				}
			}
			for i := 0; i < len(ids); i += 2 {
				if _, err := h.Free(ids[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := h.BestFit(sid, 0, 8192)
				if err := h.Alloc(id, 8192, 8192); err != nil {
					b.Fatal(err)
				}
				if _, err := h.Free(id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHeapLiveBlocks measures what 10⁶ live allocated blocks cost the
// Go runtime: bytes of Go heap per block (bytes/block) and the duration of
// one full runtime.GC() with them live (gc-ms, also ns/op): pointer-free
// records in slabs and a table of BlockIDs, which the collector does not
// scan. (benchmarks.BenchmarkLiveBlocksGC measures the same through the
// allocator.)
func BenchmarkHeapLiveBlocks(b *testing.B) {
	const live = 1_000_000
	b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		keep, _ := liveHeap(b, live)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			runtime.GC()
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1e3/float64(b.N), "gc-ms")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/live, "bytes/block")
		runtime.KeepAlive(keep)
	})
}
