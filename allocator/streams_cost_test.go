package allocator

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

// What a stream in use costs the allocator in Go heap: a trace may name
// 100,000 streams, so a stream may not cost kilobytes (two full TLSF
// tables of class roots would be 8.3 KB a stream). With sparse free
// indexes: 380 bytes for a stream the allocator
// has seen (its streamState, its map entries, its heap record and two
// empty free indexes; 8,350 before) and 1,225 for one holding one block
// (9,049 before), which adds the growth that maps 2 MiB for it: the block
// and its free rest, a group of the free index, the segment's and the
// emulator's records of the handle and its mapping (about 380 of the
// 1,225). The bounds leave room for map growth.
const (
	maxSeenStreamCost     = 640
	maxOneBlockStreamCost = 1536
)

// streamStateCost makes n streams, then lets the allocator see each one
// (Synchronize) or allocate size bytes on each, and returns the Go heap
// that adds per stream (the emulator's streams are not counted; the
// memory a Malloc maps is).
func streamStateCost(tb testing.TB, n int, size uint64) float64 {
	tb.Helper()
	a, e := newAlloc(tb, "")
	streams := make([]backend.Stream, n)
	for i := range streams {
		s, err := e.StreamCreate(0)
		require.NoError(tb, err)
		streams[i] = s
	}
	before := heapInUse()
	for _, s := range streams {
		if size == 0 {
			require.NoError(tb, a.Synchronize(s))
			continue
		}
		_, err := a.Malloc(size, s)
		require.NoError(tb, err)
	}
	after := heapInUse()
	runtime.KeepAlive(a)
	require.NoError(tb, a.Check())
	return float64(after-before) / float64(n)
}

// TestStreamStateCost: a stream costs the allocator in proportion to what
// it holds: hundreds of bytes, not kilobytes.
func TestStreamStateCost(t *testing.T) {
	seen := streamStateCost(t, 20000, 0)
	one := streamStateCost(t, 2000, 64) // fewer: each growth on a new stream walks the others (reclaim.go)
	t.Logf("heap per stream: %.0f B seen, %.0f B holding one block", seen, one)
	assert.Less(t, seen, float64(maxSeenStreamCost))
	assert.Less(t, one, float64(maxOneBlockStreamCost))
}

// BenchmarkStreamStateCost reports the Go heap per stream in use, seen
// (Synchronize) and holding one 64-byte block.
func BenchmarkStreamStateCost(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
		size uint64
	}{{"seen", 20000, 0}, {"one-block", 2000, 64}} {
		b.Run(c.name, func(b *testing.B) {
			var cost float64
			for b.Loop() {
				cost = streamStateCost(b, c.n, c.size)
			}
			b.ReportMetric(cost, "B/stream")
		})
	}
}
