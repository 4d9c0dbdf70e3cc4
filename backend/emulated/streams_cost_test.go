package emulated

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxStreamCost bounds the Go heap one idle stream costs the emulator: its
// 64-byte record and its entry in the process's stream map (measured 87).
const maxStreamCost = 160

// streamCost creates n streams on a fresh emulator and returns the Go heap
// they hold per stream.
func streamCost(tb testing.TB, n int) float64 {
	tb.Helper()
	e, err := New()
	require.NoError(tb, err)
	defer e.Close()
	before := heapInUse()
	for range n {
		_, err := e.StreamCreate(0)
		require.NoError(tb, err)
	}
	after := heapInUse()
	runtime.KeepAlive(e)
	return float64(after-before) / float64(n)
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestStreamCost: a stream costs the emulator bytes, not kilobytes, since a
// replay creates one per stream its trace names.
func TestStreamCost(t *testing.T) {
	assert.Equal(t, uintptr(64), unsafe.Sizeof(stream{}), "one size class")
	cost := streamCost(t, 50000)
	t.Logf("%.0f bytes per stream", cost)
	assert.Less(t, cost, float64(maxStreamCost))
}

// BenchmarkStreamCost reports the Go heap an idle stream holds.
func BenchmarkStreamCost(b *testing.B) {
	var cost float64
	for b.Loop() {
		cost = streamCost(b, 10000)
	}
	b.ReportMetric(cost, "B/stream")
}
