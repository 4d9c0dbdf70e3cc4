package replay

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// BenchmarkWarmReplay replays the allocations and frees of the
// cs336_ctx128_fullstep snapshot (a GPT training step) straight against
// an allocator on the default stream, after one pass has warmed its cache,
// and reports ns per Malloc or Free call (ns/call) and the driver calls
// of the measured passes (driver-calls/op, 0 when the cache holds the
// step). Allocations the step leaves live are freed after each pass, so
// every pass starts from the same state. Skipped without the trace.
//
// Two ways of finding a free's pointer:
//
//	ids=map    a Go map from trace id to pointer, as a replay tool keeps
//	           it (the first figure reported; about a fifth of its time
//	           is the map's)
//	ids=dense  every trace id resolved up front to a slot of a slice, so
//	           that the figure is the allocator's calls and little else
func BenchmarkWarmReplay(b *testing.B) {
	pt := loadSnapshot(b, sharedTrace(b, "cs336_ctx128_fullstep.pickle"))
	var events []trace.Event
	for _, ev := range pt.Events {
		if ev.Kind == trace.Alloc || ev.Kind == trace.Free {
			events = append(events, ev)
		}
	}
	b.Run("ids=map", func(b *testing.B) {
		live := make(map[uint64]uintptr)
		warmReplay(b, func(a *allocator.Allocator) int {
			calls := 0
			for _, ev := range events {
				switch ev.Kind {
				case trace.Alloc:
					p, err := a.Malloc(ev.Size, 0)
					if err != nil {
						b.Fatal(err)
					}
					live[ev.ID] = p
				case trace.Free:
					p, ok := live[ev.ID]
					if !ok {
						continue // allocated before recording began
					}
					delete(live, ev.ID)
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
				}
				calls++
			}
			for id, p := range live {
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
				delete(live, id)
				calls++
			}
			return calls
		})
	})
	b.Run("ids=dense", func(b *testing.B) {
		ops, slots := denseOps(events)
		ptrs := make([]uintptr, slots) // 0: slot not live
		warmReplay(b, func(a *allocator.Allocator) int {
			return densePass(b, a, ops, ptrs)
		})
	})
	// Planned steps: MarkStep after each pass; the warm-up passes learn
	// the step and plan it, so the timed passes are served from the plan.
	b.Run("ids=dense/planned", func(b *testing.B) {
		ops, slots := denseOps(events)
		ptrs := make([]uintptr, slots)
		cfg := allocator.DefaultConfig()
		cfg.PlannedSteps = true
		warmReplayConfig(b, cfg, 4, func(a *allocator.Allocator) int {
			calls := densePass(b, a, ops, ptrs)
			if err := a.MarkStep(); err != nil {
				b.Fatal(err)
			}
			return calls
		}, func(a *allocator.Allocator) {
			if st := a.StepStats(); st.State != "planned" || st.Divergences != 0 {
				b.Fatalf("the step is not planned: %+v", st)
			}
		})
	})
}

// densePass runs ops once on a with pointers in ptrs (0: slot not
// live), frees what the pass leaves live, and returns the calls made.
func densePass(b *testing.B, a *allocator.Allocator, ops []warmOp, ptrs []uintptr) int {
	for _, op := range ops {
		if op.size != 0 {
			p, err := a.Malloc(op.size, 0)
			if err != nil {
				b.Fatal(err)
			}
			ptrs[op.slot] = p
			continue
		}
		p := ptrs[op.slot]
		ptrs[op.slot] = 0
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	calls := len(ops)
	for i, p := range ptrs {
		if p != 0 {
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
			ptrs[i] = 0
			calls++
		}
	}
	return calls
}

// warmReplay runs pass once to warm a fresh allocator's cache, then b.N
// times timed, and reports ns per call and driver calls per pass.
func warmReplay(b *testing.B, pass func(*allocator.Allocator) int) {
	warmReplayConfig(b, allocator.DefaultConfig(), 1, pass, nil)
}

// warmReplayConfig is warmReplay with cfg and warm passes before the
// timed ones; verify, if not nil, runs after them.
func warmReplayConfig(b *testing.B, cfg allocator.Config, warm int, pass func(*allocator.Allocator) int, verify func(*allocator.Allocator)) {
	e, err := emulated.New(emulated.WithCapacity(80 << 30))
	if err != nil {
		b.Fatal(err)
	}
	a, err := allocator.New(e, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	for range warm {
		pass(a) // warm the cache
	}
	driverCalls := func() int64 {
		var n int64
		for _, c := range e.CallCounts() {
			n += c
		}
		return n
	}
	before, sim0 := driverCalls(), e.SimulatedTime()
	calls := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		calls += pass(a)
	}
	b.StopTimer()
	if verify != nil {
		verify(a)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls), "ns/call")
	b.ReportMetric(float64(driverCalls()-before)/float64(b.N), "driver-calls/op")
	b.ReportMetric(float64((e.SimulatedTime()-sim0).Nanoseconds())/float64(b.N), "sim-driver-ns/op")
}
