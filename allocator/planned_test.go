package allocator

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

const plannedConf = "planned_steps:True"

// stepOp is one call of a test step: a Malloc of size bytes into slot, or
// (size 0) a Free of slot.
type stepOp struct {
	slot int
	size uint64
}

// trainStep is a small training step: activations born and freed within
// it (planned), one small block, and a block kept to the next step (slot
// 9, freed at the start of the next one: a heap entry).
var trainStep = []stepOp{
	{9, 0}, // last step's kept block
	{0, 4 << 20}, {1, 1 << 20}, {0, 0}, {2, 3 << 20}, {3, 1000},
	{9, 2 << 20}, {1, 0}, {4, 6 << 20}, {2, 0}, {3, 0}, {4, 0},
}

// runner replays steps on an allocator, checking after every call.
type runner struct {
	t     *testing.T
	a     *Allocator
	e     *emulated.Emulator
	p     *Pool // nil: the default pool
	s     backend.Stream
	ptrs  map[int]uintptr
	addrs []uintptr // addresses of the last step's Mallocs, in order
}

func newRunner(t *testing.T, a *Allocator, e *emulated.Emulator) *runner {
	return &runner{t: t, a: a, e: e, ptrs: map[int]uintptr{}}
}

func (r *runner) malloc(size uint64) (uintptr, error) {
	if r.p != nil {
		return r.p.Malloc(size, r.s)
	}
	return r.a.Malloc(size, r.s)
}

func (r *runner) step(ops []stepOp) {
	r.t.Helper()
	r.addrs = r.addrs[:0]
	for _, op := range ops {
		if op.size == 0 {
			if p, ok := r.ptrs[op.slot]; ok {
				require.NoError(r.t, r.a.Free(p))
				delete(r.ptrs, op.slot)
			}
		} else {
			p, err := r.malloc(op.size)
			require.NoError(r.t, err)
			r.ptrs[op.slot] = p
			r.addrs = append(r.addrs, p)
		}
		mustCheck(r.t, r.a, r.e)
	}
	if r.p != nil {
		require.NoError(r.t, r.p.MarkStep())
	} else {
		require.NoError(r.t, r.a.MarkStep())
	}
	mustCheck(r.t, r.a, r.e)
}

func (r *runner) state() string {
	if r.p != nil {
		return r.p.StepStats().State
	}
	return r.a.StepStats().State
}

func driverCalls(s stats.DeviceStats) int64 {
	return s.NumDeviceAlloc + s.NumDeviceFree + s.HandlesCreated + s.HandlesFreed
}

func TestPlannedStepsLearnPlanServe(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	assert.Equal(t, "unmarked", r.state())
	r.step(trainStep[1:]) // before the first MarkStep: not recorded
	assert.Equal(t, "learning", r.state())
	r.step(trainStep)
	assert.Equal(t, "learning", r.state(), "one step learned: nothing to compare with")
	r.step(trainStep)
	require.Equal(t, "planned", r.state())
	ss := a.StepStats()
	assert.Equal(t, 6, ss.Mallocs)
	assert.Equal(t, 5, ss.PlannedBlocks, "the kept block is a heap entry")
	assert.GreaterOrEqual(t, ss.PlanBytes, ss.PeakLiveBytes)
	// The step's peak of planned blocks: 3 MiB + 1000 B (512-rounded to
	// 1024) + 1 MiB + ... computed by hand: {1,2,3} live = 1+3 MiB + 1 KiB,
	// then {2,3,4} = 3+6 MiB + 1 KiB.
	assert.Equal(t, uint64(9<<20+1024), ss.PeakLiveBytes)

	before := a.Stats()
	var first []uintptr
	for i := 0; i < 4; i++ {
		r.step(trainStep)
		assert.Equal(t, "planned", r.state())
		if i == 0 {
			first = append(first, r.addrs...)
		} else {
			assert.Equal(t, first, r.addrs, "a planned step hands out the same addresses")
		}
	}
	after := a.Stats()
	assert.Equal(t, driverCalls(before), driverCalls(after), "no driver call in steady steps")
	assert.Equal(t, before.ReservedBytes[stats.AllPools].Current, after.ReservedBytes[stats.AllPools].Current)
	assert.Equal(t, uint64(0), a.StepStats().Divergences)
	// Statistics count planned blocks as blocks.
	assert.Equal(t, before.Allocation[stats.AllPools].Allocated+4*6, after.Allocation[stats.AllPools].Allocated)
}

func TestPlannedStepsConfig(t *testing.T) {
	tests := []struct {
		conf, want string
	}{
		{"", "planned"}, // on by default
		{"planned_steps:True", "planned"},
		{"planned_steps:False", "off"},
	}
	for _, tc := range tests {
		t.Run(tc.conf, func(t *testing.T) {
			a, e := newAlloc(t, tc.conf)
			r := newRunner(t, a, e)
			for i := 0; i < 4; i++ {
				r.step(trainStep)
			}
			assert.Equal(t, tc.want, a.StepStats().State)
		})
	}
	cfg, err := ParseConfig("planned_steps:False")
	require.NoError(t, err)
	assert.Contains(t, cfg.String(), "planned_steps:False")
	assert.NotContains(t, DefaultConfig().String(), "planned_steps")
	_, err = ParseConfig("planned_steps:maybe")
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// TestPlannedStepsUnmarked: without MarkStep, planning changes nothing:
// the same addresses and driver calls as with it off.
func TestPlannedStepsUnmarked(t *testing.T) {
	run := func(conf string) ([]uintptr, int64) {
		a, e := newAlloc(t, conf)
		var addrs []uintptr
		for i := 0; i < 4; i++ {
			ptrs := map[int]uintptr{}
			for _, op := range trainStep {
				if op.size == 0 {
					if p, ok := ptrs[op.slot]; ok {
						require.NoError(t, a.Free(p))
					}
					continue
				}
				p, err := a.Malloc(op.size, 0)
				require.NoError(t, err)
				ptrs[op.slot] = p
				addrs = append(addrs, p)
			}
			require.NoError(t, a.Free(ptrs[9]))
		}
		mustCheck(t, a, e)
		if conf == "" {
			assert.Equal(t, "unmarked", a.StepStats().State)
		}
		return addrs, driverCalls(a.Stats())
	}
	on, onCalls := run("")
	off, offCalls := run("planned_steps:False")
	assert.Equal(t, off, on)
	assert.Equal(t, offCalls, onCalls)
}

func TestPlannedStepsDivergence(t *testing.T) {
	other := append([]stepOp(nil), trainStep...)
	other[4] = stepOp{2, 5 << 20} // another size at the fourth call
	tests := []struct {
		name  string
		steps [][]stepOp
		want  []string // state after each step
	}{
		{"one diverged step returns to the plan", [][]stepOp{trainStep, other, trainStep}, []string{"planned", "planned", "planned"}},
		{"two in a row re-learn", [][]stepOp{other, other}, []string{"planned", "learning"}},
		{"a short step is a divergence", [][]stepOp{{{9, 0}, {0, 4 << 20}, {0, 0}}, trainStep}, []string{"planned", "planned"}},
		{"re-learns the new step", [][]stepOp{other, other, other, other}, []string{"planned", "learning", "learning", "planned"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, plannedConf)
			r := newRunner(t, a, e)
			for i := 0; i < 3; i++ {
				r.step(trainStep)
			}
			require.Equal(t, "planned", r.state())
			for i, s := range tc.steps {
				r.step(s)
				assert.Equal(t, tc.want[i], r.state(), "after step %d", i)
			}
		})
	}
}

func TestPlannedStepsLateFreeDiverges(t *testing.T) {
	// Block 0 is freed after block 2 is born: the plan may have put 2
	// where 0 was, so Malloc 2 must not be served from the plan.
	late := []stepOp{{0, 4 << 20}, {1, 1 << 20}, {2, 3 << 20}, {0, 0}, {1, 0}, {2, 0}}
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	require.Equal(t, "planned", r.state())
	r.step(late)
	assert.Equal(t, uint64(1), a.StepStats().Divergences)
	assert.Equal(t, "planned", r.state())
}

func TestPlannedStepsLiveAtMarkStepRelearns(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	keep := append([]stepOp(nil), trainStep[:len(trainStep)-1]...) // block 4 stays live
	r.step(keep)
	assert.Equal(t, "learning", r.state(), "a live planned block at MarkStep: the region is retired")
	require.NoError(t, a.Free(r.ptrs[4]))
	delete(r.ptrs, 4)
	mustCheck(t, a, e)
	for i := 0; i < 2; i++ {
		r.step(trainStep)
	}
	assert.Equal(t, "planned", r.state())
}

func TestPlannedStepsRecordStream(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	p0, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	reg := a.StepStats()
	require.Equal(t, "planned", reg.State)
	require.NoError(t, a.RecordStream(p0, s2))
	assert.Equal(t, "learning", a.StepStats().State, "a planned block recorded on another stream retires the region")
	mustCheck(t, a, e)
	// Work queued on s2: the region's memory waits for it.
	require.NoError(t, e.Hold(s2))
	require.NoError(t, a.Free(p0))
	mustCheck(t, a, e)
	assert.Positive(t, a.Stats().ActiveBytes[stats.AllPools].Current, "the region is pending on s2's event")
	require.NoError(t, e.Resume(s2))
	require.NoError(t, a.Synchronize(s2))
	mustCheck(t, a, e)
	// A step that records a block on s2 every time plans without it.
	for i := 0; i < 4; i++ {
		p, err := a.Malloc(4<<20, 0)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s2))
		q, err := a.Malloc(1<<20, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Free(q))
		require.NoError(t, a.MarkStep())
		mustCheck(t, a, e)
	}
	ss := a.StepStats()
	assert.Equal(t, "planned", ss.State)
	assert.Equal(t, 1, ss.PlannedBlocks, "the recorded block stays in the heap")
	require.NoError(t, a.Synchronize(s2))
	require.NoError(t, a.ReleaseStream(s2))
	require.NoError(t, e.StreamDestroy(s2))
}

func TestPlannedStepsStreams(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	r := newRunner(t, a, e)
	r.s = s2
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	require.Equal(t, "planned", r.state())
	r.s = 0 // the same sizes on another stream: diverges
	r.step(trainStep)
	assert.Equal(t, uint64(1), a.StepStats().Divergences)
	r.s = s2
	r.step(trainStep)
	assert.Equal(t, "planned", r.state())
	require.NoError(t, a.ReleaseStream(s2))
	assert.Equal(t, "learning", r.state(), "releasing the plan's stream drops the region")
	mustCheck(t, a, e)
	require.NoError(t, e.StreamDestroy(s2))
}

func TestPlannedStepsPool(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	p, err := a.NewPool(PoolOptions{Name: "graphs"})
	require.NoError(t, err)
	r := newRunner(t, a, e)
	r.p = p
	for i := 0; i < 4; i++ {
		r.step(trainStep)
	}
	assert.Equal(t, "planned", p.StepStats().State)
	assert.Equal(t, "unmarked", a.StepStats().State)
	// The default pool's Mallocs do not touch the pool's plan.
	x, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	r.step(trainStep)
	assert.Equal(t, uint64(0), p.StepStats().Divergences)
	require.NoError(t, a.Free(x))
	ps := p.Stats()
	assert.Equal(t, int64(2<<20), ps.AllocatedBytes[stats.AllPools].Current, "the kept block")
	require.NoError(t, a.Free(r.ptrs[9]))
	delete(r.ptrs, 9)
	require.NoError(t, p.Close(), "an idle region does not keep the pool busy")
	mustCheck(t, a, e)
}

func TestPlannedStepsEmptyCacheAndSleep(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	require.Equal(t, "planned", r.state())
	require.NoError(t, a.EmptyCache())
	assert.Equal(t, "learning", r.state())
	mustCheck(t, a, e)
	for i := 0; i < 2; i++ {
		r.step(trainStep)
	}
	require.Equal(t, "planned", r.state())
	// Sleep a planned pool mid-step: the step diverges; after Wake the
	// plan serves again.
	p0, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.DefaultPool().Sleep(SleepOptions{Mode: Discard}))
	mustCheck(t, a, e)
	require.NoError(t, a.Free(p0))
	require.NoError(t, a.DefaultPool().Wake())
	mustCheck(t, a, e)
	require.NoError(t, a.MarkStep())
	before := driverCalls(a.Stats())
	for i := 0; i < 2; i++ {
		r.step(trainStep)
		assert.Equal(t, "planned", r.state())
	}
	assert.Equal(t, before, driverCalls(a.Stats()))
}

func TestPlannedStepsMisuse(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	p0, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	p1, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p0))
	assert.ErrorIs(t, a.Free(p0), ErrDoubleFree)
	assert.ErrorIs(t, a.Free(p1+512), ErrInteriorPointer)
	assert.ErrorIs(t, a.RecordStream(p0, 0), ErrDoubleFree)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(p1))
	mustCheck(t, a, e)
	require.NoError(t, a.Close())
	assert.ErrorIs(t, a.Free(p1), ErrClosed)
	assert.ErrorIs(t, a.MarkStep(), ErrClosed)
}

func TestPlannedStepsNoAllocs(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step([]stepOp{{0, 4 << 20}, {1, 1 << 20}, {0, 0}, {1, 0}})
	}
	require.Equal(t, "planned", r.state())
	sizes := []uint64{4 << 20, 1 << 20}
	allocs := testing.AllocsPerRun(20, func() {
		p0, _ := a.Malloc(sizes[0], 0)
		p1, _ := a.Malloc(sizes[1], 0)
		_ = a.Free(p0)
		_ = a.Free(p1)
		_ = a.MarkStep()
	})
	assert.Zero(t, allocs)
	assert.Equal(t, "planned", a.StepStats().State)
}

func TestPlannedStepsSpans(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	p0, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	p1, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	require.Equal(t, "planned", a.StepStats().State)
	for _, c := range []struct {
		p    uintptr
		size uint64
	}{{p0, 4 << 20}, {p1, 1 << 20}} {
		size, spans, err := a.Spans(c.p)
		require.NoError(t, err)
		assert.Equal(t, c.size, size)
		var n uint64
		for _, s := range spans {
			n += s.Size
			assert.True(t, s.VA <= c.p+uintptr(c.size) && s.VA+uintptr(s.Size) > c.p, "span %+v outside the block", s)
		}
		assert.GreaterOrEqual(t, n, c.size)
	}
	require.NoError(t, a.Free(p0))
	_, _, err = a.Spans(p0)
	assert.ErrorIs(t, err, ErrDoubleFree)
	require.NoError(t, a.Free(p1))
	mustCheck(t, a, e)
}

func TestPlannedStepsHistoryStacks(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	r.step(trainStep)
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 1000, Stacks: true}))
	r.step(trainStep) // learning: the general path, with stacks
	rec, ok := a.History()
	require.True(t, ok)
	require.NotEmpty(t, rec.Entries)
	found := false
	for _, en := range rec.Entries {
		if en.Action == stats.TraceAlloc && en.Stack > 0 {
			f := firstFrame(t, rec.Stacks[en.Stack-1])
			assert.Equal(t, "github.com/vmmalloc/vmmalloc/allocator.(*runner).malloc", f.Function, "the stack starts at Malloc's caller")
			found = true
		}
	}
	assert.True(t, found)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	assert.Equal(t, "learning", a.StepStats().State, "with history on, a step is not planned: every block gets its stack")
	mustCheck(t, a, e)
}

func TestPlannedStepsOOMReleasesIdleRegion(t *testing.T) {
	a, e := newAlloc(t, plannedConf, emulated.WithCapacity(64<<20))
	r := newRunner(t, a, e)
	small := []stepOp{{0, 20 << 20}, {1, 20 << 20}, {0, 0}, {1, 0}}
	for i := 0; i < 3; i++ {
		r.step(small)
	}
	require.Equal(t, "planned", r.state())
	require.Positive(t, a.StepStats().RegionBytes)
	// Another pool needs nearly the whole device: the idle region goes
	// back to the heap instead of an out-of-memory error.
	p, err := a.NewPool(PoolOptions{Name: "eval"})
	require.NoError(t, err)
	x, err := p.Malloc(50<<20, 0)
	require.NoError(t, err)
	assert.Equal(t, "learning", r.state())
	mustCheck(t, a, e)
	require.NoError(t, a.Free(x))
	mustCheck(t, a, e)
}

func TestPlannedStepsSnapshot(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	p0, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	p1, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	require.Equal(t, "planned", a.StepStats().State)
	snap := a.Snapshot()
	seen := map[uintptr]stats.BlockInfo{}
	var allocated uint64
	for _, sg := range snap.Segments {
		var at uintptr = sg.Address
		for _, b := range sg.Blocks {
			require.Equal(t, at, b.Address, "blocks tile the segment")
			at += uintptr(b.Size)
			if b.State == stats.BlockActiveAllocated {
				seen[b.Address] = b
				allocated += b.Size
			}
		}
		require.Equal(t, sg.Address+uintptr(sg.TotalSize), at)
	}
	require.Contains(t, seen, p0)
	require.Contains(t, seen, p1)
	assert.Equal(t, uint64(4<<20), seen[p0].Size)
	assert.Equal(t, uint64(1<<20), seen[p1].RequestedSize)
	st := a.Stats()
	assert.Equal(t, st.AllocatedBytes[stats.AllPools].Current, int64(allocated), "the snapshot's allocated blocks are the statistics'")
	assert.Equal(t, int64(2), st.Allocation[stats.AllPools].Current-int64(len(r.ptrs)), "two planned blocks besides the kept one")
	require.NoError(t, a.Free(p0))
	require.NoError(t, a.Free(p1))
	mustCheck(t, a, e)
}

// TestPlannedStepsConcurrent: goroutines on streams of their own make a
// step's calls concurrently, so the order of the step's calls differs
// from step to step; planning must stay safe (no overlapping live
// blocks, Check clean) whatever it decides.
func TestPlannedStepsConcurrent(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	const workers = 4
	streams := make([]backend.Stream, workers)
	for i := range streams {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams[i] = s
	}
	for step := 0; step < 12; step++ {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(s backend.Stream) {
				defer wg.Done()
				var ptrs []uintptr
				for _, size := range []uint64{1 << 20, 3 << 20, 512, 2 << 20} {
					p, err := a.Malloc(size, s)
					if err != nil {
						errs <- err
						return
					}
					ptrs = append(ptrs, p)
				}
				for _, p := range ptrs {
					if err := a.Free(p); err != nil {
						errs <- err
						return
					}
				}
			}(streams[w])
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, a.MarkStep())
		mustCheck(t, a, e)
	}
	for _, s := range streams {
		require.NoError(t, a.Synchronize(s))
		require.NoError(t, a.ReleaseStream(s))
		require.NoError(t, e.StreamDestroy(s))
	}
	mustCheck(t, a, e)
}

func TestPlannedStepsRelearnsForgiven(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	r := newRunner(t, a, e)
	short := []stepOp{{0, 4 << 20}, {1, 1 << 20}, {0, 0}, {1, 0}}
	other := []stepOp{{0, 5 << 20}, {1, 1 << 20}, {0, 0}, {1, 0}}
	relearns := func() int { return a.planned.def.relearns }
	for i := 0; i < 3; i++ {
		r.step(short)
	}
	require.Equal(t, "planned", r.state())
	// An evaluation of two steps: a re-learn, then the training step's
	// plan is learned again.
	evaluate := func() {
		r.step(other)
		r.step(other)
		require.Equal(t, "learning", r.state())
		for i := 0; i < 2; i++ {
			r.step(short)
		}
		require.Equal(t, "planned", r.state())
	}
	for i := 1; i <= 3; i++ {
		evaluate()
		require.Equal(t, i, relearns())
	}
	for i := 0; i < forgiveAfter; i++ {
		r.step(short)
	}
	assert.Zero(t, relearns(), "a long run of planned steps forgives the re-learns")
	evaluate()
	assert.Equal(t, "planned", r.state(), "a fourth evaluation does not turn planning off")
}

func TestPlannedStepsPrivatePoolSleepWake(t *testing.T) {
	a, e := newAlloc(t, plannedConf)
	p, err := a.NewPool(PoolOptions{Name: "actor"})
	require.NoError(t, err)
	r := newRunner(t, a, e)
	r.p = p
	for i := 0; i < 3; i++ {
		r.step(trainStep)
	}
	require.Equal(t, "planned", r.state())
	region := p.StepStats().RegionBytes
	require.NoError(t, p.Sleep(SleepOptions{Mode: Discard}))
	mustCheck(t, a, e)
	assert.Zero(t, p.MemoryReserved(), "asleep, the region's memory is given back too")
	_, err = p.Malloc(4<<20, 0)
	assert.ErrorIs(t, err, ErrPoolAsleep)
	require.NoError(t, p.MarkStep())
	assert.Equal(t, "diverged", r.state(), "held while asleep")
	require.NoError(t, p.Wake())
	mustCheck(t, a, e)
	require.NoError(t, p.MarkStep())
	assert.Equal(t, "planned", r.state())
	before := driverCalls(a.Stats())
	r.step(trainStep)
	r.step(trainStep)
	assert.Equal(t, "planned", r.state())
	assert.Equal(t, before, driverCalls(a.Stats()), "the same region serves after Wake")
	assert.Equal(t, region, p.StepStats().RegionBytes)
	assert.Zero(t, p.StepStats().Divergences, "a sleep is not the step's divergence")
}

// TestPlannedStepsBadInput: in every step state (learning, planned, and
// at the first call of a planned step), a Malloc of a size no device
// holds, a Free of a pointer the allocator never gave out and a Malloc on
// a destroyed stream answer a typed error and change nothing: the heap's
// Check passes, the state is unchanged or diverged (never planned with a
// wrong block), and the next steps still run and plan.
func TestPlannedStepsBadInput(t *testing.T) {
	const maxU = ^uint64(0)
	bad := []struct {
		name string
		call func(a *Allocator, dead backend.Stream) error
		want error
	}{
		{"Malloc(0)", func(a *Allocator, _ backend.Stream) error { _, err := a.Malloc(0, 0); return err }, ErrInvalidSize},
		{"Malloc(2^64-1)", func(a *Allocator, _ backend.Stream) error { _, err := a.Malloc(maxU, 0); return err }, ErrInvalidSize},
		{"Malloc(2^64-511)", func(a *Allocator, _ backend.Stream) error { _, err := a.Malloc(maxU-510, 0); return err }, ErrInvalidSize},
		{"Malloc(2^63)", func(a *Allocator, _ backend.Stream) error { _, err := a.Malloc(1<<63, 0); return err }, ErrInvalidSize},
		{"Free(0)", func(a *Allocator, _ backend.Stream) error { return a.Free(0) }, ErrUnknownPointer},
		{"Free(^0)", func(a *Allocator, _ backend.Stream) error { return a.Free(^uintptr(0)) }, ErrUnknownPointer},
		{"Malloc on a destroyed stream", func(a *Allocator, dead backend.Stream) error { _, err := a.Malloc(4<<20, dead); return err }, ErrInvalidStream},
	}
	for _, steps := range []int{1, 3} { // learning after one step; planned after three
		for _, tc := range bad {
			t.Run(tc.name+"/after "+string(rune('0'+steps))+" steps", func(t *testing.T) {
				a, e := newAlloc(t, plannedConf)
				r := newRunner(t, a, e)
				for range steps {
					r.step(trainStep)
				}
				dead, err := e.StreamCreate(0)
				require.NoError(t, err)
				require.NoError(t, e.StreamDestroy(dead))
				before := a.Stats()
				err = tc.call(a, dead)
				require.Error(t, err)
				assert.ErrorIs(t, err, tc.want)
				assert.Equal(t, before.AllocatedBytes, a.Stats().AllocatedBytes)
				assert.Equal(t, before.ReservedBytes, a.Stats().ReservedBytes)
				mustCheck(t, a, e)
				for range 4 { // the loop goes on, and plans again
					r.step(trainStep)
				}
				assert.Equal(t, "planned", r.state())
				require.NoError(t, a.Close())
			})
		}
	}
}
