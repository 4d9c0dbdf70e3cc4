package memviz_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
	"github.com/vmmalloc/vmmalloc/stats"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// decode writes s and decodes it with vmmalloc's pickle reader.
func decode(t *testing.T, s memviz.Snapshot) map[string]any {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, memviz.Write(&buf, s))
	require.GreaterOrEqual(t, buf.Len(), 2)
	assert.Equal(t, []byte{0x80, 4}, buf.Bytes()[:2], "PROTO 4")
	v, err := pickle.Decode(buf.Bytes())
	require.NoError(t, err)
	m, ok := v.(map[string]any)
	require.True(t, ok, "top level is %T", v)
	return m
}

func TestSettingValues(t *testing.T) {
	cases := []struct {
		in   any
		want any
	}{
		{nil, nil},
		{true, true},
		{false, false},
		{0, int64(0)},
		{255, int64(255)},
		{256, int64(256)},
		{65535, int64(65535)},
		{65536, int64(65536)},
		{-1, int64(-1)},
		{-129, int64(-129)},
		{int64(math.MaxInt32), int64(math.MaxInt32)},
		{int64(math.MaxInt32) + 1, int64(math.MaxInt32) + 1},
		{int64(math.MinInt32), int64(math.MinInt32)},
		{int64(math.MinInt32) - 1, int64(math.MinInt32) - 1},
		{int64(0x7f0000000000), int64(0x7f0000000000)},
		{int64(0x80), int64(0x80)},
		{int64(0x8000_0000), int64(0x8000_0000)},
		{int64(math.MaxInt64), int64(math.MaxInt64)},
		{int64(math.MinInt64), int64(math.MinInt64)},
		{uint64(1 << 40), int64(1 << 40)},
		{1.5, 1.5},
		{"", ""},
		{"expandable_segments:True", "expandable_segments:True"},
		{string(bytes.Repeat([]byte("x"), 300)), string(bytes.Repeat([]byte("x"), 300))},
	}
	for _, c := range cases {
		m := decode(t, memviz.Snapshot{Settings: map[string]any{"k": c.in}})
		assert.Equal(t, c.want, m["allocator_settings"].(map[string]any)["k"], "%#v", c.in)
	}
	// Above MaxInt64 the reader returns a big.Int.
	m := decode(t, memviz.Snapshot{Settings: map[string]any{"k": uint64(math.MaxUint64)}})
	assert.Equal(t, "18446744073709551615", m["allocator_settings"].(map[string]any)["k"].(interface{ String() string }).String())
}

// fixture is a device with an expandable segment holding two mapped runs
// (the second on another stream) around an unmapped hole, and a trace
// with a shared stack.
func fixture() memviz.Device {
	const base = 0x7f0000000000
	return memviz.Device{
		Index: 1,
		Segments: []stats.SegmentInfo{{
			Device: 1, Address: base, TotalSize: 10 << 20, Pool: stats.LargePool, IsExpandable: true,
			Blocks: []stats.BlockInfo{
				{Address: base, Size: 1 << 20, RequestedSize: 1000, Stream: 0, State: stats.BlockActiveAllocated, Stack: 1},
				{Address: base + 1<<20, Size: 1 << 20, Stream: 0, State: stats.BlockInactive},
				{Address: base + 2<<20, Size: 4 << 20, State: stats.BlockUnmapped},
				{Address: base + 6<<20, Size: 2 << 20, RequestedSize: 2 << 20, Stream: 7, State: stats.BlockActivePendingFree},
				{Address: base + 8<<20, Size: 2 << 20, Stream: 0, State: stats.BlockInactive},
			},
		}},
		Trace: []stats.TraceEntry{
			{Action: stats.TraceSegmentMap, Addr: base, Size: 2 << 20, TimeNs: 5000},
			{Action: stats.TraceAlloc, Addr: base, Size: 1000, TimeNs: 6000, Stack: 1, Pool: [2]uint64{1, 0}},
			{Action: stats.TraceEmptyCache, TimeNs: 6500},
			{Action: stats.TraceOOM, Addr: 123 << 20, Size: 1 << 40, TimeNs: 7000, Stack: 1},
		},
		Stacks: [][]memviz.Frame{{{Filename: "main.go", Line: 12, Name: "main.step"}, {Filename: "main.go", Line: 3, Name: "main.main"}}},
	}
}

func TestWriteStructure(t *testing.T) {
	m := decode(t, memviz.Snapshot{Devices: []memviz.Device{fixture()}})

	segs := m["segments"].([]any)
	require.Len(t, segs, 3, "one segment per mapped run of one stream")
	type segWant struct {
		addr, total, alloc, active, requested int64
		stream                                int64
		blocks                                int
	}
	base := int64(0x7f0000000000)
	wants := []segWant{
		{base, 2 << 20, 1 << 20, 1 << 20, 1000, 0, 2},
		{base + 6<<20, 2 << 20, 0, 2 << 20, 0, 7, 1},
		{base + 8<<20, 2 << 20, 0, 0, 0, 0, 1},
	}
	for i, w := range wants {
		s := segs[i].(map[string]any)
		assert.Equal(t, int64(1), s["device"])
		assert.Equal(t, w.addr, s["address"], "segment %d", i)
		assert.Equal(t, w.total, s["total_size"], "segment %d", i)
		assert.Equal(t, w.alloc, s["allocated_size"], "segment %d", i)
		assert.Equal(t, w.active, s["active_size"], "segment %d", i)
		assert.Equal(t, w.requested, s["requested_size"], "segment %d", i)
		assert.Equal(t, w.stream, s["stream"], "segment %d", i)
		assert.Equal(t, "large", s["segment_type"])
		assert.Equal(t, true, s["is_expandable"])
		assert.Equal(t, []any{int64(0), int64(0)}, s["segment_pool_id"])
		blocks := s["blocks"].([]any)
		require.Len(t, blocks, w.blocks)
		var sum int64
		for _, b := range blocks {
			bm := b.(map[string]any)
			assert.Equal(t, w.addr+sum, bm["address"], "blocks tile the segment")
			sum += bm["size"].(int64)
			assert.NotNil(t, bm["frames"], "every block has frames")
			assert.NotEqual(t, "unmapped", bm["state"])
		}
		assert.Equal(t, w.total, sum)
	}
	b0 := segs[0].(map[string]any)["blocks"].([]any)[0].(map[string]any)
	assert.Equal(t, "active_allocated", b0["state"])
	assert.Equal(t, int64(1000), b0["requested_size"])
	frames := b0["frames"].([]any)
	require.Len(t, frames, 2)
	assert.Equal(t, map[string]any{"filename": "main.go", "line": int64(12), "name": "main.step"}, frames[0])
	b1 := segs[0].(map[string]any)["blocks"].([]any)[1].(map[string]any)
	assert.Equal(t, int64(1<<20), b1["requested_size"], "a free block's requested size is its size")
	assert.Equal(t, []any{}, b1["frames"])

	dts := m["device_traces"].([]any)
	require.Len(t, dts, 2, "indexed by device")
	assert.Equal(t, []any{}, dts[0])
	tr := dts[1].([]any)
	require.Len(t, tr, 3, "empty_cache is left out")
	e0 := tr[0].(map[string]any)
	assert.Equal(t, map[string]any{
		"action": "segment_map", "addr": base, "size": int64(2 << 20), "stream": int64(0),
		"time_us": int64(5), "frames": []any{}, "pool_id": []any{int64(0), int64(0)},
	}, e0)
	assert.Equal(t, []any{int64(1), int64(0)}, tr[1].(map[string]any)["pool_id"], "the entry's pool, as PyTorch writes it")
	oom := tr[2].(map[string]any)
	assert.Equal(t, "oom", oom["action"])
	assert.Equal(t, int64(123<<20), oom["device_free"])
	assert.NotContains(t, oom, "addr")
	assert.Equal(t, frames, oom["frames"], "a repeated stack decodes to the same frames")
	for _, e := range tr {
		assert.NotContains(t, e.(map[string]any), "category", "the viewer breaks on category")
	}
	assert.Equal(t, map[string]any{}, m["allocator_settings"])
}

func TestWriteRejects(t *testing.T) {
	badTile := fixture()
	badTile.Segments[0].Blocks[1].Address++
	shortTile := fixture()
	shortTile.Segments[0].TotalSize += 512
	badStack := fixture()
	badStack.Trace[1].Stack = 9
	badBlockStack := fixture()
	badBlockStack.Segments[0].Blocks[0].Stack = 2
	badAction := fixture()
	badAction.Trace[0].Action = "segment_grow"
	badState := fixture()
	badState.Segments[0].Blocks[0].State = "busy"
	neg := fixture()
	neg.Index = -1
	for _, tc := range []struct {
		name string
		s    memviz.Snapshot
		want error
	}{
		{"blocks do not tile", memviz.Snapshot{Devices: []memviz.Device{badTile}}, memviz.ErrInvalidSnapshot},
		{"blocks short of total", memviz.Snapshot{Devices: []memviz.Device{shortTile}}, memviz.ErrInvalidSnapshot},
		{"entry stack out of range", memviz.Snapshot{Devices: []memviz.Device{badStack}}, memviz.ErrInvalidSnapshot},
		{"block stack out of range", memviz.Snapshot{Devices: []memviz.Device{badBlockStack}}, memviz.ErrInvalidSnapshot},
		{"unknown action", memviz.Snapshot{Devices: []memviz.Device{badAction}}, memviz.ErrInvalidSnapshot},
		{"unknown state", memviz.Snapshot{Devices: []memviz.Device{badState}}, memviz.ErrInvalidSnapshot},
		{"negative device", memviz.Snapshot{Devices: []memviz.Device{neg}}, memviz.ErrInvalidSnapshot},
		{"repeated device", memviz.Snapshot{Devices: []memviz.Device{fixture(), fixture()}}, memviz.ErrInvalidSnapshot},
		{"setting type", memviz.Snapshot{Settings: map[string]any{"x": []int{1}}}, memviz.ErrUnsupportedValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := memviz.Write(&buf, tc.s)
			require.ErrorIs(t, err, tc.want)
			assert.Zero(t, buf.Len(), "nothing written")
		})
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteError(t *testing.T) {
	err := memviz.Write(failWriter{}, memviz.Snapshot{Devices: []memviz.Device{fixture()}})
	require.ErrorContains(t, err, "disk full")
}

// liveSnapshot runs a small program on an allocator recording history
// with stacks and returns its snapshot.
func liveSnapshot(t *testing.T) ([]byte, *allocator.Allocator) {
	t.Helper()
	drv, err := emulated.New(emulated.WithCapacity(8 << 30))
	require.NoError(t, err)
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close(); _ = drv.Close() })
	require.NoError(t, a.RecordHistory(allocator.HistoryOptions{MaxEntries: 1000, Stacks: true}))
	s2, err := drv.StreamCreate(0)
	require.NoError(t, err)
	var ptrs []uintptr
	for i := range 20 {
		s := s2
		if i%3 == 0 {
			s = 0
		}
		p, err := a.Malloc(uint64(1+i)<<20, s)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
	}
	for _, p := range ptrs[5:15] {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.Synchronize(s2))
	require.NoError(t, a.EmptyCache())
	p, err := a.Malloc(100, 0)
	require.NoError(t, err)
	_ = p
	var buf bytes.Buffer
	require.NoError(t, a.WriteSnapshot(&buf))
	return buf.Bytes(), a
}

func TestLiveSnapshotFrames(t *testing.T) {
	data, a := liveSnapshot(t)
	v, err := pickle.Decode(data)
	require.NoError(t, err)
	m := v.(map[string]any)
	var allocated int64
	for _, s := range m["segments"].([]any) {
		allocated += s.(map[string]any)["allocated_size"].(int64)
	}
	assert.Equal(t, int64(a.MemoryAllocated()), allocated)
	tr := m["device_traces"].([]any)[0].([]any)
	require.NotEmpty(t, tr)
	var allocs int
	for _, e := range tr {
		em := e.(map[string]any)
		if em["action"] != "alloc" {
			continue
		}
		allocs++
		frames := em["frames"].([]any)
		require.NotEmpty(t, frames)
		assert.Equal(t, "github.com/vmmalloc/vmmalloc/stats/memviz_test.liveSnapshot", frames[0].(map[string]any)["name"])
	}
	assert.Equal(t, 21, allocs)

	// The viewer replays the trace backwards from the segments: the trace
	// run forwards must reach them. Live blocks and mapped bytes agree.
	live := map[int64]bool{}
	var mapped int64
	for _, e := range tr {
		em := e.(map[string]any)
		switch em["action"] {
		case "alloc":
			live[em["addr"].(int64)] = true
		case "free_requested":
			delete(live, em["addr"].(int64))
		case "segment_map", "segment_alloc":
			mapped += em["size"].(int64)
		case "segment_unmap", "segment_free":
			mapped -= em["size"].(int64)
		}
	}
	segLive := map[int64]bool{}
	var total int64
	for _, s := range m["segments"].([]any) {
		sm := s.(map[string]any)
		total += sm["total_size"].(int64)
		for _, b := range sm["blocks"].([]any) {
			if bm := b.(map[string]any); bm["state"] == "active_allocated" {
				segLive[bm["address"].(int64)] = true
			}
		}
	}
	assert.Equal(t, live, segLive)
	assert.Equal(t, mapped, total)
	assert.Equal(t, int64(a.MemoryReserved()), total)
	settings := m["allocator_settings"].(map[string]any)
	assert.Equal(t, true, settings["expandable_segments"])
}

// pythonCheck is what the viewer needs, checked by CPython's own pickle.
const pythonCheck = `
import pickle, sys
raw = open(sys.argv[1], "rb").read()
assert raw[0] == 0x80 and 2 <= raw[1] <= 4, "protocol %d" % raw[1]
s = pickle.loads(raw)
assert set(s) == {"segments", "device_traces", "allocator_settings"}, sorted(s)
states = {"active_allocated", "active_pending_free", "inactive"}
allocated = 0
for seg in s["segments"]:
    addr = seg["address"]
    for b in seg["blocks"]:
        assert b["state"] in states, b["state"]
        assert isinstance(b["frames"], list)
        assert b["address"] == addr
        addr += b["size"]
    assert addr == seg["address"] + seg["total_size"], "blocks tile the segment"
    allocated += seg["allocated_size"]
actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}
n = 0
for dev in s["device_traces"]:
    for e in dev:
        assert e["action"] in actions, e["action"]
        assert "category" not in e
        assert isinstance(e["time_us"], int) and isinstance(e["stream"], int)
        for f in e["frames"]:
            assert set(f) == {"filename", "line", "name"}
        n += 1
print(len(s["segments"]), n, allocated)
`

func TestPythonLoadsSnapshot(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	data, a := liveSnapshot(t)
	path := filepath.Join(t.TempDir(), "snapshot.pickle")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	out, err := exec.Command(py, "-c", pythonCheck, path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var segs, entries int
	var allocated uint64
	_, err = fmt.Sscan(string(out), &segs, &entries, &allocated)
	require.NoError(t, err, "%s", out)
	assert.Positive(t, segs)
	assert.Positive(t, entries)
	assert.Equal(t, a.MemoryAllocated(), allocated)
}

// TestManyStacksMemo crosses the one-byte memo index (BINPUT/BINGET to
// LONG_BINPUT/LONG_BINGET) and checks every reference decodes to its own
// frames, with vmmalloc's reader and, when present, CPython's.
func TestManyStacksMemo(t *testing.T) {
	const n = 300
	d := memviz.Device{}
	for i := range n {
		d.Stacks = append(d.Stacks, []memviz.Frame{{Filename: "f.go", Line: i, Name: fmt.Sprintf("fn%d", i)}})
	}
	for round := range 2 {
		for i := range n {
			d.Trace = append(d.Trace, stats.TraceEntry{Action: stats.TraceAlloc, Addr: uintptr(i+round*n) * 512, Size: 512, Stack: uint32(i + 1)})
		}
	}
	var buf bytes.Buffer
	require.NoError(t, memviz.Write(&buf, memviz.Snapshot{Devices: []memviz.Device{d}}))
	v, err := pickle.Decode(buf.Bytes())
	require.NoError(t, err)
	tr := v.(map[string]any)["device_traces"].([]any)[0].([]any)
	require.Len(t, tr, 2*n)
	for k, e := range tr {
		i := k % n
		frames := e.(map[string]any)["frames"].([]any)
		require.Len(t, frames, 1)
		assert.Equal(t, map[string]any{"filename": "f.go", "line": int64(i), "name": fmt.Sprintf("fn%d", i)}, frames[0], "entry %d", k)
	}

	py, err := exec.LookPath("python3")
	if err != nil {
		return
	}
	path := filepath.Join(t.TempDir(), "s.pickle")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o600))
	script := `import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
t = s["device_traces"][0]
assert all(e["frames"][0]["name"] == "fn%d" % (k % 300) for k, e in enumerate(t))
print(len(t))`
	out, err := exec.Command(py, "-c", script, path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "600\n", string(out))
}

// FuzzSettingValues round-trips setting values through the writer and
// vmmalloc's pickle reader.
func FuzzSettingValues(f *testing.F) {
	f.Add(int64(0), "expandable_segments:True", 0.5, uint64(1))
	f.Add(int64(-1<<40), "\xff\xfe", -2.25, uint64(math.MaxUint64))
	f.Add(int64(math.MinInt64), string(bytes.Repeat([]byte("é"), 200)), math.Inf(1), uint64(1<<63))
	f.Fuzz(func(t *testing.T, i int64, s string, x float64, u uint64) {
		var buf bytes.Buffer
		require.NoError(t, memviz.Write(&buf, memviz.Snapshot{Settings: map[string]any{"i": i, "s": s, "x": x, "u": u}}))
		v, err := pickle.Decode(buf.Bytes())
		require.NoError(t, err)
		got := v.(map[string]any)["allocator_settings"].(map[string]any)
		assert.Equal(t, i, got["i"])
		assert.Equal(t, strings.ToValidUTF8(s, "\uFFFD"), got["s"])
		if math.IsNaN(x) {
			assert.True(t, math.IsNaN(got["x"].(float64)))
		} else {
			assert.Equal(t, x, got["x"])
		}
		if u <= math.MaxInt64 {
			assert.Equal(t, int64(u), got["u"])
		} else {
			assert.Equal(t, strconv.FormatUint(u, 10), got["u"].(interface{ String() string }).String())
		}
	})
}

func TestWriteHTML(t *testing.T) {
	s := memviz.Snapshot{Devices: []memviz.Device{fixture()}}
	var page, raw bytes.Buffer
	require.NoError(t, memviz.WriteHTML(&page, s))
	require.NoError(t, memviz.Write(&raw, s))
	html := page.String()
	assert.Contains(t, html, `import {add_local_files} from "`+memviz.ViewerURL+`";`)
	assert.Contains(t, html, `"Active Memory Timeline"`)
	const key = `base64: "`
	i := strings.Index(html, key)
	require.Positive(t, i)
	j := strings.Index(html[i+len(key):], `"`)
	b64 := html[i+len(key) : i+len(key)+j]
	assert.Zero(t, len(b64)%4)
	assert.NotContains(t, b64, "=", "padded to a multiple of 3 bytes: no base64 padding")
	data, err := base64.StdEncoding.DecodeString(b64)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(data, raw.Bytes()))
	assert.Equal(t, make([]byte, len(data)-raw.Len()), data[raw.Len():], "zero padding after STOP")
	_, err = pickle.Decode(data)
	require.NoError(t, err)

	bad := fixture()
	bad.Index = -1
	page.Reset()
	require.ErrorIs(t, memviz.WriteHTML(&page, memviz.Snapshot{Devices: []memviz.Device{bad}}), memviz.ErrInvalidSnapshot)
	assert.Zero(t, page.Len())
}
