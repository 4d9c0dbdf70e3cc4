package allocator

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

func bitsLen(x uint64) int { return bits.Len64(x) }

// errNoVA reports that no reservation has room and the VA budget is spent.
var errNoVA = errors.New("address-space budget exhausted")

// errPoolLimit reports that a growth would take its pool past the pool's
// memory limit (PoolOptions.MemoryLimit).
var errPoolLimit = errors.New("pool memory limit reached")

// isOOM reports whether err means "no memory" (retryable by freeing cache).
func isOOM(err error) bool {
	return errors.Is(err, backend.ErrOutOfMemory) || errors.Is(err, errNoVA) || errors.Is(err, errPoolLimit)
}

// overPoolLimit reports whether mapping n more bytes for pool p would take
// it past its memory limit. mu held.
func (a *Allocator) overPoolLimit(p *Pool, n uint64) bool {
	if p.limit == math.MaxUint64 {
		return false
	}
	return uint64(a.poolRec(p).ReservedBytes[0].Current)+p.mapping+n > p.limit
}

// poolRec is the record of pool p's statistics: the aggregate until a
// private pool exists (pool.go). mu held.
func (a *Allocator) poolRec(p *Pool) *stats.HotCounters {
	if !a.pooled {
		return &a.st
	}
	return &p.st
}

// limitOOM is the error of a Malloc that pool p's limit stops. mu held.
func (a *Allocator) limitOOM(ss *streamState, cl *sizeClass, rounded, size uint64) error {
	p := ss.pool
	e := a.newOOM(p, ss, cl, size, rounded, a.growSize(p, cl, rounded))
	rec := a.poolRec(p)
	e.Allocated = uint64(rec.AllocatedBytes[0].Current)
	e.Reserved = uint64(rec.ReservedBytes[0].Current)
	e.Allowed = 0 // the pool's limit, not the fraction, stopped it (Room)
	e.Pool, e.PoolName, e.PoolLimit = p.id, p.name, p.limit
	a.adviseOOM(e, p)
	return e
}

// allocSlow runs when no free block fits: it grows the pool, and on
// out-of-memory climbs the ladder: release cached handles → wait for
// pending events and release every free handle and segment → retry → the
// last look (oom.go) → a typed OutOfMemoryError. It returns a free block
// of ss. mu held.
func (a *Allocator) allocSlow(ss *streamState, cl *sizeClass, rounded, size uint64) (arena.BlockID, error) {
	if thr := a.cfg.GarbageCollectionThreshold; thr > 0 && a.allowed < a.total {
		limit := uint64(thr * float64(a.allowed))
		if uint64(a.st.ReservedBytes[0].Current) > limit {
			_ = a.releaseUntil(limit) // best effort; growth below reports real failures
		}
	}
	// A growth in flight (mapping without mu) may leave what this request
	// needs free on ss; wait for it rather than map a second range.
	if b, err := a.awaitGrowths(ss, cl, rounded); b != arena.NoBlock || err != nil {
		return b, err
	}
	// So may a Malloc collecting owned Buffers (owned.go); it goes first.
	if b, err := a.awaitCollections(ss, cl, rounded); b != arena.NoBlock || err != nil {
		return b, err
	}
	b, err := a.grow(ss, cl, rounded)
	if err == nil || !isOOM(err) {
		return b, err
	}
	if errors.Is(err, errPoolLimit) {
		// The pool's own limit: only its own free memory can help, and
		// other pools' is theirs.
		if b, err = a.poolLimitLadder(ss, cl, rounded, size); err == nil || !isOOM(err) || errors.Is(err, ErrOutOfMemory) {
			return b, err
		}
		// The device, not the pool's limit, is short: the ladder below.
	}
	// Rung 1: cached physical handles hold device memory without being mapped.
	if a.cachedHandleBytes() > 0 {
		if terr := a.trimCaches(); terr == nil {
			if b, err = a.grow(ss, cl, rounded); err == nil || !isOOM(err) {
				return b, err
			}
		}
	}
	// Rung 1½: owned Buffers the garbage collector finds unreachable
	// (owned.go), collected with mu dropped.
	if b, done, err := a.collectOwned(ss, cl, rounded); done {
		return b, err
	}
	// Rung 2: wait for every pending event, release every free handle and
	// segment (what can be: a failure on one stream does not stop the
	// others), then retry whatever the release reported. The last look
	// climbs it again while what other goroutines did meanwhile left
	// memory to return.
	var rerr error
	for try, release := 1, true; ; try++ {
		if release {
			for _, st := range a.statsOf(ss.pool) {
				st.NumAllocRetries++
			}
			rerr = a.releaseAll()
			if b, _, _ = a.bestFit(ss, cl, rounded); b != arena.NoBlock {
				return b, nil
			}
		}
		before := a.roomNow(ss.pool, cl)
		if b, err = a.grow(ss, cl, rounded); err == nil || !isOOM(err) {
			return b, err
		}
		if errors.Is(err, errPoolLimit) {
			// Growths of other goroutines took the pool to its limit
			// meanwhile: its own ladder, with its last look.
			if b, err = a.poolLimitLadder(ss, cl, rounded, size); err == nil || !isOOM(err) || errors.Is(err, ErrOutOfMemory) {
				return b, err
			}
		}
		if try == maxLadderTries {
			break
		}
		var waited bool
		var werr error
		if b, waited, release, werr = a.lastLook(ss, cl, rounded, false); b != arena.NoBlock || werr != nil {
			return b, werr
		}
		if !waited && !release && !a.roomNow(ss.pool, cl).more(before) {
			break
		}
	}
	oom := a.newOOM(ss.pool, ss, cl, size, rounded, a.growSize(ss.pool, cl, rounded))
	if errors.Is(err, errNoVA) {
		oom.AddrSpaceVA = true
	} else {
		oom.Cause = err
	}
	if rerr != nil && !isOOM(rerr) {
		oom.Cause = errors.Join(oom.Cause, rerr) // what the release could not do
	}
	a.adviseOOM(oom, ss.pool)
	return arena.NoBlock, oom
}

// poolLimitLadder is the ladder of a growth that would take pool ss.pool
// past its memory limit: release the pool's free memory, retry, and take
// the last look (oom.go) within the pool, before an OutOfMemoryError
// whose PoolLimit is set. Any other error is the retried growth's (a
// device out of memory goes on up the device's ladder). mu held.
func (a *Allocator) poolLimitLadder(ss *streamState, cl *sizeClass, rounded, size uint64) (arena.BlockID, error) {
	for try, release := 1, true; ; try++ {
		if release {
			for _, st := range a.statsOf(ss.pool) {
				st.NumAllocRetries++
			}
			_ = a.releasePool(ss.pool)
			if !a.owns(ss) {
				return arena.NoBlock, fmt.Errorf("%w: stream %d was released while a Malloc on it waited", ErrInvalidStream, ss.stream)
			}
			if b, _, _ := a.bestFit(ss, cl, rounded); b != arena.NoBlock {
				return b, nil
			}
		}
		before := a.roomNow(ss.pool, cl)
		b, err := a.grow(ss, cl, rounded)
		if err == nil || !errors.Is(err, errPoolLimit) {
			return b, err
		}
		if try == maxLadderTries {
			break
		}
		var waited bool
		if b, waited, release, err = a.lastLook(ss, cl, rounded, true); b != arena.NoBlock || err != nil {
			return b, err
		}
		if !waited && !release && !a.roomNow(ss.pool, cl).more(before) {
			break
		}
	}
	return arena.NoBlock, a.limitOOM(ss, cl, rounded, size)
}

// owns reports whether ss is still registered with the heap as its
// stream's owner (a state retired while mu was dropped is not). mu held.
func (a *Allocator) owns(ss *streamState) bool {
	return ss.sid > 0 && int(ss.sid) < len(a.states) && a.states[ss.sid] == ss
}

// growSize is how many bytes growth for rounded maps.
func (a *Allocator) growSize(p *Pool, cl *sizeClass, rounded uint64) uint64 {
	if p.expandable {
		return roundUp(rounded, a.gran)
	}
	return a.classicSegmentSize(rounded)
}

// classicSegmentSize is PyTorch's get_allocation_size.
func (a *Allocator) classicSegmentSize(rounded uint64) uint64 {
	switch {
	case rounded <= smallSize:
		return a.cfg.SmallSegmentSize
	case rounded < minLargeAlloc:
		return max(a.cfg.LargeSegmentSize, roundUp(rounded, roundLarge))
	default:
		return roundUp(rounded, roundLarge)
	}
}

// overCap reports whether mapping n more bytes would exceed the memory
// fraction.
func (a *Allocator) overCap(n uint64) bool {
	return uint64(a.st.ReservedBytes[0].Current)+a.mappingBytes+n > a.allowed
}

// grow maps new memory for a request and returns a free block of ss of at
// least rounded bytes. mu held.
func (a *Allocator) grow(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	if !a.owns(ss) {
		return arena.NoBlock, fmt.Errorf("%w: stream %d was released while a Malloc on it waited", ErrInvalidStream, ss.stream)
	}
	if !ss.pool.expandable {
		return a.growClassic(ss, cl, rounded)
	}
	for {
		b, err := a.growExpandable(ss, cl, rounded)
		if err != errGrowAgain {
			return b, err
		}
		if b, _, _ := a.bestFit(ss, cl, rounded); b != arena.NoBlock {
			return b, nil
		}
	}
}

func (a *Allocator) growClassic(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	size := a.classicSegmentSize(rounded)
	if a.overPoolLimit(ss.pool, size) {
		return arena.NoBlock, errPoolLimit
	}
	if a.overCap(size) {
		return arena.NoBlock, backend.Errorf(backend.OpCreate, backend.ErrOutOfMemory, "", "per_process_memory_fraction cap %d bytes reached", a.allowed)
	}
	s, err := segment.NewClassicConfig(a.drv, size, segment.Config{
		Device: a.dev, Prop: backend.DeviceProp(a.dev), Counters: &a.counters, Unmapped: a.handleUnmapped,
	})
	if err != nil {
		if s != nil { // rollback incomplete: keep it to destroy later
			a.addZombie(s, cl.kind, ss.pool)
		}
		return arena.NoBlock, err
	}
	if hs := a.hookList(); hs != nil {
		// Report the new segment before it is visible to any Malloc;
		// the hooks run without mu, its bytes counted as in flight.
		r := SegmentRange{Device: a.dev, Pool: ss.pool.id, Addr: s.Base(), Size: s.Size(), Handles: []HandleSpan{{VA: s.Base(), Size: s.Size()}}}
		var herr error
		a.mappingBytes += size
		ss.pool.mapping += size
		_ = a.waitUnlocked(func() error { herr = reportMapped(hs, r); return nil })
		a.mappingBytes -= size
		ss.pool.mapping -= size
		if herr == nil && !a.owns(ss) {
			herr = fmt.Errorf("%w: stream %d was released while a Malloc on it grew the pool", ErrInvalidStream, ss.stream)
			_ = a.waitUnlocked(func() error { reportUnmapped(hs, []SegmentRange{r}); return nil })
		}
		if herr != nil {
			if derr := s.Destroy(); derr != nil {
				a.addZombie(s, cl.kind, ss.pool)
				return arena.NoBlock, errors.Join(herr, derr)
			}
			return arena.NoBlock, herr
		}
	}
	sg := &seg{s: s, class: cl, pool: ss.pool}
	head, err := a.addSeg(sg, arena.Free, ss.sid)
	if err != nil {
		return arena.NoBlock, errors.Join(err, s.Destroy())
	}
	for _, st := range a.statsOf(ss.pool) {
		st.Segment.Add(cl.kind, 1)
		st.ReservedBytes.Add(cl.kind, int64(s.MappedBytes()))
		if a.cfg.MaxSplitSize != 0 && s.Size() >= a.cfg.MaxSplitSize {
			st.OversizeSegments.Add(1)
		}
	}
	a.histReserve(true, s.Base(), int64(s.MappedBytes()), ss)
	return head, nil
}

// growExpandable finds the lowest-addressed unmapped run that, together
// with a free block of ss just before it (and after it, when the whole run
// is mapped), fits rounded bytes, maps the granules needed, and returns the
// merged free block. With no such run it reserves a new segment if the VA
// budget allows. mu held.
func (a *Allocator) growExpandable(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	if a.cfg.DefragThreshold >= 0 {
		// An isolated pool's allocation (ss.lead) maps handles of its own.
		if b := arena.NoBlock; ss.lead == nil {
			if b = a.adoptFromStreams(ss, cl, rounded); b != arena.NoBlock {
				return b, nil // another stream's idle handles, mapped where they are
			}
		}
		defer a.holdForGrowth(cl, rounded)() // handles unmapped now are remapped below
		a.learnDefragSlack(ss.pool, cl, rounded)
		a.reclaimBeforeGrow(ss, cl, rounded) // other streams first: no wait
		_ = a.flushUnmaps()                  // hooks: releases queued above
		a.defragBeforeGrow(ss, cl, rounded)  // drops mu while it waits for ss
		if !a.owns(ss) {
			return arena.NoBlock, fmt.Errorf("%w: stream %d was released while a Malloc on it waited", ErrInvalidStream, ss.stream)
		}
	}
	h := a.heap
	freeSize := func(b arena.BlockID) uint64 {
		if b != arena.NoBlock && h.Coalescable(b, ss.sid) {
			return h.Size(b)
		}
		return 0
	}
	var (
		u      arena.BlockID
		mapLen uint64
	)
	align := ss.pool.align
	alignSkip := func(c arena.BlockID) uint64 { // bytes from c's start to an aligned address
		if align == 0 {
			return 0
		}
		at := uint64(h.Addr(c))
		return roundUp(at, align) - at
	}
	h.AscendUnmapped(uint8(cl.idx), func(c arena.BlockID) bool {
		if align != 0 {
			// An aligned pool maps aligned ranges of whole alignment
			// units (rounded is one already) and merges with no
			// neighbour it was not aligned with.
			if skip := alignSkip(c); skip < h.Size(c) && h.Size(c)-skip >= rounded {
				u, mapLen = c, rounded
				return false
			}
			return true
		}
		pre := freeSize(h.Prev(c))
		size := h.Size(c)
		need := roundUp(rounded-min(pre, rounded-1), a.gran)
		if need <= size {
			u, mapLen = c, need
			return false
		}
		if post := freeSize(h.Next(c)); post > 0 && pre+size+post >= rounded {
			u, mapLen = c, size
			return false
		}
		return true
	})
	if u == arena.NoBlock {
		if cl.nexp >= a.cfg.MaxSegmentsPerPool {
			return arena.NoBlock, errNoVA
		}
		mapLen = roundUp(rounded, a.gran)
		if a.overPoolLimit(ss.pool, mapLen) {
			return arena.NoBlock, errPoolLimit
		}
		if a.overCap(mapLen) {
			return arena.NoBlock, backend.Errorf(backend.OpMap, backend.ErrOutOfMemory, "", "per_process_memory_fraction cap %d bytes reached", a.allowed)
		}
		s, err := segment.New(a.drv, segment.Config{
			Device: a.dev, Prop: backend.DeviceProp(a.dev), PageSize: cl.pageSize, Cut: segment.CutFromStart,
			VASize: max(cl.vaSize, roundUp(mapLen+align, cl.pageSize)), Cache: cl.cache, Counters: &a.counters,
			Unmapped: a.handleUnmapped,
		})
		if err != nil {
			if errors.Is(err, backend.ErrOutOfMemory) {
				return arena.NoBlock, errNoVA
			}
			return arena.NoBlock, err
		}
		sg := &seg{s: s, class: cl, expandable: true}
		if u, err = a.addSeg(sg, arena.Unmapped, 0); err != nil {
			return arena.NoBlock, errors.Join(err, s.Release())
		}
		cl.nexp++
		// Reservations are the device's: the default pool's record
		// counts them (Pool.Stats).
		for _, st := range a.statsOf(&a.def) {
			st.Segment.Add(cl.kind, 1)
		}
	}
	if a.overPoolLimit(ss.pool, mapLen) {
		return arena.NoBlock, errPoolLimit
	}
	if a.overCap(mapLen) {
		return arena.NoBlock, backend.Errorf(backend.OpMap, backend.ErrOutOfMemory, "", "per_process_memory_fraction cap %d bytes reached", a.allowed)
	}
	sg := a.segOfBlock(u)
	skip := alignSkip(u)
	addr := h.Addr(u) + uintptr(skip)
	m, err := h.BeginMap(u, skip, mapLen)
	if err != nil {
		return arena.NoBlock, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	stream := ss.stream
	p := ss.pool
	fine := a.underPressure(p, mapLen) // before mapLen counts as in flight
	p.mapping += mapLen
	err = a.mapGrowth(sg, p, uint64(addr-sg.base), mapLen, fine)
	p.mapping -= mapLen
	if err != nil {
		owner := ss
		var herr *SegmentHookError
		if !a.owns(ss) || ss.stream != stream || errors.As(err, &herr) || len(a.hooks) > 0 {
			// With hooks (or when one refused the range), what the
			// rollback could not unmap was never reported mapped: it is
			// not handed out (the idle owner's memory serves no Malloc;
			// its next release retries the unmap).
			owner = p.idle
		}
		if _, aerr := h.AbortMap(m); aerr != nil {
			return arena.NoBlock, errors.Join(err, fmt.Errorf("%w: %w", ErrCorrupt, aerr))
		}
		if strays := a.adoptStrayMappings(owner, cl, sg, addr, mapLen); len(strays) > 0 && herr == nil {
			// Report them so that the idle owner's release reports a
			// range the hooks know (best effort: a refusal changes
			// nothing, the memory is never handed out).
			hs := a.hookList()
			_ = a.waitUnlocked(func() error {
				for _, r := range strays {
					_ = reportMapped(hs, r)
				}
				return nil
			})
		}
		a.maybeDropEmpty(sg)
		return arena.NoBlock, err
	}
	if !a.owns(ss) || ss.stream != stream {
		// The stream was released while its growth mapped without mu:
		// the memory goes to the idle owner, whose free memory the next
		// release returns.
		if _, err := h.CommitMap(m, p.idle.sid); err != nil {
			return arena.NoBlock, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		a.addReserved(p, cl.kind, int64(mapLen))
		a.histReserve(false, addr, int64(mapLen), p.idle)
		return arena.NoBlock, fmt.Errorf("%w: stream %d was released while a Malloc on it grew the pool", ErrInvalidStream, stream)
	}
	b, err := h.CommitMap(m, ss.sid)
	if err != nil {
		return arena.NoBlock, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	a.addReserved(p, cl.kind, int64(mapLen))
	a.histReserve(false, addr, int64(mapLen), ss)
	if h.Size(b) < rounded {
		// A free neighbour the growth counted on was allocated while mu
		// was dropped; the memory mapped stays free on ss.
		return arena.NoBlock, errGrowAgain
	}
	return b, nil
}

// errGrowAgain: a growth mapped its range, but a free neighbour it was to
// merge with was taken while mu was dropped; grow searches again.
var errGrowAgain = errors.New("growth fell short: grow again")

// mapGrowth maps the n bytes at offset off of expandable segment sg for a
// growth, whose range the caller has marked Mapping in the heap: a growth
// of at least the pool's handleSize bytes in handles of that size (the
// last one shorter), a smaller one in pages (handle cache first), and any
// growth under pressure (fine: underPressure) in granule handles. Large handles
// cut the driver calls of large growths, and of their releases, by
// handleSize/pageSize; small growths keep page handles, which
// defragmentation can unmap from smaller holes; near the memory limit,
// where a handle stranded partly free decides whether a request fits,
// every handle is one granule. Every size is taken from the handle cache
// first.
//
// The driver calls (handle creation, map, set access) run with mu
// dropped (segment.MapOp.Run); the segment's state, its handle cache and
// the counters change only with mu held, in BeginMap and EndMap. While it
// runs the growth is counted in inflight (so Close, Check and snapshots
// wait for it), has a ticket in growths (so Mallocs that need memory wait for it rather
// than grow for the same request or declare an out-of-memory) and
// mappingBytes (so the memory fraction cap counts it). mu held on entry
// and on return.
//
// With segment hooks attached, the mapped range is reported to them in
// the same window, after Run and before EndMap (hooks.go); a refusal
// unmaps it again (under mu, as a failed map's rollback) and returns the
// *SegmentHookError.
func (a *Allocator) mapGrowth(sg *seg, p *Pool, off, n uint64, fine bool) error {
	var (
		op  *segment.MapOp
		err error
	)
	piece := sg.class.pageSize // the size of the growth's full pieces, for the reserve
	if cl := sg.class; p.align != 0 {
		// Handles of whole alignment units from an aligned start.
		piece = 0
		op, err = sg.s.BeginMapLarge(off, n, roundUp(max(cl.handleSize, cl.pageSize), p.align))
	} else if fine && a.gran < cl.pageSize {
		// Near the memory limit: granule handles, every free one of which
		// a later defragmentation or the out-of-memory ladder can unmap.
		piece = a.gran
		op, err = sg.s.BeginMapLarge(off, n, a.gran)
	} else if cl.handleSize > cl.pageSize && n >= cl.handleSize {
		piece = cl.handleSize
		op, err = sg.s.BeginMapLarge(off, n, cl.handleSize)
	} else {
		op, err = sg.s.BeginMap(off, n)
	}
	if err != nil {
		return err
	}
	a.growSeq++
	ticket := a.growSeq
	a.growths = append(a.growths, ticket)
	a.mappingBytes += n
	hs := a.hookList()
	var hookErr error
	var r SegmentRange
	if hs != nil {
		r = SegmentRange{Device: a.dev, Pool: p.id, Addr: sg.base + uintptr(off), Size: n}
		for _, pc := range op.Pieces(nil) {
			r.Handles = append(r.Handles, HandleSpan{VA: sg.base + uintptr(pc.Off), Size: pc.Len})
		}
	}
	_ = a.waitUnlocked(func() error {
		op.Run()
		if hs != nil && op.OK() {
			hookErr = reportMapped(hs, r)
		}
		return nil
	})
	a.mappingBytes -= n
	for i, t := range a.growths {
		if t == ticket {
			a.growths = append(a.growths[:i], a.growths[i+1:]...)
			break
		}
	}
	a.grown.Broadcast()
	if err := sg.s.EndMap(op); err != nil || hookErr == nil {
		if err == nil && n >= piece {
			a.kickReserve(sg.class, piece) // restock what the growth took, off its path
		}
		return err
	}
	// Refused by a hook: roll the mapped range back as a failed map
	// would (what cannot be unmapped, the caller's adoptStrayMappings
	// reconciles).
	_, uerr := sg.s.Unmap(off, n)
	return errors.Join(hookErr, uerr)
}

// awaitGrowths waits, with mu dropped, until the growths mapping without
// mu when it is called have ended (not those that start meanwhile: a
// goroutine that grows again and again does not starve it), and returns a free block of ss for rounded bytes if one has appeared
// (NoBlock if none). It returns ErrClosed or ErrInvalidStream if the
// allocator was closed or ss released meanwhile. mu held on entry and on
// return.
func (a *Allocator) awaitGrowths(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	return a.awaitTickets(&a.growths, a.growSeq, ss, cl, rounded)
}

// awaitTickets waits, with mu dropped, until no ticket of *live (ascending)
// is at most last, and then returns a free block of ss for rounded bytes
// if one has appeared (NoBlock if none), or ErrClosed or ErrInvalidStream
// if the allocator was closed or ss released meanwhile. The ends of
// growths and releases both broadcast grown. mu held on entry and on
// return.
func (a *Allocator) awaitTickets(live *[]uint64, last uint64, ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	if len(*live) == 0 {
		return arena.NoBlock, nil
	}
	stream := ss.stream
	a.inflight++ // Close and Check wait for this waiter too
	a.waitsChanged()
	for len(*live) > 0 && (*live)[0] <= last {
		a.grown.Wait()
	}
	if a.inflight--; a.inflight == 0 {
		a.quiet.Broadcast()
	}
	a.waitsChanged()
	return a.refitAfterWait(ss, stream, cl, rounded)
}

// refitAfterWait ends a wait of a Malloc on stream (ss's stream when
// the wait began) with mu dropped: ErrClosed if the allocator was closed
// meanwhile, ErrInvalidStream if ss was released, else a free block of ss
// for rounded bytes that appeared (NoBlock if none). mu held.
func (a *Allocator) refitAfterWait(ss *streamState, stream backend.Stream, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	switch {
	case a.closed:
		return arena.NoBlock, ErrClosed
	case !a.owns(ss) || ss.stream != stream:
		return arena.NoBlock, fmt.Errorf("%w: stream %d was released while a Malloc on it waited", ErrInvalidStream, stream)
	}
	b, _, _ := a.bestFit(ss, cl, rounded)
	return b, nil
}

// defragBeforeGrow keeps reserved memory within defrag_threshold of
// allocated memory: if mapping rounded bytes would push the
// pool's mapped bytes above (1+threshold) × its allocated bytes plus one
// page, the requesting stream's free handles in the pool (holes too small
// for the request) are unmapped first, after synchronising that stream.
// Their handles go to the handle cache, so the growth that follows remaps
// the same physical memory at the new address. Other streams' handles are
// left to the out-of-memory ladder: growth never waits for another stream.
// Failures are left to the growth (and the OOM ladder) to report. mu held.
func (a *Allocator) defragBeforeGrow(ss *streamState, cl *sizeClass, rounded uint64) {
	if cl.growthHandles() && a.guardsCuts(ss.pool) && a.underPressure(ss.pool, roundUp(rounded, a.gran)) {
		a.releaseFreeGrowthHandles(ss, cl) // pressure.go
		if !a.owns(ss) {
			return // the caller reports it
		}
	}
	excess := a.defragExcess(ss.pool, cl, rounded)
	if excess == 0 {
		return
	}
	total := uint64(a.st.ReservedBytes[0].Current)
	target := total - min(excess, total)
	_ = a.releaseStreamPool(ss, cl.idx, target, true)
}

// adoptStrayMappings reconciles the range [addr, addr+n) of segment sg,
// unmapped in the heap, with the segment after a failed Map whose rollback
// failed too: handles the segment still has mapped inside it are unmapped
// again, and any that stay mapped become free blocks of ss, so the
// allocator's view stays true and the memory stays usable. mu held.
//
// With hooks attached it returns the ranges it made free blocks of ss.
func (a *Allocator) adoptStrayMappings(ss *streamState, cl *sizeClass, sg *seg, addr uintptr, n uint64) []SegmentRange {
	var strays []SegmentRange
	lo0 := uint64(addr - sg.base)
	hi0 := lo0 + n
	for _, r := range sg.s.MappedRuns() {
		lo, hi := max(r.Off, lo0), min(r.Off+r.Len, hi0)
		if lo >= hi {
			continue
		}
		done, _ := sg.s.Unmap(lo, hi-lo)
		if lo += done; lo >= hi {
			continue
		}
		at := sg.base + uintptr(lo)
		u := a.heap.Find(at)
		info, _ := a.heap.Block(u)
		m, err := a.heap.BeginMap(u, uint64(at-info.Addr), hi-lo)
		if err != nil {
			continue // Check reports the disagreement
		}
		if _, err := a.heap.CommitMap(m, ss.sid); err != nil {
			continue
		}
		a.addReserved(ss.pool, cl.kind, int64(hi-lo))
		a.histReserve(false, at, int64(hi-lo), ss)
		if len(a.hooks) > 0 {
			strays = append(strays, a.segRange(sg, ss.pool, at, hi-lo))
		}
	}
	return strays
}

// addSeg adds sg to the heap, tiled by one block in state st (Free on sid,
// or Unmapped), and to the address-ordered segment list, and returns the
// block. mu held.
func (a *Allocator) addSeg(sg *seg, st arena.State, sid arena.StreamID) (arena.BlockID, error) {
	sg.base, sg.size = sg.s.Base(), sg.s.Size()
	rid, head, err := a.heap.AddRegion(sg.base, sg.size, uint8(sg.class.idx), st, sid)
	if err != nil {
		return arena.NoBlock, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	sg.rid = rid
	for int(rid) >= len(a.segOf) {
		a.segOf = append(a.segOf, nil)
	}
	a.segOf[rid] = sg
	i := sort.Search(len(a.segs), func(i int) bool { return a.segs[i].base > sg.base })
	a.segs = append(a.segs, nil)
	copy(a.segs[i+1:], a.segs[i:])
	a.segs[i] = sg
	return head, nil
}

// dropSeg forgets a destroyed or released segment and its blocks,
// adjusting statistics; mapped is the bytes it had mapped. mu held.
func (a *Allocator) dropSeg(sg *seg, mapped uint64) {
	cl := sg.class
	h := a.heap
	info, _ := h.Region(sg.rid)
	a.histReserve(!sg.expandable, sg.base, -int64(mapped), a.states[h.StreamOf(info.Head)])
	for id := info.Head; id != arena.NoBlock; id = h.Next(id) {
		b, _ := h.Block(id)
		if b.State == arena.Unmapped || b.StreamID == 0 {
			continue
		}
		o := a.states[b.StreamID]
		// The blocks cover the mapped memory exactly, and each belongs
		// to one pool's owner: each pool's reserved bytes drop by its
		// blocks' (mapped counts the total, for zombies).
		a.addReserved(o.pool, cl.kind, -int64(b.Size))
		if b.State != arena.Allocated && b.State != arena.PendingFree {
			continue
		}
		delete(a.uses, id)
		a.setHitOff()
		o.active--
		if a.regionFreedStats(id) { // a plan region: its planned blocks were counted
			continue
		}
		n := int64(b.Size)
		for _, st := range a.statsOf(o.pool) {
			if b.State == arena.Allocated {
				st.CountFree(cl.kind, n, int64(b.Requested))
			} else {
				st.CountPendingFreed(cl.kind, n, int64(b.Requested))
			}
		}
	}
	_ = h.RemoveRegion(sg.rid) // no block is in transition: the lock is held throughout
	a.segOf[sg.rid] = nil
	if sg.expandable {
		cl.nexp--
	}
	for _, st := range a.statsOf(a.segPool(sg)) {
		st.Segment.Add(cl.kind, -1)
		if !sg.expandable && a.cfg.MaxSplitSize != 0 && sg.size >= a.cfg.MaxSplitSize {
			st.OversizeSegments.Add(-1)
		}
	}
	for i, s := range a.segs {
		if s == sg {
			a.segs = append(a.segs[:i], a.segs[i+1:]...)
			break
		}
	}
}

// zombie is a segment the allocator no longer uses that still holds
// driver state. Memory it still maps counts as reserved.
type zombie struct {
	s       *segment.Segment
	kind    stats.PoolKind
	pool    *Pool  // whose reserved_bytes count it
	counted uint64 // bytes of it counted in reserved_bytes
}

// addZombie keeps s, which pool p's memory was in, for a later teardown.
// mu held.
func (a *Allocator) addZombie(s *segment.Segment, kind stats.PoolKind, p *Pool) {
	z := &zombie{s: s, kind: kind, pool: p}
	a.recountZombie(z)
	a.zombies = append(a.zombies, z)
}

// recountZombie brings reserved_bytes in line with what z still maps. mu held.
func (a *Allocator) recountZombie(z *zombie) {
	now := z.s.MappedBytes()
	a.addReserved(z.pool, z.kind, int64(now)-int64(z.counted))
	a.histReserve(true, z.s.Base(), int64(now)-int64(z.counted), nil)
	z.counted = now
}

// destroyZombies retries the teardown of segments the allocator no longer
// uses but that still hold driver state: a classic segment whose creation
// could not be rolled back, or whose release failed after its memory was
// unmapped (its reservation or a leftover handle). mu held.
func (a *Allocator) destroyZombies() error {
	var errs []error
	kept := a.zombies[:0]
	for _, z := range a.zombies {
		var err error
		if z.s.Released() {
			err = z.s.FreeLeftovers()
		} else {
			err = z.s.Destroy()
		}
		a.recountZombie(z)
		if err != nil {
			errs = append(errs, err)
			kept = append(kept, z)
		}
	}
	clear(a.zombies[len(kept):])
	a.zombies = kept
	return errors.Join(errs...)
}

// maybeDropEmpty releases an expandable segment with nothing mapped. mu held.
func (a *Allocator) maybeDropEmpty(sg *seg) {
	if a.keepEmpty || !sg.expandable {
		return
	}
	if info, ok := a.heap.Region(sg.rid); !ok || a.heap.State(info.Head) != arena.Unmapped || a.heap.Next(info.Head) != arena.NoBlock {
		return
	}
	if err := sg.s.Release(); err != nil {
		return // keep it; a later release retries
	}
	a.dropSeg(sg, 0)
}
