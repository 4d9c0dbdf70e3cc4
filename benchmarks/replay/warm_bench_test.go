package replay

import (
	"path/filepath"
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
func BenchmarkWarmReplay(b *testing.B) {
	pt := loadSnapshot(b, filepath.Join(tracesDir(), "cs336_ctx128_fullstep.pickle"))
	var events []trace.Event
	for _, ev := range pt.Events {
		if ev.Kind == trace.Alloc || ev.Kind == trace.Free {
			events = append(events, ev)
		}
	}
	e, err := emulated.New(emulated.WithCapacity(80 << 30))
	if err != nil {
		b.Fatal(err)
	}
	a, err := allocator.New(e, allocator.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	live := make(map[uint64]uintptr)
	pass := func() int {
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
	}
	pass() // warm the cache
	driverCalls := func() int64 {
		var n int64
		for _, c := range e.CallCounts() {
			n += c
		}
		return n
	}
	before := driverCalls()
	calls := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		calls += pass()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls), "ns/call")
	b.ReportMetric(float64(driverCalls()-before)/float64(b.N), "driver-calls/op")
}
