package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// pickleOf encodes v as a protocol-2 pickle using only data opcodes
// (dict, list, str, int, float, bool, None), as PyTorch snapshots do.
func pickleOf(v any) []byte {
	b := []byte{0x80, 2}
	var enc func(v any)
	enc = func(v any) {
		switch x := v.(type) {
		case nil:
			b = append(b, 'N')
		case bool:
			if x {
				b = append(b, 0x88)
			} else {
				b = append(b, 0x89)
			}
		case int:
			if x >= math.MinInt32 && x <= math.MaxInt32 {
				b = append(b, 'J')
				b = binary.LittleEndian.AppendUint32(b, uint32(int32(x)))
			} else {
				b = append(b, 0x8a, 8)
				b = binary.LittleEndian.AppendUint64(b, uint64(x))
			}
		case float64:
			b = append(b, 'G')
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(x))
		case string:
			b = append(b, 'X')
			b = binary.LittleEndian.AppendUint32(b, uint32(len(x)))
			b = append(b, x...)
		case []any:
			b = append(b, ']')
			for _, e := range x {
				enc(e)
				b = append(b, 'a')
			}
		case map[string]any:
			b = append(b, '}')
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				enc(k)
				enc(x[k])
				b = append(b, 's')
			}
		default:
			panic("pickleOf: unsupported type")
		}
	}
	enc(v)
	return append(b, '.')
}

const gib = 1 << 30

// snapshotPickle is a small PyTorch snapshot: PyTorch reserved 2 GiB in two
// segments for three tensors (peak live 1.5 GiB).
func snapshotPickle() []byte {
	entry := func(action string, addr, size, t int) any {
		return map[string]any{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []any{}}
	}
	base := 0x7f0000000000
	return pickleOf(map[string]any{
		"segments": []any{},
		"allocator_settings": map[string]any{
			"expandable_segments": false,
		},
		"device_traces": []any{[]any{
			entry("segment_alloc", base, gib, 1000),
			entry("alloc", base, gib/2, 1001),
			entry("alloc", base+gib/2, gib/2, 1002),
			entry("segment_alloc", base+gib, gib, 1003),
			entry("alloc", base+gib, gib/2, 1004),
			entry("free_requested", base, gib/2, 1005),
			entry("free_completed", base, gib/2, 1005),
			entry("free_completed", base+gib/2, gib/2, 1006),
			entry("free_completed", base+gib, gib/2, 1007),
			entry("segment_free", base+gib, gib, 1008),
		}},
	})
}

// graphPickle is a snapshot with a CUDA graph's private pool (1, 0): its
// segment at the dump, two allocs in it (one naming its pool_id, as newer
// PyTorch writes it) and one alloc in the default pool.
func graphPickle() []byte {
	entry := func(action string, addr, size, t int) map[string]any {
		return map[string]any{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []any{}}
	}
	base := 0x7f0000000000
	named := entry("alloc", base+gib+(64<<20), 32<<20, 1003)
	named["pool_id"] = []any{1, 0}
	return pickleOf(map[string]any{
		"segments": []any{
			map[string]any{"device": 0, "address": base, "total_size": 256 << 20, "allocated_size": 0, "segment_pool_id": []any{0, 0}},
			map[string]any{"device": 0, "address": base + gib, "total_size": 128 << 20, "allocated_size": 96 << 20, "segment_pool_id": []any{1, 0}},
		},
		"device_traces": []any{[]any{
			entry("alloc", base, 200<<20, 1000),
			entry("alloc", base+gib, 64<<20, 1002),
			named,
			entry("free_completed", base, 200<<20, 1004),
		}},
	})
}

// orphanPickle is a snapshot that frees a block allocated before
// recording began.
func orphanPickle() []byte {
	entry := func(action string, addr, size, t int) any {
		return map[string]any{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []any{}}
	}
	base := 0x7f0000000000
	return pickleOf(map[string]any{
		"segments": []any{},
		"device_traces": []any{[]any{
			entry("alloc", base, 1<<20, 1000),
			entry("free_completed", base+(8<<20), 1<<20, 1001),
			entry("free_completed", base, 1<<20, 1002),
		}},
	})
}

// midRunPickle is a snapshot whose recording began mid-run: it frees a
// block it never saw allocated and records no segment event, so PyTorch's
// reserved peak cannot be known from it.
func midRunPickle() []byte {
	entry := func(action string, addr, size, t int) any {
		return map[string]any{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []any{}}
	}
	return pickleOf(map[string]any{
		"segments": []any{},
		"device_traces": []any{[]any{
			entry("free_completed", 0x1000, gib, 1000),
			entry("alloc", 0x2000, gib/4, 1001),
			entry("free_completed", 0x2000, gib/4, 1002),
		}},
	})
}

const rmmLog = `Thread,Time,Action,Pointer,Size,Stream
1,08:00:00.000001,allocate,0x1000,1048576,0x0
1,08:00:00.000002,allocate,0x2000,2097152,0x0
1,08:00:00.000003,free,0x1000,1048576,0x0
1,08:00:00.000004,allocate failure,0x0,99999999999,0x0
1,08:00:00.000005,free,0x2000,2097152,0x0
`

// fixtures writes input files into a temporary directory and returns
// their paths by name.
func fixtures(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	ev := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 3 << 20, TimeNs: 10},
		{Kind: trace.Alloc, ID: 2, Size: 100, Stream: 1, TimeNs: 20},
		{Kind: trace.Free, ID: 1, TimeNs: 30},
		{Kind: trace.Free, ID: 2, Stream: 1, TimeNs: 40},
	}
	var bin, txt bytes.Buffer
	bw := trace.NewWriter(&bin)
	require.NoError(t, bw.SetInfo(trace.Info{Name: "tiny"}))
	require.NoError(t, trace.WriteAll(bw, ev))
	require.NoError(t, trace.WriteAll(trace.NewTextWriter(&txt), ev))
	snap := snapshotPickle()
	files := map[string][]byte{
		"trace.bin":        bin.Bytes(),
		"trace.txt":        txt.Bytes(),
		"noext":            bin.Bytes(),
		"snap.pickle":      snap,
		"snapdata":         snap, // detected by content
		"midrun.pickle":    midRunPickle(),
		"log.csv":          []byte(rmmLog),
		"truncated.pickle": snap[:len(snap)/2],
		"hostile.pickle":   []byte("\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."),
		"notadict.pickle":  pickleOf([]any{1, 2}),
		"garbage.dat":      []byte("hello, this is not a trace\x00\x01"),
		"empty.bin":        nil,
		"truncated.bin":    bin.Bytes()[:len(bin.Bytes())-3],
		"badtext.txt":      []byte(trace.TextHeader + "\nalloc x y\n"),
		"orphan.txt":       []byte(trace.TextHeader + "\nalloc 1 4096\nfree 9\nfree 1\n"),
		"dup.txt":          []byte(trace.TextHeader + "\nalloc 1 4096\nalloc 1 4096\nfree 1\n"),
		"orphan.pickle":    orphanPickle(),
		"graph.pickle":     graphPickle(),
		"pools.txt":        []byte(trace.TextHeader + "\nalloc 1 4194304\nalloc 2 8388608 pool=1,0\nfree 1\nalloc 3 2097152 pool=0,1\n"),
	}
	paths := map[string]string{"dir": dir, "missing": filepath.Join(dir, "missing.bin")}
	for name, data := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o644))
		paths[name] = p
	}
	return paths
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestRunSuccess(t *testing.T) {
	f := fixtures(t)
	svg := filepath.Join(f["dir"], "plot.svg")
	tests := []struct {
		name string
		args []string
		want []string // substrings of stdout
	}{
		{"replay default workload", []string{"replay"}, []string{"built-in training workload", "peak reserved", "× peak live", "MapMem"}},
		{"replay binary", []string{"replay", f["trace.bin"]}, []string{"(binary", "peak live         3.00 MiB"}},
		{"replay binary without extension", []string{"replay", f["noext"]}, []string{"(binary"}},
		{"replay text", []string{"replay", f["trace.txt"]}, []string{"(text", "4 (2 alloc, 2 free"}},
		{"replay pickle", []string{"replay", f["snap.pickle"]}, []string{"(pytorch", "PyTorch recorded: peak reserved 2.00 GiB for 1.50 GiB peak live (1.3333×)"}},
		{"replay pickle releases", []string{"replay", f["snap.pickle"]}, []string{"1 cache releases inferred from 1 segment frees/unmaps (1 applied)"}},
		{"replay pickle mid-run", []string{"replay", f["midrun.pickle"]}, []string{"PyTorch recorded: peak reserved unknown"}},
		{"replay pickle by content", []string{"replay", f["snapdata"]}, []string{"(pytorch"}},
		{"replay rmm", []string{"replay", f["log.csv"]}, []string{"(rmm", "1 allocation failures"}},
		{"replay forced format", []string{"replay", "--format", "binary", f["noext"]}, []string{"(binary"}},
		{"replay classic", []string{"replay", "--config", "expandable_segments:False", f["trace.bin"]}, []string{"expandable_segments:False ("}},
		{"replay capacity", []string{"replay", "--capacity", "1GiB", f["trace.bin"]}, []string{"1.00 GiB device"}},
		{"replay flags after trace", []string{"replay", f["trace.bin"], "--min-capacity"}, []string{"min capacity"}},
		{"replay compare", []string{"replay", "--compare", f["snap.pickle"]}, []string{"policy", "expandable-page2M", "classic-split128", "mincap/live",
			"policies (config over the defaults):", "  expandable            = defaults\n", "  classic-split128      = expandable_segments:False,max_split_size_mb:128\n"}},
		{"replay compare custom", []string{"replay", "--compare", "--config", "large_segment_size_mb:4", f["trace.txt"]}, []string{"custom", "expandable-release256", "  custom                = large_segment_size_mb:4\n"}},
		{"replay svg", []string{"replay", "--svg", svg, f["snap.pickle"]}, []string{"peak reserved"}},
		{"replay check", []string{"replay", "--check", f["trace.bin"]}, []string{"peak reserved"}},
		{"replay pools", []string{"replay", "--check", f["pools.txt"]}, []string{"  pools             3 ", "    default          1 allocs: 4.00 MiB live, 4.00 MiB allocated",
			"    pool(0,1)        1 allocs: 2.00 MiB live, 2.00 MiB allocated", "    pool(1,0)        1 allocs: 8.00 MiB live, 8.00 MiB allocated"}},
		{"replay pickle pools", []string{"replay", f["graph.pickle"]}, []string{"private pools (CUDA graphs, MemPools): 1 segments at the dump; allocs: pool(1,0) 2\n",
			"    pool(1,0)        2 allocs: 96.00 MiB live, 96.00 MiB allocated, 96.00 MiB reserved (1.0000×); 96.00 MiB reserved at end\n"}},
		{"help", []string{"help"}, []string{"vmmalloc replay", "vmmalloc sweep", "4 out of device memory"}},
		{"version", []string{"--version"}, []string{"vmmalloc ", "go1."}},
		{"version command", []string{"version"}, []string{"vmmalloc "}},
		{"replay -h", []string{"replay", "-h"}, []string{"-min-capacity", "-svg file", "-capacity size", "-allow-oom", "-strict"}},
		{"sweep -h", []string{"sweep", "-h"}, []string{"-policy name=config", "-parallel", "-o prefix"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runCLI(tc.args...)
			require.Equal(t, exitOK, code, "stderr: %s", errs)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
		})
	}
	doc, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(doc, []byte("<svg ")))
	assert.Contains(t, string(doc), "PyTorch reserved (recorded)")
}

func TestReplayJSON(t *testing.T) {
	f := fixtures(t)
	decode := func(t *testing.T, args ...string) map[string]any {
		t.Helper()
		code, out, errs := runCLI(args...)
		require.Equal(t, exitOK, code, "stderr: %s", errs)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &m), out)
		return m
	}
	t.Run("default", func(t *testing.T) {
		m := decode(t, "replay", "--json")
		assert.Greater(t, m["events"], 1000.0)
		assert.Greater(t, m["peak_allocated_bytes"], 0.0)
		assert.GreaterOrEqual(t, m["peak_reserved_bytes"], m["peak_allocated_bytes"])
		calls, ok := m["driver_calls"].(map[string]any)
		require.True(t, ok)
		assert.Greater(t, calls["MapMem"], 0.0)
		assert.NotContains(t, m, "min_capacity_bytes")
		assert.NotContains(t, m, "pytorch_peak_reserved_bytes")
		assert.NotContains(t, m, "samples")
		assert.Contains(t, m, "stats")
		// Simulated driver time beside the calls, by primitive, under the
		// default cost profile: each primitive called has a time, and they
		// add up to the total.
		assert.Equal(t, "a100", m["cost_profile"])
		times, ok := m["sim_driver_time_by_op_ns"].(map[string]any)
		require.True(t, ok)
		var sum float64
		for op, ns := range times {
			assert.Contains(t, calls, op)
			sum += ns.(float64)
		}
		assert.Greater(t, times["MallocPhysical"], times["MapMem"], "a100: creating costs more than mapping")
		assert.Equal(t, m["sim_driver_time_ns"], sum)
	})
	t.Run("cost profile", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "p.json")
		require.NoError(t, os.WriteFile(path, []byte(`{"format":"vmmalloc-cost-profile/1","name":"mine","ops":{"MapMem":{"per_call_ns":1000}}}`), 0o600))
		m := decode(t, "replay", "--json", "--cost-profile", path)
		assert.Equal(t, "mine", m["cost_profile"])
		calls := m["driver_calls"].(map[string]any)
		assert.Equal(t, map[string]any{"MapMem": calls["MapMem"].(float64) * 1000}, m["sim_driver_time_by_op_ns"])
		legacy := decode(t, "replay", "--json", "--cost-profile", "legacy")
		assert.Equal(t, "legacy", legacy["cost_profile"])
		assert.Equal(t, m["driver_calls"], legacy["driver_calls"], "the profile changes no decision")
	})
	t.Run("min capacity", func(t *testing.T) {
		m := decode(t, "replay", "--json", "--min-capacity", f["trace.bin"])
		assert.Equal(t, 4.0, m["events"])
		require.Contains(t, m, "min_capacity_bytes")
		assert.GreaterOrEqual(t, m["min_capacity_bytes"], m["peak_live_bytes"])
		assert.Equal(t, "binary", m["format"])
	})
	t.Run("pytorch", func(t *testing.T) {
		m := decode(t, "replay", "--json", "--samples", f["snap.pickle"])
		assert.Equal(t, float64(2*gib), m["pytorch_peak_reserved_bytes"])
		assert.Equal(t, float64(3*gib/2), m["pytorch_peak_live_bytes"])
		assert.Equal(t, float64(3*gib/2), m["peak_live_bytes"])
		assert.Equal(t, 7.0, m["events"], "3 allocs, 3 frees and the release the segment_free implies")
		assert.Equal(t, 1.0, m["releases_applied"])
		assert.Equal(t, true, m["pytorch_peak_reserved_known"])
		assert.NotEmpty(t, m["samples"])
	})
	t.Run("pytorch releases ignored", func(t *testing.T) {
		m := decode(t, "replay", "--json", "--releases=false", f["snap.pickle"])
		assert.Equal(t, 0.0, m["releases_applied"])
		assert.Equal(t, 1.0, m["releases_ignored"])
	})
	t.Run("pytorch reserved unknown", func(t *testing.T) {
		m := decode(t, "replay", "--json", f["midrun.pickle"])
		assert.Equal(t, false, m["pytorch_peak_reserved_known"])
		assert.NotContains(t, m, "pytorch_peak_reserved_bytes")
		assert.NotContains(t, m, "pytorch_reserved_over_live")
	})
	t.Run("pytorch pools", func(t *testing.T) {
		m := decode(t, "replay", "--json", f["graph.pickle"])
		assert.Equal(t, 1.0, m["pytorch_private_segments"])
		assert.Equal(t, map[string]any{"pool(1,0)": 2.0}, m["pytorch_pool_allocs"])
		pools, ok := m["pools"].([]any)
		require.True(t, ok, "per-pool figures")
		require.Len(t, pools, 2)
		def, graph := pools[0].(map[string]any), pools[1].(map[string]any)
		assert.Equal(t, "default", def["pool"])
		assert.Equal(t, "pool(1,0)", graph["pool"])
		assert.Equal(t, []any{1.0, 0.0}, graph["id"])
		assert.Equal(t, float64(200<<20), def["peak_live_bytes"])
		assert.Equal(t, float64(96<<20), graph["peak_live_bytes"])
		assert.Equal(t, float64(96<<20), graph["peak_allocated_bytes"])
		assert.GreaterOrEqual(t, graph["peak_reserved_bytes"], float64(96<<20))
		assert.Equal(t, float64(96<<20), graph["end_live_bytes"])
		assert.Equal(t, 2.0, graph["allocs"])
		assert.Equal(t, m["end_reserved_bytes"], def["end_reserved_bytes"].(float64)+graph["end_reserved_bytes"].(float64))
	})
	t.Run("no pools", func(t *testing.T) {
		m := decode(t, "replay", "--json", f["snap.pickle"])
		assert.NotContains(t, m, "pools")
		assert.NotContains(t, m, "pytorch_private_segments")
		assert.NotContains(t, m, "pytorch_pool_allocs")
	})
	t.Run("compare", func(t *testing.T) {
		m := decode(t, "replay", "--json", "--compare", f["trace.txt"])
		cmp, ok := m["compare"].([]any)
		require.True(t, ok)
		assert.Len(t, cmp, 6)
		assert.Equal(t, "expandable", m["policy"])
		assert.Contains(t, m, "min_capacity_bytes")
	})
}

func TestGenAndConvert(t *testing.T) {
	dir := t.TempDir()
	for _, kind := range []string{"training", "inference", "mix", "multistream"} {
		t.Run(kind, func(t *testing.T) {
			bin := filepath.Join(dir, kind+".bin")
			code, _, errs := runCLI("gen", "--kind", kind, "--seed", "3", "-o", bin)
			require.Equal(t, exitOK, code, errs)
			assert.Contains(t, errs, "wrote ")
			txt := filepath.Join(dir, kind+".txt")
			code, _, errs = runCLI("convert", bin, "-o", txt)
			require.Equal(t, exitOK, code, errs)
			back := filepath.Join(dir, kind+".back.bin")
			code, _, errs = runCLI("convert", "--to", "binary", txt, "-o", back)
			require.Equal(t, exitOK, code, errs)
			a, err := os.ReadFile(bin)
			require.NoError(t, err)
			b, err := os.ReadFile(back)
			require.NoError(t, err)
			assert.Equal(t, a, b, "binary → text → binary is lossless")
			code, out, errs := runCLI("replay", "--json", back)
			require.Equal(t, exitOK, code, errs)
			assert.Contains(t, out, `"events"`)
		})
	}
	t.Run("text to stdout", func(t *testing.T) {
		code, out, _ := runCLI("gen", "--format", "text", "--seed", "2")
		require.Equal(t, exitOK, code)
		assert.True(t, strings.HasPrefix(out, trace.TextHeader+"\n"))
		assert.Contains(t, out, "# name: training")
	})
	t.Run("same seed same bytes", func(t *testing.T) {
		_, a, _ := runCLI("gen", "--seed", "5")
		_, b, _ := runCLI("gen", "--seed", "5")
		_, c, _ := runCLI("gen", "--seed", "6")
		assert.Equal(t, a, b)
		assert.NotEqual(t, a, c)
	})
	f := fixtures(t)
	t.Run("pickle to binary", func(t *testing.T) {
		out := filepath.Join(dir, "snap.bin")
		code, _, errs := runCLI("convert", f["snap.pickle"], "-o", out)
		require.Equal(t, exitOK, code, errs)
		r, err := os.Open(out)
		require.NoError(t, err)
		defer r.Close()
		er, err := trace.Open(r)
		require.NoError(t, err)
		s, err := trace.Summarize(er)
		require.NoError(t, err)
		assert.Equal(t, int64(3), s.Allocs)
		assert.Equal(t, uint64(3*gib/2), s.PeakLiveBytes)
	})
	t.Run("rmm to text", func(t *testing.T) {
		code, out, errs := runCLI("convert", "--to", "text", f["log.csv"])
		require.Equal(t, exitOK, code, errs)
		assert.Contains(t, out, "alloc 1 1048576")
		assert.Contains(t, out, "free 2")
	})
}

func TestRunErrors(t *testing.T) {
	f := fixtures(t)
	out := filepath.Join(f["dir"], "out.bin")
	tests := []struct {
		name string
		args []string
		code int
		want string // substring of the one-line message
	}{
		{"no command", nil, exitUsage, ""},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"unknown flag", []string{"replay", "--bogus"}, exitUsage, "flag provided but not defined: -bogus"},
		{"two traces", []string{"replay", f["trace.bin"], f["trace.txt"]}, exitUsage, "at most one trace"},
		{"bad config", []string{"replay", "--config", "nope:1"}, exitUsage, `unknown key "nope"`},
		{"bad config value", []string{"replay", "--config", "max_split_size_mb:1"}, exitUsage, "max_split_size_mb"},
		{"bad capacity", []string{"replay", "--capacity", "lots"}, exitUsage, "--capacity"},
		{"unknown cost profile", []string{"replay", "--cost-profile", "b200"}, exitUsage, "--cost-profile"},
		{"sweep unknown cost profile", []string{"sweep", "--cost-profile", "b200", f["trace.bin"]}, exitUsage, "--cost-profile"},
		{"zero capacity", []string{"replay", "--capacity", "0"}, exitUsage, "--capacity"},
		{"bad format", []string{"replay", "--format", "xml", f["trace.bin"]}, exitUsage, `unknown format "xml"`},
		{"negative device", []string{"replay", "--device", "-1", f["snap.pickle"]}, exitUsage, "--device"},
		{"missing file", []string{"replay", f["missing"]}, exitFailure, "no such file"},
		{"directory", []string{"replay", f["dir"]}, exitFailure, "is a directory"},
		{"truncated pickle", []string{"replay", f["truncated.pickle"]}, exitFailure, "truncated"},
		{"hostile pickle", []string{"replay", f["hostile.pickle"]}, exitFailure, "forbidden opcode"},
		{"pickle not a snapshot", []string{"replay", f["notadict.pickle"]}, exitFailure, "malformed PyTorch snapshot"},
		{"missing device", []string{"replay", "--device", "3", f["snap.pickle"]}, exitFailure, "device 3 not in snapshot"},
		{"unknown format", []string{"replay", f["garbage.dat"]}, exitFailure, "unrecognised trace format"},
		{"empty file", []string{"replay", f["empty.bin"]}, exitFailure, "is empty"},
		{"truncated binary", []string{"replay", f["truncated.bin"]}, exitFailure, "corrupt"},
		{"bad text", []string{"replay", f["badtext.txt"]}, exitFailure, "corrupt"},
		{"forced wrong format", []string{"replay", "--format", "pytorch", f["trace.bin"]}, exitFailure, "reading"},
		{"min capacity of a hostile pickle", []string{"replay", "--min-capacity", f["hostile.pickle"]}, exitFailure, "forbidden opcode"},
		{"gen unknown kind", []string{"gen", "--kind", "video"}, exitUsage, `unknown workload "video"`},
		{"gen bad seed", []string{"gen", "--seed", "x"}, exitUsage, "invalid value"},
		{"gen bad format", []string{"gen", "--format", "csv"}, exitUsage, `unknown output format "csv"`},
		{"gen extra argument", []string{"gen", "extra"}, exitUsage, "unexpected argument"},
		{"gen unwritable", []string{"gen", "-o", filepath.Join(f["missing"], "x.bin")}, exitFailure, "no such file"},
		{"convert no input", []string{"convert"}, exitUsage, "exactly one input"},
		{"convert missing", []string{"convert", f["missing"], "-o", out}, exitFailure, "no such file"},
		{"convert hostile", []string{"convert", f["hostile.pickle"], "-o", out}, exitFailure, "forbidden opcode"},
		{"convert truncated binary", []string{"convert", f["truncated.bin"], "-o", out}, exitFailure, "corrupt"},
		{"convert onto itself", []string{"convert", f["trace.bin"], "-o", f["trace.bin"]}, exitUsage, "same file"},
		{"convert bad target", []string{"convert", "--to", "pickle", f["trace.bin"]}, exitUsage, "unknown output format"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", stderr)
			assert.NotContains(t, stderr, "goroutine")
			assert.NotContains(t, stderr, "panic")
			if tc.want == "" {
				assert.NotEmpty(t, stderr)
				return
			}
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			assert.True(t, strings.HasPrefix(stderr, "vmmalloc"), stderr)
			assert.Contains(t, stderr, tc.want)
			assert.Empty(t, stdout)
		})
	}
	_, err := os.Stat(out)
	assert.True(t, os.IsNotExist(err), "a failed convert leaves no partial output")
}

func TestRecoverPanics(t *testing.T) {
	var errb bytes.Buffer
	code := run([]string{"replay", "--json"}, nil, &errb) // nil stdout panics when written
	assert.Equal(t, exitInternal, code)
	assert.Equal(t, 1, strings.Count(errb.String(), "\n"))
	assert.Contains(t, errb.String(), "internal error")
}

func TestParseArgs(t *testing.T) {
	fs := newFlagSet("x", "", &bytes.Buffer{})
	v := fs.Bool("v", false, "")
	n := fs.Int("n", 0, "")
	pos, err := parseArgs(fs, []string{"a", "-v", "b", "-n", "3", "--", "-c", "d"})
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "-c", "d"}, pos)
	assert.True(t, *v)
	assert.Equal(t, 3, *n)
}

func TestDetect(t *testing.T) {
	tests := []struct {
		name, head, want string
	}{
		{"x.bin", trace.Magic + "\x01", fmtBinary},
		{"x", "# vmmalloc-trace v1\n", fmtText},
		{"x", "\x80\x04\x95", fmtPyTorch},
		{"x.PICKLE", "junk", fmtPyTorch},
		{"x.pkl", "", fmtPyTorch},
		{"log.csv", "anything", fmtRMM},
		{"log", "Thread,Time,Action,Pointer,Size,Stream\n", fmtRMM},
	}
	for _, tc := range tests {
		got, err := detect(tc.name, []byte(tc.head))
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
	}
	_, err := detect("x", []byte("plain words"))
	assert.ErrorIs(t, err, errUnknownFormat)
	_, err = detect("x", nil)
	assert.ErrorIs(t, err, errUnknownFormat)
}

func TestRenderBar(t *testing.T) {
	assert.Equal(t, "tr [###############               ]  50% 1,000,000 events, 2.0 Mevents/s",
		renderBar("tr", 0.5, 1_000_000, 500*time.Millisecond))
	assert.Equal(t, "tr 10 events, 10.0 events/s", renderBar("tr", -1, 10, time.Second))
	assert.Contains(t, renderBar("tr", 7, 1, time.Second), "100%")
}

func TestProgressDrawsOnlyAfterDelay(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	p := &progress{w: &buf, label: "x", fraction: func(int64) float64 { return 0.25 }, now: func() time.Time { return now }, start: now}
	p.update(10)
	assert.Empty(t, buf.String(), "nothing before the delay")
	now = now.Add(progressDelay)
	p.update(20)
	assert.Contains(t, buf.String(), " 25% 20 events")
	n := buf.Len()
	now = now.Add(progressInterval / 2)
	p.update(30)
	assert.Equal(t, n, buf.Len(), "throttled")
	p.done()
	assert.True(t, strings.HasSuffix(buf.String(), "\r"))
	var nilP *progress
	nilP.update(1)
	nilP.done()
	assert.Nil(t, newProgress(&buf, "x", nil), "a buffer is not a terminal")
}
