package trace

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSummarizeExact(t *testing.T) {
	events := []Event{
		{Kind: Mark, ID: 0, TimeNs: 5},
		{Kind: Alloc, ID: 1, Size: 100, TimeNs: 10},
		{Kind: Alloc, ID: 2, Size: 50, Stream: 1, TimeNs: 20},
		{Kind: RecordStream, ID: 1, Stream: 2, TimeNs: 25},
		{Kind: Free, ID: 1, TimeNs: 30},
		{Kind: Alloc, ID: 3, Size: 70, TimeNs: 40}, // live 120
		{Kind: Alloc, ID: 4, Size: 40, TimeNs: 50}, // live 160: peak (event 6)
		{Kind: StreamSync, Stream: 2, TimeNs: 55},
		{Kind: Free, ID: 3, TimeNs: 60},
		{Kind: Alloc, ID: 1, Size: 90, TimeNs: 70}, // id reuse after free; live 180: new peak (event 9)
		{Kind: EmptyCache, TimeNs: 80},
		{Kind: Free, ID: 1, TimeNs: 90},
		{Kind: Free, ID: 4, TimeNs: 95},
	}
	s, err := Summarize(NewSliceReader(events))
	require.NoError(t, err)
	assert.Equal(t, Summary{
		Events: 13, Allocs: 5, Frees: 4, RecordStreams: 1, StreamSyncs: 1, EmptyCaches: 1, Marks: 1,
		TotalAllocBytes: 350,
		PeakLiveBytes:   180,
		PeakLiveEvent:   9,
		PeakLiveAllocs:  3,
		LiveAllocs:      1,
		LiveBytes:       50,
		MinAllocSize:    40,
		MaxAllocSize:    100,
		Streams:         3,
		FirstTimeNs:     5,
		LastTimeNs:      95,
	}, s)
}

func TestSummarizeEmpty(t *testing.T) {
	s, err := Summarize(NewSliceReader(nil))
	require.NoError(t, err)
	assert.Equal(t, Summary{PeakLiveEvent: -1}, s)
}

func TestSummarizeFromText(t *testing.T) {
	r, err := Open(strings.NewReader(TextHeader + "\nalloc 1 4096\nalloc 2 8192\nfree 1\nalloc 3 1024\nfree 2\nfree 3\n"))
	require.NoError(t, err)
	s, err := Summarize(r)
	require.NoError(t, err)
	assert.Equal(t, uint64(12288), s.PeakLiveBytes)
	assert.Equal(t, int64(1), s.PeakLiveEvent)
	assert.Equal(t, uint64(13312), s.TotalAllocBytes)
	assert.Zero(t, s.LiveBytes)
	assert.Equal(t, 1, s.Streams)
}

func TestSummarizeValidation(t *testing.T) {
	tests := []struct {
		name   string
		events []Event
		index  int64
		reason string
	}{
		{"free unknown", []Event{{Kind: Alloc, ID: 1, Size: 1}, {Kind: Free, ID: 2}}, 1, "id 2 is not live"},
		{"double free", []Event{{Kind: Alloc, ID: 1, Size: 1}, {Kind: Free, ID: 1}, {Kind: Free, ID: 1}}, 2, "id 1 is not live"},
		{"double alloc", []Event{{Kind: Alloc, ID: 1, Size: 1}, {Kind: Alloc, ID: 1, Size: 1}}, 1, "id 1 is already live"},
		{"record dead", []Event{{Kind: RecordStream, ID: 4, Stream: 1}}, 0, "id 4 is not live"},
		{"overflow", []Event{{Kind: Alloc, ID: 1, Size: 1 << 63}, {Kind: Alloc, ID: 2, Size: 1 << 63}}, 1, "overflow"},
		{"bad kind", []Event{{Kind: 0}}, 0, "invalid kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Summarize(NewSliceReader(tc.events))
			require.ErrorIs(t, err, ErrInvalidTrace)
			var ve *ValidationError
			require.True(t, errors.As(err, &ve))
			assert.Equal(t, tc.index, ve.Index)
			assert.Equal(t, tc.events[tc.index], ve.Event)
			assert.Contains(t, ve.Reason, tc.reason)
			assert.Equal(t, tc.index, s.Events, "summary covers the events before the failure")
		})
	}
}

func TestSummarizeReadError(t *testing.T) {
	data := encodeBinary(t, Info{}, []Event{{Kind: Alloc, ID: 1, Size: 10}, {Kind: Free, ID: 1}})
	r, err := Open(strings.NewReader(string(data[:len(data)-2])))
	require.NoError(t, err)
	s, err := Summarize(r)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.Equal(t, int64(2), s.Events)
	assert.Equal(t, uint64(10), s.PeakLiveBytes)
}

// TestSummarizePools: per-pool peaks, the default pool's counted from the
// start even when the first private alloc comes after its peak.
func TestSummarizePools(t *testing.T) {
	graph, mem := PoolID{1, 0}, PoolID{0, 1}
	ev := []Event{
		{Kind: Alloc, ID: 1, Size: 100},
		{Kind: Alloc, ID: 2, Size: 50},
		{Kind: Free, ID: 2}, // the default pool peaked at 150
		{Kind: Alloc, ID: 3, Size: 70, Pool: graph},
		{Kind: Alloc, ID: 4, Size: 30, Pool: graph},
		{Kind: Free, ID: 3, Pool: mem}, // a Free's pool is ignored: the id's counts
		{Kind: Alloc, ID: 5, Size: 5, Pool: mem},
		{Kind: Alloc, ID: 6, Size: 10},
	}
	s, err := Summarize(NewSliceReader(ev))
	require.NoError(t, err)
	assert.Equal(t, map[PoolID]uint64{{}: 150, graph: 100, mem: 5}, s.PoolPeakLive)
	assert.Equal(t, uint64(200), s.PeakLiveBytes)

	s, err = Summarize(NewSliceReader(ev[:3]))
	require.NoError(t, err)
	assert.Nil(t, s.PoolPeakLive, "no private pool")
}
