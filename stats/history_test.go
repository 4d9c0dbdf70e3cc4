package stats

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// entry makes a distinct TraceEntry for sequence number i.
func entry(i int) TraceEntry {
	return TraceEntry{Action: TraceAlloc, Addr: uintptr(0x1000 * (i + 1)), Size: uint64(512 * (i + 1)), Stream: uint64(i % 3), TimeNs: int64(100 * i)}
}

func TestHistoryRing(t *testing.T) {
	tests := []struct {
		name        string
		max         int
		records     int
		wantFirst   int // sequence number of the oldest entry kept
		wantLen     int
		wantDropped int64
	}{
		{"empty", 4, 0, 0, 0, 0},
		{"partly full", 4, 3, 0, 3, 0},
		{"exactly full", 4, 4, 0, 4, 0},
		{"wrapped once", 4, 5, 1, 4, 1},
		{"wrapped to the start again", 4, 8, 4, 4, 4},
		{"wrapped many times", 4, 23, 19, 4, 19},
		{"capacity one", 1, 5, 4, 1, 4},
		{"zero capacity drops all", 0, 3, 0, 0, 3},
		{"negative capacity drops all", -7, 2, 0, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHistory(tt.max)
			for i := range tt.records {
				h.Record(entry(i))
			}
			want := []TraceEntry{}
			for i := tt.wantFirst; i < tt.wantFirst+tt.wantLen; i++ {
				want = append(want, entry(i))
			}
			assert.Equal(t, want, h.Entries())
			assert.Equal(t, tt.wantLen, h.Len())
			assert.Equal(t, tt.wantDropped, h.Dropped())
			assert.Equal(t, max(tt.max, 0), h.Cap())
		})
	}
}

func TestHistoryEntriesIsACopy(t *testing.T) {
	h := NewHistory(3)
	h.Record(entry(0))
	h.Record(entry(1))
	got := h.Entries()
	got[0].Size = 1
	h.Record(entry(2))
	h.Record(entry(3)) // overwrites entry 0 in the ring
	assert.Equal(t, uint64(1), got[0].Size, "old copy unaffected by the ring")
	assert.Equal(t, []TraceEntry{entry(1), entry(2), entry(3)}, h.Entries())
}

func TestHistoryClear(t *testing.T) {
	h := NewHistory(2)
	for i := range 5 {
		h.Record(entry(i))
	}
	require.Equal(t, int64(3), h.Dropped())
	h.Clear()
	assert.Equal(t, 0, h.Len())
	assert.Equal(t, int64(0), h.Dropped())
	assert.Equal(t, 2, h.Cap())
	assert.Equal(t, []TraceEntry{}, h.Entries())
	h.Record(entry(7))
	assert.Equal(t, []TraceEntry{entry(7)}, h.Entries())
}

func TestHistoryNil(t *testing.T) {
	var h *History
	require.NotPanics(t, func() {
		h.Record(entry(0))
		h.Clear()
	})
	assert.Equal(t, 0, h.Len())
	assert.Equal(t, 0, h.Cap())
	assert.Equal(t, int64(0), h.Dropped())
	assert.Equal(t, []TraceEntry{}, h.Entries())
}

func TestHistoryCap(t *testing.T) {
	tests := []struct{ in, want int }{
		{-1, 0}, {0, 0}, {1, 1}, {100000, 100000},
		{MaxHistoryEntries, MaxHistoryEntries}, {MaxHistoryEntries + 1, MaxHistoryEntries},
		{int(^uint(0) >> 1), MaxHistoryEntries},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, historyCap(tt.in), "historyCap(%d)", tt.in)
	}
}

func TestHistoryRecordDoesNotAllocate(t *testing.T) {
	h := NewHistory(64)
	e := entry(5)
	allocs := testing.AllocsPerRun(1000, func() {
		e.TimeNs++
		h.Record(e)
	})
	assert.Zero(t, allocs)
	assert.Equal(t, 64, h.Len())
}

func TestTraceActionValid(t *testing.T) {
	for _, a := range []TraceAction{TraceAlloc, TraceFreeRequested, TraceFreeCompleted, TraceSegmentAlloc,
		TraceSegmentFree, TraceSegmentMap, TraceSegmentUnmap, TraceSnapshot, TraceOOM} {
		assert.True(t, a.Valid(), a)
	}
	assert.Equal(t, TraceAction("segment_unmap"), TraceSegmentUnmap)
	assert.Equal(t, TraceAction("free_requested"), TraceFreeRequested)
	assert.Equal(t, TraceAction("oom"), TraceOOM)
	for _, a := range []TraceAction{"", "ALLOC", "free", "segment-map"} {
		assert.False(t, a.Valid(), a)
	}
}

func BenchmarkHistoryRecord(b *testing.B) {
	h := NewHistory(1 << 16)
	e := TraceEntry{Action: TraceSegmentMap, Addr: 0x7f0000000000, Size: 20 << 20, Stream: 1}
	b.ReportAllocs()
	for b.Loop() {
		e.TimeNs++
		h.Record(e)
	}
}
