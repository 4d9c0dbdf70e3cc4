package allocator

import (
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
//  1. adoptFromStreams: another stream's free block that holds enough whole
//     handles for the request changes hands: the handles stay mapped where
//     they are and only their stream changes (no driver call but the
//     probe below).
//  2. reclaimBeforeGrow: when no single block is large enough and the pool
//     would grow past its defrag limit, other streams' free whole handles
//     are unmapped (to the handle cache) and the growth that follows maps
//     them where the heap grows.
//
// Both are on unless defrag_threshold is off.
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
// two driver calls (EventRecord, EventQuery) per stream probed, most free
// bytes first, probed only when it has a block that would serve and
// nothing was freed to it since its last successful probe.
// Adoption saves the growth's driver calls; reclaiming trades another
// stream's cached memory for fewer bytes reserved.

// adoptFromStreams finds, among other streams whose queued work has
// completed, a free block of pool p holding at least rounded bytes of whole
// handles, and gives the fewest of those handles that make rounded bytes,
// from the block's high end, to ss. It returns them as a free block of ss,
// merged with ss's free neighbours, out of any list; or nil. mu held.
func (a *Allocator) adoptFromStreams(ss *streamState, p *pool, rounded uint64) *arena.Block {
	if len(a.streams) < 2 {
		return nil
	}
	for _, t := range a.reclaimCandidates(ss, p) {
		if t.free[p.idx].Bytes() < rounded {
			continue
		}
		b, lo, hi := a.adoptable(t, p, rounded)
		if b == nil || !a.streamIdle(t) {
			continue
		}
		return a.adopt(ss, t, p, b, lo, hi)
	}
	return nil
}

// adoptable returns the smallest free expandable block of t in pool p
// that holds at least rounded bytes of whole handles, and the segment
// offsets [lo, hi) of the fewest of them, from its high end, that make
// rounded bytes; or nil. mu held.
func (a *Allocator) adoptable(t *streamState, p *pool, rounded uint64) (found *arena.Block, lo, hi uint64) {
	t.free[p.idx].Each(func(b *arena.Block) bool {
		if b.Size < rounded {
			return true
		}
		sg := b.Region.Owner.(*seg)
		if !sg.expandable {
			return true
		}
		l, h := sg.s.WholeHandles(uint64(b.Addr-sg.r.Base), b.Size, rounded)
		if h-l < rounded {
			return true
		}
		found, lo, hi = b, l, h
		return false // Each yields ascending sizes: the first is the smallest
	})
	return found, lo, hi
}

// adopt moves the whole handles [lo, hi) of free block b from t to ss.
// mu held.
func (a *Allocator) adopt(ss, t *streamState, p *pool, b *arena.Block, lo, hi uint64) *arena.Block {
	sg := b.Region.Owner.(*seg)
	tfl := t.free[p.idx]
	tfl.Remove(b)
	off := uint64(b.Addr - sg.r.Base)
	piece := b
	if lo > off {
		piece = arena.Split(&a.bpool, b, lo-off)
		tfl.Insert(b)
	}
	if piece.Size > hi-lo {
		tfl.Insert(arena.Split(&a.bpool, piece, hi-lo))
	}
	piece.Stream = ss.stream
	fl := ss.free[p.idx]
	if prev := piece.Prev; prev != nil && prev.State == arena.Free && prev.Stream == ss.stream && fl.Contains(prev) {
		fl.Remove(prev)
		arena.Merge(&a.bpool, prev)
		piece = prev
	}
	if next := piece.Next; next != nil && next.State == arena.Free && next.Stream == ss.stream && fl.Contains(next) {
		fl.Remove(next)
		arena.Merge(&a.bpool, piece)
	}
	return piece
}

// reclaimBeforeGrow unmaps other streams' free handles in pool p, for a
// growth of rounded bytes for ss, until the pool's mapped bytes after the
// growth would be within the defrag limit (see defragBeforeGrow). mu held.
func (a *Allocator) reclaimBeforeGrow(ss *streamState, p *pool, rounded uint64) {
	excess := a.defragExcess(p, rounded)
	if excess == 0 || len(a.streams) < 2 {
		return
	}
	for _, t := range a.reclaimCandidates(ss, p) {
		total := uint64(a.st.ReservedBytes[0].Current)
		if excess = a.defragExcess(p, rounded); excess == 0 {
			return
		}
		if !a.streamIdle(t) {
			continue
		}
		_ = a.releaseStreamPool(t, p.idx, total-min(excess, total), false)
	}
}

// defragExcess is by how many bytes growing pool p by rounded bytes would
// take its mapped bytes above (1+defrag_threshold) × (allocated + rounded)
// plus one page; 0 when it would not. mu held.
func (a *Allocator) defragExcess(p *pool, rounded uint64) uint64 {
	reserved := uint64(a.st.ReservedBytes[p.kind].Current)
	after := reserved + roundUp(rounded, a.gran)
	limit := uint64((1+a.cfg.DefragThreshold)*float64(uint64(a.st.AllocatedBytes[p.kind].Current)+rounded)) + p.pageSize
	if after <= limit {
		return 0
	}
	return after - limit
}

// reclaimCandidates lists the streams other than ss holding at least one
// granule of free memory in pool p, most free bytes first (then in stream
// order). mu held.
func (a *Allocator) reclaimCandidates(ss *streamState, p *pool) []*streamState {
	var cands []*streamState
	for _, t := range a.streams {
		if t != ss && t.free[p.idx].Bytes() >= a.gran {
			cands = append(cands, t)
		}
	}
	slices.SortFunc(cands, func(x, y *streamState) int {
		bx, by := x.free[p.idx].Bytes(), y.free[p.idx].Bytes()
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
// and queries it. Any failure answers false. mu held.
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
		return false
	}
	done, err := a.drv.EventQuery(ev)
	t.idle = err == nil && done
	return t.idle
}
