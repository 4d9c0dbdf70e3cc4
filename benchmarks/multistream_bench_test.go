package benchmarks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// multiStreamModes are the policies the multi-stream study compares: the
// default expandable policy (which takes idle streams' memory back before
// growing), expandable without it (defrag_threshold:off: each stream keeps
// its own cache, as before), and PyTorch's classic algorithm.
var multiStreamModes = []struct{ name, conf string }{
	{"expandable", ""},
	{"expandable-per-stream", "defrag_threshold:off"},
	{"classic", "expandable_segments:False"},
}

// BenchmarkMultiStreamWorkload replays the synthetic offloaded-inference
// run (workload.MultiStream: weights prefetched on 8 side streams, used
// and freed by the compute stream, activations offloaded) and reports
// peak reserved / peak live and driver calls per step, over the whole run
// and after the first step.
func BenchmarkMultiStreamWorkload(b *testing.B) {
	events, err := workload.MultiStream(workload.DefaultMultiStreamConfig(), 1)
	require.NoError(b, err)
	for _, mode := range multiStreamModes {
		b.Run(mode.name, func(b *testing.B) {
			var r *replay.Report
			for i := 0; i < b.N; i++ {
				r = replaySteps(b, events, mode.conf, 1)
			}
			steps := float64(workload.DefaultMultiStreamConfig().Steps)
			b.ReportMetric(float64(r.PeakReserved)/float64(r.PeakLive), "reserved/live")
			b.ReportMetric(float64(r.DriverCallsTotal)/steps, "driver-calls/step")
			b.ReportMetric(float64(r.SimDriverTime.Microseconds())/steps, "sim-driver-µs/step")
			// From Mark 1 to the end: every step but the first.
			b.ReportMetric(float64(r.SteadyDriverCalls)/(steps-1), "warm-driver-calls/step")
			b.ReportMetric(float64(len(events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// TestMultiStreamWorkloadTargets: on the synthetic multi-stream run, the
// default expandable policy reserves within 10% of peak live, where each
// stream keeping its own cache (and the classic algorithm) reserve more
// than twice it; the invariants hold after the replay.
func TestMultiStreamWorkloadTargets(t *testing.T) {
	events, err := workload.MultiStream(workload.DefaultMultiStreamConfig(), 1)
	require.NoError(t, err)
	ratios := map[string]float64{}
	for _, mode := range multiStreamModes {
		r := replaySteps(t, events, mode.conf, 1)
		ratios[mode.name] = float64(r.PeakReserved) / float64(r.PeakLive)
		t.Logf("%-22s reserved/live %.4f, %d driver calls (%d after the first step), %v simulated driver time",
			mode.name, ratios[mode.name], r.DriverCallsTotal, r.SteadyDriverCalls, r.SimDriverTime)
	}
	assert.LessOrEqual(t, ratios["expandable"], 1.10)
	assert.Greater(t, ratios["expandable-per-stream"], 2.0)
	assert.Greater(t, ratios["classic"], 2.0)
}
