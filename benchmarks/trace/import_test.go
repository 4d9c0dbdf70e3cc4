package trace

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
)

// snapshotFixture is a hand-made snapshot written by CPython's
// pickle.dumps(snap, protocol=4) with T = 1_700_000_000_000_000 and
// S = 140000000000000:
//
//	device_traces[0]:
//	  free_completed 0x500 64 t=T           (no matching alloc)
//	  segment_alloc 0x1000 2097152 t=T+1
//	  alloc 0x1000 1000 t=T+2
//	  alloc 0x1400 3000 stream=S t=T+3
//	  free_requested 0x1000 1000 t=T+4
//	  free_completed 0x1000 1000 t=T+5
//	  alloc 0x1400 500 stream=S t=T+6       (address still live)
//	  oom 0 1<<40 t=T+7 device_free=123
//	  snapshot t=T+8
//	  segment_free 0x9000 4194304 t=T+9     (segment never seen)
//	  segment_map 0x2000 1048576 t=T+10
//	  segment_unmap 0x2000 1048576 t=T+11
//	  weird t=T+12
//	device_traces[1]: []
//	segments: device 0 total 2097152 allocated 500; device 1 total 999 allocated 9
//	allocator_settings: {expandable_segments: True, max_split_size: -1}
const snapshotFixture = "\x80\x04\x95\xb9\x03\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94(}\x94(\x8c\x06device\x94K\x00\x8c\x07address\x94M\x00\x10\x8c\x0atotal_size\x94J\x00\x00 \x00\x8c\x0eallocated_size\x94M\xf4\x01\x8c\x0bactive_size\x94M\xf4\x01\x8c\x0erequested_size\x94M\xf4\x01\x8c\x06stream\x94K\x00\x8c\x0csegment_type\x94\x8c\x05large\x94\x8c\x0fsegment_pool_id\x94K\x00K\x00\x86\x94\x8c\x0dis_expandable\x94\x89\x8c\x06blocks\x94]\x94u}\x94(h\x04K\x01h\x05M\x00\x10h\x06M\xe7\x03h\x07K\x09h\x10]\x94ue\x8c\x0ddevice_traces\x94]\x94(]\x94(}\x94(\x8c\x06action\x94\x8c\x0efree_completed\x94\x8c\x04addr\x94M\x00\x05\x8c\x04size\x94K@h\x0aK\x00\x8c\x07time_us\x94\x8a\x07\x00@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x0dsegment_alloc\x94h\x1aM\x00\x10h\x1bJ\x00\x00 \x00h\x0aK\x00h\x1c\x8a\x07\x01@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x05alloc\x94h\x1aM\x00\x10h\x1bM\xe8\x03h\x0aK\x00h\x1c\x8a\x07\x02@\x1e\x18$\x0a\x06u}\x94(h\x18h h\x1aM\x00\x14h\x1bM\xb8\x0bh\x0a\x8a\x06\x00\xc0DJT\x7fh\x1c\x8a\x07\x03@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x0efree_requested\x94h\x1aM\x00\x10h\x1bM\xe8\x03h\x0aK\x00h\x1c\x8a\x07\x04@\x1e\x18$\x0a\x06u}\x94(h\x18h\x19h\x1aM\x00\x10h\x1bM\xe8\x03h\x0aK\x00h\x1c\x8a\x07\x05@\x1e\x18$\x0a\x06u}\x94(h\x18h h\x1aM\x00\x14h\x1bM\xf4\x01h\x0a\x8a\x06\x00\xc0DJT\x7fh\x1c\x8a\x07\x06@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x03oom\x94h\x1aK\x00h\x1b\x8a\x06\x00\x00\x00\x00\x00\x01h\x0aK\x00h\x1c\x8a\x07\x07@\x1e\x18$\x0a\x06\x8c\x0bdevice_free\x94K{u}\x94(h\x18\x8c\x08snapshot\x94h\x1aK\x00h\x1bK\x00h\x0aK\x00h\x1c\x8a\x07\x08@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x0csegment_free\x94h\x1aM\x00\x90h\x1bJ\x00\x00@\x00h\x0aK\x00h\x1c\x8a\x07\x09@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x0bsegment_map\x94h\x1aM\x00 h\x1bJ\x00\x00\x10\x00h\x0aK\x00h\x1c\x8a\x07\x0a@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x0dsegment_unmap\x94h\x1aM\x00 h\x1bJ\x00\x00\x10\x00h\x0aK\x00h\x1c\x8a\x07\x0b@\x1e\x18$\x0a\x06u}\x94(h\x18\x8c\x05weird\x94h\x1aK\x00h\x1bK\x00h\x0aK\x00h\x1c\x8a\x07\x0c@\x1e\x18$\x0a\x06ue]\x94e\x8c\x12allocator_settings\x94}\x94(\x8c\x13expandable_segments\x94\x88\x8c\x0emax_split_size\x94J\xff\xff\xff\xffu\x8c\x14external_annotations\x94]\x94u."

func TestImportPyTorchFixture(t *testing.T) {
	tr, err := ImportPyTorchSnapshot(strings.NewReader(snapshotFixture), 0)
	require.NoError(t, err)
	assert.Equal(t, []Event{
		{Kind: Alloc, ID: 1, Size: 1000, Stream: 0, TimeNs: 2000},
		{Kind: Alloc, ID: 2, Size: 3000, Stream: 1, TimeNs: 3000},
		{Kind: Free, ID: 1, Stream: 0, TimeNs: 5000},
		{Kind: Free, ID: 2, Stream: 1, TimeNs: 6000}, // implicit free of the duplicated address
		{Kind: Alloc, ID: 3, Size: 500, Stream: 1, TimeNs: 6000},
		{Kind: EmptyCache, TimeNs: 9000},  // segment_free: a release
		{Kind: EmptyCache, TimeNs: 11000}, // segment_unmap after a segment_map: another
	}, tr.Events)
	assert.Equal(t, 2, tr.Releases)
	assert.Equal(t, 1, tr.UnmatchedSegmentFrees)
	assert.False(t, tr.PeakReservedKnown, "a segment freed that the trace never saw created")
	assert.Equal(t, 13, tr.Entries)
	assert.Equal(t, 3, tr.Allocs)
	assert.Equal(t, 1, tr.Frees)
	assert.Equal(t, 1, tr.FreeRequests)
	assert.Equal(t, 1, tr.UnmatchedFrees)
	assert.Equal(t, 1, tr.DuplicateAllocs)
	assert.Equal(t, 1, tr.OOMs)
	assert.Equal(t, 1, tr.Snapshots)
	assert.Equal(t, [4]int{1, 1, 1, 1}, [4]int{tr.SegmentAllocs, tr.SegmentFrees, tr.SegmentMaps, tr.SegmentUnmaps})
	assert.Equal(t, map[string]int{"weird": 1}, tr.UnknownActions)
	assert.Equal(t, uint64(4000), tr.PeakLive)
	assert.Equal(t, 1, tr.LiveAllocsEnd)
	assert.Equal(t, uint64(500), tr.LiveBytesEnd)
	assert.Equal(t, uint64(4500), tr.TotalAllocated)
	// Raw reserved: +2 MiB, -4 MiB, +1 MiB, -1 MiB; lifted by 2 MiB.
	assert.Equal(t, uint64(2<<20), tr.ReservedBaseline)
	assert.Equal(t, []Point{{1000, 4 << 20}, {9000, 0}, {10000, 1 << 20}, {11000, 0}}, tr.ReservedCurve)
	assert.Equal(t, uint64(4<<20), tr.PeakReserved)
	assert.Equal(t, int64(1_700_000_000_000_000), tr.StartTimeUs)
	assert.Equal(t, []int64{0, 140000000000000}, tr.Streams)
	assert.Equal(t, map[string]any{"expandable_segments": true, "max_split_size": int64(-1)}, tr.Settings)
	assert.Equal(t, 1, tr.SnapshotSegments)
	assert.Equal(t, uint64(2097152), tr.SnapshotReserved)
	assert.Equal(t, uint64(500), tr.SnapshotAllocated)
	assert.Equal(t, Info{Source: "pytorch memory snapshot", Device: "cuda:0"}, tr.Info)

	// The events form a valid trace whose summary agrees.
	s, err := Summarize(tr.Reader())
	require.NoError(t, err)
	assert.Equal(t, tr.PeakLive, s.PeakLiveBytes)
	assert.Equal(t, int64(tr.LiveAllocsEnd), s.LiveAllocs)

	tr1, err := ImportPyTorchSnapshot(strings.NewReader(snapshotFixture), 1)
	require.NoError(t, err)
	assert.Empty(t, tr1.Events)
	assert.Equal(t, uint64(999), tr1.SnapshotReserved)
	assert.Equal(t, "cuda:1", tr1.Info.Device)
}

func TestImportPyTorchErrors(t *testing.T) {
	for _, dev := range []int{-1, 2} {
		_, err := ImportPyTorchSnapshot(strings.NewReader(snapshotFixture), dev)
		assert.ErrorIs(t, err, ErrSnapshot)
		assert.ErrorContains(t, err, "not in snapshot")
	}
	tests := []struct {
		name string
		in   string // pickle bytes
		want error
		msg  string
	}{
		// collections.OrderedDict(a=1): refused by the pickle decoder.
		{"code in pickle", "\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94\x8c\x01a\x94K\x01s.", pickle.ErrForbidden, "STACK_GLOBAL"},
		{"truncated", snapshotFixture[:100], pickle.ErrTruncated, "truncated"},
		// The rest are CPython pickle.dumps(value, protocol=2) of the value shown.
		// []
		{"list at top", "\x80\x02]q\x00.", ErrSnapshot, "top level is a list"},
		// {}
		{"no device_traces", "\x80\x02}q\x00.", ErrSnapshot, "no device_traces"},
		// {'device_traces': [[{'action': 'alloc', 'addr': 1}]]}
		{"alloc without size", "\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03}q\x04(X\x06\x00\x00\x00actionq\x05X\x05\x00\x00\x00allocq\x06X\x04\x00\x00\x00addrq\x07K\x01uaas.", ErrSnapshot, "lacks integer addr"},
		// {'device_traces': [[{'addr': 1}]]}
		{"no action", "\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03}q\x04X\x04\x00\x00\x00addrq\x05K\x01saas.", ErrSnapshot, "no action"},
		// {'device_traces': [[7]]}
		{"entry not dict", "\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03K\x07aas.", ErrSnapshot, "is an int"},
		// {'device_traces': [[{'action': 'alloc', 'addr': 1, 'size': -4}]]}
		{"negative size", "\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03}q\x04(X\x06\x00\x00\x00actionq\x05X\x05\x00\x00\x00allocq\x06X\x04\x00\x00\x00addrq\x07K\x01X\x04\x00\x00\x00sizeq\x08J\xfc\xff\xff\xffuaas.", ErrSnapshot, "non-negative size"},
		// {'device_traces': [[{'action': 'alloc', 'addr': 1, 'size': 4, 'stream': 'x'}]]}
		{"bad stream", "\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03}q\x04(X\x06\x00\x00\x00actionq\x05X\x05\x00\x00\x00allocq\x06X\x04\x00\x00\x00addrq\x07K\x01X\x04\x00\x00\x00sizeq\x08K\x04X\x06\x00\x00\x00streamq\x09X\x01\x00\x00\x00xq\x0auaas.", ErrSnapshot, "stream is a str"},
		// {'device_traces': [7]}
		{"device trace not list", "\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02K\x07as.", ErrSnapshot, "want a list"},
		// {'device_traces': [[]], 'segments': [{'device': 0}]}
		{"bad segment", "\x80\x02}q\x00(X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03aX\x08\x00\x00\x00segmentsq\x04]q\x05}q\x06X\x06\x00\x00\x00deviceq\x07K\x00sau.", ErrSnapshot, "total_size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ImportPyTorchSnapshot(strings.NewReader(tc.in), 0)
			assert.Nil(t, tr)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

// roundGB rounds bytes to GB (1e9) with two decimals, as the traces README
// reports them.
func roundGB(b uint64) float64 { return math.Round(float64(b)/1e7) / 100 }

func TestImportRealSnapshots(t *testing.T) {
	tests := []struct {
		file          string
		entries       int
		allocs        int
		peakLiveGB    float64
		peakReserveGB float64
		ratio         float64
	}{
		{"cs336_ctx128_fullstep.pickle", 19342, 6771, 41.17, 47.35, 1.150},
		{"cs336_ctx128_forward.pickle", 4657, 2058, 5.72, 5.90, 1.031},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			p, err := SharedFile(tc.file)
			if err != nil {
				t.Skip(err)
			}
			f, err := os.Open(p)
			require.NoError(t, err)
			defer f.Close()
			tr, err := ImportPyTorchSnapshot(f, 0)
			require.NoError(t, err)
			assert.Equal(t, tc.entries, tr.Entries)
			assert.Equal(t, tc.allocs, tr.Allocs)
			assert.Equal(t, tc.peakLiveGB, roundGB(tr.PeakLive))
			assert.Equal(t, tc.peakReserveGB, roundGB(tr.PeakReserved))
			assert.InDelta(t, tc.ratio, float64(tr.PeakReserved)/float64(tr.PeakLive), 0.0005)
			// README: self-contained, one stream, classic allocator.
			assert.Zero(t, tr.UnmatchedFrees)
			assert.Zero(t, tr.DuplicateAllocs)
			assert.Zero(t, tr.ReservedBaseline)
			assert.Equal(t, []int64{0}, tr.Streams)
			assert.Equal(t, false, tr.Settings["expandable_segments"])
			assert.Equal(t, tr.Frees, tr.FreeRequests)
			assert.Equal(t, tr.Allocs+tr.Frees, len(tr.Events))
			assert.Zero(t, tr.Releases)
			assert.True(t, tr.PeakReservedKnown)
			assert.Equal(t, tr.Entries, tr.Allocs+tr.Frees+tr.FreeRequests+tr.SegmentAllocs)

			s, err := Summarize(tr.Reader())
			require.NoError(t, err)
			assert.Equal(t, tr.PeakLive, s.PeakLiveBytes)
			assert.Equal(t, int64(tr.Allocs), s.Allocs)
			assert.Equal(t, tr.TotalAllocated, s.TotalAllocBytes)

			// And through the binary format.
			var buf bytes.Buffer
			w := NewWriter(&buf)
			require.NoError(t, w.SetInfo(tr.Info))
			require.NoError(t, WriteAll(w, tr.Events))
			r, err := Open(&buf)
			require.NoError(t, err)
			s2, err := Summarize(r)
			require.NoError(t, err)
			assert.Equal(t, s, s2)
		})
	}
}

func TestImportRMMLog(t *testing.T) {
	const log = `Thread,Time,Action,Pointer,Size,Stream
140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0x0
140573312345856,23:59:59.999500,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,00:00:00.000250,allocate failure,(nil),1099511627776,0x0
140573312345856,00:00:00.001000,free,0x7f8a40000000,1024,0x0
140573312345856,00:00:00.002000,free,0x7f8a40000000,1024,0x0

140573312345856,00:00:00.003000,allocate,0x7f8a40000000,4096,0x7f8a38001020
140573312345856,00:00:00.004000,allocate,(nil),0,0x0
140573312345856,00:00:00.005000,allocate,0x7f8a40000000,100,0x0
`
	tr, err := ImportRMMLog(strings.NewReader(log))
	require.NoError(t, err)
	assert.Equal(t, []Event{
		{Kind: Alloc, ID: 1, Size: 1024, Stream: 0, TimeNs: 0},
		{Kind: Alloc, ID: 2, Size: 2048, Stream: 1, TimeNs: 500_000},
		{Kind: Free, ID: 1, Stream: 0, TimeNs: 2_000_000}, // midnight passed
		{Kind: Alloc, ID: 3, Size: 4096, Stream: 1, TimeNs: 4_000_000},
		{Kind: Free, ID: 3, Stream: 0, TimeNs: 6_000_000}, // duplicate pointer
		{Kind: Alloc, ID: 4, Size: 100, Stream: 0, TimeNs: 6_000_000},
	}, tr.Events)
	assert.Equal(t, 8, tr.Rows)
	assert.Equal(t, 4, tr.Allocs)
	assert.Equal(t, 1, tr.Frees)
	assert.Equal(t, 1, tr.Failures)
	assert.Equal(t, 1, tr.UnmatchedFrees)
	assert.Equal(t, 1, tr.DuplicateAllocs)
	assert.Equal(t, 1, tr.NullPointers)
	assert.Equal(t, uint64(6144), tr.PeakLive) // 2048 + 4096
	assert.Equal(t, 2, tr.LiveAllocsEnd)
	assert.Equal(t, uint64(2148), tr.LiveBytesEnd)
	assert.Equal(t, uint64(7268), tr.TotalAllocated)
	assert.Equal(t, []uint64{0, 0x7f8a38001020}, tr.Streams)

	s, err := Summarize(tr.Reader())
	require.NoError(t, err)
	assert.Equal(t, tr.PeakLive, s.PeakLiveBytes)
}

func TestImportRMMLogVariants(t *testing.T) {
	// Columns reordered, epoch-seconds time, "deallocate", decimal pointers, no Stream column.
	const log = "Size,Action,Pointer,Time\n" +
		"10,allocate,4096,1634567890.5\n" +
		"10,deallocate,4096,1634567890.75\n"
	tr, err := ImportRMMLog(strings.NewReader(log))
	require.NoError(t, err)
	assert.Equal(t, []Event{
		{Kind: Alloc, ID: 1, Size: 10},
		{Kind: Free, ID: 1, TimeNs: 250_000_000},
	}, tr.Events)
}

func TestImportRMMLogErrors(t *testing.T) {
	const h = "Thread,Time,Action,Pointer,Size,Stream\n"
	tests := []struct {
		name string
		in   string
		want error
		msg  string
	}{
		{"empty", "", ErrRMMLog, "empty input"},
		{"missing column", "Thread,Time,Action,Pointer,Stream\n", ErrRMMLog, `lacks column "size"`},
		{"unknown action", h + "1,00:00:00.0,realloc,0x10,1,0x0\n", ErrRMMLog, `line 2: unknown action "realloc"`},
		{"bad size", h + "1,00:00:00.0,allocate,0x10,-1,0x0\n", ErrRMMLog, `size "-1"`},
		{"bad pointer", h + "1,00:00:00.0,allocate,0xzz,1,0x0\n", ErrRMMLog, "pointer"},
		{"bad stream", h + "1,00:00:00.0,allocate,0x10,1,stream\n", ErrRMMLog, "stream"},
		{"bad time", h + "1,25:00:00.0,allocate,0x10,1,0x0\n", ErrRMMLog, "bad time"},
		{"bad fraction", h + "1,1.5x,allocate,0x10,1,0x0\n", ErrRMMLog, "bad time"},
		{"csv quote", h + "1,\"00:00,allocate\n", ErrRMMLog, "line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ImportRMMLog(strings.NewReader(tc.in))
			assert.Nil(t, tr)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
	boom := errors.New("boom")
	_, err := ImportRMMLog(errorReader{boom})
	assert.ErrorIs(t, err, boom)
}

// entry builds one device_traces entry as the pickle decoder returns it.
func entry(action string, addr, size int64, stream int64, us int64) map[string]any {
	return map[string]any{"action": action, "addr": addr, "size": size, "stream": stream, "time_us": us}
}

func TestImportPyTorchReleases(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name     string
		entries  []any
		kinds    []Kind
		releases int
		known    bool
		peak     uint64
	}{
		{
			name: "self-contained, no release",
			entries: []any{
				entry("segment_alloc", 0x1000, 2*mb, 0, 1),
				entry("alloc", 0x1000, mb, 0, 2),
				entry("free_completed", 0x1000, mb, 0, 3),
			},
			kinds: []Kind{Alloc, Free}, known: true, peak: 2 * mb,
		},
		{
			name: "one run of segment frees is one release, before the next alloc",
			entries: []any{
				entry("segment_alloc", 0x1000, 2*mb, 0, 1),
				entry("segment_alloc", 0x9000, 4*mb, 7, 2),
				entry("alloc", 0x1000, mb, 0, 3),
				entry("free_completed", 0x1000, mb, 0, 4),
				entry("segment_free", 0x1000, 2*mb, 0, 5),
				entry("segment_free", 0x9000, 4*mb, 7, 6),
				entry("segment_alloc", 0x1000, 8*mb, 0, 7),
				entry("alloc", 0x1000, 8*mb, 0, 8),
				entry("segment_free", 0x1000, 8*mb, 0, 9), // a second run
			},
			kinds: []Kind{Alloc, Free, EmptyCache, Alloc, EmptyCache}, releases: 2, known: true, peak: 8 * mb,
		},
		{
			name: "free of a block allocated before recording began",
			entries: []any{
				entry("segment_alloc", 0x1000, 2*mb, 0, 1),
				entry("free_completed", 0x5000, mb, 0, 2),
			},
			kinds: []Kind{}, known: false, peak: 2 * mb,
		},
		{
			name: "segment freed that the trace never saw created",
			entries: []any{
				entry("segment_alloc", 0x1000, 8*mb, 0, 1),
				entry("segment_free", 0x9000, 2*mb, 0, 2),
			},
			kinds: []Kind{EmptyCache}, releases: 1, known: false, peak: 8 * mb,
		},
		{
			name:    "no segment entries",
			entries: []any{entry("alloc", 0x1000, mb, 0, 1)},
			kinds:   []Kind{Alloc}, known: false,
		},
		{
			name: "expandable: map and unmap",
			entries: []any{
				entry("segment_map", 0x1000, 20*mb, 0, 1),
				entry("alloc", 0x1000, 20*mb, 0, 2),
				entry("free_completed", 0x1000, 20*mb, 0, 3),
				entry("segment_unmap", 0x1000, 20*mb, 0, 4),
				entry("segment_unmap", 0x2000, 0, 0, 5),
			},
			kinds: []Kind{Alloc, Free, EmptyCache}, releases: 1, known: true, peak: 20 * mb,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := &PyTorchTrace{Streams: []int64{0}}
			require.NoError(t, tr.convert(tc.entries))
			kinds := []Kind{}
			for _, e := range tr.Events {
				kinds = append(kinds, e.Kind)
			}
			assert.Equal(t, tc.kinds, kinds)
			assert.Equal(t, tc.releases, tr.Releases)
			assert.Equal(t, tc.known, tr.PeakReservedKnown)
			assert.Equal(t, tc.peak, tr.PeakReserved)
			// The events are a valid trace.
			_, err := Summarize(tr.Reader())
			require.NoError(t, err)
		})
	}
}

// poolEntry is entry with the pool_id newer PyTorch writes.
func poolEntry(action string, addr, size int64, pool [2]int64, us int64) map[string]any {
	e := entry(action, addr, size, 0, us)
	e["pool_id"] = []any{pool[0], pool[1]}
	return e
}

// segment is a snapshot segment as the pickle decoder returns it.
func segment(addr, size int64, pool any) map[string]any {
	s := map[string]any{"device": int64(0), "address": addr, "total_size": size, "allocated_size": int64(0)}
	if pool != nil {
		s["segment_pool_id"] = pool
	}
	return s
}

// importEntries runs the importer's steps on decoded segments and entries.
func importEntries(segments, entries []any) (*PyTorchTrace, error) {
	tr := &PyTorchTrace{Streams: []int64{0}}
	if err := tr.readSegments(segments); err != nil {
		return nil, err
	}
	if err := tr.preparePools(entries); err != nil {
		return nil, err
	}
	if err := tr.convert(entries); err != nil {
		return nil, err
	}
	return tr, nil
}

func TestImportPyTorchPools(t *testing.T) {
	const mb = 1 << 20
	graph := []any{int64(1), int64(0)} // a CUDA graph's pool, as segment_pool_id
	mempool := []any{int64(0), int64(2)}
	tests := []struct {
		name     string
		segments []any
		entries  []any
		pools    []PoolID // of the Alloc events, in order
		private  int
		poolIDs  int
	}{
		{
			name:     "allocs inside a graph-pool segment are in its pool, others in the default",
			segments: []any{segment(0x1000_0000, 20*mb, graph), segment(0x2000_0000, 2*mb, []any{int64(0), int64(0)}), segment(0x3000_0000, 2*mb, nil)},
			entries: []any{
				entry("alloc", 0x1000_0000, mb, 0, 1),
				entry("alloc", 0x1000_0000+20*mb-512, 512, 0, 2), // the last byte range of the segment
				entry("alloc", 0x1000_0000+20*mb, 512, 0, 3),     // just past it
				entry("alloc", 0x2000_0000, mb, 0, 4),
				entry("alloc", 0x3000_0000, mb, 0, 5),
				entry("alloc", 0x0fff_ffff, 1, 0, 6), // just before it
			},
			pools:   []PoolID{{1, 0}, {1, 0}, {}, {}, {}, {}},
			private: 1,
		},
		{
			name:     "a range released after an alloc may have been another segment's then",
			segments: []any{segment(0x1000_0000, 4*mb, graph), segment(0x5000_0000, 4*mb, mempool)},
			entries: []any{
				entry("alloc", 0x1000_0000, mb, 0, 1), // before the release: unknown, default
				entry("alloc", 0x5000_0000, mb, 0, 2), // the other segment is never released
				entry("free_completed", 0x1000_0000, mb, 0, 3),
				entry("segment_free", 0x0f00_0000, 16*mb+1, 0, 4),
				entry("segment_alloc", 0x1000_0000, 4*mb, 0, 5),
				entry("alloc", 0x1000_0000+mb, mb, 0, 6),           // after it: the graph pool's
				entry("segment_unmap", 0x5000_0000+4*mb, mb, 0, 7), // touches nothing: ends are exclusive
				entry("alloc", 0x5000_0000+mb, mb, 0, 8),
			},
			pools:   []PoolID{{}, {0, 2}, {1, 0}, {0, 2}},
			private: 2,
		},
		{
			name:     "an unmap of part of a segment invalidates it before the unmap",
			segments: []any{segment(0x1000_0000, 4*mb, graph), segment(0x1000_0000+4*mb, 4*mb, mempool), segment(0x1000_0000+8*mb, 4*mb, graph)},
			entries: []any{
				entry("alloc", 0x1000_0000, 1, 0, 1),
				entry("alloc", 0x1000_0000+4*mb, 1, 0, 2),
				entry("alloc", 0x1000_0000+8*mb, 1, 0, 3),
				entry("segment_unmap", 0x1000_0000+3*mb, 2*mb, 0, 4), // the first two
				entry("alloc", 0x1000_0000+mb, 1, 0, 5),
				entry("alloc", 0x1000_0000+5*mb, 1, 0, 6),
			},
			pools:   []PoolID{{}, {}, {1, 0}, {1, 0}, {0, 2}},
			private: 3,
		},
		{
			name:     "an entry's pool_id wins over the segments",
			segments: []any{segment(0x1000_0000, 4*mb, graph)},
			entries: []any{
				poolEntry("alloc", 0x1000_0000, mb, [2]int64{0, 0}, 1),
				poolEntry("alloc", 0x9000_0000, mb, [2]int64{0, 5}, 2),
				poolEntry("alloc", 0x9100_0000, mb, [2]int64{-1, 3}, 3), // uint64 halves written as int64
				entry("alloc", 0x1000_0000+mb, mb, 0, 4),
			},
			pools:   []PoolID{{}, {0, 5}, {math.MaxUint64, 3}, {1, 0}},
			private: 1, poolIDs: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := importEntries(tc.segments, tc.entries)
			require.NoError(t, err)
			var pools []PoolID
			want := map[PoolID]int{}
			for _, e := range tr.Events {
				if e.Kind == Alloc {
					pools = append(pools, e.Pool)
				}
			}
			for _, p := range tc.pools {
				if !p.IsDefault() {
					want[p]++
				}
			}
			assert.Equal(t, tc.pools, pools)
			assert.Equal(t, tc.private, tr.PrivateSegments)
			assert.Equal(t, tc.poolIDs, tr.AllocPoolIDs)
			if len(want) == 0 {
				assert.Nil(t, tr.PoolAllocs)
			} else {
				assert.Equal(t, want, tr.PoolAllocs)
			}
			_, err = Summarize(tr.Reader())
			require.NoError(t, err)
		})
	}
}

func TestImportPyTorchPoolErrors(t *testing.T) {
	const mb = 1 << 20
	graph := []any{int64(1), int64(0)}
	for _, tc := range []struct {
		name     string
		segments []any
		entries  []any
		msg      string
	}{
		{"segment_pool_id not a pair", []any{segment(0, mb, []any{int64(1)})}, nil, "segments[0]: segment_pool_id is a list"},
		{"segment_pool_id not ints", []any{segment(0, mb, []any{"a", int64(1)})}, nil, "want an (int, int) tuple"},
		{"segment_pool_id a str", []any{segment(0, mb, "1,0")}, nil, "segment_pool_id is a str"},
		{"private segment without address", []any{map[string]any{"total_size": int64(mb), "allocated_size": int64(0), "segment_pool_id": graph}}, nil, "segments[0] in pool(1,0) lacks"},
		{"private segments overlap", []any{segment(0x1000, mb, graph), segment(0x2000, mb, []any{int64(0), int64(1)})}, nil, "overlap"},
		{"pool_id not a pair", nil, []any{func() any { e := entry("alloc", 1, 1, 0, 1); e["pool_id"] = int64(3); return e }()}, "pool_id is an int"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := importEntries(tc.segments, tc.entries)
			require.ErrorIs(t, err, ErrSnapshot)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
	// Default-pool segments may overlap (a hostile file listing one
	// segment many times): only private ones are indexed.
	tr, err := importEntries([]any{segment(0x1000, mb, nil), segment(0x1000, mb, []any{int64(0), int64(0)})}, nil)
	require.NoError(t, err)
	assert.Zero(t, tr.PrivateSegments)
}

// TestImportPyTorchPoolsLinear: release entries shared through the memo
// (one entry listed 100000 times) over 10000 private segments cost time
// linear in both: each segment is invalidated once.
func TestImportPyTorchPoolsLinear(t *testing.T) {
	const nseg, nrel = 10000, 100000
	segs := make([]any, nseg)
	for i := range segs {
		segs[i] = segment(int64(i)<<21, 1<<21, []any{int64(1), int64(0)})
	}
	release := entry("segment_unmap", 0, nseg<<21, 0, 1)
	entries := make([]any, nrel)
	for i := range entries {
		entries[i] = release
	}
	entries = append(entries, entry("alloc", 5<<21, 1, 0, 2))
	tr, err := importEntries(segs, entries)
	require.NoError(t, err)
	assert.Equal(t, nseg, tr.PrivateSegments)
	require.Len(t, tr.Events, 2) // one release, the alloc
	assert.Equal(t, PoolID{1, 0}, tr.Events[1].Pool)
	for _, s := range tr.private {
		assert.Equal(t, nrel-1, s.validFrom)
	}
}

// TestRealSnapshotPools reads every shared snapshot (policy/ included),
// every device: the pools the importer gives the allocs agree with what
// the file records (no private pool is invented), and the snapshots known
// today record none: all their segments have segment_pool_id (0, 0) and
// their entries no pool_id, so they replay in the default pool alone.
func TestRealSnapshotPools(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("reads every shared trace: skipped with -short and under -race")
	}
	dir, err := SharedDir()
	if err != nil {
		t.Skip(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.pickle"))
	policy, _ := filepath.Glob(filepath.Join(dir, "policy", "*.pickle"))
	files = append(files, policy...)
	if len(files) == 0 {
		t.Skipf("no snapshots in %s", dir)
	}
	known := map[string]bool{ // the shared snapshots known to hold no private pool
		"cs336_ctx128_forward.pickle": true, "cs336_ctx128_fullstep.pickle": true,
		"cs336_gpt2small_compiled_train.pickle": true, "cs336_medium_ctx1024_train.pickle": true,
		"cs336_small_forward_bf16.pickle": true, "llama7b_offload_4streams.pickle": true,
		"opt125m_zeroth_order_finetune.pickle": true, "tts_inference_server.pickle": true,
		"cs336_ctx512_fullstep.pickle": true, "cs336_xl_forward_bf16.pickle": true,
		"gcn_3gpu_expandable_oom.pickle": true,
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for dev := 0; ; dev++ {
			tr, err := ImportPyTorchSnapshot(bytes.NewReader(data), dev)
			if errors.Is(err, ErrSnapshot) && strings.Contains(err.Error(), "not in snapshot") {
				break
			}
			require.NoError(t, err, "%s device %d", f, dev)
			t.Logf("%s cuda:%d: %d segments, %d in private pools; %d allocs, %d with pool_id; private-pool allocs %v",
				filepath.Base(f), dev, tr.SnapshotSegments, tr.PrivateSegments, tr.Allocs, tr.AllocPoolIDs, tr.PoolAllocs)
			if tr.PrivateSegments == 0 && tr.AllocPoolIDs == 0 {
				assert.Nil(t, tr.PoolAllocs, "%s: a pool the file does not record", f)
			}
			if known[filepath.Base(f)] {
				assert.Zero(t, tr.PrivateSegments, f)
				assert.Zero(t, tr.AllocPoolIDs, f)
			}
		}
	}
}
