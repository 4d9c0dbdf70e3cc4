package host

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// BenchmarkPoliciesOnTraces replays the allocations of the shared PyTorch
// snapshots as pinned staging (every tensor staged through pinned memory,
// as BenchmarkSizeClassesOnTraces does) under the size classes, expandable
// segments, and expandable segments with pinned_release_on_grow (rog), three times
// over as three steps of a training loop (what is still live at the end
// of a step is freed). It reports held/live (peak pinned bytes over peak
// bytes asked for and live), hit% (Malloc calls served without pinning),
// pins (driver pin calls in all) and steady-pins (pin and unpin calls in
// the third step: the target is 0). Skips without the traces.
func BenchmarkPoliciesOnTraces(b *testing.B) {
	for _, st := range sharedTraces(b) {
		name, tr := st.name, st.trace
		for _, pol := range []string{"classes", "expandable", "expandable-rog"} {
			b.Run(name+"/"+pol, func(b *testing.B) {
				var r stepReplay
				for b.Loop() {
					r = replaySteps(b, tr.Events, "expandable_segments:"+map[string]string{"classes": "False", "expandable": "True", "expandable-rog": "True,pinned_release_on_grow:True"}[pol], 3)
				}
				b.ReportMetric(float64(r.st.ReservedBytes.Peak)/float64(r.st.RequestedBytes.Peak), "held/live")
				b.ReportMetric(100*float64(r.st.CacheHits)/float64(r.st.Allocation.Allocated), "hit%")
				b.ReportMetric(float64(r.st.NumHostAlloc), "pins")
				b.ReportMetric(float64(r.steady), "steady-pins")
				b.ReportMetric(float64(r.st.RequestedBytes.Peak)/(1<<20), "live-MiB")
			})
		}
	}
}

type stepReplay struct {
	st     Stats
	steady int64 // pin plus unpin calls of the last step
}

// replaySteps replays the Alloc and Free events of a trace steps times
// through one allocator of configuration conf (unlimited budget).
func replaySteps(b *testing.B, events []trace.Event, conf string, steps int) stepReplay {
	e, err := emulated.New(emulated.WithHostCapacity(1 << 50))
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := ParseConfig(conf + ",pinned_budget_mb:0")
	if err != nil {
		b.Fatal(err)
	}
	cfg.Budget = NewPinBudget(0)
	a, err := New(e, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	var r stepReplay
	for step := range steps {
		before := a.Stats()
		live := make(map[uint64]uintptr)
		for _, ev := range events {
			switch ev.Kind {
			case trace.Alloc:
				if ev.Size == 0 {
					continue
				}
				p, err := a.Malloc(ev.Size)
				if err != nil {
					b.Fatal(err)
				}
				live[ev.ID] = p
			case trace.Free:
				if p, ok := live[ev.ID]; ok {
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
					delete(live, ev.ID)
				}
			}
		}
		for _, p := range live {
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
		}
		if step == steps-1 {
			after := a.Stats()
			r.steady = after.NumHostAlloc - before.NumHostAlloc + after.NumHostFree - before.NumHostFree
		}
	}
	r.st = a.Stats()
	return r
}
