package allocator

import (
	"github.com/vmmalloc/vmmalloc/arena"
)

// Out-of-memory errors and the end of the ladder.
//
// The ladder (grow.go, allocSlow) drops mu in many places: while it waits
// for streams and events, while growths map, while hooks run. Meanwhile
// other goroutines free blocks (to any stream and pool, some pending on
// events), start and end growths, and release memory of their own. If
// the ladder returned an *OutOfMemoryError whenever its last growth
// failed, a retry made at once, with nothing changed by the caller, could
// find that memory and succeed (pytorch/pytorch#189504 reports PyTorch
// doing so). So before it gives up the ladder, with mu held, takes a last
// look (lastLook):
//
//   - growths, releases and owned-Buffer collections in flight are waited
//     for (those in flight then; not later ones), since each may give
//     memory back or leave a free block;
//   - completed events are processed and the request's free lists
//     searched again;
//   - if memory a release could return has appeared (a block pending on
//     events, cached handles, a releasable free block in any pool; see
//     releaseWouldHelp), rung 2 is climbed again.
//
// It gives up only when none of these applies, or after maxLadderTries
// growths: goroutines that free and allocate without pause could
// otherwise keep it climbing for ever. So an OutOfMemoryError means that
// the state the ladder saw last, under mu, has nothing left that the
// ladder could use, and a retry with nothing changed fails too.

// maxLadderTries bounds the growths the last looks add to one Malloc's
// ladder.
const maxLadderTries = 8

// lastLook is the ladder's last look before an out-of-memory error for
// rounded bytes of ss in cl: it waits for the growths, releases and
// collections in flight, processes completed events, and returns a free
// block of ss that fits (NoBlock if none). waited reports whether it
// waited for anything, so that growth may be tried again; release whether
// memory that a release would return is cached (releaseWouldHelp, in
// pool ss.pool only when poolOnly). ErrClosed or ErrInvalidStream if the
// allocator was closed or ss released while it waited. mu held (dropped
// while it waits).
func (a *Allocator) lastLook(ss *streamState, cl *sizeClass, rounded uint64, poolOnly bool) (b arena.BlockID, waited, release bool, err error) {
	if len(a.growths) > 0 {
		waited = true
		if b, err = a.awaitGrowths(ss, cl, rounded); b != arena.NoBlock || err != nil {
			return b, waited, false, err
		}
	}
	if len(a.releasesLive) > 0 {
		waited = true
		if b, err = a.awaitReleases(ss, cl, rounded); b != arena.NoBlock || err != nil {
			return b, waited, false, err
		}
	}
	if a.owned.collecting > 0 {
		waited = true
		if b, err = a.awaitCollections(ss, cl, rounded); b != arena.NoBlock || err != nil {
			return b, waited, false, err
		}
	}
	if a.pending > 0 {
		a.processEvents()
	}
	if b, _, _ = a.bestFit(ss, cl, rounded); b != arena.NoBlock {
		return b, waited, false, nil
	}
	var only *Pool
	if poolOnly {
		only = ss.pool
	}
	return arena.NoBlock, waited, a.releaseWouldHelp(only), nil
}

// room is what a growth of pool p in size class cl has room for: the
// device's free memory, the bytes per_process_memory_fraction and the
// pool's limit still allow (growths in flight counted), and the
// expandable segments reserved. mu held.
type room struct {
	free, capRoom, poolRoom uint64
	segs                    int
}

func (a *Allocator) roomNow(p *Pool, cl *sizeClass) room {
	free, _, _ := a.drv.MemGetInfo(a.dev)
	used := uint64(a.st.ReservedBytes[0].Current) + a.mappingBytes
	pused := uint64(a.poolRec(p).ReservedBytes[0].Current) + p.mapping
	return room{free: free, capRoom: a.allowed - min(a.allowed, used), poolRoom: p.limit - min(p.limit, pused), segs: cl.nexp}
}

// more reports whether r has room that old had not: memory given back
// (a growth that failed, a release) while a growth that failed ran with
// mu dropped, which the next growth may use.
func (r room) more(old room) bool {
	return r.free > old.free || r.capRoom > old.capRoom || r.poolRoom > old.poolRoom || r.segs < old.segs
}

// releaseWouldHelp reports whether rung 2 of the ladder (releaseAll) has
// memory to return: a block pending on stream events, handles in the
// handle caches, or a free block that holds a whole physical handle or is
// a whole classic segment, of a stream in use or a released stream's
// (idle owner), in a pool that is awake. For a pool at its limit (p not
// nil) it is releasePool's: such free blocks of p (releasePool waits for
// no event, and cached handles count against no pool). Memory of streams
// destroyed without ReleaseStream is left out: only a device synchronize
// returns it, which rung 2 made already. mu held.
func (a *Allocator) releaseWouldHelp(p *Pool) bool {
	if p == nil && (a.pending > len(a.stranded) || a.cachedHandleBytes() > 0) {
		return true
	}
	found := false
	check := func(o *streamState) {
		for i := range a.classes {
			if found || (p != nil && o.pool != p) || o.pool.asleep {
				return
			}
			a.heap.EachFree(o.sid, uint8(i), func(b arena.BlockID) bool {
				found = a.releasable(b)
				return !found
			})
		}
	}
	for _, ps := range a.streams {
		for _, o := range a.poolStates(ps) {
			check(o)
		}
	}
	for _, q := range a.pools {
		if q != nil {
			check(q.idle)
		}
	}
	return found
}

// awaitReleases waits, with mu dropped, until the releases whose unmaps
// run without mu when it is called (beginRelease) have ended, and returns
// a free block of ss for rounded bytes if one has appeared (NoBlock if
// none), as awaitGrowths does for growths. mu held on entry and on
// return.
func (a *Allocator) awaitReleases(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	return a.awaitTickets(&a.releasesLive, a.releaseSeq, ss, cl, rounded)
}

// beginRelease gives a release whose unmaps are about to run with mu
// dropped (releaseRels, flushUnmaps) a ticket in releasesLive, so that a
// ladder about to declare out of memory waits for the memory it returns;
// endRelease ends it. mu held.
func (a *Allocator) beginRelease() uint64 {
	a.releaseSeq++
	a.releasesLive = append(a.releasesLive, a.releaseSeq)
	return a.releaseSeq
}

// endRelease ends release ticket t and wakes the ladders waiting for it
// (awaitReleases). mu held.
func (a *Allocator) endRelease(t uint64) {
	for i, x := range a.releasesLive {
		if x == t {
			a.releasesLive = append(a.releasesLive[:i], a.releasesLive[i+1:]...)
			break
		}
	}
	a.grown.Broadcast()
}

// newOOM is the *OutOfMemoryError of a request of size bytes, rounded to
// rounded, for which growth would map tried bytes, in pool p on ss (ss
// nil and rounded 0: a Wake of p), with the device's figures and where
// its free memory is; the caller sets what only it knows (PoolLimit,
// AddrSpaceVA, Cause) and then calls adviseOOM. It counts the OOM in
// num_ooms. mu held.
func (a *Allocator) newOOM(p *Pool, ss *streamState, cl *sizeClass, size, rounded, tried uint64) *OutOfMemoryError {
	for _, st := range a.statsOf(p) {
		st.NumOOMs++
	}
	free, _, _ := a.drv.MemGetInfo(a.dev)
	e := &OutOfMemoryError{
		Device:          a.dev,
		Requested:       size,
		Rounded:         rounded,
		Tried:           tried,
		Total:           a.total,
		Free:            free,
		Allocated:       uint64(a.st.AllocatedBytes[0].Current),
		Reserved:        uint64(a.st.ReservedBytes[0].Current),
		Stranded:        a.strandedBytes(),
		Owned:           a.owned.bytes.Load(),
		AsleepAllocated: a.asleepAllocated(),
		OwnedGC:         a.cfg.OwnedBufferGC,
	}
	_, _, held, heldBytes := a.exportedTotals()
	e.ExporterHeld, e.ExporterHeldHandles = uint64(heldBytes), int(held)
	if a.allowed < a.total {
		e.Allowed = a.allowed
	}
	// Where the free memory is: the request's pool on its stream, other
	// streams of the pool (released ones' too), other pools awake.
	var primary *streamState
	if ss != nil {
		primary = ss.primary
	}
	count := func(o *streamState, own bool) {
		switch n := a.freeBytes(o); {
		case o.pool.asleep:
		case o.pool != p:
			e.OtherPoolsFree += n
		case own:
			e.Unusable += n
		default:
			e.OtherStreamsFree += n
		}
	}
	for _, ps := range a.streams {
		for _, o := range a.poolStates(ps) {
			count(o, ps == primary)
		}
	}
	for _, q := range a.pools {
		if q != nil {
			count(q.idle, false)
		}
	}
	if ss != nil {
		maxSize, _ := a.fitLimits(p.expandable, cl, rounded)
		a.heap.EachFree(ss.sid, uint8(cl.idx), func(b arena.BlockID) bool {
			n := a.heap.Size(b)
			if n > maxSize {
				return false // ascending sizes: the rest are larger still
			}
			e.Largest = n
			return true
		})
	}
	return e
}

// adviseOOM sets e.Advice from its figures; p is the request's pool. mu
// held.
func (a *Allocator) adviseOOM(e *OutOfMemoryError, p *Pool) {
	need := e.Rounded
	if need == 0 {
		need = e.Tried
	}
	var s string
	switch {
	case e.AddrSpaceVA:
		s = "raise max_segments_per_pool (the address space a size class may reserve), or free memory"
	case e.Fragmented() && p.expandable:
		s = "the free memory is stranded in physical handles that still hold allocations; smaller handles " +
			"(expandable_handle_mb, large_segment_size_mb) strand less, and roundup_power2_divisions makes sizes repeat"
	case e.Fragmented():
		s = "the free memory is fragmented; expandable_segments:True avoids most of it, " +
			"max_split_size_mb keeps large blocks whole, and roundup_power2_divisions makes sizes repeat"
	case e.OtherStreamsFree > 0 && e.OtherStreamsFree+e.Room() >= need:
		s = "other streams cache the memory, which this stream cannot take; allocate on one stream and " +
			"call RecordStream where others use the memory, or ReleaseStream streams no longer used"
	case e.OtherPoolsFree > 0 && e.OtherPoolsFree+e.Room() >= need:
		s = "other pools cache the memory; Close, or Sleep, pools no longer used"
	case e.PoolLimit != 0:
		s = "the pool's memory limit is reached; free memory in the pool, or raise its MemoryLimit"
	case e.Allowed != 0:
		s = "per_process_memory_fraction leaves too little room for it; free memory, or raise per_process_memory_fraction (SetMemoryFraction)"
	default:
		s = "the device has too little free memory for it; free memory (tensors still referenced) or use less"
	}
	e.Advice = "Advice: " + s + "."
}
