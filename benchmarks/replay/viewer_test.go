package replay

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// viewerSeg is a segment as PyTorch's memory viewer tracks it.
type viewerSeg struct{ addr, size, stream int64 }

// viewerReplay checks a snapshot the way the memory viewer's "Allocator
// State History" uses it: starting from the final segments and active
// blocks, it walks the trace backwards (free_requested/free_completed
// pairs merged into free), undoing each entry, and fails where the viewer
// would throw or draw a block outside every segment. It returns the
// segments and blocks left before the first entry.
func viewerReplay(t *testing.T, data []byte) (segs, blocks int) {
	t.Helper()
	v, err := pickle.Decode(data)
	require.NoError(t, err)
	top := v.(map[string]any)
	var ss []viewerSeg
	live := map[int64]int64{} // addr → size
	for _, s := range top["segments"].([]any) {
		m := s.(map[string]any)
		base := m["address"].(int64)
		ss = append(ss, viewerSeg{base, m["total_size"].(int64), m["stream"].(int64)})
		addr := base
		for _, b := range m["blocks"].([]any) {
			bm := b.(map[string]any)
			if st := bm["state"]; st == "active_allocated" || st == "active_pending_free" {
				live[addr] = bm["size"].(int64)
			}
			addr += bm["size"].(int64)
		}
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].addr < ss[j].addr })
	inside := func(addr, size int64) int {
		for i, g := range ss {
			if g.addr <= addr && addr+size <= g.addr+g.size {
				return i
			}
		}
		return -1
	}
	checkBlocks := func(when string) {
		for a, n := range live {
			require.GreaterOrEqual(t, inside(a, n), 0, "%s: block %#x+%d outside every segment", when, a, n)
		}
	}
	checkBlocks("final state")

	// Merge adjacent free_requested/free_completed pairs as the viewer does.
	var ev []map[string]any
	for _, e := range top["device_traces"].([]any)[0].([]any) {
		m := e.(map[string]any)
		if m["action"] == "free_completed" && len(ev) > 0 {
			if p := ev[len(ev)-1]; p["action"] == "free_requested" && p["addr"] == m["addr"] {
				p["action"] = "free"
				continue
			}
		}
		ev = append(ev, m)
	}
	for i := len(ev) - 1; i >= 0; i-- {
		e := ev[i]
		addr, _ := e["addr"].(int64)
		size := e["size"].(int64)
		stream := e["stream"].(int64)
		where := fmt.Sprintf("entry %d (%s %#x+%d)", i, e["action"], addr, size)
		switch e["action"] {
		case "free", "free_completed":
			live[addr] = size
		case "free_requested":
			_, ok := live[addr]
			require.True(t, ok, "%s: the viewer throws on a free_requested of an unknown block", where)
		case "alloc":
			delete(live, addr)
		case "segment_free", "segment_unmap":
			j := sort.Search(len(ss), func(k int) bool { return ss[k].addr > addr })
			ss = append(ss, viewerSeg{})
			copy(ss[j+1:], ss[j:])
			ss[j] = viewerSeg{addr, size, stream}
			if e["action"] == "segment_unmap" { // merge with same-stream neighbours: next, then previous
				if j+1 < len(ss) && addr+size == ss[j+1].addr && stream == ss[j+1].stream {
					ss[j].size += ss[j+1].size
					ss = append(ss[:j+1], ss[j+2:]...)
				}
				if j > 0 && ss[j-1].addr+ss[j-1].size == addr && ss[j-1].stream == stream {
					ss[j-1].size += ss[j].size
					ss = append(ss[:j], ss[j+1:]...)
				}
			}
		case "segment_alloc":
			j := -1
			for k, g := range ss {
				if g.addr == addr {
					j = k
				}
			}
			require.GreaterOrEqual(t, j, 0, "%s: segment_alloc of no segment", where)
			ss = append(ss[:j], ss[j+1:]...)
		case "segment_map":
			j := inside(addr, size)
			require.GreaterOrEqual(t, j, 0, "%s: the viewer throws on a mapping inside no segment", where)
			g := ss[j]
			switch {
			case g.addr == addr:
				ss[j].addr += size
				ss[j].size -= size
				if ss[j].size == 0 {
					ss = append(ss[:j], ss[j+1:]...)
				}
			case g.addr+g.size == addr+size:
				ss[j].size -= size
			default:
				ss[j].size = addr - g.addr
				ss = append(ss, viewerSeg{addr + size, g.addr + g.size - addr - size, g.stream})
				sort.Slice(ss, func(i, j int) bool { return ss[i].addr < ss[j].addr })
			}
		}
		checkBlocks(where)
	}
	return len(ss), len(live)
}

// TestSnapshotViewerReplay checks snapshots of replays with record_stream,
// several streams and empty_cache, classic and expandable, whole and with
// a wrapped history, as the memory viewer reads them.
func TestSnapshotViewerReplay(t *testing.T) {
	mixCfg := workload.DefaultMixConfig()
	mixCfg.Allocs, mixCfg.EmptyCacheProb = 2500, 0.004
	mix, err := workload.RandomMix(mixCfg, 11)
	require.NoError(t, err)
	for _, tc := range []struct {
		config  string
		entries int
		empty   bool // the whole history was kept: the walk ends with nothing
	}{
		{"", 0, true},
		{"expandable_segments:False", 0, true},
		{"", 700, false},
		{"expandable_segments:False", 700, false},
	} {
		t.Run(fmt.Sprintf("%q/%d", tc.config, tc.entries), func(t *testing.T) {
			var snap bytes.Buffer
			rep, err := Run(trace.NewSliceReader(mix), Options{Config: mustConfig(t, tc.config), Snapshot: &snap, SnapshotEntries: tc.entries, MaxSamples: -1})
			require.NoError(t, err)
			require.Positive(t, rep.RecordStreams)
			require.Positive(t, rep.EmptyCaches)
			if d := os.Getenv("VMMALLOC_DUMP_SNAPSHOT"); d != "" {
				require.NoError(t, os.WriteFile(filepath.Join(d, fmt.Sprintf("viewer%d.pickle", tc.entries)), snap.Bytes(), 0o644))
			}
			segs, blocks := viewerReplay(t, snap.Bytes())
			if tc.empty {
				require.Zero(t, segs, "before the first entry nothing was mapped")
				require.Zero(t, blocks)
			}
		})
	}
}
