package benchmarks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// replaySteps replays a training trace with the replay engine, counting
// driver calls from the Mark that ends the warm-up.
func replaySteps(tb testing.TB, events []trace.Event, conf string, warmup uint64) *replay.Report {
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(tb, err)
	rep, err := replay.Run(trace.NewSliceReader(events), replay.Options{
		Config: cfg, SteadyFromMark: warmup, MaxSamples: -1,
	})
	require.NoError(tb, err)
	require.Zero(tb, rep.OOMs)
	return rep
}

// warmupSteps returns the number of the step after the one whose live
// bytes peak highest: from there on, every step fits in memory already
// mapped, so a caching allocator should make no driver call.
func warmupSteps(events []trace.Event) uint64 {
	sizes := map[uint64]uint64{}
	var live, peak, stepPeak uint64
	var step, peakStep uint64
	for _, ev := range events {
		switch ev.Kind {
		case trace.Alloc:
			sizes[ev.ID] = ev.Size
			live += ev.Size
			stepPeak = max(stepPeak, live)
		case trace.Free:
			live -= sizes[ev.ID]
			delete(sizes, ev.ID)
		case trace.Mark:
			if stepPeak > peak {
				peak, peakStep = stepPeak, step
			}
			step, stepPeak = ev.ID, live
		}
	}
	return peakStep + 1
}

// BenchmarkTrainingWorkload replays a synthetic transformer training run
// (parameters, gradients, Adam states, per-layer activations freed in
// reverse in backward, sequence length varying per step) and reports
// fragmentation and driver calls per step after the warm-up (the steps up
// to the one with the highest live peak, see warmupSteps), for expandable
// and classic segments side by side.
func BenchmarkTrainingWorkload(b *testing.B) {
	cfg := workload.DefaultTrainingConfig()
	events, err := workload.TransformerTraining(cfg, 1)
	require.NoError(b, err)
	for _, mode := range []struct{ name, conf string }{
		{"expandable", "expandable_segments:True"},
		{"classic", "expandable_segments:False"},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var r *replay.Report
			for i := 0; i < b.N; i++ {
				r = replaySteps(b, events, mode.conf, warmupSteps(events))
			}
			b.ReportMetric(float64(r.PeakReserved)/float64(r.PeakAllocated), "reserved/allocated")
			b.ReportMetric(float64(r.SteadyDriverCalls)/float64(max(r.SteadySteps, 1)), "driver-calls/step")
			b.ReportMetric(float64(len(events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(r.SimDriverTime.Microseconds())/1e3, "sim-driver-ms")
		})
	}
}

// TestTrainingWorkloadTargets checks the expandable-segment targets on the
// synthetic training run: reserved within 3% of allocated at the peak, and
// no driver call per step once warm (after the step with the longest
// sequence).
func TestTrainingWorkloadTargets(t *testing.T) {
	cfg := workload.DefaultTrainingConfig()
	cfg.Steps = 20
	events, err := workload.TransformerTraining(cfg, 1)
	require.NoError(t, err)
	warm := warmupSteps(events)
	require.Less(t, warm, uint64(cfg.Steps), "the peak step must leave warm steps to measure")
	r := replaySteps(t, events, "expandable_segments:True", warm)
	ratio := float64(r.PeakReserved) / float64(r.PeakAllocated)
	t.Logf("expandable: peak allocated %d MiB, peak reserved %d MiB, ratio %.4f, %d driver calls in %d warm steps (%v simulated driver time in all)",
		r.PeakAllocated>>20, r.PeakReserved>>20, ratio, r.SteadyDriverCalls, r.SteadySteps, r.SimDriverTime)
	assert.LessOrEqual(t, ratio, 1.03)
	assert.Positive(t, r.SteadySteps)
	assert.Zero(t, r.SteadyDriverCalls)
	c := replaySteps(t, events, "expandable_segments:False", warm)
	t.Logf("classic: ratio %.4f, %d driver calls in %d warm steps (%v simulated driver time in all)",
		float64(c.PeakReserved)/float64(c.PeakAllocated), c.SteadyDriverCalls, c.SteadySteps, c.SimDriverTime)
}
