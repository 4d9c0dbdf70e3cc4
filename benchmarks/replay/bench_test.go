package replay

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// sharedTrace returns the path of the real trace name
// (trace.SharedFile), skipping tb when it is not there.
func sharedTrace(tb testing.TB, name string) string {
	tb.Helper()
	p, err := trace.SharedFile(name)
	if err != nil {
		tb.Skip(err)
	}
	return p
}

// sharedTraces returns the real PyTorch snapshots (trace.SharedDir),
// skipping tb when there are none.
func sharedTraces(tb testing.TB) []string {
	tb.Helper()
	dir, err := trace.SharedDir()
	if err != nil {
		tb.Skip(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.pickle"))
	if len(files) == 0 {
		tb.Skipf("no *.pickle in %s", dir)
	}
	return files
}

// studyPolicies are the two policies every study compares.
var studyPolicies = []Policy{
	{Name: "expandable", Config: ""},
	{Name: "classic", Config: "expandable_segments:False"},
}

// bigTraining is a longer training run for speed measurements (~0.5 M
// events).
var bigTraining = sync.OnceValues(func() ([]trace.Event, error) {
	cfg := workload.DefaultTrainingConfig()
	cfg.Steps = 400
	return workload.TransformerTraining(cfg, 1)
})

// studyBench replays events under each study policy, reporting
// reserved/live, mincap/live, driver calls and events/s.
func studyBench(b *testing.B, events []trace.Event) {
	for _, p := range studyPolicies {
		b.Run(p.Name, func(b *testing.B) {
			cfg, err := allocator.ParseConfig(p.Config)
			if err != nil {
				b.Fatal(err)
			}
			mc, err := SearchMinCapacity(events, cfg, Options{})
			if err != nil {
				b.Fatal(err)
			}
			var rep *Report
			var events64 int64
			for b.Loop() {
				rep, err = Run(trace.NewSliceReader(events), Options{Name: p.Name, Config: cfg})
				if err != nil {
					b.Fatal(err)
				}
				events64 += rep.Events
			}
			b.ReportMetric(rep.ReservedOverLive, "reserved/live")
			b.ReportMetric(mc.OverLive, "mincap/live")
			b.ReportMetric(float64(rep.DriverCallsTotal), "driver-calls")
			b.ReportMetric(float64(rep.SimDriverTime.Microseconds())/1e3, "sim-driver-ms")
			b.ReportMetric(float64(events64)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkWorkloads replays each generated workload (default configs,
// seed 1) and a long training run.
func BenchmarkWorkloads(b *testing.B) {
	for _, name := range workload.Names() {
		b.Run(name, func(b *testing.B) {
			events, _, err := workload.Generate(name, 1)
			if err != nil {
				b.Fatal(err)
			}
			studyBench(b, events)
		})
	}
	b.Run("training-400steps", func(b *testing.B) {
		events, err := bigTraining()
		if err != nil {
			b.Fatal(err)
		}
		studyBench(b, events)
	})
}

// BenchmarkPyTorchTraces replays every PyTorch snapshot in the traces
// directory; it is skipped when there is none.
func BenchmarkPyTorchTraces(b *testing.B) {
	files := sharedTraces(b)
	for _, path := range files {
		b.Run(strings.TrimSuffix(filepath.Base(path), ".pickle"), func(b *testing.B) {
			pt := loadSnapshot(b, path)
			studyBench(b, pt.Events)
			b.Logf("PyTorch recorded: peak reserved %d, peak live %d, ratio %.4f", pt.PeakReserved, pt.PeakLive, ratio(pt.PeakReserved, pt.PeakLive))
		})
	}
}

// loadSnapshot imports a PyTorch snapshot, skipping when it is absent.
func loadSnapshot(tb testing.TB, path string) *trace.PyTorchTrace {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Skipf("trace not available: %v", err)
	}
	defer f.Close()
	pt, err := trace.ImportPyTorchSnapshot(f, 0)
	if err != nil {
		tb.Fatalf("importing %s: %v", path, err)
	}
	return pt
}
