package galloc

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gogpu/galloc"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// rounds is how many times each benchmark alternates between the two
// allocators; each round times one share of b.N on each, in turn first.
const rounds = 20

// sideBySide runs vm and gal n times each in alternating rounds and
// reports the ns per unit of each (a run of vm or gal is perRun units)
// and their ratio.
func sideBySide(b *testing.B, n int, unit string, perRun int, vm, gal func(n int)) {
	per := max(n/rounds, 1)
	var tv, tg time.Duration
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		first, second, t1, t2 := vm, gal, &tv, &tg
		if r%2 == 1 {
			first, second, t1, t2 = gal, vm, &tg, &tv
		}
		start := time.Now()
		first(per)
		mid := time.Now()
		second(per)
		*t1 += mid.Sub(start)
		*t2 += time.Since(mid)
	}
	b.StopTimer()
	ops := float64(per * rounds * perRun)
	b.ReportMetric(float64(tv.Nanoseconds())/ops, "vmmalloc-ns/"+unit)
	b.ReportMetric(float64(tg.Nanoseconds())/ops, "galloc-ns/"+unit)
	b.ReportMetric(float64(tv)/float64(tg), "ratio")
}

func newAllocator(b *testing.B, capacity uint64) *allocator.Allocator {
	return newAllocatorConfig(b, capacity, allocator.DefaultConfig())
}

func newAllocatorConfig(b *testing.B, capacity uint64, cfg allocator.Config) *allocator.Allocator {
	e, err := emulated.New(emulated.WithCapacity(capacity))
	if err != nil {
		b.Fatal(err)
	}
	a, err := allocator.New(e, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

// BenchmarkCacheHit times Malloc(4096)+Free with 100 live blocks of mixed
// sizes around it, on vmmalloc's default pool or a private pool, and on a
// galloc.SyncAllocator holding the same live blocks.
func BenchmarkCacheHit(b *testing.B) {
	for _, pooled := range []bool{false, true} {
		name := "pool=default"
		if pooled {
			name = "pool=private"
		}
		b.Run(name, func(b *testing.B) {
			a := newAllocator(b, 80<<30)
			malloc := a.Malloc
			if pooled {
				p, err := a.NewPool(allocator.PoolOptions{Name: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				malloc = p.Malloc
			}
			g := galloc.NewSync(1<<30, 1<<12)
			for i := 0; i < 100; i++ {
				size := uint64(512 * (1 + i%7))
				if _, err := malloc(size, 0); err != nil {
					b.Fatal(err)
				}
				if g.Allocate(uint32(size)).Failed() {
					b.Fatal("galloc: no space")
				}
			}
			vm := func(n int) {
				for i := 0; i < n; i++ {
					p, err := malloc(4096, 0)
					if err != nil {
						b.Fatal(err)
					}
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			gal := func(n int) {
				for i := 0; i < n; i++ {
					al := g.Allocate(4096)
					if al.Failed() {
						b.Fatal("galloc: no space")
					}
					g.Free(al)
				}
			}
			vm(1)
			gal(1)
			b.ReportAllocs()
			sideBySide(b, b.N, "pair", 1, vm, gal)
		})
	}
}

// op is one call of the warm replay: a Malloc of size bytes whose result
// goes to slot, or (size 0) a Free of the block in slot.
type op struct {
	size uint64
	slot int32
}

// replayOps reads the Malloc and Free calls of a shared snapshot, every
// trace id resolved to a slot of its own allocation; frees of blocks
// allocated before recording began are left out.
func replayOps(b *testing.B, name string) ([]op, int) {
	// This module sits two levels below vmmalloc's root, beside which
	// the shared traces are (trace.SharedDir looks beside this module's).
	dir, err := trace.SharedDir()
	if err != nil {
		if dir = filepath.Join("..", "..", "..", "shared", "traces"); !isDir(dir) {
			b.Skip(err)
		}
	}
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		b.Skip(err)
	}
	defer f.Close()
	pt, err := trace.ImportPyTorchSnapshot(f, 0)
	if err != nil {
		b.Fatal(err)
	}
	var ops []op
	slotOf := make(map[uint64]int32)
	var n int32
	for _, ev := range pt.Events {
		switch {
		case ev.Kind == trace.Alloc && ev.Size != 0:
			slotOf[ev.ID] = n
			ops = append(ops, op{size: ev.Size, slot: n})
			n++
		case ev.Kind == trace.Free:
			if s, ok := slotOf[ev.ID]; ok {
				delete(slotOf, ev.ID)
				ops = append(ops, op{slot: s})
			}
		}
	}
	return ops, int(n)
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// BenchmarkWarmReplay replays the Malloc/Free calls of
// cs336_ctx128_fullstep on a warm vmmalloc allocator (80 GiB emulated
// device, default config) and on a galloc.SyncAllocator of 80 GiB in
// 512-byte units, one pass each per round, and reports ns per call. Blocks
// a pass leaves live are freed after it (counted as calls), so every pass
// starts from the same state.
func BenchmarkWarmReplay(b *testing.B) {
	warmReplaySideBySide(b, allocator.DefaultConfig(), false)
}

// BenchmarkWarmReplayPlanned is BenchmarkWarmReplay with planned steps
// on (planned_steps:True) and vmmalloc's MarkStep after each pass: the
// warm-up passes learn the step, and the timed passes are served from
// its plan.
func BenchmarkWarmReplayPlanned(b *testing.B) {
	cfg := allocator.DefaultConfig()
	cfg.PlannedSteps = true
	warmReplaySideBySide(b, cfg, true)
}

func warmReplaySideBySide(b *testing.B, cfg allocator.Config, step bool) {
	ops, slots := replayOps(b, "cs336_ctx128_fullstep.pickle")
	a := newAllocatorConfig(b, 80<<30, cfg)
	g := galloc.NewSync(80<<30/512, 1<<20)
	ptrs := make([]uintptr, slots)
	allocs := make([]galloc.Allocation, slots)
	live := make([]bool, slots)
	vm := func(n int) {
		for range n {
			for _, o := range ops {
				if o.size != 0 {
					p, err := a.Malloc(o.size, 0)
					if err != nil {
						b.Fatal(err)
					}
					ptrs[o.slot] = p
					continue
				}
				if err := a.Free(ptrs[o.slot]); err != nil {
					b.Fatal(err)
				}
				ptrs[o.slot] = 0
			}
			for i, p := range ptrs {
				if p != 0 {
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
					ptrs[i] = 0
				}
			}
			if step {
				if err := a.MarkStep(); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	gal := func(n int) {
		for range n {
			for _, o := range ops {
				if o.size != 0 {
					al := g.Allocate(uint32((o.size + 511) / 512))
					if al.Failed() {
						b.Fatal("galloc: no space")
					}
					allocs[o.slot], live[o.slot] = al, true
					continue
				}
				g.Free(allocs[o.slot])
				live[o.slot] = false
			}
			for i, l := range live {
				if l {
					g.Free(allocs[i])
					live[i] = false
				}
			}
		}
	}
	vm(1) // warm vmmalloc's cache
	if step {
		vm(3) // learn the step (two identical steps after the first MarkStep) and plan it
		if st := a.StepStats(); st.State != "planned" {
			b.Fatalf("the step is not planned: %+v", st)
		}
	}
	gal(1)
	// Calls per pass: the trace's, plus the frees of what it leaves live.
	calls := len(ops)
	for _, o := range ops {
		if o.size != 0 {
			live[o.slot] = true
		} else {
			live[o.slot] = false
		}
	}
	for i, l := range live {
		if l {
			calls++
			live[i] = false
		}
	}
	b.ReportAllocs()
	sideBySide(b, max(b.N, rounds), "call", calls, vm, gal)
}
