package allocator

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// heapInUse is the live heap after a full collection, in bytes.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkShortLivedStreams creates, uses and retires one stream per
// iteration (Malloc, RecordStream of the default stream, Free,
// ReleaseStream, StreamDestroy) and reports the heap the allocator keeps
// per stream once all are gone: bounded memory for 10⁵ streams is
//
//	go test ./allocator -run '^$' -bench ShortLivedStreams -benchtime 100000x -benchmem
func BenchmarkShortLivedStreams(b *testing.B) {
	e, err := emulated.New()
	require.NoError(b, err)
	a, err := New(e, DefaultConfig())
	require.NoError(b, err)
	defer e.Close()
	defer a.Close()
	start := heapInUse()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := e.StreamCreate(0)
		if err != nil {
			b.Fatal(err)
		}
		p, err := a.Malloc(uint64(4096*(i%5+1)), s)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.RecordStream(p, a.DefaultStream()); err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
		if err := a.ReleaseStream(s); err != nil {
			b.Fatal(err)
		}
		if err := e.StreamDestroy(s); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	end := heapInUse()
	b.ReportMetric(float64(int64(end)-int64(start))/float64(b.N), "retained-B/stream")
	b.ReportMetric(float64(len(a.streams)), "streams-known")
	if err := a.Check(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkMallocFreeAfterStreams is a cache-hit Malloc+Free on the
// default stream after 20,000 streams were each used once and retired,
// while one block waits for an event (so every Malloc polls events): the
// work per call must not grow with the streams ever seen.
//
//	go test ./allocator -run '^$' -bench MallocFreeAfterStreams -benchmem
func BenchmarkMallocFreeAfterStreams(b *testing.B) {
	for _, tc := range []struct {
		name    string
		release bool // ReleaseStream before StreamDestroy
	}{{"destroyed", false}, {"released", true}} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := emulated.New(emulated.WithManualCompletion())
			require.NoError(b, err)
			a, err := New(e, DefaultConfig())
			require.NoError(b, err)
			defer e.Close()
			defer a.Close()
			for range 20_000 {
				s, err := e.StreamCreate(0)
				require.NoError(b, err)
				p, err := a.Malloc(4096, s)
				require.NoError(b, err)
				require.NoError(b, a.Free(p))
				if tc.release {
					require.NoError(b, a.ReleaseStream(s))
				}
				require.NoError(b, e.StreamDestroy(s))
			}
			busy, err := e.StreamCreate(0)
			require.NoError(b, err)
			w, err := a.Malloc(4096, 0)
			require.NoError(b, err)
			require.NoError(b, e.Launch(busy, w, 4096))
			require.NoError(b, a.RecordStream(w, busy))
			require.NoError(b, a.Free(w)) // pending on busy's event
			p, err := a.Malloc(4096, 0)   // warm the cache
			require.NoError(b, err)
			require.NoError(b, a.Free(p))
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
			b.ReportMetric(float64(len(a.busy)), "busy-streams")
			require.NoError(b, e.Complete(busy))
		})
	}
}
