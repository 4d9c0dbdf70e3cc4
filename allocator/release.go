package allocator

import (
	"errors"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
)

// insertEvents records an event on every stream in b.Uses, so b is reused
// only once they complete. If recording fails on a stream, it falls back to
// synchronising that stream; if that fails too, every event taken is given
// back and the error returned with nothing changed. mu held.
func (a *Allocator) insertEvents(b *arena.Block) error {
	start := len(a.scratchEvents)
	var err error
	for _, u := range b.Uses {
		ev, e := a.getEvent()
		if e == nil {
			if e = a.drv.EventRecord(ev, u); e == nil {
				a.scratchEvents = append(a.scratchEvents, pendingEvent{ev: ev, b: b})
				a.scratchStreams = append(a.scratchStreams, u)
				continue
			}
			a.events = append(a.events, ev)
		}
		// Could not record: wait for the stream instead.
		a.counters.StreamSyncs++
		if e2 := a.drv.StreamSynchronize(u); e2 != nil {
			err = errors.Join(e, e2)
			break
		}
	}
	recorded := a.scratchEvents[start:]
	streams := a.scratchStreams[start:]
	if err != nil {
		for _, pe := range recorded {
			a.events = append(a.events, pe.ev)
		}
	} else {
		for i, pe := range recorded {
			ss := a.streams[streams[i]]
			ss.queue = append(ss.queue, pe)
			b.Events++
		}
	}
	a.scratchEvents = a.scratchEvents[:start]
	a.scratchStreams = a.scratchStreams[:start]
	return err
}

// getEvent takes an idle event or creates one. mu held.
func (a *Allocator) getEvent() (backend.Event, error) {
	if n := len(a.events); n > 0 {
		ev := a.events[n-1]
		a.events = a.events[:n-1]
		return ev, nil
	}
	return a.drv.EventCreate(a.dev)
}

// eventDone retires the oldest event of ss. mu held.
func (a *Allocator) eventDone(ss *streamState) {
	pe := ss.queue[0]
	ss.queue[0] = pendingEvent{}
	ss.queue = ss.queue[1:]
	if len(ss.queue) == 0 {
		ss.queue = ss.queue[:0:0]
	}
	a.events = append(a.events, pe.ev)
	pe.b.Events--
	if pe.b.Events == 0 {
		a.pending--
		if a.hist != nil {
			a.histFreeCompleted(pe.b)
		}
		a.freeBlock(pe.b)
	}
}

// processEvents frees blocks whose events have all completed. Each
// stream's queue is polled in order and polling stops at the first event
// not yet complete (or whose query fails: a failed query never frees a
// block early). mu held.
func (a *Allocator) processEvents() {
	for _, ss := range a.streams {
		for len(ss.queue) > 0 {
			done, err := a.drv.EventQuery(ss.queue[0].ev)
			if err != nil || !done {
				break
			}
			a.eventDone(ss)
		}
	}
}

// synchronizeAndFreeEvents waits for every pending event and frees the
// blocks waiting on them. On a failed wait it stops; the blocks still
// waiting stay PendingFree. mu held.
func (a *Allocator) synchronizeAndFreeEvents() error {
	if a.pending == 0 {
		return nil
	}
	a.st.NumSyncAllStreams++
	for _, ss := range a.sortedStreams() {
		for len(ss.queue) > 0 {
			if err := a.drv.EventSynchronize(ss.queue[0].ev); err != nil {
				return err
			}
			a.eventDone(ss)
		}
	}
	return nil
}

// cachedHandleBytes is the device memory held by the handle caches. mu held.
func (a *Allocator) cachedHandleBytes() uint64 {
	return a.pools[0].cache.Bytes() + a.pools[1].cache.Bytes()
}

// trimCaches frees every cached handle. mu held.
func (a *Allocator) trimCaches() error {
	return errors.Join(a.pools[0].cache.Trim(0), a.pools[1].cache.Trim(0))
}

// releaseAll waits for pending events, then unmaps every free handle and
// releases every free segment and cached handle (empty_cache). mu held.
func (a *Allocator) releaseAll() error {
	err := a.synchronizeAndFreeEvents()
	return errors.Join(err, a.releaseUntil(0), a.trimCaches(), a.sweepSegments(), a.destroyZombies())
}

// releaseUntil releases free memory, stream by stream, until reserved bytes
// are at most target. Each stream is synchronised once before its handles are
// unmapped. mu held.
func (a *Allocator) releaseUntil(target uint64) error {
	var errs []error
	for _, ss := range a.sortedStreams() {
		if uint64(a.st.ReservedBytes[0].Current) <= target {
			break
		}
		if err := a.releaseStream(ss, target, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseStream unmaps the free handles and frees the free classic segments
// of ss, largest blocks first, until reserved bytes are at most target.
// needSync says whether ss must be synchronised first. mu held.
func (a *Allocator) releaseStream(ss *streamState, target uint64, needSync bool) error {
	return a.releaseStreamPool(ss, -1, target, needSync)
}

// releaseStreamPool is releaseStream limited to pool index onlyPool (-1:
// every pool). mu held.
func (a *Allocator) releaseStreamPool(ss *streamState, onlyPool int, target uint64, needSync bool) error {
	blocks := a.scratch[:0]
	for i := range ss.free {
		if onlyPool >= 0 && i != onlyPool {
			continue
		}
		ss.free[i].Each(func(b *arena.Block) bool {
			if a.releasable(b) {
				blocks = append(blocks, b)
			}
			return true
		})
	}
	defer func() { a.scratch = blocks[:0] }()
	if len(blocks) == 0 {
		return nil
	}
	if needSync {
		a.counters.StreamSyncs++
		if err := a.drv.StreamSynchronize(ss.stream); err != nil {
			return err
		}
	}
	var errs []error
	for i := len(blocks) - 1; i >= 0; i-- { // Each yields ascending sizes
		reserved := uint64(a.st.ReservedBytes[0].Current)
		if reserved <= target {
			break
		}
		if err := a.releaseBlock(ss, blocks[i], reserved-target); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releasable reports whether releasing free block b would return memory:
// a whole classic segment, or an expandable block holding at least one
// whole physical handle.
func (a *Allocator) releasable(b *arena.Block) bool {
	sg := b.Region.Owner.(*seg)
	if !sg.expandable {
		return !b.IsSplit()
	}
	lo, hi := sg.s.WholeHandles(uint64(b.Addr-sg.r.Base), b.Size, ^uint64(0))
	return hi > lo
}

// releaseBlock returns the memory of free block b (whose stream work is
// known complete) to the driver: a whole classic segment, or the whole
// handles inside an expandable block, the fewest from its high end that
// make at least limit bytes (so the heap stays low). mu held.
func (a *Allocator) releaseBlock(ss *streamState, b *arena.Block, limit uint64) error {
	sg := b.Region.Owner.(*seg)
	p := sg.pool
	fl := ss.free[p.idx]
	if !sg.expandable {
		return a.destroyClassic(sg)
	}
	off := uint64(b.Addr - sg.r.Base)
	lo, hi := sg.s.WholeHandles(off, b.Size, limit)
	if lo >= hi {
		return nil
	}
	fl.Remove(b)
	done, err := sg.s.Unmap(lo, hi-lo)
	if done == 0 {
		fl.Insert(b)
		return err
	}
	piece := b
	if lo > off {
		piece = arena.Split(&a.bpool, b, lo-off)
		fl.Insert(b)
	}
	if piece.Size > done {
		right := arena.Split(&a.bpool, piece, done)
		fl.Insert(right)
	}
	piece.State = arena.Unmapped
	piece.Stream = 0
	a.histReserve(false, piece.Addr, -int64(done), ss.stream)
	a.st.ReservedBytes.Add(p.kind, -int64(done))
	if prev := piece.Prev; prev != nil && prev.State == arena.Unmapped {
		p.unmapped.Delete(prev)
		arena.Merge(&a.bpool, prev)
		piece = prev
	}
	if next := piece.Next; next != nil && next.State == arena.Unmapped {
		p.unmapped.Delete(next)
		arena.Merge(&a.bpool, piece)
	}
	p.unmapped.ReplaceOrInsert(piece)
	a.maybeDropEmpty(sg)
	return err
}

// destroyClassic tears down a classic segment whose one block is free. If
// the teardown fails after the memory was unmapped, the segment is no
// longer usable: it is dropped from the pools and kept as a zombie whose
// remaining driver state later releases retry. mu held.
func (a *Allocator) destroyClassic(sg *seg) error {
	mapped := sg.s.MappedBytes()
	err := sg.s.Destroy()
	if err == nil {
		a.dropSeg(sg, mapped)
		return nil
	}
	if sg.s.MappedBytes() == 0 {
		a.dropSeg(sg, mapped)
		a.addZombie(sg.s, sg.pool.kind)
	}
	return err
}

// sweepSegments retries what earlier releases left undone: leftover
// handles whose free failed, and empty expandable segments whose release
// failed. mu held.
func (a *Allocator) sweepSegments() error {
	var errs []error
	for _, sg := range append([]*seg(nil), a.segs...) {
		if sg.s.Leftovers() > 0 {
			if err := sg.s.FreeLeftovers(); err != nil {
				errs = append(errs, err)
			}
		}
		a.maybeDropEmpty(sg)
	}
	return errors.Join(errs...)
}

// EmptyCache waits for pending stream events, unmaps every free handle,
// releases empty segments and cached physical handles
// (torch.cuda.empty_cache). Memory in use is untouched.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	a.histEmptyCache()
	return a.releaseAll()
}

// Synchronize waits for the work queued on stream (0 = the default stream),
// frees blocks whose events completed, and then releases free memory of
// that stream above the release threshold (release_threshold_mb), as
// CUDA's stream-ordered pool does at synchronisation points.
func (a *Allocator) Synchronize(stream backend.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	ss, err := a.stream(stream)
	if err != nil {
		return err
	}
	a.counters.StreamSyncs++
	if err := a.drv.StreamSynchronize(ss.stream); err != nil {
		return err
	}
	a.processEvents()
	if a.cfg.ReleaseThreshold == ^uint64(0) {
		return nil
	}
	cached := uint64(a.st.ReservedBytes[0].Current - a.st.ActiveBytes[0].Current)
	if cached <= a.cfg.ReleaseThreshold {
		return nil
	}
	target := uint64(a.st.ReservedBytes[0].Current) - (cached - a.cfg.ReleaseThreshold)
	return a.releaseStream(ss, target, false)
}
