package allocator

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/arena/plan"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Planned steps.
//
// A training loop or a fixed-shape serving loop makes the same calls every
// step. With planned_steps on and MarkStep called at the end of each step,
// a pool learns its step, packs the blocks born and freed within it into
// one region offline (package arena/plan), and serves the following steps
// from that plan: the k-th Malloc of the step returns base+offset[k] after
// comparing its rounded size and stream with the k-th call learned, with
// no search, split or merge and no driver call.
//
// Each pool's step is a state machine of its own (stepPlan):
//
//	unmarked ──MarkStep──▶ learning ──two identical steps──▶ planned
//	                         ▲   │                             │    ▲
//	               re-learn ─┘   │ 8 steps in a row            │    │ MarkStep after
//	               (below)       ▼ that differ                 ▼    │ a first divergence
//	                            off ◀──── 4 re-learns ──── diverged ┘
//
// A step diverges at a call that differs, a late Free, a step that ends
// early, an out-of-memory error, Sleep or memory history. A pool
// re-learns (its region freed, or retired while blocks of it are live)
// after two diverged steps in a row, planned blocks still live at
// MarkStep, EmptyCache, or RecordStream on a planned block; 4 re-learns
// without 64 planned steps in a row between them turn planning off for
// the pool.
//
//   - learning: every Malloc of the pool goes through the general path and
//     is recorded (rounded size, stream), as is every Free of a block born
//     in the step (which Malloc it frees) and every RecordStream on one.
//     MarkStep compares the step with the previous one; when they are
//     equal, the blocks born and freed within the step on its main stream
//     (the one with the most such bytes) become intervals (size, Malloc's
//     call index, Free's call index) and plan.Pack places them. Blocks
//     that outlive the step, blocks of other streams and blocks recorded
//     on another stream stay heap entries: the plan sends those Mallocs
//     to the heap. The pool's free cache is released and the region is
//     carved from the heap as one allocated block, mapped once.
//   - planned: Malloc k is served from the plan when its rounded size and
//     stream match, and when every planned block whose learned Free came
//     before it has been freed: a Free that comes late would otherwise
//     leave a live block where the plan puts this one. Each planned block
//     has the rank of its Free in the learned step; the region keeps the
//     length of the prefix of ranks freed this step (Frees may come early
//     and in any order), and Malloc k needs it to reach the number of
//     planned Frees learned before it: one compare.
//     A Free of a planned block marks it dead. At MarkStep the step
//     starts over at k = 0.
//   - diverged: the first call that does not match sends the rest of the
//     step to the heap; the region's live blocks stay where they are and
//     are freed as usual. At MarkStep, a first divergence returns to
//     planned; a second in a row, or planned blocks still live, drops the
//     region (freed, or retired until its last block is freed) and
//     re-learns.
//
// Streams: a plan serves one stream, so a planned block reuses only
// memory that blocks of the same stream held, in that stream's order, as
// the heap's per-stream free lists allow. A RecordStream on a planned
// block retires the region: it is freed to the heap (with events on the
// streams recorded, as a heap block would be) only once its last block is
// freed, and never reused by the plan before.
//
// Accounting: the region is one allocated heap block that the statistics
// do not count; each live planned block is counted as a heap block of its
// rounded size would be (allocated, active, requested bytes and counts),
// so Stats, Check's recount and snapshots see planned blocks like others.
// Check verifies that the live planned blocks of a region lie inside it
// and that no two overlap. Memory history records every block with its
// stack, so while history is on a planned step diverges and the heap
// serves it.
//
// Memory: a region with no live block is cache the heap cannot reuse, so
// a Malloc about to fail with an out-of-memory error first gives every
// such region back to the heap (dropIdleRegions), and its pool learns
// again. Isolated pools are never planned.
//
// The Allocator holds one pointer (planned), nil when planned_steps is
// off: a Malloc or Free without planning tests it and nothing more; with
// planning, Malloc tests the pool's state and Free the newest region's
// bounds before anything else.

// stepState is a pool's planned-step state.
type stepState uint8

const (
	stepUnmarked stepState = iota // MarkStep not called yet: nothing recorded
	stepLearning                  // recording the step's calls
	stepPlanned                   // serving the step from the plan
	stepDiverged                  // the rest of the step goes to the heap
	stepOff                       // planning given up for this pool
)

func (s stepState) String() string {
	return [...]string{"unmarked", "learning", "planned", "diverged", "off"}[s]
}

const (
	// maxLearnMisses is how many steps in a row may differ from the one
	// before while learning before planning is turned off for the pool.
	maxLearnMisses = 8
	// maxRelearns is how many times a pool re-learns before planning is
	// turned off for it.
	maxRelearns = 4
	// forgiveAfter is how many planned steps in a row reset the count of
	// re-learns, so that a training loop whose evaluation now and then
	// forces a re-learn keeps planning.
	forgiveAfter = 64
	// maxStepCalls bounds the calls one learned step records.
	maxStepCalls = 1 << 22
)

// planner is the planned-step state of an allocator. Allocator.mu guards
// every field.
type planner struct {
	steps []*stepPlan // by Pool.slot; nil where the pool never marked a step
	def   *stepPlan   // steps[0], the default pool's
	// regions are the plan regions whose blocks may be live: each
	// pool's current one and the retired ones not yet freed. lo and span
	// bound their addresses, so Free tells a heap pointer from a planned
	// one with one compare: ptr-lo < span.
	regions []*planRegion
	lo      uintptr
	span    uintptr
	// hot is the newest region (the one a plan serves from), for Free's
	// first test; nil when none or once the allocator is closed.
	hot    *planRegion
	closed bool
	// pendingRegions are region blocks freed to the heap with events
	// still queued (PendingFree); the statistics never counted them.
	pendingRegions []arena.BlockID
	// born maps each live block born in a learning step to its Malloc;
	// learning counts the pools learning, so that Free looks it up only
	// then.
	born     map[uintptr]bornRef
	learning int
}

// bornRef names the Malloc call of a learning step that returned a block.
type bornRef struct {
	sp  *stepPlan
	idx int32 // index in sp.cur
}

// stepCall is one recorded call of a learning step.
type stepCall struct {
	rounded uint64         // Malloc: the rounded size; Free: 0
	stream  backend.Stream // Malloc: the stream, resolved (never 0)
	malloc  int32          // Free: the index in the step's calls of the Malloc it frees
	heap    bool           // Malloc: another stream was recorded on the block: never planned
}

// stepPlan is one pool's planned-step state machine. Allocator.mu.
type stepPlan struct {
	p     *Pool
	plain bool // Malloc rounds to 512 bytes only (Allocator.plainRound, no pool alignment). Fixed.
	state stepState
	// cur and prev are the calls of this step and of the one before
	// (learning); bad marks a step that cannot be planned (an error, too
	// many calls).
	cur, prev []stepCall
	bad       bool
	misses    int // learning steps in a row that differed from the previous one
	relearns  int // regions dropped to re-learn since the last forgiveAfter planned steps in a row
	streak    int // planned steps in a row that matched the plan
	diverged  int // diverged steps in a row
	// held: the step is diverged because memory history is on or the
	// pool slept, not because its calls differed; it is not counted.
	held bool
	reg  *planRegion
	k    int // the next Malloc's index in reg.calls (planned, diverged)
	// Figures for studies (StepStats).
	planned, divergences, steps uint64
}

// planCall is the k-th Malloc of a planned step.
type planCall struct {
	rounded uint64
	stream  backend.Stream
	blk     int32 // the planned block, or -1: served by the heap
	needF   int32 // planned Frees learned before it: planRegion.prefix must reach it
}

// planBlock is a planned block of a region.
type planBlock struct {
	off  uint64 // offset in the region
	size uint64 // nbytes: its rounded size
	req  uint64 // requested nbytes while live, 0 when dead
	rank int32  // its Free's rank among the learned step's planned Frees
	slot int32  // its offset's entry in the offset table
}

// planRegion is a plan and its memory: one allocated heap block holding
// the planned blocks at their offsets. Allocator.mu.
type planRegion struct {
	sp      *stepPlan // the pool's plan serving from it; nil once retired
	id      arena.BlockID
	base    uintptr
	size    uint64 // nbytes of the heap block
	need    uint64 // nbytes the packing needs (<= size)
	peak    uint64 // plan.PeakLive of the intervals: no packing is smaller
	stream  backend.Stream
	pool    *Pool
	calls   []planCall  // per Malloc of the step, and a sentinel that matches none
	blocks  []planBlock // the planned blocks
	deadAt  []uint32    // per Free rank: the epoch of the step in which that block was freed
	byRank  []int32     // per Free rank: the block
	epoch   uint32      // the step's epoch: deadAt entries of other epochs are stale
	prefix  int32       // ranks [0, prefix) are freed this step
	keys    []uint64    // offset table (open addressing): offset+1, 0 empty
	live    []int32     // offset table: the live block at that offset, or -1
	shift   uint8       // 64 - log2(len(keys))
	mask    uint64      // len(keys) - 1
	nLive   int         // live planned blocks
	uses    []backend.Stream
	retired bool
}

// newPlanner is the planner of allocator a, with planned_steps on.
func newPlanner(a *Allocator) *planner {
	pl := &planner{born: map[uintptr]bornRef{}}
	pl.stepOf(&a.def)
	return pl
}

// stepOf is pool p's step state, made on first use. mu held.
func (pl *planner) stepOf(p *Pool) *stepPlan {
	for len(pl.steps) <= p.slot {
		pl.steps = append(pl.steps, nil)
	}
	sp := pl.steps[p.slot]
	if sp == nil || sp.p != p { // a closed pool's slot reused
		sp = &stepPlan{p: p}
		sp.plain = p.a.plainRound && p.align == 0
		pl.steps[p.slot] = sp
		if p.slot == 0 {
			pl.def = sp
		}
	}
	return sp
}

// bounds recomputes lo and span over the regions. mu held.
func (pl *planner) bounds() {
	pl.lo, pl.span, pl.hot = 0, 0, nil
	if len(pl.regions) == 0 {
		return
	}
	if !pl.closed {
		pl.hot = pl.regions[len(pl.regions)-1]
	}
	lo, hi := pl.regions[0].base, pl.regions[0].base
	for _, r := range pl.regions {
		lo = min(lo, r.base)
		hi = max(hi, r.base+uintptr(r.size))
	}
	pl.lo, pl.span = lo, hi-lo
}

// regionAt is the region holding ptr, or nil. mu held.
func (pl *planner) regionAt(ptr uintptr) *planRegion {
	for _, r := range pl.regions {
		if ptr-r.base < uintptr(r.size) {
			return r
		}
	}
	return nil
}

// plannedRegion is the plan region holding ptr, or nil (also with
// planned_steps off). mu held.
func (a *Allocator) plannedRegion(ptr uintptr) *planRegion {
	if pl := a.planned; pl != nil && ptr-pl.lo < pl.span {
		return pl.regionAt(ptr)
	}
	return nil
}

// regionOf is the region whose heap block is id, or nil. mu held.
func (pl *planner) regionOf(id arena.BlockID) *planRegion {
	for _, r := range pl.regions {
		if r.id == id {
			return r
		}
	}
	return nil
}

// MarkStep marks the end of a step of the default pool: a training
// iteration, a served batch. See Pool.MarkStep.
func (a *Allocator) MarkStep() error { return a.def.MarkStep() }

// MarkStep marks the end of one of the pool's steps. With planned_steps
// on, a pool whose steps repeat the same Mallocs and Frees learns them and
// serves later steps from one region packed offline, falling back to the
// heap for the rest of a step at the first call that differs (see the
// package documentation, Planned steps). With planned_steps off it only
// checks that the pool is live. Planning may grow or release memory here,
// never during a planned step.
func (p *Pool) MarkStep() error {
	a := p.a
	a.mu.Lock()
	defer a.unlock()
	if err := p.live(); err != nil {
		return err
	}
	pl := a.planned
	if pl == nil || p.isolated {
		return nil
	}
	return a.markStep(pl, pl.stepOf(p))
}

// markStep ends sp's step. mu held.
func (a *Allocator) markStep(pl *planner, sp *stepPlan) error {
	sp.steps++
	switch sp.state {
	case stepUnmarked:
		a.learn(pl, sp)
	case stepLearning:
		clearBorn(pl, sp)
		if !sp.bad && len(sp.cur) > 0 && slices.Equal(sp.cur, sp.prev) && !sp.p.asleep && a.hist == nil {
			if err := a.makePlan(pl, sp); err == nil {
				return nil
			}
			// No plan (no memory for the region, nothing to plan):
			// count it as a miss.
		}
		sp.misses++
		if sp.misses >= maxLearnMisses {
			a.stepOff(pl, sp)
			return nil
		}
		sp.prev, sp.cur = sp.cur, sp.prev[:0]
		sp.bad = false
	case stepPlanned:
		if sp.k != len(sp.reg.calls)-1 {
			sp.divergences++
			sp.diverged++
			sp.streak = 0
		} else {
			sp.diverged = 0
			if sp.streak++; sp.streak >= forgiveAfter {
				sp.relearns = 0 // a long run of planned steps: divergences were exceptions
			}
		}
		return a.restartStep(pl, sp)
	case stepDiverged:
		if !sp.held {
			sp.diverged++
		}
		return a.restartStep(pl, sp)
	}
	return nil
}

// restartStep starts the next step of a planned or diverged pool: from
// the plan again when its region is empty and the pool did not diverge
// twice in a row, else re-learning. mu held.
func (a *Allocator) restartStep(pl *planner, sp *stepPlan) error {
	r := sp.reg
	if r.nLive > 0 || sp.diverged >= 2 {
		return a.relearn(pl, sp)
	}
	sp.state, sp.k, sp.held = stepPlanned, 0, false
	r.epoch++
	r.prefix = 0
	if r.epoch == 0 { // wrapped: no entry may look fresh
		clear(r.deadAt)
		r.epoch = 1
	}
	if a.hist != nil || sp.p.asleep {
		sp.state, sp.held = stepDiverged, true
	}
	return nil
}

// learn starts recording sp's steps. mu held.
func (a *Allocator) learn(pl *planner, sp *stepPlan) {
	if sp.state != stepLearning {
		pl.learning++
	}
	sp.state, sp.cur, sp.prev, sp.bad, sp.misses, sp.diverged = stepLearning, sp.cur[:0], sp.prev[:0], false, 0, 0
}

// clearBorn forgets sp's blocks born in the step just ended: their Frees
// in a later step are not the step's own. mu held.
func clearBorn(pl *planner, sp *stepPlan) {
	for addr, r := range pl.born {
		if r.sp == sp {
			delete(pl.born, addr)
		}
	}
}

// stopLearning leaves the learning state. mu held.
func (a *Allocator) stopLearning(pl *planner, sp *stepPlan) {
	if sp.state == stepLearning {
		pl.learning--
		clearBorn(pl, sp)
	}
}

// relearn drops sp's region and learns again, or turns planning off
// after maxRelearns. mu held.
func (a *Allocator) relearn(pl *planner, sp *stepPlan) error {
	err := a.dropRegion(pl, sp)
	sp.relearns++
	if sp.relearns >= maxRelearns {
		a.stepOff(pl, sp)
		return err
	}
	a.learn(pl, sp)
	return err
}

// stepOff turns planning off for sp's pool. mu held.
func (a *Allocator) stepOff(pl *planner, sp *stepPlan) {
	a.stopLearning(pl, sp)
	_ = a.dropRegion(pl, sp)
	sp.state, sp.cur, sp.prev = stepOff, nil, nil
}

// dropRegion detaches sp's region: freed to the heap now when no planned
// block is live and no stream was recorded, else retired until its last
// block is freed. mu held.
func (a *Allocator) dropRegion(pl *planner, sp *stepPlan) error {
	r := sp.reg
	if r == nil {
		return nil
	}
	sp.reg, r.sp, r.retired = nil, nil, true
	if r.nLive == 0 {
		return a.freeRegion(pl, r)
	}
	return nil
}

// diverge sends the rest of sp's step to the heap. mu held.
func (sp *stepPlan) diverge() {
	if sp.state == stepPlanned {
		sp.state = stepDiverged
		sp.divergences++
	}
}

// roundFor is the rounded size of a request of size bytes in pool p, as
// mallocLocked rounds it; false when mallocLocked refuses the size.
func (a *Allocator) roundFor(p *Pool, size uint64) (uint64, bool) {
	if size == 0 || size > a.total {
		return 0, false
	}
	rounded := a.roundSize(size)
	if p.align != 0 && rounded <= a.maxBlock {
		rounded = roundUp(rounded, p.align)
	}
	return rounded, rounded >= size && rounded <= a.maxBlock
}

// planMalloc serves a Malloc of sp's planned step from its plan and
// returns the address with mu unlocked; 0, mu held, when the caller
// continues on its usual path: a heap entry of the plan, or a call that
// differs (the step diverges).
func (a *Allocator) planMalloc(sp *stepPlan, size uint64, stream backend.Stream) uintptr {
	r := sp.reg
	// No test of size, history or sleep here: a size of 0 or past the
	// device rounds to no call's size (the sentinel's is MaxUint64), and
	// RecordHistory and Sleep diverge the step (restartStep holds it
	// diverged while they last).
	c := &r.calls[sp.k]
	rounded := (size + minBlockSize - 1) &^ (minBlockSize - 1)
	if !sp.plain {
		rounded, _ = a.roundFor(sp.p, size)
	}
	if c.rounded != rounded || c.stream != stream && (stream != 0 || c.stream != a.defaultS) {
		sp.diverge()
		return 0
	}
	j := c.blk
	if j < 0 { // a heap entry
		sp.k++
		return 0
	}
	if r.prefix < c.needF { // a block the plan has freed by now is live
		sp.diverge()
		return 0
	}
	sp.k++
	b := &r.blocks[j]
	b.req = size
	r.live[b.slot] = j
	r.nLive++
	bsize := b.size
	kind := stats.SmallPool
	if bsize > smallSize {
		kind = stats.LargePool
	}
	if a.pooled {
		stats.CountMallocBoth(&a.st, &sp.p.st, kind, int64(bsize), int64(size))
	} else {
		a.st.CountMalloc(kind, int64(bsize), int64(size))
	}
	if bsize >= a.oversize {
		for _, st := range a.statsOf(sp.p) {
			st.OversizeAllocations.Add(1)
		}
	}
	a.mu.Unlock()
	return r.base + uintptr(b.off)
}

// learnMalloc makes and records a Malloc of sp's learning step. mu held;
// it unlocks.
func (a *Allocator) learnMalloc(sp *stepPlan, size uint64, stream backend.Stream) (uintptr, error) {
	addr, err := a.mallocLocked(sp.p, size, stream)
	a.recordMalloc(sp, size, stream, addr, err)
	a.unlock()
	return addr, err
}

// recordMalloc records a Malloc of a learning step. mu held.
func (a *Allocator) recordMalloc(sp *stepPlan, size uint64, stream backend.Stream, addr uintptr, err error) {
	if err != nil || len(sp.cur) >= maxStepCalls {
		sp.bad = true
		return
	}
	rounded, _ := a.roundFor(sp.p, size)
	if stream == 0 {
		stream = a.defaultS
	}
	a.planned.born[addr] = bornRef{sp: sp, idx: int32(len(sp.cur))}
	sp.cur = append(sp.cur, stepCall{rounded: rounded, stream: stream})
}

// stepFree handles a Free of ptr when planning is on: a planned block is
// freed here (done); a block born in a learning step is recorded and the
// caller frees it. mu held; it does not unlock.
func (a *Allocator) stepFree(pl *planner, ptr uintptr) (done bool, err error) {
	if a.closed {
		return false, nil
	}
	if ptr-pl.lo < pl.span {
		if r := pl.regionAt(ptr); r != nil {
			return true, a.planFree(pl, r, ptr)
		}
	}
	if pl.learning > 0 {
		if b, ok := pl.born[ptr]; ok {
			delete(pl.born, ptr)
			sp := b.sp
			if len(sp.cur) >= maxStepCalls {
				sp.bad = true
			} else {
				sp.cur = append(sp.cur, stepCall{malloc: b.idx})
			}
		}
	}
	return false, nil
}

// lookup is offset off's entry in the offset table, or -1. mu held.
func (r *planRegion) lookup(off uint64) int32 {
	for i := ((off >> 9) * 0x9E3779B97F4A7C15) >> r.shift; ; i = (i + 1) & r.mask {
		switch r.keys[i] {
		case off + 1:
			return int32(i)
		case 0:
			return -1
		}
	}
}

// planFree frees the planned block at ptr of region r. mu held.
func (a *Allocator) planFree(pl *planner, r *planRegion, ptr uintptr) error {
	// The Free the learned step makes next is of the block of the lowest
	// rank not yet freed: try it before the offset table.
	off := uint64(ptr - r.base)
	var b *planBlock
	if f := r.prefix; int(f) < len(r.byRank) {
		if b = &r.blocks[r.byRank[f]]; b.off != off || b.req == 0 {
			b = nil
		}
	}
	if b == nil {
		i := r.lookup(off)
		if i < 0 || r.live[i] < 0 {
			return r.badPointer(ptr)
		}
		b = &r.blocks[r.live[i]]
	}
	r.live[b.slot] = -1
	bsize, req := b.size, b.req
	b.req = 0
	r.nLive--
	d, e := r.deadAt, r.epoch
	d[b.rank] = e
	if f := b.rank; f == r.prefix {
		for f++; int(f) < len(d) && d[f] == e; f++ {
		}
		r.prefix = f
	}
	kind := stats.SmallPool
	if bsize > smallSize {
		kind = stats.LargePool
	}
	p := r.pool
	a.st.CountFree(kind, int64(bsize), int64(req))
	if a.pooled {
		p.st.CountFree(kind, int64(bsize), int64(req))
	}
	if bsize >= a.oversize {
		for _, st := range a.statsOf(p) {
			st.OversizeAllocations.Add(-1)
		}
	}
	if r.retired && r.nLive == 0 {
		return a.freeRegion(pl, r)
	}
	return nil
}

// badPointer classifies a pointer into region r that is not a live
// planned block's start.
func (r *planRegion) badPointer(ptr uintptr) error {
	off := uint64(ptr - r.base)
	for _, b := range r.blocks {
		if b.req != 0 && off > b.off && off < b.off+b.size {
			return fmt.Errorf("%w: %#x is %d bytes into the planned block at %#x", ErrInteriorPointer, ptr, off-b.off, r.base+uintptr(b.off))
		}
	}
	return fmt.Errorf("%w: %#x is not a live planned block", ErrDoubleFree, ptr)
}

// liveBlock is the live planned block starting at ptr in r, or -1.
func (r *planRegion) liveBlock(ptr uintptr) int32 {
	i := r.lookup(uint64(ptr - r.base))
	if i < 0 {
		return -1
	}
	return r.live[i]
}

// freeRegion gives region r's heap block back to the heap, after events
// on the streams recorded on its blocks. The statistics never counted
// it. mu held (dropped while insertEvents waits).
func (a *Allocator) freeRegion(pl *planner, r *planRegion) error {
	if i := slices.Index(pl.regions, r); i >= 0 {
		pl.regions = slices.Delete(pl.regions, i, i+1)
		pl.bounds()
	}
	b := r.id
	if len(r.uses) > 0 {
		if err := a.insertEvents(b, r.uses); err != nil {
			return err // the region stays allocated: its memory is never reused
		}
		r.uses = nil
	}
	pk, ok := a.heap.Peek(b)
	if !ok {
		return fmt.Errorf("%w: plan region %#x is not in the heap", ErrCorrupt, r.base)
	}
	owner := a.states[pk.Stream]
	if owner.pool.asleep {
		a.dropBackup(owner.pool, r.base)
	}
	owner.frees++
	if pk.Events > 0 {
		if err := a.heap.MarkPending(b); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		pl.pendingRegions = append(pl.pendingRegions, b)
		a.pending++
		a.setHitOff()
		return nil
	}
	return a.freeRegionBlock(b, owner)
}

// freeRegionBlock frees region block b of owner in the heap, without
// statistics. mu held.
func (a *Allocator) freeRegionBlock(b arena.BlockID, owner *streamState) error {
	if _, err := a.heap.Free(b); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	owner.idle = false
	owner.active--
	if owner.idleOwner {
		_ = a.releaseIdle(owner)
	}
	return nil
}

// pendingRegion reports whether b is a region block pending free, and
// forgets it when take. mu held.
func (a *Allocator) pendingRegion(b arena.BlockID, take bool) bool {
	pl := a.planned
	if pl == nil {
		return false
	}
	i := slices.Index(pl.pendingRegions, b)
	if i >= 0 && take {
		pl.pendingRegions = slices.Delete(pl.pendingRegions, i, i+1)
	}
	return i >= 0
}

// makePlan packs sp's learned step and carves its region. mu held
// (dropped while the region's growth maps).
func (a *Allocator) makePlan(pl *planner, sp *stepPlan) error {
	calls := sp.cur
	p := sp.p
	// Each Malloc's Free, if within the step.
	death := make([]int32, len(calls))
	for i := range death {
		death[i] = -1
	}
	byStream := map[backend.Stream]uint64{}
	for i, c := range calls {
		if c.rounded == 0 {
			death[c.malloc] = int32(i)
		}
	}
	for i, c := range calls {
		if c.rounded != 0 && death[i] >= 0 && !c.heap {
			byStream[c.stream] += c.rounded
		}
	}
	var main backend.Stream
	var most uint64
	for s, n := range byStream {
		if n > most || n == most && s < main {
			main, most = s, n
		}
	}
	if most == 0 {
		return errors.New("nothing to plan")
	}
	align := uint64(minBlockSize)
	if p.align != 0 {
		align = p.align
	}
	r := &planRegion{stream: main}
	var ivs []plan.Interval
	blkOf := make([]int32, len(calls))
	for i, c := range calls {
		blkOf[i] = -1
		if c.rounded == 0 {
			continue
		}
		if death[i] >= 0 && !c.heap && c.stream == main {
			blkOf[i] = int32(len(ivs))
			ivs = append(ivs, plan.Interval{Size: c.rounded, Birth: uint64(i), Death: uint64(death[i])})
			r.blocks = append(r.blocks, planBlock{size: c.rounded})
		}
	}
	offs, need, err := plan.Pack(ivs, align)
	if err != nil {
		return err
	}
	for j, off := range offs {
		r.blocks[j].off = off
	}
	r.need, r.peak = need, plan.PeakLive(ivs, align)
	// Per Malloc: the call, its block, and the planned Frees learned
	// before it; per planned block, its Free's rank.
	var frees int32
	for i, c := range calls {
		if c.rounded == 0 {
			if j := blkOf[c.malloc]; j >= 0 {
				r.blocks[j].rank = frees
				frees++
			}
			continue
		}
		r.calls = append(r.calls, planCall{rounded: c.rounded, stream: c.stream, blk: blkOf[i], needF: frees})
	}
	r.calls = append(r.calls, planCall{rounded: math.MaxUint64, blk: -1})
	r.deadAt = make([]uint32, frees)
	r.byRank = make([]int32, frees)
	for j, b := range r.blocks {
		r.byRank[b.rank] = int32(j)
	}
	r.epoch = 1
	r.index()
	// The region: the pool's free cache is released first, so that the
	// region maps where the step's heap blocks were instead of beside
	// them.
	_ = a.releasePool(p)
	if err := a.carveRegion(p, r, roundUp(need, minBlockSize)); err != nil {
		return err
	}
	a.stopLearning(pl, sp)
	sp.reg, r.sp = r, sp
	sp.state, sp.k, sp.diverged, sp.misses = stepPlanned, 0, 0, 0
	sp.planned++
	pl.regions = append(pl.regions, r)
	pl.bounds()
	return nil
}

// index builds r's offset table. mu held.
func (r *planRegion) index() {
	n := 1
	shift := uint8(64)
	for n < 2*len(r.blocks)+2 {
		n *= 2
		shift--
	}
	r.keys, r.live, r.shift, r.mask = make([]uint64, n), make([]int32, n), shift, uint64(n-1)
	for i := range r.live {
		r.live[i] = -1
	}
	for j := range r.blocks {
		b := &r.blocks[j]
		i := ((b.off >> 9) * 0x9E3779B97F4A7C15) >> shift
		for r.keys[i] != 0 && r.keys[i] != b.off+1 {
			i = (i + 1) & r.mask
		}
		r.keys[i] = b.off + 1
		b.slot = int32(i)
	}
}

// carveRegion allocates r's heap block of size bytes in pool p on r's
// stream, as mallocLocked would but uncounted by the statistics (its
// planned blocks are counted instead). mu held (dropped while growing).
func (a *Allocator) carveRegion(p *Pool, r *planRegion, size uint64) error {
	ps, err := a.stream(r.stream)
	if err != nil {
		return err
	}
	ss, err := a.owner(p, ps)
	if err != nil {
		return err
	}
	if a.pending > 0 {
		a.processEvents()
	}
	if size > a.maxBlock {
		return fmt.Errorf("%w: a plan of %d bytes", ErrInvalidSize, size)
	}
	cl := a.classFor(size)
	b, _, bsize := a.bestFit(ss, cl, size)
	if b != arena.NoBlock && cl.growthHandles() && a.guardsCuts(p) {
		if b, _, bsize, err = a.fitPressed(ss, cl, size, b, 0, bsize); err != nil {
			return err
		}
	}
	if b == arena.NoBlock {
		if b, err = a.allocSlow(ss, cl, size, size); err != nil {
			return err
		}
		pk, _ := a.heap.Peek(b)
		bsize = pk.Size
	}
	if a.shouldSplit(p.expandable, cl, bsize, size) {
		bsize = size
	}
	if err := a.heap.Alloc(b, bsize, bsize); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	ss.active++
	r.id, r.base, r.size, r.pool = b, a.heap.Addr(b), bsize, p
	return nil
}

// stepRecordStream handles RecordStream of a planned block: the region is
// retired (its memory waits for s's work when freed) and the pool
// re-learns. ok reports that ptr was a planned pointer. mu held.
func (a *Allocator) stepRecordStream(pl *planner, ptr uintptr, s backend.Stream) (ok bool, err error) {
	r := pl.regionAt(ptr)
	if r == nil {
		return false, nil
	}
	if r.liveBlock(ptr) < 0 {
		return true, r.badPointer(ptr)
	}
	ss, err := a.stream(s)
	if err != nil {
		return true, err
	}
	if ss.stream == r.stream || slices.Contains(r.uses, ss.stream) {
		return true, nil
	}
	r.uses = append(r.uses, ss.stream)
	if sp := r.sp; sp != nil {
		sp.diverge()
		return true, a.relearn(pl, sp)
	}
	return true, nil
}

// recordLearnStream marks a block born in a learning step as recorded on
// another stream: the plan leaves it to the heap. mu held.
func (pl *planner) recordLearnStream(ptr uintptr) {
	if b, ok := pl.born[ptr]; ok {
		b.sp.cur[b.idx].heap = true
	}
}

// stepsEvent tells the planner that pool p (nil: every pool) cannot
// continue its steps as planned: EmptyCache drops the region and
// re-learns (a region with live blocks is retired); Sleep and
// RecordHistory hold the step diverged (drop false). mu held.
func (a *Allocator) stepsEvent(p *Pool, drop bool) error {
	pl := a.planned
	if pl == nil {
		return nil
	}
	var errs []error
	for _, sp := range pl.steps {
		if sp == nil || p != nil && sp.p != p {
			continue
		}
		switch sp.state {
		case stepPlanned, stepDiverged:
			if drop {
				sp.diverge()
				errs = append(errs, a.relearn(pl, sp))
			} else if sp.state == stepPlanned {
				sp.state, sp.held = stepDiverged, true
			}
		case stepLearning:
			sp.bad = true
		}
	}
	return errors.Join(errs...)
}

// stepsStream drops the regions serving stream s (ReleaseStream). mu held.
func (a *Allocator) stepsStream(s backend.Stream) error {
	pl := a.planned
	if pl == nil {
		return nil
	}
	var errs []error
	for _, sp := range pl.steps {
		if sp != nil && sp.reg != nil && sp.reg.stream == s {
			sp.diverge()
			errs = append(errs, a.relearn(pl, sp))
		}
	}
	return errors.Join(errs...)
}

// stepsClosed forgets every plan when the allocator closes: the regions
// go with their segments. mu held.
func (a *Allocator) stepsClosed() {
	pl := a.planned
	if pl == nil {
		return
	}
	for _, sp := range pl.steps {
		if sp != nil {
			sp.state, sp.reg, sp.cur, sp.prev = stepOff, nil, nil, nil
		}
	}
	pl.learning = 0
	clear(pl.born)
	pl.closed, pl.hot = true, nil
}

// poolClosing drops pool p's plan before Close checks for live
// allocations. mu held.
func (a *Allocator) poolClosing(p *Pool) error {
	pl := a.planned
	if pl == nil || p.slot >= len(pl.steps) || pl.steps[p.slot] == nil || pl.steps[p.slot].p != p {
		return nil
	}
	sp := pl.steps[p.slot]
	a.stopLearning(pl, sp)
	err := a.dropRegion(pl, sp)
	sp.state = stepOff
	return err
}

// regionFreedStats counts, when block id is a plan region being dropped
// with its segment (Close), the frees of its live planned blocks instead
// of the block itself; false when id is no region. mu held.
func (a *Allocator) regionFreedStats(id arena.BlockID) bool {
	pl := a.planned
	if pl == nil {
		return false
	}
	if a.pendingRegion(id, true) {
		return true
	}
	r := pl.regionOf(id)
	if r == nil {
		return false
	}
	for _, b := range r.blocks {
		if b.req != 0 {
			_ = a.planFree(pl, r, r.base+uintptr(b.off))
		}
	}
	if i := slices.Index(pl.regions, r); i >= 0 {
		pl.regions = slices.Delete(pl.regions, i, i+1)
		pl.bounds()
	}
	if r.sp != nil {
		r.sp.reg = nil
		r.sp.state = stepOff
	}
	return true
}

// checkPlans verifies every region: its block is allocated (or pending
// free, for pendingRegions) in the heap at its address, its live blocks lie
// inside it and no two overlap, and the live count and offset table agree;
// it adds the live blocks to the recount. mu held.
func (a *Allocator) checkPlans(rc *recount) error {
	pl := a.planned
	if pl == nil {
		return nil
	}
	for _, b := range pl.pendingRegions {
		if a.heap.State(b) != arena.PendingFree {
			return corrupt("pending plan region %d is %s", b, a.heap.State(b))
		}
	}
	for _, r := range pl.regions {
		if a.heap.State(r.id) != arena.Allocated || a.heap.Addr(r.id) != r.base || a.heap.Size(r.id) != r.size {
			return corrupt("plan region %#x+%d is not its allocated heap block", r.base, r.size)
		}
		if r.base-pl.lo >= pl.span || r.base+uintptr(r.size)-pl.lo > pl.span {
			return corrupt("plan region %#x+%d outside the planner's bounds", r.base, r.size)
		}
		if (r.sp == nil) != r.retired || r.sp != nil && r.sp.reg != r {
			return corrupt("plan region %#x: retired %v, but its plan says otherwise", r.base, r.retired)
		}
		p := a.states[a.heap.StreamOf(r.id)].pool
		if p != r.pool {
			return corrupt("plan region %#x: pool %q, its block's owner's %q", r.base, r.pool.name, p.name)
		}
		for f := int32(0); f < r.prefix; f++ {
			if r.deadAt[f] != r.epoch {
				return corrupt("plan region %#x: Free rank %d counted in the freed prefix %d, not freed this step", r.base, f, r.prefix)
			}
		}
		type span struct{ off, end uint64 }
		var live []span
		for j, b := range r.blocks {
			if r.keys[b.slot] != b.off+1 {
				return corrupt("plan region %#x: block %d's offset +%d not in the offset table", r.base, j, b.off)
			}
			q := b.req
			if q == 0 {
				if r.live[b.slot] == int32(j) {
					return corrupt("plan region %#x: dead block %d marked live", r.base, j)
				}
				continue
			}
			if r.live[b.slot] != int32(j) {
				return corrupt("plan region %#x: live block %d not in the offset table", r.base, j)
			}
			if q > b.size || b.off+b.size > r.size {
				return corrupt("plan region %#x: block %d (+%d, %d of %d bytes) outside the region or its size", r.base, j, b.off, q, b.size)
			}
			live = append(live, span{b.off, b.off + b.size})
			n, req := int64(b.size), int64(q)
			kind := stats.SmallPool
			if b.size > smallSize {
				kind = stats.LargePool
			}
			rc.add(p, func(w *stats.DeviceStats) {
				w.Active.Add(kind, 1)
				w.ActiveBytes.Add(kind, n)
				w.RequestedBytes.Add(kind, req)
				w.Allocation.Add(kind, 1)
				w.AllocatedBytes.Add(kind, n)
			})
			if a.cfg.MaxSplitSize != 0 && b.size >= a.cfg.MaxSplitSize {
				rc.add(p, func(w *stats.DeviceStats) { w.OversizeAllocations.Add(1) })
			}
		}
		if len(live) != r.nLive {
			return corrupt("plan region %#x counts %d live blocks, %d are", r.base, r.nLive, len(live))
		}
		slices.SortFunc(live, func(x, y span) int { return cmp.Compare(x.off, y.off) })
		for i := 1; i < len(live); i++ {
			if live[i].off < live[i-1].end {
				return corrupt("plan region %#x: live planned blocks at +%d and +%d overlap", r.base, live[i-1].off, live[i].off)
			}
		}
	}
	return nil
}

// planSnapshotBlocks expands region block b of a snapshot into its live
// planned blocks and the free space between them; nil when b is no
// region. mu held.
func (a *Allocator) planSnapshotBlocks(id arena.BlockID, b arena.BlockInfo, pool PoolID) []stats.BlockInfo {
	pl := a.planned
	if pl == nil {
		return nil
	}
	r := pl.regionOf(id)
	if r == nil {
		return nil
	}
	var live []planBlock
	for _, b := range r.blocks {
		if b.req != 0 {
			live = append(live, b)
		}
	}
	slices.SortFunc(live, func(x, y planBlock) int { return cmp.Compare(x.off, y.off) })
	out := make([]stats.BlockInfo, 0, 2*len(live)+1)
	var at uint64
	for _, lb := range live {
		if lb.off > at {
			out = append(out, stats.BlockInfo{Address: r.base + uintptr(at), Size: lb.off - at, Stream: uint64(b.Stream), Pool: pool, State: stats.BlockInactive})
		}
		out = append(out, stats.BlockInfo{Address: r.base + uintptr(lb.off), Size: lb.size, RequestedSize: lb.req, Stream: uint64(b.Stream), Pool: pool, State: stats.BlockActiveAllocated})
		at = lb.off + lb.size
	}
	if at < r.size {
		out = append(out, stats.BlockInfo{Address: r.base + uintptr(at), Size: r.size - at, Stream: uint64(b.Stream), Pool: pool, State: stats.BlockInactive})
	}
	return out
}

// StepStats describes a pool's planned steps, for studies.
type StepStats struct {
	State string // unmarked, learning, planned, diverged or off
	// Steps counts MarkStep calls, Plans the plans made, Divergences the
	// steps that diverged.
	Steps, Plans, Divergences uint64
	// RegionBytes is the current region's heap block, PlanBytes what
	// its packing needs, PeakLiveBytes the most bytes of planned blocks
	// live at once in the learned step (no packing is smaller); 0
	// without a region. PlannedBlocks counts the step's planned blocks,
	// Mallocs its Mallocs.
	RegionBytes, PlanBytes, PeakLiveBytes uint64
	PlannedBlocks, Mallocs                int
}

// StepStats reports the pool's planned-step state.
func (p *Pool) StepStats() StepStats {
	a := p.a
	a.mu.Lock()
	defer a.mu.Unlock()
	pl := a.planned
	if pl == nil || p.slot >= len(pl.steps) || pl.steps[p.slot] == nil || pl.steps[p.slot].p != p {
		if pl == nil {
			return StepStats{State: stepOff.String()}
		}
		return StepStats{State: stepUnmarked.String()}
	}
	sp := pl.steps[p.slot]
	s := StepStats{State: sp.state.String(), Steps: sp.steps, Plans: sp.planned, Divergences: sp.divergences}
	if r := sp.reg; r != nil {
		s.RegionBytes, s.PlanBytes, s.PeakLiveBytes = r.size, r.need, r.peak
		s.PlannedBlocks, s.Mallocs = len(r.blocks), len(r.calls)-1
	}
	return s
}

// StepStats reports the default pool's planned-step state.
func (a *Allocator) StepStats() StepStats { return a.def.StepStats() }

// countPlanned counts in history h's profile, when block id is a plan
// region, its live planned blocks as allocated before recording began;
// false when id is no region. mu held.
func (a *Allocator) countPlanned(h *history, id arena.BlockID, s backend.Stream) bool {
	pl := a.planned
	if pl == nil {
		return false
	}
	r := pl.regionOf(id)
	if r == nil {
		return false
	}
	for _, b := range r.blocks {
		if b.req != 0 {
			kind := stats.SmallPool
			if b.size > smallSize {
				kind = stats.LargePool
			}
			c := h.count(profKey{stream: s, pool: kind})
			c.allocs++
			c.allocBytes += int64(b.size)
		}
	}
	return true
}

// dropIdleRegions, when a Malloc of pool p ran out of memory (err),
// diverges p's step and gives the plan regions with no live block back to
// the heap, so that the step, or another pool, can use them before it
// fails; their pools learn again. It reports whether it freed any. mu
// held.
func (a *Allocator) dropIdleRegions(p *Pool, err error) bool {
	var oom *OutOfMemoryError
	pl := a.planned
	if !errors.As(err, &oom) || pl == nil {
		return false
	}
	if p.slot < len(pl.steps) && pl.steps[p.slot] != nil && pl.steps[p.slot].p == p {
		pl.steps[p.slot].diverge() // the rest of the step goes to the heap
	}
	freed := false
	for _, sp := range pl.steps {
		if sp != nil && sp.reg != nil && sp.reg.nLive == 0 {
			sp.diverge()
			_ = a.relearn(pl, sp)
			freed = true
		}
	}
	return freed
}
