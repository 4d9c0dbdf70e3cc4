package fuzz

import (
	"errors"
	"sort"
	"testing"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// FuzzPlannedSteps learns a plan and then diverges at random points.
//
// The input's first bytes make a step: Mallocs of sizes from a small set
// (so that planned blocks share offsets) and Frees in an order the input
// picks, some blocks kept to the next step. The step is run until the
// default pool serves it from a plan; then every further step replays it
// with divergences the rest of the input chooses at chosen calls: another
// size, another stream, a Free skipped until later, a Free made early, an
// extra Malloc, RecordStream on another stream, EmptyCache, Sleep and
// Wake, MarkStep mid-step. After every operation Check runs and the live
// blocks, as the harness knows them, must not overlap.
func FuzzPlannedSteps(f *testing.F) {
	f.Add([]byte{6, 1, 2, 3, 1, 2, 3, 0, 1, 2, 3, 4, 5, 9, 3, 1, 4, 2, 7, 5})
	f.Add([]byte{8, 7, 0, 1, 2, 3, 4, 5, 6, 7, 200, 3, 0, 100, 1, 50, 2, 9, 3})
	f.Add([]byte{3, 0, 0, 0, 2, 1, 0, 1, 1, 4, 2, 8, 3, 6, 4, 2, 5})
	f.Fuzz(func(t *testing.T, in []byte) {
		runPlanned(t, in)
	})
}

// plannedSizes are the Malloc sizes of a planned-step input.
var plannedSizes = []uint64{512, 4096, 1 << 20, 3 << 20, 2<<20 + 512, 8 << 20, 700, 64 << 10}

type plannedHarness struct {
	t    *testing.T
	a    *allocator.Allocator
	e    *emulated.Emulator
	s2   backend.Stream
	live map[uintptr]uint64
}

func (h *plannedHarness) check(what string) {
	h.t.Helper()
	if err := h.a.Check(); err != nil {
		h.t.Fatalf("after %s: %v", what, err)
	}
	type span struct {
		p uintptr
		n uint64
	}
	var ss []span
	for p, n := range h.live {
		ss = append(ss, span{p, n})
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].p < ss[j].p })
	for i := 1; i < len(ss); i++ {
		if ss[i-1].p+uintptr(ss[i-1].n) > ss[i].p {
			h.t.Fatalf("after %s: live blocks %#x+%d and %#x+%d overlap", what, ss[i-1].p, ss[i-1].n, ss[i].p, ss[i].n)
		}
	}
}

func (h *plannedHarness) malloc(size uint64, s backend.Stream) uintptr {
	h.t.Helper()
	p, err := h.a.Malloc(size, s)
	if err != nil {
		var oom *allocator.OutOfMemoryError
		if errors.As(err, &oom) || errors.Is(err, allocator.ErrPoolAsleep) {
			return 0
		}
		h.t.Fatalf("Malloc(%d): %v", size, err)
	}
	h.live[p] = size
	h.check("Malloc")
	return p
}

func (h *plannedHarness) free(p uintptr) {
	h.t.Helper()
	if p == 0 {
		return
	}
	if err := h.a.Free(p); err != nil {
		h.t.Fatalf("Free(%#x): %v", p, err)
	}
	delete(h.live, p)
	h.check("Free")
}

func runPlanned(t *testing.T, in []byte) {
	if len(in) < 2 {
		return
	}
	e, err := emulated.New(emulated.WithCapacity(1 << 30))
	if err != nil {
		t.Fatal(err)
	}
	cfg := allocator.DefaultConfig()
	cfg.PlannedSteps = true
	a, err := allocator.New(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		_ = e.Close()
	}()
	s2, err := e.StreamCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	h := &plannedHarness{t: t, a: a, e: e, s2: s2, live: map[uintptr]uint64{}}

	// The step: n Mallocs, then Frees in the input's order; a block
	// whose byte is odd is freed between Mallocs, the others at the end,
	// and the last one is kept to the next step.
	n := int(in[0])%8 + 1
	in = in[1:]
	if len(in) < n {
		return
	}
	sizes := make([]uint64, n)
	early := make([]bool, n)
	for i := range n {
		sizes[i] = plannedSizes[in[i]%uint8(len(plannedSizes))]
		early[i] = in[i]&8 != 0
	}
	in = in[n:]
	var kept uintptr
	// divergeAt is the call (Malloc index) where a divergence of kind
	// happens in this step, or -1.
	step := func(divergeAt int, kind byte) {
		ptrs := make([]uintptr, n)
		var deferred []uintptr
		h.free(kept)
		kept = 0
		for i := range n {
			size, s := sizes[i], backend.Stream(0)
			if i == divergeAt {
				switch kind % 9 {
				case 0:
					size += 512
				case 1:
					s = h.s2
				case 2: // an extra Malloc, kept to the end
					deferred = append(deferred, h.malloc(4096, 0))
				case 3:
					if err := a.EmptyCache(); err != nil {
						t.Fatal(err)
					}
					h.check("EmptyCache")
				case 4:
					pool := a.DefaultPool()
					if err := pool.Sleep(allocator.SleepOptions{Mode: allocator.Discard}); err != nil {
						t.Fatal(err)
					}
					h.check("Sleep")
					if err := pool.Wake(); err != nil {
						t.Fatal(err)
					}
					h.check("Wake")
				case 5:
					if err := a.MarkStep(); err != nil {
						t.Fatal(err)
					}
					h.check("MarkStep")
				}
			}
			ptrs[i] = h.malloc(size, s)
			if i == divergeAt && kind%9 == 6 && ptrs[i] != 0 {
				if err := a.RecordStream(ptrs[i], h.s2); err != nil {
					t.Fatal(err)
				}
				h.check("RecordStream")
			}
			if early[i] && i > 0 {
				if i-1 == divergeAt && kind%9 == 7 { // a late Free
					deferred = append(deferred, ptrs[i-1])
				} else {
					h.free(ptrs[i-1])
				}
				ptrs[i-1] = 0
			}
		}
		for i := range n - 1 {
			if i == divergeAt && kind%9 == 8 {
				deferred = append(deferred, ptrs[i])
				continue
			}
			h.free(ptrs[i])
		}
		for _, p := range deferred {
			h.free(p)
		}
		kept = ptrs[n-1]
		if err := a.MarkStep(); err != nil {
			t.Fatal(err)
		}
		h.check("MarkStep")
	}
	for range 4 {
		step(-1, 0)
	}
	if st := a.StepStats(); n >= 2 && st.State != "planned" {
		t.Fatalf("after 4 identical steps of %d Mallocs: %+v, want planned", n, st)
	}
	for len(in) >= 2 {
		at := int(in[0]) % (n + 2) // n and n+1: no divergence
		if at >= n {
			at = -1
		}
		step(at, in[1])
		in = in[2:]
	}
	h.free(kept)
	if err := a.Synchronize(s2); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseStream(s2); err != nil {
		t.Fatal(err)
	}
	h.check("ReleaseStream")
}
