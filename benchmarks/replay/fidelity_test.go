package replay

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// namedSnapshot is one imported shared trace.
type namedSnapshot struct {
	name string // file name
	pt   *trace.PyTorchTrace
}

// sharedSnapshots imports every *.pickle of the shared traces folder, in
// name order, or skips when there is none.
func sharedSnapshots(t testing.TB) []namedSnapshot {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(tracesDir(), "*.pickle"))
	if len(files) == 0 {
		t.Skipf("no *.pickle in %s (set %s)", tracesDir(), tracesEnv)
	}
	slices.Sort(files)
	out := make([]namedSnapshot, 0, len(files))
	for _, f := range files {
		out = append(out, namedSnapshot{filepath.Base(f), loadSnapshot(t, f)})
	}
	return out
}

// classicSettings reports whether a snapshot was recorded with PyTorch's
// classic allocator: expandable_segments false or absent (its default).
func classicSettings(pt *trace.PyTorchTrace) bool {
	es, ok := pt.Settings["expandable_segments"]
	return !ok || es == false
}

// TestFidelityClassic replays every shared snapshot recorded with the
// classic allocator whose segments are all in the file (PyTorch's reserved
// peak is known) with vmmalloc's classic mode, honouring the releases the
// trace records, and requires PyTorch's reserved peak within 1%.
func TestFidelityClassic(t *testing.T) {
	cfg, err := allocator.ParseConfig("expandable_segments:False")
	require.NoError(t, err)
	checked := 0
	for _, ns := range sharedSnapshots(t) {
		name, pt := ns.name, ns.pt
		if !classicSettings(pt) || !pt.PeakReservedKnown {
			t.Logf("%s: skipped (classic %v, reserved peak known %v)", name, classicSettings(pt), pt.PeakReservedKnown)
			continue
		}
		checked++
		t.Run(name, func(t *testing.T) {
			rep, err := Run(pt.Reader(), Options{Config: cfg, Check: true, MaxSamples: -1})
			require.NoError(t, err)
			t.Logf("PyTorch %s, classic replay %s (%.4f), %d releases applied",
				FormatBytes(pt.PeakReserved), FormatBytes(rep.PeakReserved),
				ratio(rep.PeakReserved, pt.PeakReserved), rep.ReleasesApplied)
			assert.Equal(t, int64(pt.Releases), rep.ReleasesApplied)
			assert.Zero(t, rep.OOMs)
			assert.InEpsilon(t, float64(pt.PeakReserved), float64(rep.PeakReserved), 0.01)
		})
	}
	assert.NotZero(t, checked, "at least one shared trace is classic with a known reserved peak")
}

// TestReplayReleases replays a two-stream trace whose program released the
// cache between the streams' allocations: honoured, the second stream
// reuses the memory; ignored, classic keeps both streams' memory reserved
// while expandable takes the idle stream's memory back.
func TestReplayReleases(t *testing.T) {
	const mb = 1 << 20
	events := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 100 * mb, Stream: 1},
		{Kind: trace.Free, ID: 1, Stream: 1},
		{Kind: trace.EmptyCache},
		{Kind: trace.Alloc, ID: 2, Size: 100 * mb, Stream: 2},
		{Kind: trace.Free, ID: 2, Stream: 2},
	}
	tests := []struct {
		name     string
		config   string
		ignore   bool
		reserved uint64
		applied  int64
		ignored  int64
	}{
		{"classic honoured", "expandable_segments:False", false, 100 * mb, 1, 0},
		{"classic ignored", "expandable_segments:False", true, 200 * mb, 0, 1},
		{"expandable honoured", "", false, 100 * mb, 1, 0},
		// Expandable takes the idle stream's memory back by itself.
		{"expandable ignored", "", true, 100 * mb, 0, 1},
		{"expandable without reclaim, ignored", "defrag_threshold:off", true, 200 * mb, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := allocator.ParseConfig(tc.config)
			require.NoError(t, err)
			rep, err := Run(sliceOf(events), Options{Config: cfg, IgnoreReleases: tc.ignore, Check: true})
			require.NoError(t, err)
			assert.Equal(t, tc.reserved, rep.PeakReserved)
			assert.Equal(t, tc.applied, rep.ReleasesApplied)
			assert.Equal(t, tc.ignored, rep.ReleasesIgnored)
			assert.Equal(t, int64(1), rep.EmptyCaches)
		})
	}
}
