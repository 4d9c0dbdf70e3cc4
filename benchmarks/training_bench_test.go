package benchmarks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// stepResult is what one replay of a training trace measured.
type stepResult struct {
	peakAllocated, peakReserved int64
	warmCalls                   int64 // driver calls after the warm-up steps
	warmSteps                   int64 // steps after warm-up
	driverTime                  float64
}

// replaySteps replays a training trace on a fresh allocator and counts the
// driver calls made after warmup Mark events.
func replaySteps(tb testing.TB, events []trace.Event, conf string, warmup uint64) stepResult {
	e, err := emulated.New(emulated.WithCostModel(emulated.DefaultCostModel()))
	require.NoError(tb, err)
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(tb, err)
	a, err := allocator.New(e, cfg)
	require.NoError(tb, err)
	defer a.Close()
	ptrs := make(map[uint64]uintptr, 1024)
	var r stepResult
	var base emulated.CallCounts
	warm := false
	for _, ev := range events {
		switch ev.Kind {
		case trace.Alloc:
			p, err := a.Malloc(ev.Size, 0)
			require.NoError(tb, err)
			ptrs[ev.ID] = p
		case trace.Free:
			require.NoError(tb, a.Free(ptrs[ev.ID]))
			delete(ptrs, ev.ID)
		case trace.Mark:
			if ev.ID == warmup {
				warm, base = true, e.CallCounts()
			}
			if warm {
				r.warmSteps++
			}
		}
	}
	if warm {
		r.warmSteps-- // marks open steps; the last one closes the run
		now := e.CallCounts()
		for op := range now {
			if backend.Op(op) != backend.OpMemGetInfo {
				r.warmCalls += now[op] - base[op]
			}
		}
	}
	st := a.Stats()
	r.peakAllocated = st.AllocatedBytes[0].Peak
	r.peakReserved = st.ReservedBytes[0].Peak
	r.driverTime = e.SimulatedTime().Seconds()
	return r
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
			var r stepResult
			for i := 0; i < b.N; i++ {
				r = replaySteps(b, events, mode.conf, warmupSteps(events))
			}
			b.ReportMetric(float64(r.peakReserved)/float64(r.peakAllocated), "reserved/allocated")
			b.ReportMetric(float64(r.warmCalls)/float64(max(r.warmSteps, 1)), "driver-calls/step")
			b.ReportMetric(float64(len(events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(r.driverTime*1e3, "sim-driver-ms")
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
	ratio := float64(r.peakReserved) / float64(r.peakAllocated)
	t.Logf("expandable: peak allocated %d MiB, peak reserved %d MiB, ratio %.4f, %d driver calls in %d warm steps",
		r.peakAllocated>>20, r.peakReserved>>20, ratio, r.warmCalls, r.warmSteps)
	assert.LessOrEqual(t, ratio, 1.03)
	assert.Zero(t, r.warmCalls)
	c := replaySteps(t, events, "expandable_segments:False", warm)
	t.Logf("classic: ratio %.4f, %d driver calls in %d warm steps",
		float64(c.peakReserved)/float64(c.peakAllocated), c.warmCalls, c.warmSteps)
}
