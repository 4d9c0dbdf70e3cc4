package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// BenchmarkSizeClassesOnTraces replays the allocations of real PyTorch
// snapshots through the host allocator, as if every tensor were staged
// through pinned memory (the llama7b trace offloads layers CPU↔GPU on side
// streams: its sizes are what a pinned pool sees), once per choice of
// pinned_roundup_power2_divisions. It reports held/live (peak pinned bytes
// held over peak bytes asked for and live), the share of Malloc calls
// served from the cache, and MallocHost calls. Skips without the traces.
func BenchmarkSizeClassesOnTraces(b *testing.B) {
	for _, st := range sharedTraces(b) {
		name, tr := st.name, st.trace
		for _, div := range []int{1, 2, 4, 8} {
			b.Run(name+"/div="+string(rune('0'+div)), func(b *testing.B) {
				var st Stats
				for b.Loop() {
					st = replayHost(b, tr.Events, div)
				}
				b.ReportMetric(float64(st.ReservedBytes.Peak)/float64(st.RequestedBytes.Peak), "held/live")
				b.ReportMetric(float64(st.AllocatedBytes.Peak)/float64(st.RequestedBytes.Peak), "class/live")
				b.ReportMetric(100*float64(st.CacheHits)/float64(st.Allocation.Allocated), "hit%")
				b.ReportMetric(float64(st.NumHostAlloc), "MallocHost")
			})
		}
	}
}

// namedTrace is a shared snapshot and its name (the file's, less .pickle).
type namedTrace struct {
	name  string
	trace *trace.PyTorchTrace
}

// sharedTraces reads the shared PyTorch snapshots (measurement input,
// never in the repository), skipping b without them; a file that does not
// import is logged and left out.
func sharedTraces(b *testing.B) []namedTrace {
	dir, err := trace.SharedDir()
	if err != nil {
		b.Skip(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.pickle"))
	if len(files) == 0 {
		b.Skip("no traces in " + dir)
	}
	var out []namedTrace
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			b.Fatal(err)
		}
		tr, err := trace.ImportPyTorchSnapshot(fh, 0)
		fh.Close()
		if err != nil {
			b.Logf("%s: %v", f, err)
			continue
		}
		out = append(out, namedTrace{strings.TrimSuffix(filepath.Base(f), ".pickle"), tr})
	}
	return out
}

// replayHost runs the Alloc and Free events of a trace through a fresh
// host allocator with div classes per power of two.
func replayHost(b *testing.B, events []trace.Event, div int) Stats {
	e, err := emulated.New(emulated.WithHostCapacity(1 << 50))
	if err != nil {
		b.Fatal(err)
	}
	a, err := New(e, Config{RoundupDivisions: div})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
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
	return a.Stats()
}
