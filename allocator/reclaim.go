package allocator

import (
	"math"
	"slices"

	"github.com/vmmalloc/vmmalloc/arena"
)

// Reclaiming other streams' free memory before growth.
//
// Handles belong to one stream at a time (see the package documentation),
// so without help every stream keeps the peak of its own cache: a program
// that prefetches on side streams reserves the sum of the streams' peaks
// rather than the peak of their sum. Before an expandable pool grows, two
// steps take memory back from other streams whose queued work has
// completed:
//
//  1. adoptFromStreams: a run of adjacent free blocks of ss and of idle
//     streams that holds enough whole handles for the request changes
//     hands: the handles stay mapped where they are and only their stream
//     changes (no driver call but the probe below).
//  2. reclaimBeforeGrow: when no single block is large enough and the pool
//     would grow past its defrag limit, other streams' free whole handles
//     are unmapped (to the handle cache) and the growth that follows maps
//     them where the heap grows.
//
// Both are on unless defrag_threshold is off. Adoption also takes other
// pools' idle handles when the growing pool is under pressure
// (crossPoolAdoption; pool.go says which pools lend): two tenants whose
// peaks do not fit together then hand their memory back and forth where
// it is mapped, where the ladder would unmap all of one and the growth map
// it again in granules (about 21,000 driver calls and 1.1 s of simulated
// driver time per round of a 60 %/55 % alternation on an 8 GiB device,
// against 5 calls and 80 µs; benchmarks' TestTwoTenantAlternation). A
// run holding another pool's blocks gives ss the fewest whole handles
// from its low end, after ss's own free bytes there, so that what one
// request leaves free in its last handle is next to what the next one
// adopts, rather than stranded in the taker (BenchmarkMultiTenantPools:
// 480 MiB for the larger pool, not 600).
//
// Safety: a block on stream T's free list was last used by work queued on
// T before its Free (uses on other streams keep it PendingFree until their
// events complete, so it is not on the list). An event recorded on T and
// found complete by a non-blocking EventQuery proves that all such work
// has finished for every block freed before the record, so T's free
// handles can be unmapped or handed to another stream. The answer holds
// until the next block is freed to T (streamState.idle; memory taken from
// the free list, or fresh mappings added to it, were never used since).
// A stream whose probe is not complete, or whose record or query fails,
// is skipped: growth never waits for another stream.
//
// Cost: the slow path only (a Malloc that its stream's free list cannot
// serve, in an expandable pool with another stream holding free memory):
// two driver calls (EventRecord, EventQuery) per stream probed, probed
// only when a free block of it is met and nothing was freed to it since its
// last successful probe; adoption walks the pool's blocks, O(blocks).
// Adoption saves the growth's driver calls; reclaiming trades another
// stream's cached memory for fewer bytes reserved.

// Above adoptExactNum/adoptExactDen of the memory the process may use
// (per_process_memory_fraction), adoption takes only runs of whole handles
// that exceed the request by less than a granule.
const (
	adoptExactNum = 3
	adoptExactDen = 4
)

// adoptFromStreams finds the lowest run of adjacent free blocks of size class cl,
// each of ss or of a stream whose queued work has completed, that holds at
// least rounded bytes of whole handles, and gives the fewest of those
// handles that make rounded bytes, from the run's high end, to ss (near
// the memory limit, only if they exceed rounded by less than a granule).
// Free blocks of different streams never coalesce, so memory that changed hands
// often lies in such runs. It returns the handles as one free block of ss,
// merged with ss's free neighbours, out of any list; or nil. mu held.
func (a *Allocator) adoptFromStreams(ss *streamState, cl *sizeClass, rounded uint64) arena.BlockID {
	cross := a.crossPoolAdoption(ss, rounded)
	if len(a.streams) < 2 && !cross {
		return arena.NoBlock
	}
	pi := uint8(cl.idx)
	var avail uint64
	for _, t := range a.ownersOf(ss.pool) {
		avail += a.heap.FreeBytes(t.sid, pi)
	}
	if cross {
		for _, q := range a.pools {
			if q != nil && q != ss.pool && a.lendsHandles(q) {
				for _, t := range a.ownersOf(q) {
					avail += a.heap.FreeBytes(t.sid, pi)
				}
			}
		}
	}
	if avail < rounded {
		return arena.NoBlock
	}
	// Whole handles may hold up to a page more than the request; the rest
	// stays free inside a handle the request uses, where no other stream
	// can have it and no release can unmap it. Growth cuts a handle to
	// size instead. Near the memory limit, adopt only what fits as well.
	exact := uint64(a.st.ReservedBytes[0].Current) > a.allowed/adoptExactDen*adoptExactNum ||
		ss.pool.limit != math.MaxUint64 && uint64(a.poolRec(ss.pool).ReservedBytes[0].Current) > ss.pool.limit/adoptExactDen*adoptExactNum
	var busy []*streamState // streams found busy by this call
	usable := func(b arena.BlockInfo) bool {
		if b.State != arena.Free {
			return false
		}
		if b.StreamID == ss.sid {
			return true
		}
		t := a.states[b.StreamID]
		if t == nil || !a.inUse(t) || slices.Contains(busy, t) {
			return false
		}
		if t.pool != ss.pool && (!cross || t.lead != nil || !a.lendsHandles(t.pool)) {
			return false
		}
		if a.streamIdle(t) {
			return true
		}
		busy = append(busy, t)
		return false
	}
	for _, sg := range a.segs {
		if sg.class != cl || !sg.expandable {
			continue
		}
		info, _ := a.heap.Region(sg.rid)
		start := arena.NoBlock
		var (
			runLen  uint64
			pre     uint64 // ss's free bytes at the run's start
			foreign bool   // the run holds another pool's blocks
		)
		for id := info.Head; id != arena.NoBlock; id = a.heap.Next(id) {
			b, _ := a.heap.Block(id)
			if !usable(b) {
				start = arena.NoBlock
				continue
			}
			if start == arena.NoBlock {
				start, runLen, pre, foreign = id, 0, 0, false
			}
			if b.StreamID == ss.sid && runLen == pre {
				pre += b.Size
			}
			foreign = foreign || a.states[b.StreamID].pool != ss.pool
			runLen += b.Size
			if runLen < rounded {
				continue
			}
			off := uint64(a.heap.Addr(start) - sg.base)
			var lo, hi uint64
			need := rounded
			if foreign {
				// Another pool's handles: the fewest from the run's low
				// end, after ss's own free bytes there, so that what the
				// request leaves of the last one stays next to the
				// handles the next request adopts.
				lo, hi = sg.s.WholeHandles(off, runLen, ^uint64(0))
				if lo == off+pre {
					need = rounded - min(pre, rounded-1)
				}
				hi = min(hi, a.handleEndFrom(sg, lo, need))
			} else {
				lo, hi = sg.s.WholeHandles(off, runLen, rounded)
			}
			if hi-lo >= need && (!exact || hi-lo-need < a.gran) {
				if cross && a.overPoolLimit(ss.pool, hi-lo) {
					continue // another pool's handles would take ss's past its limit
				}
				return a.adoptRange(ss, sg, start, lo, hi)
			}
		}
	}
	return arena.NoBlock
}

// handleEndFrom is the first handle boundary of sg at or after lo+n, lo
// a handle boundary of mapped memory. mu held.
func (a *Allocator) handleEndFrom(sg *seg, lo, n uint64) uint64 {
	at := lo
	for at < lo+n {
		_, size, ok := sg.s.HandleRange(at)
		if !ok || size == 0 {
			return at
		}
		at += size
	}
	return at
}

// crossPoolAdoption reports whether a growth of rounded bytes for ss may
// adopt other pools' idle handles where they are mapped (lendsHandles
// says which pools lend): only under pressure (pressure.go), where the
// alternative is to map fresh memory in granules and, once the device is
// full, the out-of-memory ladder's unmapping of every pool's cache and
// remapping it; adoption moves the same memory between pools with no
// driver call but the idle probe. ss's pool must be an expandable,
// unaligned, shared pool, and no segment hook may be attached (hooks
// report each range with its pool). mu held.
func (a *Allocator) crossPoolAdoption(ss *streamState, rounded uint64) bool {
	p := ss.pool
	return a.pooled && ss.lead == nil && p.expandable && p.align == 0 && !p.isolated && len(a.hooks) == 0 &&
		len(a.exported) == 0 && a.underPressure(p, roundUp(rounded, a.gran))
}

// lendsHandles reports whether pool q's free handles may be adopted by
// another pool's growth under pressure: an expandable, unaligned, shared
// pool that is awake and not closing. mu held.
func (a *Allocator) lendsHandles(q *Pool) bool {
	return q.expandable && q.align == 0 && !q.isolated && !q.asleep && !q.closing && !q.closed
}

// adoptRange gives the segment offsets [lo, hi), whole handles inside the
// run of free blocks beginning at start, to ss: the heap takes the blocks
// (or their parts) inside it out of their streams' free indexes and makes
// them one free block of ss, merged with ss's free neighbours, which it
// returns. Parts outside it stay with their streams: lo and hi are handle
// boundaries, so every handle still holds blocks of one stream. mu held.
func (a *Allocator) adoptRange(ss *streamState, sg *seg, start arena.BlockID, lo, hi uint64) arena.BlockID {
	from, fromOff := arena.NoBlock, uint64(0)
	for id := start; id != arena.NoBlock; id = a.heap.Next(id) {
		b, _ := a.heap.Block(id)
		off := uint64(b.Addr - sg.base)
		if off >= hi {
			break
		}
		if off+b.Size <= lo {
			continue
		}
		if from == arena.NoBlock {
			from, fromOff = id, lo-off
		}
		plo, phi := max(off, lo), min(off+b.Size, hi)
		if from := a.states[b.StreamID].pool; from != ss.pool {
			// Another pool's handles: their reserved bytes move with them,
			// counted as an unmap from that pool and a map into ss's (the
			// aggregate dips and comes back, its peak unchanged).
			for _, st := range a.statsOf(from) {
				st.ReservedBytes.Add(sg.class.kind, -int64(phi-plo))
			}
			for _, st := range a.statsOf(ss.pool) {
				st.ReservedBytes.Add(sg.class.kind, int64(phi-plo))
			}
		}
		if b.StreamID != ss.sid && a.hist != nil {
			a.histHandOver(sg.base+uintptr(plo), phi-plo, b.Stream, ss.stream, a.states[b.StreamID].pool.id, ss.pool.id)
		}
	}
	got, err := a.heap.AdoptRange(from, fromOff, hi-lo, ss.sid)
	if err != nil {
		return arena.NoBlock // Check reports the disagreement; growth maps instead
	}
	return got
}

// reclaimBeforeGrow unmaps other streams' free handles in size class cl, for a
// growth of rounded bytes for ss, until the pool's mapped bytes after the
// growth would be within the defrag limit (see defragBeforeGrow). mu held.
func (a *Allocator) reclaimBeforeGrow(ss *streamState, cl *sizeClass, rounded uint64) {
	excess := a.defragExcess(ss.pool, cl, rounded)
	if excess == 0 || len(a.streams) < 2 {
		return
	}
	for _, t := range a.reclaimCandidates(ss, cl) {
		total := uint64(a.st.ReservedBytes[0].Current)
		if excess = a.defragExcess(ss.pool, cl, rounded); excess == 0 {
			return
		}
		if !a.inUse(t) || !a.streamIdle(t) {
			continue // retired while a flush below dropped mu, or busy
		}
		_ = a.releaseStreamPool(t, cl.idx, total-min(excess, total), false)
		_ = a.flushUnmaps() // hooks: the growth remaps what this unmaps
	}
}

// defragExcess is by how many bytes growing size class cl by rounded bytes would
// take its mapped bytes above the defrag limit, (1+defrag_threshold) × the
// pool's high water mark (the most bytes allocated plus the request seen
// by a growth, this one included) plus one page, plus the slack the pool
// has learned (learnDefragSlack) while it is not under pressure; 0 when
// it would not. It raises the mark. mu held.
//
// The limit follows the high water mark, not the bytes allocated now:
// memory mapped for an earlier peak is worth keeping until the workload
// needs more than that peak, since a workload that comes back to it would
// otherwise unmap and remap the same handles every step ("remap
// thrash"). Peak reserved is bounded all the same: a growth past the mark
// that defragmentation cannot keep under the limit is the only way
// reserved bytes exceed (1+threshold) × peak allocated plus a page and
// the slack, and the slack applies only below the pressure line.
func (a *Allocator) defragExcess(p *Pool, cl *sizeClass, rounded uint64) uint64 {
	rec := a.poolRec(p)
	reserved := uint64(rec.ReservedBytes[cl.kind].Current)
	n := roundUp(rounded, a.gran)
	after := reserved + n
	hw := &p.highWater[cl.idx]
	*hw = max(*hw, uint64(rec.AllocatedBytes[cl.kind].Current)+rounded)
	limit := uint64((1+a.cfg.DefragThreshold)*float64(*hw)) + cl.pageSize
	if after <= limit {
		return 0
	}
	if sl := p.defragSlack[cl.idx]; sl > 0 && !a.underPressure(p, n) {
		if limit += sl; after <= limit {
			return 0
		}
	}
	return after - limit
}

// learnDefragSlack runs once per growth of pool p in size class cl, before
// its defragmentation decisions. A growth past the defrag limit at the
// same high water mark as the last one that was, after the pool has
// allocated at least that mark's worth of bytes since (the workload came
// back to the same peak, a new training step, with a layout the limit does
// not hold: best fit places a step's blocks differently in a heap that is
// all free than the first step's growth did), raises the pool's limit by
// the excess rather than unmap and remap it again. It does so only while
// the device is below the pressure line (pressure.go), where the process
// could map its reserved memory twice over and a driver call costs more
// than the memory; above the line the slack does not apply and
// defragmentation keeps reserved memory near the mark. The slack is at
// most maxDefragSlack thresholds of the mark. Within one step (less than
// a mark's worth of allocation between the two) nothing is learned, so a
// single pass replays as before. mu held.
func (a *Allocator) learnDefragSlack(p *Pool, cl *sizeClass, rounded uint64) {
	if a.cfg.DefragThreshold < 0 {
		return
	}
	excess := a.defragExcess(p, cl, rounded)
	if excess == 0 {
		return
	}
	i := cl.idx
	hw := p.highWater[i]
	churn := a.poolRec(p).AllocatedBytes[cl.kind].Allocated // cumulative nbytes
	if p.defragAt[i] != hw || churn < p.defragChurn[i] {
		// A new mark, or the accumulated statistics were reset.
		p.defragAt[i], p.defragChurn[i] = hw, churn
		return
	}
	if uint64(churn-p.defragChurn[i]) < hw || a.underPressure(p, roundUp(rounded, a.gran)) {
		return
	}
	p.defragChurn[i] = churn
	p.defragSlack[i] = min(p.defragSlack[i]+excess, a.defragSlackCap(hw))
}

// defragSlackCap is the most slack learnDefragSlack may learn at high
// water mark hw: maxDefragSlack thresholds of it (none with
// defragmentation off). Check verifies it.
func (a *Allocator) defragSlackCap(hw uint64) uint64 {
	return uint64(maxDefragSlack * max(a.cfg.DefragThreshold, 0) * float64(hw))
}

// forgetDefragSlack drops what learnDefragSlack learned for p: at an
// EmptyCache the program asks for its cached memory back, so learning
// starts again. mu held.
func (p *Pool) forgetDefragSlack() {
	p.defragAt, p.defragChurn, p.defragSlack = [2]uint64{}, [2]int64{}, [2]uint64{}
}

// maxDefragSlack bounds the learned slack, in defrag thresholds of the
// high water mark: the limit rises to (1+3×defrag_threshold) × the mark
// at most (docs/results.md, "Warm training loop", for what it changes).
const maxDefragSlack = 2

// reclaimCandidates lists the streams other than ss holding at least one
// granule of free memory in size class cl, most free bytes first (then in stream
// order). mu held.
func (a *Allocator) reclaimCandidates(ss *streamState, cl *sizeClass) []*streamState {
	var cands []*streamState
	for _, t := range a.ownersOf(ss.pool) {
		if t != ss && a.heap.FreeBytes(t.sid, uint8(cl.idx)) >= a.gran {
			cands = append(cands, t)
		}
	}
	slices.SortFunc(cands, func(x, y *streamState) int {
		bx, by := a.heap.FreeBytes(x.sid, uint8(cl.idx)), a.heap.FreeBytes(y.sid, uint8(cl.idx))
		switch {
		case bx != by:
			if bx > by {
				return -1
			}
			return 1
		case x.stream < y.stream:
			return -1
		case x.stream > y.stream:
			return 1
		}
		return 0
	})
	return cands
}

// streamIdle reports, without waiting, whether the work that used the
// blocks in t's free lists has completed. An earlier answer stands while no
// block has been freed to t (t.idle); otherwise it records an event on t
// and queries it. Any failure answers false; a stream the driver no longer
// knows is marked vanished, so later growths do not probe it again. mu
// held.
func (a *Allocator) streamIdle(t *streamState) bool {
	if t.idle {
		return true
	}
	ev, err := a.getEvent()
	if err != nil {
		return false
	}
	defer func() { a.events = append(a.events, ev) }()
	if a.drv.EventRecord(ev, t.stream) != nil {
		if a.streamGone(t.stream) {
			// Destroyed behind the allocator's back: never probed again
			// (its memory waits for a device synchronize, streams.go).
			a.vanish(t.primary)
		}
		return false
	}
	done, err := a.drv.EventQuery(ev)
	t.idle = err == nil && done
	return t.idle
}

// holdForGrowth lets size class cl's handle cache keep, beyond handle_cache_mb,
// the full-size handles that releases before a growth of rounded bytes
// unmap, so that the growth maps them again instead of freeing them and
// creating new ones; the returned function restores the limit and frees
// what the growth did not use. mu held.
func (a *Allocator) holdForGrowth(cl *sizeClass, rounded uint64) func() {
	// The raise is undone by subtraction, not by restoring the old limit:
	// growths that drop mu while they map overlap, and each undoes only
	// its own raise.
	extra := roundUp(rounded, max(cl.pageSize, cl.handleSize))
	cl.cache.SetMaxBytes(cl.cache.MaxBytes() + extra)
	return func() {
		limit := cl.cache.MaxBytes() - extra
		cl.cache.SetMaxBytes(limit)
		_ = cl.cache.TrimBytes(limit) // a failed free keeps the handle cached; a later trim retries
	}
}
