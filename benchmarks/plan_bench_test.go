package benchmarks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/arena/plan"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// planAlign is the alignment the plan benchmarks pack to: the allocator's
// size rounding (512 bytes, as PyTorch's caching allocator).
const planAlign = 512

// stepIntervals turns a trace into the intervals of one step: each Alloc
// that the trace frees is an interval from its Alloc's position to its
// Free's position in the sequence of Alloc and Free events; blocks never
// freed are left out (they outlive the step).
func stepIntervals(events []trace.Event) []plan.Interval {
	type born struct{ size, at uint64 }
	live := make(map[uint64]born)
	var ivs []plan.Interval
	var call uint64
	for _, e := range events {
		switch e.Kind {
		case trace.Alloc:
			live[e.ID] = born{e.Size, call}
			call++
		case trace.Free:
			if b, ok := live[e.ID]; ok {
				delete(live, e.ID)
				if b.size > 0 {
					ivs = append(ivs, plan.Interval{Size: b.size, Birth: b.at, Death: call})
				}
			}
			call++
		}
	}
	return ivs
}

// sharedStepIntervals returns the step intervals of every shared trace
// (policy/ included), by file name; it skips tb when the traces are absent.
func sharedStepIntervals(tb testing.TB) map[string][]plan.Interval {
	dir, err := trace.SharedDir()
	if err != nil {
		tb.Skip(err)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.pickle"))
	require.NoError(tb, err)
	more, err := filepath.Glob(filepath.Join(dir, "policy", "*.pickle"))
	require.NoError(tb, err)
	names = append(names, more...)
	if len(names) == 0 {
		tb.Skip("no shared traces")
	}
	out := make(map[string][]plan.Interval)
	for _, p := range names {
		f, err := os.Open(p)
		require.NoError(tb, err)
		t, err := trace.ImportPyTorchSnapshot(f, 0)
		f.Close()
		require.NoError(tb, err, p)
		rel, _ := filepath.Rel(dir, p)
		out[strings.TrimSuffix(filepath.ToSlash(rel), ".pickle")] = stepIntervals(t.Events)
	}
	return out
}

// TestPlanPackSharedTraces packs each shared trace's step and holds the
// region within 100 ppm of the step's peak live bytes, logging how close
// it lands. (Planned steps' target for steady-state reserved memory is
// 1.003 × the peak; the packer lands within 1 ppm of it on every shared
// trace, so it is held to the tighter bound.)
func TestPlanPackSharedTraces(t *testing.T) {
	for name, ivs := range sharedStepIntervals(t) {
		offs, size, err := plan.Pack(ivs, planAlign)
		require.NoError(t, err, name)
		require.NoError(t, plan.Verify(ivs, offs, planAlign, size), name)
		peak := plan.PeakLive(ivs, planAlign)
		t.Logf("%-40s %5d intervals: region %d, peak live %d, ratio %.7f", name, len(ivs), size, peak, float64(size)/float64(peak))
		require.LessOrEqual(t, float64(size), 1.0001*float64(peak), name)
	}
}

// BenchmarkPlanPackSharedTraces packs each shared trace's step (its blocks
// allocated and freed within the trace) and reports the region's size
// against the step's peak live bytes (size/peak, the lower bound being 1)
// and the planning time per interval.
func BenchmarkPlanPackSharedTraces(b *testing.B) {
	steps := sharedStepIntervals(b)
	for name, ivs := range steps {
		b.Run(strings.ReplaceAll(name, "/", "_"), func(b *testing.B) {
			peak := plan.PeakLive(ivs, planAlign)
			var size uint64
			b.ReportAllocs()
			for b.Loop() {
				offs, sz, err := plan.Pack(ivs, planAlign)
				if err != nil {
					b.Fatal(err)
				}
				size = sz
				_ = offs
			}
			offs, _, _ := plan.Pack(ivs, planAlign)
			require.NoError(b, plan.Verify(ivs, offs, planAlign, size))
			b.ReportMetric(float64(size)/float64(peak), "size/peak")
			b.ReportMetric((float64(size)/float64(peak)-1)*1e6, "excess-ppm")
			b.ReportMetric(float64(len(ivs)), "intervals")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ivs)), "ns/interval")
		})
	}
}
