package allocator

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Private memory pools.
//
// A Pool is PyTorch's MemPool: a private cache of one Allocator whose
// blocks serve only its own Mallocs. What the device shares and what a
// pool owns:
//
//	shared by the device (Allocator)        owned by each Pool
//	─────────────────────────────────       ──────────────────────────────
//	VA reservations (segments, per size     its free lists: one owner per
//	  class), so the address-space bound      stream in the heap (streamState
//	  does not grow with pools                with pool == the Pool)
//	the handle caches                       the handles it has mapped (a
//	the streams, their events, the busy       handle holds blocks of one
//	  list (primary stream states)            owner, so of one pool)
//	the out-of-memory ladder                its idle owner (memory of
//	segment hooks                             released streams)
//	the aggregate statistics                its statistics, limit, segment
//	                                          kind (expandable or classic)
//
// A block's pool is its owner's: the heap labels every block with an owner
// (arena.StreamID), and each owner belongs to one pool, so Free finds the
// pool of any pointer without a lookup of its own. The default pool is the
// Allocator's own cache (Allocator.def); its owners are the primary stream
// states in Allocator.streams, which also hold the stream's events and
// lifecycle. A private pool's owner of stream s hangs off s's primary state
// (streamState.owners, by Pool.slot), so ReleaseStream, a stream's
// vanishing and Close reach every pool's memory of s.
//
// Growth maps only into unmapped address space (shared) and into free
// blocks of the growing owner; reclaim (reclaim.go) moves handles only
// between owners of one pool. Adoption does too, but under pressure
// (pressure.go) a pool's growth also adopts other pools' idle free
// handles where they are mapped (crossPoolAdoption): whole handles, so a
// handle still holds blocks of one pool, their reserved bytes moving with
// them, within the taker's limit, never from a pool asleep, aligned or
// isolated, and not while segment hooks or exports watch the ranges. Free
// memory of one pool thus serves another pool's next peak with no driver
// call, where the ladder would unmap it and the growth map it again in
// granules. The out-of-memory ladder's rung 2 unmaps
// the free handles of every pool before it declares out of memory, so no
// pool starves for memory another pool only caches; a pool's own memory
// limit is enforced at growth, and a Malloc stopped by it releases only
// that pool's free memory before it fails.
//
// Statistics: Allocator.st is always the aggregate. Until the first
// private pool is made, it is also the default pool's (the cache hit counts
// one record, as before pools existed); from then on (Allocator.pooled)
// every pool also counts its own record (Pool.st), which starts as a copy
// of the aggregate for the default pool and at zero for a new one, so the
// pools' Current, Allocated and Freed always add up to the aggregate's.

// PoolID names a pool as PyTorch's MempoolId_t does: (0, 0) is the default
// pool; pools made by NewPool get (0, n) unless PoolOptions.ID sets one
// (PyTorch's CUDA-graph pools are (n, 0)).
type PoolID [2]uint64

// SegmentKind selects the segments a pool maps its memory in.
type SegmentKind int

const (
	// SegmentsDefault: the allocator's configuration (expandable_segments).
	SegmentsDefault SegmentKind = iota
	// SegmentsExpandable: expandable segments whatever the configuration
	// (the fix for pytorch#147851, pools that silently lost them).
	SegmentsExpandable
	// SegmentsClassic: one classic segment per growth (PyTorch's default
	// algorithm).
	SegmentsClassic
)

// PoolOptions configures a private pool (NewPool). The zero value is a
// pool like the allocator's own cache, without a limit.
type PoolOptions struct {
	// Name labels the pool in errors and Summary; "" names it by its ID.
	Name string
	// ID is the pool's PoolID; the zero value assigns (0, n). It must not
	// be (0, 0) (the default pool's) once assigned, nor another live
	// pool's.
	ID PoolID
	// MemoryLimit is the most bytes the pool may have mapped (its
	// reserved bytes): a Malloc that would take it past fails with an
	// *OutOfMemoryError whose PoolLimit is set. 0 means no limit but the
	// device's; values above the device's memory mean the same. A limit
	// below one granule is refused: the pool could never allocate.
	MemoryLimit uint64
	// Segments selects expandable or classic segments for this pool.
	Segments SegmentKind
	// Alignment, when not 0, aligns the pool's handles and allocations:
	// every allocation starts at a multiple of it and is rounded up to
	// one, and lies in handles whose addresses and sizes are multiples of
	// it (NVLS multicast needs the multicast granularity, far above
	// 2 MiB; pytorch#148374). It must be a power of two and a multiple of
	// the driver's granularity, and needs expandable segments.
	Alignment uint64
	// Isolated puts every allocation of the pool in physical handles of
	// its own (its size rounded up to the granularity, or a classic
	// segment of its own), so that exporting it over IPC (allocator/ipc)
	// shares that allocation and nothing else. A freed allocation's
	// handles are reused only by an allocation of the same mapped size on
	// the same stream; other free memory of the pool is released as
	// usual (EmptyCache, the out-of-memory ladder).
	Isolated bool
}

// ErrPoolBusy is returned by Pool.Close while the pool has live
// allocations.
var ErrPoolBusy = errors.New("vmmalloc: pool has live allocations")

// ErrInvalidPool is wrapped when a pool argument is not a live pool of
// this allocator, or the default pool is asked to do what only private
// pools do.
var ErrInvalidPool = errors.New("vmmalloc: invalid pool")

// maxPools bounds the private pools of one allocator (NewPool refuses
// more): the address-space bound is stated for this many.
const maxPools = 64

// Pool is a private memory pool of an Allocator (PyTorch's MemPool): its
// blocks serve only Mallocs made through it. Free any pointer with
// Allocator.Free, wherever it came from; RecordStream works as for the
// default pool. All methods are safe for concurrent use.
type Pool struct {
	a    *Allocator
	id   PoolID
	name string
	slot int // index in Allocator.pools and streamState.owners; 0 for the default pool
	// expandable: this pool maps into expandable segments (else classic
	// ones). Fixed at creation.
	expandable bool
	// limit is the most bytes the pool may have mapped; math.MaxUint64
	// when none. Fixed at creation.
	limit uint64
	// align is PoolOptions.Alignment (0: the granule). Fixed at creation.
	align uint64
	// isolated is PoolOptions.Isolated. Fixed at creation.
	isolated bool
	// st is the pool's own statistics, counted while Allocator.pooled; mu.
	st stats.HotCounters
	// recs are the records statsOf returns: the aggregate, then st. Fixed.
	recs [2]*stats.HotCounters
	// idle owns the memory of released and vanished streams in this pool
	// (streams.go). mu.
	idle *streamState
	// highWater is, per size class, the most bytes allocated in the pool
	// plus the request being grown for, seen by a growth so far; the
	// defrag limit is relative to it (reclaim.go). mu.
	highWater [2]uint64
	// Per size class: defragAt is the high water mark when a growth
	// first found the pool past its defrag limit at that mark, and
	// defragChurn the pool's cumulative allocated bytes then (or at the
	// last slack raise); defragSlack is the nbytes by which growths that
	// came back past the limit at the same mark, a mark's worth of
	// allocation later, raised it (learnDefragSlack, reclaim.go). mu.
	defragAt    [2]uint64
	defragChurn [2]int64
	defragSlack [2]uint64
	// mapping is the bytes the pool's growths in flight map without mu
	// (mapGrowth), counted against its limit. mu.
	mapping uint64
	closed  bool // guarded by mu
	// cachedAtOpen is, per size class, the bytes the device-wide handle
	// cache held when the pool was made: Close trims it back to there (or
	// to its level at Close, if lower). mu.
	cachedAtOpen [2]uint64
	// closing: Close is releasing the pool's memory without mu; Mallocs
	// through it are refused. mu.
	closing bool
	// asleep: the pool is not awake (sleeping, asleep or waking;
	// sleep.go): Malloc and RecordStream refuse it, releases skip it. mu.
	asleep bool
	// sleep is the pool's sleep record, kept while awake for its spare
	// host buffers; nil until the first Sleep. mu.
	sleep *poolSleep
}

// DefaultPool is the allocator's own cache, which Allocator.Malloc
// allocates from: PoolID (0, 0). It cannot be closed (Close the Allocator).
func (a *Allocator) DefaultPool() *Pool { return &a.def }

// NewPool makes a private pool (torch.cuda.MemPool). Its memory shares the
// device's address reservations and handle caches with every other pool,
// but a block of it is never handed to another pool's Malloc.
func (a *Allocator) NewPool(o PoolOptions) (*Pool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if o.Segments < SegmentsDefault || o.Segments > SegmentsClassic {
		return nil, fmt.Errorf("%w: PoolOptions.Segments: %d", ErrInvalidConfig, o.Segments)
	}
	if o.MemoryLimit != 0 && o.MemoryLimit < a.gran {
		return nil, fmt.Errorf("%w: PoolOptions.MemoryLimit: %d bytes is below one granule (%d bytes)", ErrInvalidConfig, o.MemoryLimit, a.gran)
	}
	if al := o.Alignment; al != 0 {
		switch {
		case al&(al-1) != 0:
			return nil, fmt.Errorf("%w: PoolOptions.Alignment: %d is not a power of two", ErrInvalidConfig, al)
		case al < a.gran || al%a.gran != 0:
			return nil, fmt.Errorf("%w: PoolOptions.Alignment: %d is not a multiple of the driver granularity %d", ErrInvalidConfig, al, a.gran)
		case al > a.total:
			return nil, fmt.Errorf("%w: PoolOptions.Alignment: %d is larger than the device's %d bytes", ErrInvalidConfig, al, a.total)
		case o.Segments == SegmentsClassic || o.Segments == SegmentsDefault && !a.cfg.ExpandableSegments:
			return nil, fmt.Errorf("%w: PoolOptions.Alignment needs expandable segments", ErrInvalidConfig)
		}
	}
	live := 0
	for _, p := range a.pools[1:] {
		if p == nil {
			continue
		}
		live++
		if o.ID != (PoolID{}) && p.id == o.ID {
			return nil, fmt.Errorf("%w: PoolOptions.ID %v is the ID of pool %q", ErrInvalidConfig, o.ID, p.name)
		}
	}
	if live >= maxPools {
		return nil, fmt.Errorf("%w: %d private pools already (at most %d)", ErrInvalidConfig, live, maxPools)
	}
	id := o.ID
	if id == (PoolID{}) {
		a.poolSeq++
		id = PoolID{0, a.poolSeq}
	}
	p := &Pool{a: a, id: id, name: o.Name, expandable: a.cfg.ExpandableSegments, limit: math.MaxUint64}
	p.cachedAtOpen = [2]uint64{a.classes[0].cache.Bytes(), a.classes[1].cache.Bytes()}
	p.recs = [2]*stats.HotCounters{&a.st, &p.st}
	if p.name == "" {
		p.name = fmt.Sprintf("pool(%d,%d)", id[0], id[1])
	}
	switch o.Segments {
	case SegmentsExpandable:
		p.expandable = true
	case SegmentsClassic:
		p.expandable = false
	}
	if o.MemoryLimit != 0 {
		p.limit = o.MemoryLimit
	}
	if o.Alignment > a.gran {
		p.align = o.Alignment
	}
	p.isolated = o.Isolated
	p.st.MaxSplitSize = a.st.MaxSplitSize
	var err error
	if p.idle, err = a.newStreamState(idleStream); err != nil {
		return nil, err
	}
	p.idle.pool, p.idle.primary, p.idle.idleOwner = p, p.idle, true
	if !a.pooled {
		// From now on every pool counts its own record; the default
		// pool's so far is the aggregate.
		a.pooled = true
		a.def.st = a.st
	}
	if !p.expandable {
		a.setSplitHook()
	}
	p.slot = len(a.pools)
	for i, q := range a.pools {
		if i > 0 && q == nil {
			p.slot = i
			break
		}
	}
	if p.slot == len(a.pools) {
		a.pools = append(a.pools, nil)
	}
	a.pools[p.slot] = p
	return p, nil
}

// ID is the pool's PoolID ((0, 0) for the default pool).
func (p *Pool) ID() PoolID { return p.id }

// Name is the pool's name ("default" for the default pool).
func (p *Pool) Name() string { return p.name }

// Allocator is the allocator the pool belongs to.
func (p *Pool) Allocator() *Allocator { return p.a }

// Expandable reports whether the pool maps its memory in expandable
// segments.
func (p *Pool) Expandable() bool { return p.expandable }

// MemoryLimit is the most bytes the pool may have mapped; 0 when it has no
// limit of its own.
func (p *Pool) MemoryLimit() uint64 {
	if p.limit == math.MaxUint64 {
		return 0
	}
	return p.limit
}

// live reports whether p may serve and count calls. mu held.
func (p *Pool) live() error {
	switch {
	case p.a.closed:
		return ErrClosed
	case p.closed:
		return fmt.Errorf("%w: pool %q is closed", ErrClosed, p.name)
	case p.closing:
		return fmt.Errorf("%w: pool %q is being closed", ErrClosed, p.name)
	}
	return nil
}

// Malloc allocates size bytes from the pool on stream (0 = the default
// stream), as Allocator.Malloc does from the default pool. Free the
// pointer with Allocator.Free.
func (p *Pool) Malloc(size uint64, stream backend.Stream) (uintptr, error) {
	a := p.a
	if p.slot == 0 { // the default pool
		return a.Malloc(size, stream)
	}
	a.mu.Lock()
	if pl := a.planned; pl != nil && p.slot < len(pl.steps) {
		if sp := pl.steps[p.slot]; sp != nil && sp.p == p {
			switch sp.state {
			case stepPlanned:
				if addr := a.planMalloc(sp, size, stream); addr != 0 {
					return addr, nil
				}
			case stepLearning:
				return a.learnMalloc(sp, size, stream)
			}
		}
	}
	// The cache hit, as Allocator.Malloc's, on the pool's owner of the
	// stream used last (a closed pool has none).
	if ss := a.lastS; ss != nil && a.hitOff&(hitClosed|hitPending|hitHistory) == 0 && !p.asleep && size-1 < a.total &&
		(ss.stream == stream || stream == 0 && ss.stream == a.defaultS) && p.slot < len(ss.owners) {
		if o := ss.owners[p.slot]; o != nil {
			rounded := (size + minBlockSize - 1) &^ (minBlockSize - 1)
			if !a.plainRound {
				rounded = a.roundSize(size)
			}
			if p.align != 0 {
				rounded = roundUp(rounded, p.align) // size-1 < a.total: no wrap
			}
			cl := a.classFor(rounded)
			maxSize, minSplit := a.fitLimits(p.expandable, cl, rounded)
			if a.st.ReservedBytes[0].Current > a.pressureAt || p.limit != math.MaxUint64 {
				maxSize = a.poolHitBound(p, rounded, maxSize) // pressure.go
			}
			if b, addr, bsize := a.heap.AllocFit(o.sid, uint8(cl.idx), rounded, size, maxSize, minSplit); b != 0 {
				if bsize < a.oversize { // countAlloc's common case (pooled), without the call
					o.active++
					stats.CountMallocBoth(&a.st, &o.pool.st, cl.kind, int64(bsize), int64(size))
				} else {
					a.countAlloc(o, cl, bsize, size)
				}
				a.mu.Unlock()
				return addr, nil
			}
		}
	}
	return a.mallocSlow(p, size, stream)
}

// owner returns the state of pool p for the stream whose primary state is
// ss, making it on first use. mu held.
func (a *Allocator) owner(p *Pool, ss *streamState) (*streamState, error) {
	if p == &a.def {
		return ss, nil
	}
	if p.slot < len(ss.owners) {
		if o := ss.owners[p.slot]; o != nil {
			return o, nil
		}
	}
	o, err := a.newStreamState(ss.stream)
	if err != nil {
		return nil, err
	}
	o.pool, o.primary = p, ss
	for len(ss.owners) <= p.slot {
		ss.owners = append(ss.owners, nil)
	}
	ss.owners[p.slot] = o
	return o, nil
}

// inUse reports whether owner t is its stream's live owner in its pool
// (not released, vanished or idle). mu held.
func (a *Allocator) inUse(t *streamState) bool {
	ps := a.streams[t.stream]
	if ps == nil || t.primary != ps {
		return false
	}
	if t.lead != nil {
		return a.inUse(t.lead) && slices.Contains(t.lead.isolated, t)
	}
	return t == ps || t.pool.slot < len(ps.owners) && ps.owners[t.pool.slot] == t
}

// ownersOf lists pool p's owners of streams in use, in stream order. mu
// held.
func (a *Allocator) ownersOf(p *Pool) []*streamState {
	var out []*streamState
	for _, ss := range a.sortedStreams() {
		if p == &a.def {
			out = append(out, ss)
		} else if p.slot < len(ss.owners) && ss.owners[p.slot] != nil {
			o := ss.owners[p.slot]
			out = append(out, o)
			out = append(out, o.isolated...)
		}
	}
	return out
}

// statsOf returns the records a change to pool p's statistics moves: the
// aggregate, and p's own once private pools exist. mu held.
func (a *Allocator) statsOf(p *Pool) []*stats.HotCounters {
	if !a.pooled {
		return p.recs[:1]
	}
	return p.recs[:2]
}

// setSplitHook counts classic inactive_split through the heap's split
// hook once a classic pool exists (expandable free handles can always be
// released, so PyTorch leaves them out). mu held (or a not yet shared).
func (a *Allocator) setSplitHook() {
	if a.splitHooked {
		return
	}
	a.splitHooked = true
	a.heap.SetSplitHook(func(class uint8, sid arena.StreamID, blocks, bytes int64) {
		o := a.states[sid]
		if o == nil || o.pool.expandable {
			return
		}
		kind := a.classes[class].kind
		for _, st := range a.statsOf(o.pool) {
			st.InactiveSplit.Add(kind, blocks)
			st.InactiveSplitBytes.Add(kind, bytes)
		}
	})
}

// Stats returns a copy of the pool's statistics, in the shape of
// Allocator.Stats; the pools' current values and accumulated counts add up
// to the allocator's. The driver-call counters (NumDeviceAlloc and the
// like) are the device's and appear only in Allocator.Stats.
func (p *Pool) Stats() stats.DeviceStats {
	a := p.a
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.poolStats(p)
}

// poolStats is Pool.Stats with mu held.
func (a *Allocator) poolStats(p *Pool) stats.DeviceStats {
	var s stats.DeviceStats
	if !a.pooled {
		s = a.st.Settled()
		s.MaxSplitSize = a.st.MaxSplitSize
	} else {
		s = p.st.Settled()
	}
	s.AsleepBytes, s.HostBackupBytes = a.sleepTotals(p)
	return s
}

// MemoryAllocated is the bytes in the pool's allocated blocks.
func (p *Pool) MemoryAllocated() uint64 {
	s := p.Stats()
	return uint64(s.AllocatedBytes[stats.AllPools].Current)
}

// MemoryReserved is the bytes of device memory the pool has mapped.
func (p *Pool) MemoryReserved() uint64 {
	s := p.Stats()
	return uint64(s.ReservedBytes[stats.AllPools].Current)
}

// Pools lists the allocator's pools, the default pool first, then the
// private ones in the order of their slots.
func (a *Allocator) Pools() []*Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*Pool, 0, len(a.pools))
	for _, p := range a.pools {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// EmptyCache returns the pool's free memory to the driver (empty_cache
// inside a pool, which PyTorch makes a no-op, pytorch#158152): it waits for
// pending stream events, unmaps the pool's free handles, frees its free
// classic segments and the cached physical handles. Other pools' memory is
// untouched. Of an asleep pool, whose free memory is unmapped already, it
// gives up the free cache Wake would map back: Wake maps only what holds
// allocations.
func (p *Pool) EmptyCache() error {
	a := p.a
	a.mu.Lock()
	defer a.unlock()
	if err := p.live(); err != nil {
		return err
	}
	a.histEmptyCache()
	p.forgetDefragSlack()
	err := errors.Join(a.stepsEvent(p, true), a.synchronizeAndFreeEvents())
	if p.asleep && p.sleep.state == Asleep {
		// Its free cache is unmapped already: Wake will not map it back.
		err = errors.Join(err, a.dropFreeRuns(p, p.sleep))
	}
	err = errors.Join(err, a.releasePool(p), a.flushUnmaps())
	return errors.Join(err, a.trimCaches(), a.sweepSegments())
}

// releasePool unmaps every free handle and frees every free classic
// segment of pool p: its idle owner's (no wait), then each owner's after
// synchronising its stream. mu held (dropped while it waits).
func (a *Allocator) releasePool(p *Pool) error {
	errs := []error{a.releaseStream(p.idle, 0, false)}
	for _, o := range a.ownersOf(p) {
		if a.heap.FreeLen(o.sid, smallIdx)+a.heap.FreeLen(o.sid, largeIdx) == 0 {
			continue
		}
		errs = append(errs, a.releaseStream(o, 0, true))
	}
	return errors.Join(errs...)
}

// Close returns the pool's memory to the driver and retires the pool;
// later calls on it return an error wrapping ErrClosed. The handles of
// the pool's memory do not stay in the device-wide handle cache
// (handle_cache_mb): Close trims the cache back to the bytes it held when
// the pool was made, so the device's free memory is at least what it was
// then (handles the pool's growth took from the cache are freed, not put
// back). Close refuses
// (ErrPoolBusy, changing nothing) while the pool has live allocations,
// pending frees included: a tensor that outlives its pool stays valid, and
// is freed with Allocator.Free as usual (pytorch#146431). To wait for
// them, free them (or let their owners free them), then call Close again;
// Stats().Active says how many are left. The default pool cannot be
// closed: close the Allocator.
func (p *Pool) Close() error {
	a := p.a
	a.mu.Lock()
	defer a.unlock()
	if err := p.live(); err != nil {
		return err
	}
	if p == &a.def {
		return fmt.Errorf("%w: the default pool closes with the allocator", ErrInvalidPool)
	}
	a.quiesceWaits()
	if err := a.poolClosing(p); err != nil {
		return err
	}
	if err := p.live(); err != nil {
		return err // closed by another Close meanwhile
	}
	if p.asleep {
		// Nothing allocated: nothing to wake; its free cache is given up.
		if err := a.closeAsleep(p); err != nil {
			return err
		}
	}
	if n, bytes := p.st.ActiveNow(stats.AllPools); n > 0 {
		return fmt.Errorf("%w: pool %q has %d allocations (%d bytes) not yet freed", ErrPoolBusy, p.name, n, bytes)
	}
	if len(a.vanished) > 0 {
		// Memory of streams destroyed without ReleaseStream waits for a
		// device synchronize before anything may unmap it.
		qerr := a.quiesce()
		for _, o := range a.poolOwnersAll(p) {
			if _, gone := a.vanished[o.stream]; gone && o.primary == a.vanished[o.stream] && a.heap.StreamBlocks(o.sid) > 0 {
				return fmt.Errorf("%w: pool %q holds memory of stream %d, destroyed without ReleaseStream, until a device synchronize: %w", ErrPoolBusy, p.name, o.stream, qerr)
			}
		}
	}
	// Detach the pool's owners so that no Malloc (the cache hit finds
	// owners through their streams) takes its memory while the releases
	// below wait for their streams without mu; closing makes the general
	// path refuse the pool.
	owners := a.poolOwnersAll(p)
	for _, o := range owners {
		if o.lead == nil {
			o.primary.owners[p.slot] = nil
		}
	}
	p.closing = true
	// The releases unmap the pool's handles into the device-wide handle
	// caches, as a ReleaseStream of its streams did before: trimmed back
	// to where they stood when the pool was made (or now, if lower), the
	// caches give the pool's handles to the driver and keep what was
	// there before it (TestReturnsMemoryToDriver).
	cached := [2]uint64{a.classes[0].cache.Bytes(), a.classes[1].cache.Bytes()}
	for i := range cached {
		cached[i] = min(cached[i], p.cachedAtOpen[i])
	}
	errs := []error{a.releaseStream(p.idle, 0, false)}
	for _, o := range owners {
		errs = append(errs, a.releaseStream(o, 0, true))
	}
	errs = append(errs, a.flushUnmaps())
	for i := range a.classes {
		if hc := a.classes[i].cache; hc.Bytes() > cached[i] {
			errs = append(errs, hc.TrimBytes(cached[i]))
		}
	}
	err := errors.Join(errs...)
	left := a.heap.StreamBlocks(p.idle.sid)
	for _, o := range owners {
		left += a.heap.StreamBlocks(o.sid)
	}
	p.closing = false
	if err != nil || left > 0 || a.closed {
		// Undo: the pool stays open, its owners where they were (an
		// owner whose stream was released meanwhile gives its memory to
		// the idle owner).
		for _, o := range owners {
			if a.inUsePrimary(o.primary) {
				if o.lead == nil {
					o.primary.owners[p.slot] = o
				}
			} else {
				a.adoptIntoIdle(o)
				a.unregister(o)
			}
		}
		if err == nil && left > 0 {
			err = fmt.Errorf("%w: pool %q still holds %d free blocks the driver did not release; retry", ErrPoolBusy, p.name, left)
		}
		if a.closed {
			return ErrClosed
		}
		return err
	}
	for _, o := range owners {
		a.unregister(o)
	}
	a.unregister(p.idle)
	if p.sleep != nil {
		_ = a.dropSleep(p) // awake: only spare host buffers
	}
	p.closed = true
	a.pools[p.slot] = nil
	a.setSleepOff()
	a.poolsClosed++
	return nil
}

// inUsePrimary reports whether ss is a primary stream state in use or
// vanished (not retired). mu held.
func (a *Allocator) inUsePrimary(ss *streamState) bool {
	return a.streams[ss.stream] == ss || a.vanished[ss.stream] == ss
}

// poolOwnersAll lists every owner of pool p: of streams in use and of
// vanished streams. mu held.
func (a *Allocator) poolOwnersAll(p *Pool) []*streamState {
	var out []*streamState
	add := func(ps *streamState) {
		if p.slot < len(ps.owners) && ps.owners[p.slot] != nil {
			out = append(out, ps.owners[p.slot])
			out = append(out, ps.owners[p.slot].isolated...)
		}
	}
	for _, ps := range a.sortedStreams() {
		add(ps)
	}
	ids := make([]backend.Stream, 0, len(a.vanished))
	for id := range a.vanished {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		add(a.vanished[id])
	}
	return out
}

// poolSummary is Summary's table of pools; "" while no private pool was
// ever made.
func (a *Allocator) poolSummary() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.pooled {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %-16s %-10s %10s %21s %21s\n", "pool", "name", "segments", "limit", "allocated cur/peak", "reserved cur/peak")
	for _, p := range a.pools {
		if p == nil {
			continue
		}
		st := &p.st
		kind, limit := "expandable", "-"
		if !p.expandable {
			kind = "classic"
		}
		if p.limit != math.MaxUint64 {
			limit = humanize.IBytes(p.limit)
		}
		fmt.Fprintf(&b, "%-10s %-16s %-10s %10s %10s/%10s %10s/%10s\n",
			fmt.Sprintf("(%d,%d)", p.id[0], p.id[1]), p.name, kind, limit,
			humanize.IBytes(uint64(st.AllocatedBytes[stats.AllPools].Current)), humanize.IBytes(uint64(st.AllocatedBytes[stats.AllPools].Peak)),
			humanize.IBytes(uint64(st.ReservedBytes[stats.AllPools].Current)), humanize.IBytes(uint64(st.ReservedBytes[stats.AllPools].Peak)))
	}
	return b.String()
}
