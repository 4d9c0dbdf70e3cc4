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
	files := sharedTraces(t)
	slices.Sort(files)
	out := make([]namedSnapshot, 0, len(files))
	for _, f := range files {
		out = append(out, namedSnapshot{filepath.Base(f), loadSnapshot(t, f)})
	}
	return out
}

// policySnapshots loads the snapshots of trace.SharedDir()/policy (issue
// 19: the traces on which the default policy missed its targets), named
// "policy/<file>"; none when the folder is absent.
func policySnapshots(t testing.TB) []namedSnapshot {
	t.Helper()
	dir, err := trace.SharedDir()
	if err != nil {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(dir, "policy", "*.pickle"))
	slices.Sort(files)
	out := make([]namedSnapshot, 0, len(files))
	for _, f := range files {
		out = append(out, namedSnapshot{"policy/" + filepath.Base(f), loadSnapshot(t, f)})
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

// driverCallBudget is, per shared trace, a ceiling on the driver calls of
// the default policy (the calls of the policy that did not take back idle
// streams' memory, and for the policy traces the calls when they were
// added): the default may make no more, with the recorded releases honoured
// or ignored.
var driverCallBudget = map[string]int64{
	"cs336_ctx128_forward.pickle":           1_972,
	"cs336_ctx128_fullstep.pickle":          8_237,
	"cs336_gpt2small_compiled_train.pickle": 481,
	"cs336_medium_ctx1024_train.pickle":     3_134,
	"cs336_small_forward_bf16.pickle":       265,
	"llama7b_offload_4streams.pickle":       17_665,
	"opt125m_zeroth_order_finetune.pickle":  721,
	"tts_inference_server.pickle":           25,
	"policy/cs336_ctx512_fullstep.pickle":   4_027,
	"policy/cs336_xl_forward_bf16.pickle":   3_832,
	"policy/gcn_3gpu_expandable_oom.pickle": 1_270,
}

// reservedBudget is, per shared trace, the default policy's peak reserved /
// peak live with releases honoured, a ceiling (docs/results.md lists the
// current figures): cutting driver calls may not cost reserved memory.
var reservedBudget = map[string]float64{
	"cs336_ctx128_forward.pickle":           1.0068,
	"cs336_ctx128_fullstep.pickle":          1.0042,
	"cs336_gpt2small_compiled_train.pickle": 1.0340,
	"cs336_medium_ctx1024_train.pickle":     1.0097,
	"cs336_small_forward_bf16.pickle":       1.1140,
	"llama7b_offload_4streams.pickle":       1.0139,
	"opt125m_zeroth_order_finetune.pickle":  1.0159,
	"tts_inference_server.pickle":           1.4926,
	"policy/cs336_ctx512_fullstep.pickle":   1.0386,
	"policy/cs336_xl_forward_bf16.pickle":   1.0165,
	"policy/gcn_3gpu_expandable_oom.pickle": 1.0111,
}

// minCapacityBound is, per shared trace of at least 1 GB peak live, the
// default policy's minimum capacity / peak live (docs/results.md, "Under
// memory pressure"), to 4 decimals: the target
// is 1.005, and these are what the policy reaches. The two policy traces
// above it strand memory in partly free growth handles mapped while the
// device had room, which no release can unmap (cs336_ctx512_fullstep:
// 1.0026 with granule handles everywhere, at 17× the driver calls), or
// hold it free in the large pool at the trace's final peak in holes of
// 1–2.3 MiB between live blocks, each inside granules that also hold live
// bytes (cs336_xl_forward_bf16: 1.0147 even with 2 MiB pages; the small
// pool holds 30 MiB for 29.5 MiB allocated and rounding adds nothing,
// requested = allocated).
var minCapacityBound = map[string]float64{
	"cs336_ctx128_forward.pickle":           1.0061,
	"cs336_ctx128_fullstep.pickle":          1.0040,
	"cs336_gpt2small_compiled_train.pickle": 1.0036,
	"cs336_medium_ctx1024_train.pickle":     1.0002,
	"llama7b_offload_4streams.pickle":       1.0006,
	"opt125m_zeroth_order_finetune.pickle":  1.0029,
	"policy/cs336_ctx512_fullstep.pickle":   1.0079,
	"policy/cs336_xl_forward_bf16.pickle":   1.0154,
	"policy/gcn_3gpu_expandable_oom.pickle": 1.0021,
}

// reservedOverPyTorch is, per trace, by how many bytes the default's peak
// reserved may exceed PyTorch's recorded peak: 0 but where it is not met.
// On gcn_3gpu_expandable_oom the default reserves 8 MiB (0.1 %) more at 80
// GiB: memory stays mapped up to 1.01 × the high water mark of allocated
// bytes plus a page (8.56 GB), above PyTorch's 1.0101 × peak live; the
// pressure rule does not apply on a device that has room.
var reservedOverPyTorch = map[string]uint64{
	"policy/gcn_3gpu_expandable_oom.pickle": 8 << 20,
}

// TestSharedTracesTargets replays every shared snapshot (policy/ too) with
// the default expandable policy, honouring the releases it records, and
// requires peak reserved at most PyTorch's recorded peak wherever the file
// lets it be known (reservedOverPyTorch says where it is not met) and a
// minimum capacity within the trace's minCapacityBound (else 1%) of peak
// live wherever peak live is at least 1 GB. On the multi-stream trace it also requires reserved /
// live ≤ 1.10 with the releases ignored: the policy keeps close to live
// without the program's help. Driver calls, honoured and ignored, stay
// within the trace's driverCallBudget and reserved / live within its
// reservedBudget (a trace without them is logged).
func TestSharedTracesTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every shared trace with a capacity search")
	}
	for _, ns := range append(sharedSnapshots(t), policySnapshots(t)...) {
		t.Run(ns.name, func(t *testing.T) {
			pt := ns.pt
			rep, err := Run(pt.Reader(), Options{Check: true, MaxSamples: -1})
			require.NoError(t, err)
			require.Zero(t, rep.OOMs)
			if pt.PeakReservedKnown {
				assert.LessOrEqual(t, rep.PeakReserved, pt.PeakReserved+reservedOverPyTorch[ns.name], "no more than PyTorch reserved")
			}
			if rep.PeakLive >= 1e9 {
				res, err := SearchMinCapacity(pt.Events, allocator.DefaultConfig(), Options{})
				require.NoError(t, err)
				bound, ok := minCapacityBound[ns.name]
				if !ok {
					bound = 1.01
				}
				assert.LessOrEqual(t, res.OverLive, bound+5e-5, "min capacity / peak live (4 decimals)")
			}
			ignored, err := Run(pt.Reader(), Options{Check: true, MaxSamples: -1, IgnoreReleases: true})
			require.NoError(t, err)
			assert.Equal(t, int64(pt.Releases), ignored.ReleasesIgnored)
			if len(pt.Streams) > 2 {
				assert.LessOrEqual(t, ignored.ReservedOverLive, 1.10, "multi-stream, releases ignored")
			}
			if budget, ok := driverCallBudget[ns.name]; ok {
				assert.LessOrEqual(t, rep.DriverCallsTotal, budget, "driver calls, releases honoured")
				assert.LessOrEqual(t, ignored.DriverCallsTotal, budget, "driver calls, releases ignored")
			} else {
				t.Logf("%s: no driver-call budget", ns.name)
			}
			if budget, ok := reservedBudget[ns.name]; ok {
				assert.LessOrEqual(t, rep.ReservedOverLive, budget+5e-5, "reserved / live, releases honoured (4 decimals)")
			} else {
				t.Logf("%s: no reserved budget", ns.name)
			}
			recorded := "unknown"
			if pt.PeakReservedKnown {
				recorded = FormatBytes(pt.PeakReserved)
			}
			t.Logf("live %s, PyTorch reserved %s, expandable %.4f (releases ignored %.4f), %d driver calls (%d), %v simulated driver time (%v)",
				FormatBytes(rep.PeakLive), recorded, rep.ReservedOverLive, ignored.ReservedOverLive,
				rep.DriverCallsTotal, ignored.DriverCallsTotal, rep.SimDriverTime, ignored.SimDriverTime)
		})
	}
}
