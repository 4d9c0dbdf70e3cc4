package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Allocator is a caching allocator for one device. All methods are safe for
// concurrent use; one mutex serialises them (as PyTorch's per-device
// allocator does), and the cache-hit path holds it for tens of
// nanoseconds.
type Allocator struct {
	drv     backend.Driver
	cfg     Config
	reserve handleReserve // created handles kept ready (reserve.go)
	dev     int
	total   uint64 // device capacity, nbytes
	gran    uint64 // driver MINIMUM granularity: the unit of mapping, nbytes
	allowed uint64 // reserved-memory cap from the memory fraction (SetMemoryFraction), nbytes; mu
	// pressureAt is the reserved bytes above which the device is under
	// pressure (pressure.go), for the cache hit's test; it follows
	// allowed (New, SetMemoryFraction). mu.
	pressureAt int64
	// plainRound: no roundup_power2_divisions bucket above 1, so
	// roundSize is rounding up to 512 bytes. Set by New.
	plainRound bool
	// oversize is the block size from which an allocation counts in
	// oversize_allocations: max_split_size_mb, or math.MaxUint64 when it
	// is unset (one compare on the cache hit). Set by New.
	oversize uint64
	// maxBlock is the largest rounded request one segment can hold, nbytes
	// (maxBlockSize): 32 TiB at 2 MiB granules, so only devices of tens of
	// TiB and more come near it. Set by New.
	maxBlock uint64

	mu       sync.Mutex
	quiet    sync.Cond                          // signalled (L = &mu) when inflight drops to 0
	inflight int                                // driver waits running with mu dropped (waitUnlocked); mu
	defaultS backend.Stream                     // the default stream; 0 once Close destroyed it; mu
	closed   bool                               // guarded by mu
	heap     *arena.Heap                        // every block: storage, split, coalesce, best fit (arena.Heap); mu
	states   []*streamState                     // stream states by arena.StreamID; mu
	segOf    []*seg                             // segments by arena.RegionID; mu
	uses     map[arena.BlockID][]backend.Stream // other streams recorded on allocated blocks (RecordStream); mu
	freeing  map[arena.BlockID]bool             // allocated blocks whose Free waits without mu (insertEvents); mu
	streams  map[backend.Stream]*streamState    // validated streams in use; mu
	vanished map[backend.Stream]*streamState    // streams destroyed behind the allocator's back; mu
	ghosts   uint64                             // ghost ids given to vanished streams whose id was reused; mu
	busy     []*streamState                     // streams with queued events, any order; mu
	stranded []arena.BlockID                    // PendingFree blocks waiting on a vanished stream's work; mu
	lastS    *streamState                       // most recently used stream; mu
	// hitOff has a bit (hitClosed, ...) for each precondition of the
	// cache hit that fails now, so that Malloc's and Free's fast paths
	// test one byte, not the fields it summarises; setHitOff and
	// setSleepOff recompute it wherever one changes, and Check verifies
	// it. mu.
	hitOff hitBits
	spare  []*streamState // empty states of released streams for reuse, at most maxSpareStates; mu
	// keepEmpty keeps empty expandable reservations while a released
	// stream's memory is returned, for the next stream to map into; mu.
	keepEmpty bool
	classes   [2]sizeClass      // small, large; mu
	segs      []*seg            // every segment, ascending base; mu
	pending   int               // blocks in PendingFree; mu
	events    []backend.Event   // idle events for reuse; mu
	st        stats.HotCounters // the aggregate of every pool; mu; Allocated/Freed of the hot arrays through Settled
	counters  segment.Counters  // driver-call figures shared by segments; mu
	scratch   []arena.BlockID   // reusable slice for release walks; mu
	hist      *history          // memory history (history.go); nil when off; mu
	// exported are the handles shared with other processes (ShareSpans),
	// mapped or held by their exporters only (exported.go); mu.
	exported map[backend.Handle]*exportedHandle

	zombies        []*zombie        // dropped segments still holding driver state; mu
	scratchEvents  []pendingEvent   // reusable slice for insertEvents; mu
	scratchStreams []backend.Stream // reusable slice for insertEvents; mu

	// growths are the tickets, ascending, of the growths whose driver map
	// calls run with mu dropped (mapGrowth), growSeq the last ticket
	// issued, mappingBytes the nbytes they map; grown is signalled
	// (L = &mu) whenever one ends. mu.
	growths      []uint64
	growSeq      uint64
	mappingBytes uint64
	grown        sync.Cond
	// releasesLive are the tickets, ascending, of the releases whose
	// unmaps run with mu dropped (releaseRels, flushUnmaps), releaseSeq
	// the last issued; grown is signalled when one ends too, for a
	// ladder's last look (oom.go). mu.
	releasesLive []uint64
	releaseSeq   uint64

	// def is the default pool: the allocator's own cache (pool.go).
	def Pool
	// pools are the live pools by Pool.slot: [0] is &def, nil marks a
	// closed private pool's slot for reuse. mu.
	pools []*Pool
	// pooled: a private pool has been made, so every pool counts its
	// own statistics besides the aggregate (pool.go). Never cleared. mu.
	pooled      bool
	poolSeq     uint64 // the last n of the PoolIDs (0, n) assigned; mu
	splitHooked bool   // the heap's split hook counts classic inactive_split; mu
	poolsClosed int    // private pools closed, ever; mu

	// hooks are the attached segment hooks, hookSeq the last HookID
	// given (hooks.go). mu.
	hooks   []*hook
	hookSeq HookID
	// unmapQueue holds the releases marked while hooks are attached, to
	// be reported and made by flushUnmaps before the call that queued
	// them returns; queuedBytes their nbytes. mu.
	unmapQueue  []unmapEntry
	queuedBytes uint64

	owned ownedSet // live owned Buffers (owned.go); its own lock, never taken under mu

	// quiescing counts the calls waiting in quiesceWaits (Close, Check,
	// snapshots) for inflight to drop to 0. waitWatch, nil except in
	// tests, is broadcast (L = &mu) whenever inflight or quiescing
	// changes, so that a test can wait for a call to reach one of those
	// waits instead of sleeping. mu.
	quiescing int
	waitWatch *sync.Cond

	// planned is the planned-step state (planned.go); nil when
	// planned_steps is off. mu.
	planned *planner
}

// streamState is the per-stream part of the allocator. The allocator's
// mutex guards every field.
type streamState struct {
	stream  backend.Stream
	sid     arena.StreamID // the stream's owner id in the heap, whose free indexes hold its free blocks per pool
	queue   []pendingEvent // events recorded on this stream, oldest first
	busyIdx int            // index in Allocator.busy while queue is not empty, else -1
	// frees counts Free calls that succeeded on blocks of this stream,
	// ever, whether the block went free or pending on events: Synchronize
	// and ReleaseStream wait again when one came during their wait.
	frees   uint64
	active  int    // Allocated and PendingFree blocks of this stream
	retired uint64 // events of queue retired, ever (ReleaseStream completes only those queued before its wait)
	// releasing: ReleaseStream is waiting for the stream without mu;
	// stream() refuses it, so no Malloc, RecordStream or Synchronize
	// starts on it, and it is never lastS.
	releasing bool
	// idle: an event recorded on the stream was found complete and no
	// block has been freed to it since, so every block in its free lists
	// may go to another stream (reclaim.go). Cleared by freeBlock.
	idle bool
	// idleOwner: this is a pool's idle owner (Pool.idle), which owns the
	// memory of released streams. Fixed.
	idleOwner bool
	// pool is the pool whose blocks this state owns. Fixed.
	pool *Pool
	// primary is the stream's state in the default pool, which holds its
	// events and lifecycle (queue, busyIdx, retired, releasing); itself
	// there. A private pool's state uses only its own sid, active, frees
	// and idle. Fixed.
	primary *streamState
	// owners are, on a primary state, the stream's states in private
	// pools by Pool.slot (nil where a pool has none).
	owners []*streamState
	// isolated are, on a stream's owner in an isolated pool (its lead,
	// which holds no block itself), the owners of one allocation each
	// (pool_isolated.go); lead is such an owner's lead, else nil.
	isolated []*streamState
	lead     *streamState
}

// pendingEvent is an event recorded on a stream that a PendingFree block
// waits for.
type pendingEvent struct {
	ev backend.Event
	b  arena.BlockID
}

// sizeClass is the small or the large size class (PyTorch's small and
// large "pools"; Pool is the public, private memory pool).
type sizeClass struct {
	kind     stats.PoolKind
	idx      int
	pageSize uint64 // bytes per full-size physical handle (expandable)
	// handleSize is the most bytes per physical handle a growth creates
	// (expandable): pageSize, or for the large pool the larger
	// expandable_handle_mb rounded up to the granule, for growths of at
	// least that many bytes (mapGrowth). Fixed at New.
	handleSize uint64
	vaSize     uint64               // bytes of VA per expandable segment
	cache      *segment.HandleCache // unmapped full-size handles
	nexp       int                  // expandable segments in this pool
}

// seg is one segment and its blocks.
type seg struct {
	s          *segment.Segment
	rid        arena.RegionID // the segment's region in the heap
	base       uintptr        // first byte of the reservation
	size       uint64         // nbytes reserved
	class      *sizeClass
	expandable bool
	// pool is the pool a classic segment was made for; nil for an
	// expandable one, whose reservation every pool shares. Fixed.
	pool *Pool
}

// segPool is the pool whose record counts segment sg: a classic
// segment's own, the default pool for a shared expandable reservation.
func (a *Allocator) segPool(sg *seg) *Pool {
	if sg.pool != nil {
		return sg.pool
	}
	return &a.def
}

// addReserved moves pool p's reserved bytes of size class kind by d, and
// the aggregate's. mu held.
func (a *Allocator) addReserved(p *Pool, kind stats.PoolKind, d int64) {
	for _, st := range a.statsOf(p) {
		st.ReservedBytes.Add(kind, d)
	}
}

const (
	smallIdx = 0
	largeIdx = 1
)

// classKind is the statistics pool kind of size class idx
// (sizeClass.kind without the load).
func classKind(idx uint8) stats.PoolKind {
	return stats.SmallPool + stats.PoolKind(idx)
}

// New creates an allocator for cfg.Device over drv. It creates the
// device's default stream (used when Malloc is given stream 0).
func New(drv backend.Driver, cfg Config) (*Allocator, error) {
	if drv == nil {
		return nil, fmt.Errorf("%w: nil driver", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Device >= drv.DeviceCount() {
		return nil, fmt.Errorf("%w: Device: %d, but the driver has %d devices", ErrInvalidConfig, cfg.Device, drv.DeviceCount())
	}
	prop := backend.DeviceProp(cfg.Device)
	gran, err := drv.Granularity(prop, backend.GranularityMinimum)
	if err != nil {
		return nil, err
	}
	for _, ps := range []struct {
		name string
		v    uint64
	}{{"small_segment_size_mb", cfg.SmallSegmentSize}, {"large_segment_size_mb", cfg.LargeSegmentSize}} {
		if gran == 0 || ps.v%gran != 0 {
			return nil, fmt.Errorf("%w: %s: %d bytes is not a multiple of the driver granularity %d", ErrInvalidConfig, ps.name, ps.v, gran)
		}
	}
	_, total, err := drv.MemGetInfo(cfg.Device)
	if err != nil {
		return nil, err
	}
	heap, err := arena.NewHeap(len(Allocator{}.classes))
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		heap:     heap,
		states:   make([]*streamState, 1),
		segOf:    make([]*seg, 1),
		uses:     make(map[arena.BlockID][]backend.Stream),
		drv:      drv,
		cfg:      cfg,
		dev:      cfg.Device,
		total:    total,
		gran:     gran,
		allowed:  total,
		streams:  make(map[backend.Stream]*streamState),
		vanished: make(map[backend.Stream]*streamState),
	}
	a.quiet.L = &a.mu
	a.owned.init(&a.mu)

	a.maxBlock = maxBlockSize(gran, cfg.SmallSegmentSize, cfg.LargeSegmentSize)
	a.grown.L = &a.mu
	a.plainRound = true
	for _, d := range cfg.RoundupPower2Divisions {
		a.plainRound = a.plainRound && d <= 1
	}
	a.def = Pool{a: a, name: "default", expandable: cfg.ExpandableSegments, limit: math.MaxUint64}
	if cfg.PlannedSteps {
		a.planned = newPlanner(a) // after plainRound and def
	}
	a.def.recs = [2]*stats.HotCounters{&a.st, &a.def.st}
	a.pools = []*Pool{&a.def}
	if a.def.idle, err = a.newStreamState(idleStream); err != nil {
		return nil, err
	}
	a.def.idle.pool, a.def.idle.primary, a.def.idle.idleOwner = &a.def, a.def.idle, true
	if !cfg.ExpandableSegments {
		a.setSplitHook()
	}
	if cfg.PerProcessMemoryFraction < 1 {
		a.allowed = uint64(cfg.PerProcessMemoryFraction * float64(total))
	}
	a.oversize = math.MaxUint64
	a.pressureAt = pressureLine(a.allowed)
	if cfg.MaxSplitSize != 0 {
		a.st.MaxSplitSize = int64(cfg.MaxSplitSize)
		a.oversize = cfg.MaxSplitSize
	} else {
		a.st.MaxSplitSize = math.MaxInt64
	}
	for i, ps := range []uint64{cfg.SmallSegmentSize, cfg.LargeSegmentSize} {
		cl := &a.classes[i]
		cl.idx = i
		cl.kind = classKind(uint8(i))
		cl.pageSize = ps
		cl.handleSize = ps
		if i == largeIdx {
			cl.handleSize = max(ps, roundUp(cfg.ExpandableHandleSize, gran))
		}
		cl.vaSize = reservationSize(total, gran, ps)
		cl.cache = segment.NewHandleCache(drv, ps, prop, int(cfg.HandleCacheSize/ps), &a.counters)
		// The budget holds growth handles and the granule handles of
		// growths under pressure (pressure.go) as well as pages.
		cl.cache.Hold(cl.handleSize)
		cl.cache.Hold(gran)
		cl.cache.SetMaxBytes(cfg.HandleCacheSize)
	}
	s, err := drv.StreamCreate(cfg.Device)
	if err != nil {
		return nil, err
	}
	a.defaultS = s
	ss, err := a.newState(s)
	if err != nil {
		return nil, errors.Join(err, drv.StreamDestroy(s))
	}
	a.streams[s] = ss
	a.startReserve()
	return a, nil
}

// reservationSize is the VA size of one expandable segment: 9/8 of the
// device's memory rounded up to a page, but at most what one segment can
// track (segment.MaxGranules granules, rounded down to a page), so that a
// device of tens of TiB, or one reporting a capacity near 2^64, still gets
// reservations it can use (several, within max_segments_per_pool).
func reservationSize(total, gran, page uint64) uint64 {
	limit := uint64(math.MaxUint64) / page * page
	if gran <= math.MaxUint64/segment.MaxGranules {
		limit = segment.MaxGranules * gran / page * page
	}
	want := total + total/8
	if want < total || want > limit { // overflowed, or beyond one segment
		return limit
	}
	return min(roundUp(want, page), limit)
}

// maxBlockSize is the largest rounded request that one segment can hold
// (Allocator.maxBlock): the most bytes a segment tracks, segment.MaxGranules
// granules (2^63 when that does not fit in 64 bits), so that rounding up
// to any unit a growth rounds a request to (the granule, each pool's page,
// a multiple of the granule, and the classic 2 MiB step) stays within it.
// A request of at
// most that many bytes keeps every rounding within what a segment tracks
// and far from 2^64; growth handles of expandable_handle_mb do not round
// up (segment.MapLarge maps the last one shorter).
func maxBlockSize(gran, smallPage, largePage uint64) uint64 {
	track := uint64(1) << 63
	if gran <= track/segment.MaxGranules {
		track = segment.MaxGranules * gran
	}
	limit := track
	for _, u := range []uint64{gran, smallPage, largePage, roundLarge} {
		if u > 0 {
			limit = min(limit, roundDown(track, u))
		}
	}
	return roundDown(limit, minBlockSize)
}

// newStreamState makes the state of stream s and registers s with the
// heap. mu held (or a not yet shared).
func (a *Allocator) newStreamState(s backend.Stream) (*streamState, error) {
	ss := &streamState{stream: s, busyIdx: -1}
	return ss, a.register(ss)
}

// register makes ss.stream an owner of blocks in the heap. mu held.
func (a *Allocator) register(ss *streamState) error {
	sid, err := a.heap.AddStream(ss.stream)
	if err != nil {
		return err
	}
	ss.sid = sid
	for int(sid) >= len(a.states) {
		a.states = append(a.states, nil)
	}
	a.states[sid] = ss
	return nil
}

// freeLen and freeBytes count the free blocks of ss in every pool. mu held.
func (a *Allocator) freeLen(ss *streamState) int {
	return a.heap.FreeLen(ss.sid, smallIdx) + a.heap.FreeLen(ss.sid, largeIdx)
}

func (a *Allocator) freeBytes(ss *streamState) uint64 {
	return a.heap.FreeBytes(ss.sid, smallIdx) + a.heap.FreeBytes(ss.sid, largeIdx)
}

// ownerOf is the state owning block id. mu held.
func (a *Allocator) ownerOf(id arena.BlockID) *streamState {
	return a.states[a.heap.StreamOf(id)]
}

// segOfBlock is the segment holding block id. mu held.
func (a *Allocator) segOfBlock(id arena.BlockID) *seg { return a.segOf[a.heap.RegionOf(id)] }

// Device is the device ordinal this allocator serves.
func (a *Allocator) Device() int { return a.dev }

// DefaultStream is the stream Malloc uses when given stream 0; 0 once
// Close has destroyed it.
func (a *Allocator) DefaultStream() backend.Stream {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.defaultS
}

// Granularity is the driver's mapping granularity in bytes: the unit in
// which the allocator maps and unmaps device memory, so the multiple that
// OutOfMemoryError.Tried and reserved bytes are rounded to.
func (a *Allocator) Granularity() uint64 { return a.gran }

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config { return a.cfg }

// Driver returns the driver the allocator allocates through.
func (a *Allocator) Driver() backend.Driver { return a.drv }

func roundUp(n, m uint64) uint64   { return (n + m - 1) / m * m }
func roundDown(n, m uint64) uint64 { return n / m * m }

// stream returns the state of s, validating it on first use. mu held.
func (a *Allocator) stream(s backend.Stream) (*streamState, error) {
	if s == 0 {
		s = a.defaultS
	}
	if ss := a.lastS; ss != nil && ss.stream == s {
		return ss, nil
	}
	ss, ok := a.streams[s]
	if !ok {
		if s >= minInternalStream {
			return nil, fmt.Errorf("%w: stream %d", ErrInvalidStream, s)
		}
		if _, err := a.validator().Validate(s); err != nil {
			return nil, invalidStream(err)
		}
		var err error
		if old, gone := a.vanished[s]; gone {
			// The driver handed a destroyed stream's id to a new stream
			// (CUDA and ACL ids are pointers, and are reused).
			a.retireVanishedID(old)
		}
		if ss, err = a.newState(s); err != nil {
			return nil, err
		}
		a.streams[s] = ss
	}
	if ss.releasing { // never lastS (ReleaseStream cleared it)
		return nil, fmt.Errorf("%w: stream %d is being released", ErrInvalidStream, s)
	}
	a.lastS = ss
	return ss, nil
}

// roundSize rounds a request to a block size: at least 512 bytes, a
// multiple of 512, and, where roundup_power2_divisions sets d > 1 for the
// request's bucket, up to the next 1/d step between powers of two.
func (a *Allocator) roundSize(size uint64) uint64 {
	if size <= minBlockSize {
		return minBlockSize
	}
	// Bucket i holds sizes in [2^i, 2^(i+1)) MiB; sizes below 1 MiB use
	// bucket 0, sizes of 32 GiB and up bucket 15.
	idx := max(bitsLen(size>>20)-1, 0)
	idx = min(idx, numRoundupBuckets-1)
	if d := uint64(a.cfg.RoundupPower2Divisions[idx]); d > 1 && size > minBlockSize*d {
		floor := uint64(1) << (bitsLen(size) - 1)
		if floor != size {
			step := floor / d
			size = roundUp(size, step)
		}
	}
	return roundUp(size, minBlockSize)
}

// classFor returns the size class serving rounded sizes of n bytes.
func (a *Allocator) classFor(n uint64) *sizeClass {
	if n <= smallSize {
		return &a.classes[smallIdx]
	}
	return &a.classes[largeIdx]
}

// hitBits is a set of reasons why the cache hit may not be taken now.
type hitBits uint8

const (
	hitClosed    hitBits = 1 << iota // Close was called
	hitPending                       // some block is pending free (events to process)
	hitHistory                       // memory history is on
	hitUses                          // some block has other streams recorded on it (RecordStream)
	hitAsleep                        // the default pool is asleep
	hitAnyAsleep                     // some pool is asleep (the default one or a private one)

	// mallocHitOff are the reasons that keep the default pool's Malloc
	// off its cache hit, freeHitOff those that keep Free off its own (a
	// free in a pool asleep drops the block's backup: freeSlow).
	mallocHitOff = hitClosed | hitPending | hitHistory | hitAsleep
	freeHitOff   = hitClosed | hitHistory | hitUses | hitAnyAsleep
	// sleepHitOff are the reasons that only Sleep and Wake change.
	sleepHitOff = hitAsleep | hitAnyAsleep
)

// hitOffNow computes hitOff from the fields it summarises. mu held.
func (a *Allocator) hitOffNow() hitBits {
	return a.hitOffFields() | a.hitOffSleep()
}

// hitOffFields is hitOffNow's part that setHitOff recomputes. mu held.
func (a *Allocator) hitOffFields() hitBits {
	var off hitBits
	if a.closed {
		off |= hitClosed
	}
	if a.pending != 0 {
		off |= hitPending
	}
	if a.hist != nil {
		off |= hitHistory
	}
	if len(a.uses) != 0 {
		off |= hitUses
	}
	return off
}

// hitOffSleep is hitOffNow's part that setSleepOff recomputes: it looks
// at every pool. mu held.
func (a *Allocator) hitOffSleep() hitBits {
	var off hitBits
	if a.def.asleep {
		off |= hitAsleep
	}
	for _, p := range a.pools {
		if p != nil && p.asleep {
			off |= hitAnyAsleep
		}
	}
	return off
}

// setHitOff brings hitOff up to date after a change of closed, pending,
// hist or uses. mu held.
func (a *Allocator) setHitOff() { a.hitOff = a.hitOff&sleepHitOff | a.hitOffFields() }

// setSleepOff brings hitOff up to date after a pool fell asleep, woke or
// closed. mu held.
func (a *Allocator) setSleepOff() { a.hitOff = a.hitOff&^sleepHitOff | a.hitOffSleep() }

// Malloc allocates size bytes on stream (0 = the default stream) and
// returns the device address. The memory may be used by work queued on
// stream; use RecordStream before using it on another stream.
func (a *Allocator) Malloc(size uint64, stream backend.Stream) (uintptr, error) {
	a.mu.Lock()
	if pl := a.planned; pl != nil {
		switch sp := pl.def; sp.state { // def is made with the planner
		case stepPlanned:
			if addr := a.planMalloc(sp, size, stream); addr != 0 {
				return addr, nil
			}
		case stepLearning:
			return a.learnMalloc(sp, size, stream)
		}
	}
	// The cache hit: the stream used last, no event to process, no
	// history, a free block that fits. One lock round trip without defer:
	// nothing between Lock and Unlock can panic.
	if ss := a.lastS; ss != nil && a.hitOff&mallocHitOff == 0 && size-1 < a.total &&
		(ss.stream == stream || stream == 0 && ss.stream == a.defaultS) {
		// Wraps to 0 only within 511 bytes of 2^64, which AllocFit refuses.
		rounded := (size + minBlockSize - 1) &^ (minBlockSize - 1)
		if !a.plainRound {
			rounded = a.roundSize(size)
		}
		cl := a.classFor(rounded)
		maxSize, minSplit := a.fitLimits(a.def.expandable, cl, rounded)
		maxSize = a.hitBound(rounded, maxSize)
		if b, addr, bsize := a.heap.AllocFit(ss.sid, uint8(cl.idx), rounded, size, maxSize, minSplit); b != arena.NoBlock {
			if bsize < a.oversize { // countAlloc's common case, without the call
				ss.active++
				if a.pooled {
					stats.CountMallocBoth(&a.st, &ss.pool.st, cl.kind, int64(bsize), int64(size))
				} else {
					a.st.CountMalloc(cl.kind, int64(bsize), int64(size))
				}
			} else {
				a.countAlloc(ss, cl, bsize, size)
			}
			a.mu.Unlock()
			return addr, nil
		}
	}
	return a.mallocSlow(&a.def, size, stream)
}

// mallocSlow is Malloc's general path in pool p: validation, events,
// growth, the OOM ladder and history. mu held; it unlocks.
func (a *Allocator) mallocSlow(p *Pool, size uint64, stream backend.Stream) (uintptr, error) {
	defer a.unlock()
	addr, err := a.mallocLocked(p, size, stream)
	if err != nil && a.planned != nil && a.dropIdleRegions(p, err) {
		return a.mallocLocked(p, size, stream) // with the idle plan regions back in the heap
	}
	return addr, err
}

// mallocLocked is mallocSlow without the unlock. mu held (dropped while
// a growth maps).
func (a *Allocator) mallocLocked(p *Pool, size uint64, stream backend.Stream) (uintptr, error) {
	if err := p.live(); err != nil {
		return 0, err
	}
	if p.asleep {
		return 0, p.notAwake()
	}
	if size == 0 {
		return 0, fmt.Errorf("%w: zero bytes", ErrInvalidSize)
	}
	if size > a.total {
		return 0, fmt.Errorf("%w: %d bytes is larger than device %d's %d bytes", ErrInvalidSize, size, a.dev, a.total)
	}
	rounded := a.roundSize(size)
	if p.align != 0 && rounded <= a.maxBlock {
		rounded = roundUp(rounded, p.align)
	}
	if rounded < size || rounded > a.maxBlock { // wrapped past 2^64, or beyond any segment
		return 0, fmt.Errorf("%w: %d bytes rounds up to more than the largest block one segment holds (%d bytes)", ErrInvalidSize, size, a.maxBlock)
	}
	ps, err := a.stream(stream)
	if err != nil {
		return 0, err
	}
	ss, err := a.owner(p, ps)
	if err != nil {
		return 0, err
	}
	if a.pending > 0 {
		a.processEvents()
	}
	cl := a.classFor(rounded)
	if p.isolated {
		if ss, err = a.isolatedOwner(ss, cl, rounded); err != nil {
			return 0, err
		}
	}
	b, addr, bsize := a.bestFit(ss, cl, rounded)
	if b != arena.NoBlock && cl.growthHandles() && a.guardsCuts(p) {
		if b, addr, bsize, err = a.fitPressed(ss, cl, rounded, b, addr, bsize); err != nil {
			return 0, err
		}
	}
	if b == arena.NoBlock {
		if b, err = a.allocSlow(ss, cl, rounded, size); err != nil {
			if a.hist != nil {
				a.histOOM(size, ss.stream, ss.pool.id, err)
			}
			return 0, err
		}
		pk, _ := a.heap.Peek(b)
		addr, bsize = pk.Addr, pk.Size
	}
	if err := a.allocFound(ss, cl, b, bsize, rounded, size); err != nil {
		return 0, err
	}
	if a.hist != nil {
		a.histAlloc(b, size)
	}
	return addr, nil
}

// bestFit returns the best free block of ss in cl for rounded bytes, its
// address and size, or NoBlock: none fits, or the best one is larger than
// fitLimits allows (PyTorch's max_split_size rules for classic
// oversize blocks). mu held.
func (a *Allocator) bestFit(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, uintptr, uint64) {
	b, addr, size := a.heap.BestFitAt(ss.sid, uint8(cl.idx), rounded)
	if b == arena.NoBlock {
		return b, addr, size
	}
	if maxSize, _ := a.fitLimits(ss.pool.expandable, cl, rounded); size > maxSize {
		return arena.NoBlock, 0, 0
	}
	return b, addr, size
}

// fitLimits is the one statement of which free block may serve a request
// of rounded bytes in cl (PyTorch's max_split_size rules in classic mode)
// and when it is split: the largest such block, and the smallest remainder
// split off. AllocFit takes them as bounds; bestFit and shouldSplit apply
// them on the general path.
func (a *Allocator) fitLimits(expandable bool, cl *sizeClass, rounded uint64) (maxSize, minSplit uint64) {
	if expandable {
		return math.MaxUint64, minBlockSize
	}
	maxSize = math.MaxUint64
	if mss := a.cfg.MaxSplitSize; mss != 0 {
		// bestFit refuses a block of size >= lim, computed as it does
		// (with MaxNonSplitRounding 0, every block).
		lim := mss
		if rounded >= mss {
			lim = rounded + a.cfg.MaxNonSplitRounding
		}
		maxSize = max(lim, 1) - 1
	}
	switch {
	case cl.idx == smallIdx:
		minSplit = minBlockSize
	case a.cfg.MaxSplitSize == 0 || rounded < a.cfg.MaxSplitSize:
		minSplit = smallSize + 1
	default:
		minSplit = math.MaxUint64 // never split
	}
	return maxSize, minSplit
}

// shouldSplit reports whether a free block of size bytes serving rounded
// bytes in cl is split (fitLimits' minimum remainder).
func (a *Allocator) shouldSplit(expandable bool, cl *sizeClass, size, rounded uint64) bool {
	_, minSplit := a.fitLimits(expandable, cl, rounded)
	return size-rounded >= minSplit
}

// inactiveSplit reports whether block b counts in inactive_split: a free
// block split off a larger classic segment (expandable free handles can
// always be released, so PyTorch leaves them out). The heap's split hook
// keeps the statistic; Check recounts it with this.
func (a *Allocator) inactiveSplit(b arena.BlockInfo) bool {
	return b.State == arena.Free && b.IsSplit() && !a.states[b.StreamID].pool.expandable
}

// allocFound hands out free block b of ss, of bsize bytes, for a request,
// splitting off the rest. mu held.
func (a *Allocator) allocFound(ss *streamState, cl *sizeClass, b arena.BlockID, bsize, rounded, size uint64) error {
	if a.shouldSplit(ss.pool.expandable, cl, bsize, rounded) {
		bsize = rounded
	}
	if err := a.heap.Alloc(b, bsize, size); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	a.countAlloc(ss, cl, bsize, size)
	return nil
}

// countAlloc counts a block of bsize bytes handed out on ss for a request
// of size bytes. mu held.
func (a *Allocator) countAlloc(ss *streamState, cl *sizeClass, bsize, size uint64) {
	ss.active++
	if a.pooled {
		stats.CountMallocBoth(&a.st, &ss.pool.st, cl.kind, int64(bsize), int64(size))
	} else {
		a.st.CountMalloc(cl.kind, int64(bsize), int64(size))
	}
	if bsize >= a.oversize {
		for _, st := range a.statsOf(ss.pool) {
			st.OversizeAllocations.Add(1)
		}
	}
}

// Free returns ptr to the allocator. If other streams were recorded on it
// with RecordStream, its memory is reused only after events recorded on
// those streams now have completed. On error nothing changes.
func (a *Allocator) Free(ptr uintptr) error {
	a.mu.Lock()
	if pl := a.planned; pl != nil {
		if r := pl.hot; r != nil && ptr-r.base < uintptr(r.size) { // a planned block
			err := a.planFree(pl, r, ptr)
			if len(a.unmapQueue) > 0 { // a retired region went back to the heap
				_ = a.flushUnmaps()
			}
			a.mu.Unlock()
			return err
		}
		if ptr-pl.lo < pl.span || pl.learning > 0 {
			if done, err := a.stepFree(pl, ptr); done {
				a.unlock()
				return err
			}
		}
	}
	// The common case: no stream recorded on any block, no history, no
	// pool asleep, no event on this one. One lock round trip without
	// defer.
	if a.hitOff&freeHitOff == 0 {
		if pk, ok := a.heap.FreeAt(ptr); ok {
			// No guess from lastS: a private pool's owner is never
			// lastS, and the index costs what the guess does.
			ss := a.states[pk.Stream]
			ss.idle = false
			ss.active--
			ss.frees++
			if pk.Size < a.oversize { // countFree's common case, without the call
				kind := classKind(pk.Pool)
				a.st.CountFree(kind, int64(pk.Size), int64(pk.Requested))
				if a.pooled {
					ss.pool.st.CountFree(kind, int64(pk.Size), int64(pk.Requested))
				}
			} else {
				a.countFree(ss, pk)
			}
			if ss.idleOwner {
				return a.releaseIdleUnlock()
			}
			a.mu.Unlock()
			return nil
		}
	}
	return a.freeSlow(ptr)
}

// releaseIdleUnlock gives back the memory freed to the idle owner (see
// freeBlockPeek). mu held; it unlocks.
func (a *Allocator) releaseIdleUnlock() error {
	defer a.unlock()
	_ = a.releaseIdles()
	return nil
}

// countFree counts in the statistics the free of Allocated block pk of
// ss (no events; the heap has freed it). mu held.
func (a *Allocator) countFree(ss *streamState, pk arena.Freed) {
	kind := classKind(pk.Pool)
	a.st.CountFree(kind, int64(pk.Size), int64(pk.Requested))
	if a.pooled {
		ss.pool.st.CountFree(kind, int64(pk.Size), int64(pk.Requested))
	}
	if pk.Size >= a.oversize {
		for _, st := range a.statsOf(ss.pool) {
			st.OversizeAllocations.Add(-1)
		}
	}
}

// freeSlow is Free's general path: bad pointers, recorded streams,
// events, history. mu held; it unlocks.
func (a *Allocator) freeSlow(ptr uintptr) error {
	defer a.unlock()
	return a.freeLocked(ptr)
}

// freeLocked is freeSlow without the unlock. mu held.
func (a *Allocator) freeLocked(ptr uintptr) error {
	if a.closed {
		return ErrClosed
	}
	if ptr == 0 || ptr%minBlockSize != 0 { // never handed out: no lookup
		return a.badPointer(ptr)
	}
	b := a.heap.Lookup(ptr)
	if b == arena.NoBlock {
		return a.badPointer(ptr)
	}
	if len(a.uses) > 0 {
		if uses := a.uses[b]; len(uses) > 0 {
			if err := a.insertEvents(b, uses); err != nil {
				return err // nothing changed
			}
			delete(a.uses, b)
			a.setHitOff()
		}
	}
	if a.hist != nil {
		a.histFreeRequested(b)
	}
	pk, _ := a.heap.Peek(b)
	owner := a.states[pk.Stream]
	if p := owner.pool; p.asleep && a.dropBackup(p, ptr) {
		// The backup's pinned memory goes with its last block, once the
		// free is done (freeSpares drops mu).
		defer func() {
			if sl := p.sleep; sl != nil {
				_ = a.freeSpares(sl)
			}
		}()
	}
	owner.frees++
	cl := &a.classes[pk.Pool]
	for _, st := range a.statsOf(owner.pool) {
		if pk.Size >= a.oversize {
			st.OversizeAllocations.Add(-1)
		}
	}
	if pk.Events > 0 {
		if err := a.heap.MarkPending(b); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		for _, st := range a.statsOf(owner.pool) {
			st.CountPending(cl.kind, int64(pk.Size))
		}
		a.pending++
		a.setHitOff()
		return nil
	}
	return a.freeBlockPeek(b, pk, false)
}

// badPointer classifies a pointer that is not a live allocation. mu held.
//
//   - ErrInteriorPointer: inside an allocated (or pending-free) block, not
//     at its start;
//   - ErrDoubleFree: the start of a pending-free block, or a 512-aligned
//     address inside mapped free memory, where a block may have been
//     handed out and freed already;
//   - ErrUnknownPointer: everything that can never have been handed out:
//     0, an address outside every reservation, one not 512-aligned, or
//     one in the unmapped part of a reservation.
func (a *Allocator) badPointer(ptr uintptr) error {
	sg := a.segAt(ptr)
	if sg == nil {
		return fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	}
	id := a.heap.Find(ptr)
	b, _ := a.heap.Block(id)
	switch {
	case id == arena.NoBlock:
		return fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	case b.Addr != ptr && (b.State == arena.Allocated || b.State == arena.PendingFree):
		return fmt.Errorf("%w: %#x is %d bytes into the block at %#x", ErrInteriorPointer, ptr, ptr-b.Addr, b.Addr)
	case b.State == arena.PendingFree:
		return fmt.Errorf("%w: %#x (free pending on stream events)", ErrDoubleFree, ptr)
	case b.State == arena.Unmapped:
		return fmt.Errorf("%w: %#x is in unmapped address space of the reservation at %#x", ErrUnknownPointer, ptr, sg.base)
	case ptr%minBlockSize != 0:
		return fmt.Errorf("%w: %#x is not 512-byte aligned", ErrUnknownPointer, ptr)
	default:
		return fmt.Errorf("%w: %#x is not the start of an allocation", ErrDoubleFree, ptr)
	}
}

// segAt returns the segment whose range holds ptr. mu held.
func (a *Allocator) segAt(ptr uintptr) *seg {
	i := sort.Search(len(a.segs), func(i int) bool { return a.segs[i].base+uintptr(a.segs[i].size) > ptr })
	if i < len(a.segs) && a.segs[i].base <= ptr {
		return a.segs[i]
	}
	return nil
}

// freeBlock makes a PendingFree block free, its events done; the heap
// coalesces it with free neighbours of the same stream. mu held.
func (a *Allocator) freeBlock(b arena.BlockID) error {
	info, ok := a.heap.Peek(b)
	if !ok {
		return fmt.Errorf("%w: free of unknown block %d", ErrCorrupt, b)
	}
	return a.freeBlockPeek(b, info, true)
}

// freeBlockPeek makes block b free given what the heap says of it: an
// Allocated block, or (pending) a PendingFree one whose Allocation was
// counted down by Free already. mu held.
func (a *Allocator) freeBlockPeek(b arena.BlockID, info arena.Peek, pending bool) error {
	ss := a.lastS // usually the stream just used
	if ss == nil || ss.sid != info.Stream {
		ss = a.states[info.Stream]
	}
	cl := &a.classes[info.Pool]
	if _, err := a.heap.Free(b); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	ss.idle = false
	ss.active--
	if pending && a.pendingRegion(b, true) { // a plan region: never counted
		if ss.idleOwner {
			_ = a.releaseIdle(ss)
		}
		return nil
	}
	for _, st := range a.statsOf(ss.pool) {
		if pending {
			st.CountPendingFreed(cl.kind, int64(info.Size), int64(info.Requested))
		} else {
			st.CountFree(cl.kind, int64(info.Size), int64(info.Requested))
		}
	}
	if ss.idleOwner {
		_ = a.releaseIdle(ss)
	}
	return nil
}

// RecordStream marks ptr as used by work on stream s: when ptr is freed, its
// memory is reused only after that work completes. Recording the block's
// own allocation stream is a no-op. A stream the allocator already knows is
// asked about again (StreamDevice, a lookup that waits for nothing), so one
// destroyed since is refused with ErrInvalidStream, as one it never saw is
// and as the host allocator refuses it (see backend.StreamValidator).
func (a *Allocator) RecordStream(ptr uintptr, s backend.Stream) error {
	a.mu.Lock()
	defer a.unlock()
	if a.closed {
		return ErrClosed
	}
	if ptr == 0 || ptr%minBlockSize != 0 { // never handed out: no lookup
		return a.badPointer(ptr)
	}
	if pl := a.planned; pl != nil {
		if ok, err := a.stepRecordStream(pl, ptr, s); ok {
			return err
		}
	}
	b := a.heap.Lookup(ptr)
	if b == arena.NoBlock {
		return a.badPointer(ptr)
	}
	if a.freeing[b] {
		return fmt.Errorf("%w: %#x is being freed by another call", ErrDoubleFree, ptr)
	}
	if p := a.ownerOf(b).pool; p.asleep {
		return p.notAwake()
	}
	known := a.knownStream(s)
	ss, err := a.stream(s)
	if err != nil {
		return err
	}
	if known {
		if err := a.recheckStream(ss); err != nil {
			return err
		}
	}
	if owner := a.states[a.heap.StreamOf(b)]; owner.primary == ss {
		return nil // the block's own stream
	}
	if pl := a.planned; pl != nil && pl.learning > 0 {
		pl.recordLearnStream(ptr)
	}
	uses := a.uses[b]
	for _, u := range uses {
		if u == ss.stream {
			return nil
		}
	}
	a.uses[b] = append(uses, ss.stream)
	a.setHitOff()
	return nil
}

// Stats returns a copy of the allocator's statistics.
func (a *Allocator) Stats() stats.DeviceStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.statsLocked()
}

func (a *Allocator) statsLocked() stats.DeviceStats {
	s := a.st.Settled()
	s.NumDeviceAlloc = a.counters.Maps
	s.NumDeviceFree = a.counters.Unmaps
	s.HandlesCreated = a.counters.HandlesCreated
	s.HandlesFreed = a.counters.HandlesFreed
	s.HandlesReused = a.counters.HandlesReused
	s.NumStreamSyncs = a.counters.StreamSyncs
	s.StrandedBytes = int64(a.strandedBytes())
	s.ExportedHandles, s.ExportedBytes, s.ExporterHeldHandles, s.ExporterHeldBytes = a.exportedTotals()
	s.OwnedBytes = int64(a.owned.bytes.Load())
	s.OwnedReclaimedBytes = int64(a.owned.cleaned.Load() - a.owned.cleanedBase.Load())
	s.AsleepBytes, s.HostBackupBytes = a.sleepTotals(nil)
	s.CachedHandleBytes = int64(a.cachedHandleBytes())
	s.ReserveHandlesCreated, s.ReserveFailures = a.reserve.created, a.reserve.failed
	return s
}

// ResetPeakStats sets every peak to its current value, the aggregate's
// and every pool's.
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.ResetPeak()
	for _, p := range a.pools {
		if p != nil {
			p.st.ResetPeak()
		}
	}
}

// ResetAccumulatedStats zeroes the accumulated counters.
func (a *Allocator) ResetAccumulatedStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.ResetAccumulated()
	for _, p := range a.pools {
		if p != nil {
			p.st.ResetAccumulated()
		}
	}
	a.counters = segment.Counters{}
	a.reserve.created, a.reserve.failed = 0, 0
	a.owned.cleanedBase.Store(a.owned.cleaned.Load())
}

// Summary is a memory_summary()-style table of the statistics.
//
// Once private pools exist, a table of every pool follows: its ID, name,
// segment kind, limit, and current and peak allocated and reserved bytes.
func (a *Allocator) Summary() string {
	s := a.Stats()
	return stats.Summary(&s, a.dev, false) + a.poolSummary()
}

// MemoryAllocated is the bytes in allocated blocks (torch.cuda.memory_allocated).
func (a *Allocator) MemoryAllocated() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.st.AllocatedBytes[stats.AllPools].Current)
}

// MemoryReserved is the bytes of mapped device memory (torch.cuda.memory_reserved).
func (a *Allocator) MemoryReserved() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.st.ReservedBytes[stats.AllPools].Current)
}

// SetMemoryFraction caps the memory the allocator may map at fraction of
// the device total from now on (torch.cuda.set_per_process_memory_fraction,
// and the per_process_memory_fraction key at New). Memory already mapped
// above a lower cap stays mapped until freed and released; growth past the
// cap fails with an *OutOfMemoryError. A fraction outside (0,1] is an error
// wrapping ErrInvalidConfig and changes nothing.
func (a *Allocator) SetMemoryFraction(fraction float64) error {
	if !(fraction > 0 && fraction <= 1) {
		return fmt.Errorf("%w: memory fraction %v outside (0,1]", ErrInvalidConfig, fraction)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	a.allowed = a.total
	if fraction < 1 {
		a.allowed = uint64(fraction * float64(a.total))
	}
	a.pressureAt = pressureLine(a.allowed)
	return nil
}

// Close synchronises, unmaps and releases everything the allocator holds,
// including blocks still allocated, and destroys its events and default
// stream. Later calls of every method return ErrClosed. If a driver call
// fails, Close returns the error and a later Close retries what is left.
//
// Streams destroyed without ReleaseStream are waited for with a device
// synchronize where the driver can do one; where it cannot, Close releases
// their memory regardless: closing the allocator vouches that the device's
// work on its memory is done.
func (a *Allocator) Close() error {
	a.stopReserve() // before mu: the refill takes it
	a.mu.Lock()
	defer a.unlock()
	a.quiesceWaits()
	if a.closed && len(a.segs) == 0 && a.defaultS == 0 && len(a.events) == 0 && len(a.zombies) == 0 {
		return ErrClosed
	}
	a.closed = true
	a.setHitOff()
	a.stepsClosed()
	var errs []error
	// Every later call returns ErrClosed before it touches state, and no
	// wait was in flight when closed was set, so nothing changes the
	// streams while each synchronize runs without mu; another Close waits
	// in quiesceWaits until this one returns.
	for _, ss := range a.sortedStreams() {
		a.counters.StreamSyncs++
		s := ss.stream
		if err := a.waitUnlocked(func() error { return a.drv.StreamSynchronize(s) }); err != nil {
			if !a.streamGone(ss.stream) {
				errs = append(errs, err)
				continue
			}
			a.vanish(ss)
		}
	}
	if err := a.quiesce(); err != nil && !errors.Is(err, errNoDeviceSync) {
		errs = append(errs, err)
	}
	if err := a.flushUnmaps(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if hs := a.hookList(); hs != nil {
		// Everything still mapped is about to be unmapped.
		rs := a.mappedRanges()
		_ = a.waitUnlocked(func() error { reportUnmapped(hs, rs); return nil })
		a.hooks = nil
	}
	if err := a.closeSleeps(); err != nil {
		errs = append(errs, err)
	}
	a.eachState(func(ss *streamState) {
		for _, pe := range ss.queue {
			a.events = append(a.events, pe.ev)
		}
		ss.queue = nil
		ss.busyIdx = -1
	})
	a.busy = nil
	a.stranded = nil
	a.pending = 0
	a.setHitOff()
	for len(a.segs) > 0 {
		sg := a.segs[len(a.segs)-1]
		mapped := sg.s.MappedBytes()
		err := sg.s.Destroy()
		a.dropSeg(sg, mapped)
		if err != nil { // keep what is left for a later Close to retry
			errs = append(errs, err)
			a.addZombie(sg.s, sg.class.kind, a.segPool(sg))
		}
	}
	if err := a.destroyZombies(); err != nil {
		errs = append(errs, err)
	}
	for i := range a.classes {
		if err := a.classes[i].cache.Trim(0); err != nil {
			errs = append(errs, err)
		}
	}
	for len(a.events) > 0 {
		if err := a.drv.EventDestroy(a.events[len(a.events)-1]); err != nil {
			errs = append(errs, err)
			break
		}
		a.events = a.events[:len(a.events)-1]
	}
	if a.defaultS != 0 && len(errs) == 0 {
		if err := a.drv.StreamDestroy(a.defaultS); err != nil {
			errs = append(errs, err)
		} else {
			a.defaultS = 0
		}
	}
	clear(a.uses)
	a.setHitOff()
	return errors.Join(errs...)
}

// sortedStreams lists the stream states in stream order. mu held.
func (a *Allocator) sortedStreams() []*streamState {
	out := make([]*streamState, 0, len(a.streams))
	for _, ss := range a.streams {
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].stream < out[j].stream })
	return out
}
