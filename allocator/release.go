package allocator

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
)

// insertEvents records an event on every stream in uses (the streams
// recorded on allocated block b), so b is reused only once they complete.
// Where recording fails on a stream, it falls back to synchronising that
// stream; those waits run without mu (waitUnlocked), with b marked in
// Allocator.freeing so that another Free or RecordStream of it meanwhile
// fails with ErrDoubleFree. If a wait fails too, every event taken is
// given back and the error returned with nothing changed. A stream the
// driver no longer knows needs no event: a released one has no work
// left, and for a vanished one (destroyed without ReleaseStream) b stays
// pending (stranded), without a device-wide wait, until the next device
// synchronize (quiesce) shows the vanished stream's work complete. mu held
// (dropped while it waits).
func (a *Allocator) insertEvents(b arena.BlockID, uses []backend.Stream) error {
	if a.freeing[b] {
		return fmt.Errorf("%w: %#x is being freed by another call", ErrDoubleFree, a.heap.Addr(b))
	}
	start := len(a.scratchEvents)
	var (
		syncs  []backend.Stream // streams no event could be recorded on
		recErr []error          // why, by syncs index
	)
	for _, u := range uses {
		ev, e := a.getEvent()
		if e == nil {
			if e = a.drv.EventRecord(ev, u); e == nil {
				a.scratchEvents = append(a.scratchEvents, pendingEvent{ev: ev, b: b})
				a.scratchStreams = append(a.scratchStreams, u)
				continue
			}
			a.events = append(a.events, ev)
		}
		syncs = append(syncs, u)
		recErr = append(recErr, e)
	}
	recorded := a.scratchEvents[start:]
	streams := a.scratchStreams[start:]
	var err error
	strand := false
	if len(syncs) > 0 {
		// Could not record: wait for those streams instead, without mu.
		// The scratch slices are another goroutine's meanwhile.
		recorded = append([]pendingEvent(nil), recorded...)
		streams = append([]backend.Stream(nil), streams...)
		a.scratchEvents = a.scratchEvents[:start]
		a.scratchStreams = a.scratchStreams[:start]
		if a.freeing == nil {
			a.freeing = make(map[arena.BlockID]bool)
		}
		a.freeing[b] = true
		waitErr := make([]error, len(syncs))
		a.counters.StreamSyncs += int64(len(syncs))
		_ = a.waitUnlocked(func() error {
			for i, u := range syncs {
				waitErr[i] = a.drv.StreamSynchronize(u)
			}
			return nil
		})
		delete(a.freeing, b)
		for i, u := range syncs {
			if waitErr[i] == nil {
				continue
			}
			if a.streamGone(u) {
				if ss, ok := a.streams[u]; ok {
					a.vanish(ss)
				}
				if _, ok := a.vanished[u]; ok {
					strand = true
				}
				continue // released: nothing in flight
			}
			err = errors.Join(recErr[i], waitErr[i])
			break
		}
	}
	if err != nil {
		for _, pe := range recorded {
			a.events = append(a.events, pe.ev)
		}
	} else {
		for i, pe := range recorded {
			ss := a.stateOf(streams[i])
			if ss == nil { // released, but the caller kept it alive: learn it again
				var nerr error
				if ss, nerr = a.newState(streams[i]); nerr != nil {
					a.events = append(a.events, pe.ev) // the event is not waited for: the block is freed without it
					continue
				}
				a.streams[streams[i]] = ss
			}
			ss.queue = append(ss.queue, pe)
			a.markBusy(ss)
			_, _ = a.heap.AddEvents(b, 1)
		}
		if strand {
			_, _ = a.heap.AddEvents(b, 1) // a phantom event only quiesce retires
			a.stranded = append(a.stranded, b)
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
	ss.retired++
	if len(ss.queue) == 0 {
		ss.queue = ss.queue[:0:0]
		a.unbusy(ss)
	}
	a.events = append(a.events, pe.ev)
	if n, err := a.heap.AddEvents(pe.b, -1); err == nil && n == 0 {
		a.pending--
		a.setHitOff()
		if a.hist != nil {
			a.histFreeCompleted(pe.b)
		}
		_ = a.freeBlock(pe.b)
	}
}

// processEvents frees blocks whose events have all completed. Each busy
// stream's queue is polled in order and polling stops at the first event
// not yet complete (or whose query fails: a failed query never frees a
// block early). Only streams with queued events are visited. mu held.
func (a *Allocator) processEvents() {
	// Backwards: eventDone removes a stream whose queue empties by moving
	// the last busy stream, already visited, into its place.
	for i := len(a.busy) - 1; i >= 0; i-- {
		if i >= len(a.busy) {
			continue
		}
		ss := a.busy[i]
		for len(ss.queue) > 0 {
			done, err := a.drv.EventQuery(ss.queue[0].ev)
			if err != nil || !done {
				break
			}
			a.eventDone(ss)
		}
	}
}

// synchronizeAndFreeEvents waits for the events pending on each busy
// stream when it comes to that stream, and frees the blocks waiting on
// them. A failed wait stops that stream's queue (its blocks stay
// PendingFree) and the others go on; the errors are joined. Events queued
// during its waits stay pending (as if their Free came after this call),
// so a stream that is freed to without end cannot hold it. mu held
// (dropped while it waits).
func (a *Allocator) synchronizeAndFreeEvents() error {
	if len(a.busy) == 0 {
		return nil
	}
	a.st.NumSyncAllStreams++
	if a.pooled {
		a.def.st.NumSyncAllStreams++ // the device's: the default pool's record
	}
	var errs []error
	for _, ss := range a.sortedBusy() {
		upTo := ss.retired + uint64(len(ss.queue))
		for ss.retired < upTo && len(ss.queue) > 0 {
			// The wait runs without mu: the block waiting on the event is
			// PendingFree, which nothing else may take. Another goroutine
			// may retire the event meanwhile, and then recycle it and the
			// block: the same pendingEvent, recorded again after this
			// wait, can head the queue again. So the head is retired here
			// only if nothing was retired from the queue meanwhile
			// (retired only grows; events leave the queue only from its
			// head, each counted), which makes it the event waited for.
			pe, seq := ss.queue[0], ss.retired
			if err := a.waitUnlocked(func() error { return a.drv.EventSynchronize(pe.ev) }); err != nil {
				errs = append(errs, err)
				break
			}
			if ss.retired == seq && len(ss.queue) > 0 {
				a.eventDone(ss)
			}
		}
	}
	return errors.Join(errs...)
}

// cachedHandleBytes is the device memory held by the handle caches. mu held.
func (a *Allocator) cachedHandleBytes() uint64 {
	return a.classes[0].cache.Bytes() + a.classes[1].cache.Bytes()
}

// trimCaches frees every cached handle. mu held.
func (a *Allocator) trimCaches() error {
	return errors.Join(a.classes[0].cache.Trim(0), a.classes[1].cache.Trim(0))
}

// releaseAll waits for pending events, then unmaps every free handle and
// releases every free segment and cached handle (empty_cache). Memory of
// streams destroyed behind its back is released after a device
// synchronize; where the driver cannot do one it stays stranded, which is
// not an error. mu held.
func (a *Allocator) releaseAll() error {
	err := a.synchronizeAndFreeEvents()
	err = errors.Join(err, a.releaseUntil(0))
	if qerr := a.quiesce(); qerr != nil && !errors.Is(qerr, errNoDeviceSync) {
		err = errors.Join(err, qerr)
	}
	err = errors.Join(err, a.flushUnmaps())
	return errors.Join(err, a.trimCaches(), a.sweepSegments(), a.destroyZombies(), a.releaseExported())
}

// releaseUntil releases free memory, stream by stream, until reserved bytes
// are at most target: first the idle owner's (released streams: no wait),
// then each stream in use, synchronised once before its handles are
// unmapped. A failure on one stream does not stop the others. mu held.
func (a *Allocator) releaseUntil(target uint64) error {
	var errs []error
	if err := a.releaseIdlesUntil(target); err != nil {
		errs = append(errs, err)
	}
	for _, ss := range a.sortedStreams() {
		// Every pool's memory of the stream: a pool that cannot grow
		// takes back what the others only cache.
		for _, o := range a.poolStates(ss) {
			if uint64(a.st.ReservedBytes[0].Current) <= target {
				break
			}
			if err := a.releaseStream(o, target, true); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(a.vanished) > 0 && uint64(a.st.ReservedBytes[0].Current) > target {
		// One device synchronize for every stream found destroyed.
		if err := a.quiesce(); err != nil && !errors.Is(err, errNoDeviceSync) {
			errs = append(errs, err)
		}
		if err := a.releaseIdlesUntil(target); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseIdlesUntil releases the free memory of every pool's idle owner
// (no wait) until reserved bytes are at most target. mu held.
func (a *Allocator) releaseIdlesUntil(target uint64) error {
	var errs []error
	for _, p := range a.pools {
		if p != nil && uint64(a.st.ReservedBytes[0].Current) > target {
			errs = append(errs, a.releaseStream(p.idle, target, false))
		}
	}
	return errors.Join(errs...)
}

// poolStates lists the states of the stream whose primary state is ss in
// every pool: ss first, then its private pools' owners. mu held.
func (a *Allocator) poolStates(ss *streamState) []*streamState {
	if len(ss.owners) == 0 {
		return []*streamState{ss}
	}
	out := []*streamState{ss}
	for _, o := range ss.owners {
		if o != nil {
			out = append(out, o)
			out = append(out, o.isolated...)
		}
	}
	return out
}

// releaseStream unmaps the free handles and frees the free classic segments
// of ss, largest blocks first, until reserved bytes are at most target.
// needSync says whether ss must be synchronised first. mu held.
func (a *Allocator) releaseStream(ss *streamState, target uint64, needSync bool) error {
	return a.releaseStreamPool(ss, -1, target, needSync)
}

// releaseStreamPool is releaseStream limited to pool index onlyPool (-1:
// every pool). mu held; when needSync it drops mu while it waits for the
// stream (see waitUnlocked), after marking what it will release. mu held
// again when it returns.
func (a *Allocator) releaseStreamPool(ss *streamState, onlyPool int, target uint64, needSync bool) error {
	blocks := a.scratch[:0]
	for i := range a.classes {
		if onlyPool >= 0 && i != onlyPool {
			continue
		}
		a.heap.EachFree(ss.sid, uint8(i), func(b arena.BlockID) bool {
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
	if !needSync {
		var errs []error
		for i := len(blocks) - 1; i >= 0; i-- { // EachFree yields ascending sizes
			reserved := uint64(a.st.ReservedBytes[0].Current) - a.queuedBytes // queued: as good as released
			if reserved <= target {
				break
			}
			if err := a.releaseBlock(ss, blocks[i], reserved-target); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	// Mark the ranges to release (largest blocks first, as many whole
	// handles as the target asks for), so that nothing allocates them
	// while the stream is waited for without the lock: work queued on ss
	// after the wait began may use only memory freed to ss later.
	// rels outlives the lock drop, so it is not a.scratch, which another
	// goroutine may use meanwhile.
	var rels []arena.BlockID
	reserved := uint64(a.st.ReservedBytes[0].Current)
	for i := len(blocks) - 1; i >= 0 && reserved > target; i-- {
		info, _ := a.heap.Block(blocks[i])
		sg := a.segOf[info.Region]
		off, n := uint64(0), info.Size
		if sg.expandable {
			lo, hi := sg.s.WholeHandles(uint64(info.Addr-sg.base), info.Size, reserved-target)
			if lo >= hi {
				continue
			}
			off, n = lo-uint64(info.Addr-sg.base), hi-lo
		}
		rel, err := a.heap.BeginRelease(blocks[i], off, n)
		if err != nil {
			continue // Check reports the disagreement
		}
		rels = append(rels, rel)
		reserved -= min(n, reserved)
	}
	return a.releaseRels(ss, rels)
}

// releaseRels returns the memory of rels, ranges of ss's free blocks that
// the caller marked Releasing (arena.Heap.BeginRelease): it synchronises
// ss and unmaps them (whole handles of expandable segments, whole classic
// segments) with mu dropped, then commits what was unmapped. If the wait
// fails, every range goes back to ss's free memory unchanged. mu held
// (dropped while it waits).
func (a *Allocator) releaseRels(ss *streamState, rels []arena.BlockID) error {
	if len(rels) == 0 {
		return nil
	}
	// The unmaps of expandable ranges run after the wait, still without
	// mu (segment.UnmapOp); a range whose unmap cannot begin is released
	// under mu below, as before.
	ops := make([]*segment.UnmapOp, len(rels))
	for i, rel := range rels {
		info, _ := a.heap.Block(rel)
		if sg := a.segOf[info.Region]; sg.expandable {
			ops[i], _ = sg.s.BeginUnmap(uint64(info.Addr-sg.base), info.Size)
		}
	}
	a.counters.StreamSyncs++
	s := ss.stream // read under mu: a ReleaseStream meanwhile may recycle ss
	hs := a.hookList()
	var rs []SegmentRange
	if hs != nil {
		for _, rel := range rels {
			info, _ := a.heap.Block(rel)
			rs = append(rs, a.segRange(a.segOf[info.Region], ss.pool, info.Addr, info.Size))
		}
	}
	ticket := a.beginRelease()
	err := a.waitUnlocked(func() error {
		if err := a.drv.StreamSynchronize(s); err != nil {
			return err
		}
		reportUnmapped(hs, rs) // idle now, still mapped
		for _, op := range ops {
			if op != nil {
				op.Run()
			}
		}
		return nil
	})
	// Waiters wake only once mu is dropped again, after the commits below.
	a.endRelease(ticket)
	if err != nil {
		for i, rel := range rels {
			if ops[i] != nil {
				info, _ := a.heap.Block(rel)
				_, _ = a.segOf[info.Region].s.EndUnmap(ops[i]) // never run: unmaps nothing
			}
			_, _ = a.heap.AbortRelease(rel)
		}
		if !a.owns(ss) {
			// ReleaseStream retired ss meanwhile, after its own wait
			// for ss: the marked blocks went to the idle owner, with
			// their work complete, and the caller may have destroyed
			// the stream since, so this wait's failure says nothing.
			return a.releaseIdles()
		}
		if v, ok := a.vanished[s]; ok && v == ss.primary {
			// Found destroyed behind our back by the wait for another of
			// its pools' states: released with the others, as below.
			return nil
		}
		if a.streams[s] != ss.primary || !a.streamGone(s) {
			return err
		}
		// Destroyed behind our back: its memory is released once a
		// device synchronize shows its work complete (releaseUntil
		// and releaseAll do one for all such streams; stranded and
		// counted until then).
		a.vanish(ss.primary)
		return nil
	}
	var (
		errs  []error
		again []SegmentRange // reported unmapped, but still mapped
	)
	for i, rel := range rels {
		var err error
		info, _ := a.heap.Block(rel)
		sg := a.segOf[info.Region]
		if ops[i] != nil {
			done, uerr := sg.s.EndUnmap(ops[i])
			if hs != nil && done < info.Size {
				again = append(again, a.segRange(sg, ss.pool, info.Addr+uintptr(done), info.Size-done))
			}
			err = a.commitReleased(ss, rel, sg, done, uerr)
		} else {
			before := sg.s.MappedBytes()
			err = a.releaseMarked(ss, rel)
			if hs != nil && err != nil && a.segOf[info.Region] == sg && sg.s.MappedBytes() == before {
				again = append(again, rs[i])
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(again) > 0 {
		_ = a.waitUnlocked(func() error {
			for _, r := range again {
				_ = reportMapped(hs, r) // best effort: it stays mapped either way
			}
			return nil
		})
	}
	return errors.Join(errs...)
}

// waitUnlocked runs wait, a driver call that may block (a stream or event
// synchronize), with mu dropped, and retakes mu. Blocks the caller marked
// Releasing stay out of every index meanwhile; Close, Check and Snapshot
// wait until no such call is in flight. mu held on entry and on return.
func (a *Allocator) waitUnlocked(wait func() error) error {
	a.inflight++
	a.waitsChanged()
	a.mu.Unlock()
	err := wait()
	a.mu.Lock()
	if a.inflight--; a.inflight == 0 {
		a.quiet.Broadcast()
	}
	a.waitsChanged()
	return err
}

// quiesceWaits waits until no driver wait runs without the lock, so that
// no block is Releasing. mu held (dropped while waiting).
func (a *Allocator) quiesceWaits() {
	if a.inflight == 0 {
		return
	}
	a.quiescing++
	a.waitsChanged()
	for a.inflight > 0 {
		a.quiet.Wait()
	}
	a.quiescing--
	a.waitsChanged()
}

// waitsChanged wakes a test waiting on waitWatch for inflight or
// quiescing to reach some value. mu held.
func (a *Allocator) waitsChanged() {
	if a.waitWatch != nil {
		a.waitWatch.Broadcast()
	}
}

// releaseMarked returns the memory of Releasing block rel, whose stream
// work is complete: a whole classic segment, or the whole handles it
// covers in an expandable segment. mu held.
func (a *Allocator) releaseMarked(ss *streamState, rel arena.BlockID) error {
	info, _ := a.heap.Block(rel)
	sg := a.segOf[info.Region]
	if !sg.expandable {
		if _, err := a.heap.AbortRelease(rel); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return a.destroyClassic(sg)
	}
	lo := uint64(info.Addr - sg.base)
	done, err := sg.s.Unmap(lo, info.Size)
	return a.commitReleased(ss, rel, sg, done, err)
}

// commitReleased commits the release of Releasing block rel of expandable
// segment sg, whose first done bytes were unmapped (err: what the unmap
// reported), and counts it. mu held.
func (a *Allocator) commitReleased(ss *streamState, rel arena.BlockID, sg *seg, done uint64, err error) error {
	addr := a.heap.Addr(rel)
	if _, cerr := a.heap.CommitRelease(rel, done); cerr != nil {
		return errors.Join(err, fmt.Errorf("%w: %w", ErrCorrupt, cerr))
	}
	if done > 0 {
		a.histReserve(false, addr, -int64(done), ss)
		a.addReserved(ss.pool, sg.class.kind, -int64(done))
		a.maybeDropEmpty(sg)
	}
	return err
}

// releasable reports whether releasing free block b would return memory:
// a whole classic segment, or an expandable block holding at least one
// whole physical handle. mu held.
func (a *Allocator) releasable(b arena.BlockID) bool {
	info, _ := a.heap.Block(b)
	if a.states[info.StreamID].pool.asleep {
		return false // sleep.go: its handles are not the heap's to release
	}
	sg := a.segOf[info.Region]
	if !sg.expandable {
		return !info.IsSplit()
	}
	lo, hi := sg.s.WholeHandles(uint64(info.Addr-sg.base), info.Size, ^uint64(0))
	return hi > lo
}

// releaseBlock returns the memory of free block b (whose stream work is
// known complete) to the driver: a whole classic segment, or the whole
// handles inside an expandable block, the fewest from its high end that
// make at least limit bytes (so the heap stays low). The range is marked
// releasing in the heap while it is unmapped. mu held.
func (a *Allocator) releaseBlock(ss *streamState, b arena.BlockID, limit uint64) error {
	info, ok := a.heap.Block(b)
	if !ok || info.State != arena.Free || info.StreamID != ss.sid || ss.pool.asleep {
		return nil // merged or released since the walk; or asleep (sleep.go)
	}
	sg := a.segOf[info.Region]
	cl := sg.class
	if !sg.expandable {
		if len(a.hooks) > 0 {
			return a.queueRelease(ss, sg, b, 0, sg.size)
		}
		return a.destroyClassic(sg)
	}
	off := uint64(info.Addr - sg.base)
	lo, hi := sg.s.WholeHandles(off, info.Size, limit)
	if lo >= hi {
		return nil
	}
	if len(a.hooks) > 0 {
		// The hooks are called without mu: queued, reported and
		// unmapped before the call returns (flushUnmaps).
		return a.queueRelease(ss, sg, b, lo, hi)
	}
	rel, err := a.heap.BeginRelease(b, lo-off, hi-lo)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	done, err := sg.s.Unmap(lo, hi-lo)
	if _, cerr := a.heap.CommitRelease(rel, done); cerr != nil {
		return errors.Join(err, fmt.Errorf("%w: %w", ErrCorrupt, cerr))
	}
	if done == 0 {
		return err
	}
	a.histReserve(false, sg.base+uintptr(lo), -int64(done), ss)
	a.addReserved(ss.pool, cl.kind, -int64(done))
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
		a.addZombie(sg.s, sg.class.kind, a.segPool(sg))
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
	defer a.unlock()
	if a.closed {
		return ErrClosed
	}
	a.histEmptyCache()
	for _, p := range a.pools {
		if p != nil {
			p.forgetDefragSlack()
		}
	}
	return errors.Join(a.stepsEvent(nil, true), a.releaseAll())
}

// Synchronize waits for the work queued on stream (0 = the default stream),
// frees blocks whose events completed, and then releases free memory of
// that stream above the release threshold (release_threshold_mb), as
// CUDA's stream-ordered pool does at synchronisation points.
func (a *Allocator) Synchronize(stream backend.Stream) error {
	a.mu.Lock()
	defer a.unlock()
	if a.closed {
		return ErrClosed
	}
	ss, err := a.stream(stream)
	if err != nil {
		return err
	}
	a.counters.StreamSyncs++
	frees := a.streamFrees(ss)
	// The wait runs without mu. Blocks freed to ss meanwhile may have work
	// queued after the wait began, so the release below waits again (with
	// the blocks marked) if any was.
	s := ss.stream // read under mu: a ReleaseStream meanwhile may recycle ss
	if err := a.waitUnlocked(func() error { return a.drv.StreamSynchronize(s) }); err != nil {
		if !a.streamGone(s) {
			return err
		}
		a.vanish(ss)
		return fmt.Errorf("%w: stream %d was destroyed: %w", ErrInvalidStream, s, errors.Join(err, a.quiesce()))
	}
	if a.closed {
		return ErrClosed
	}
	if !a.owns(ss) {
		return nil // released meanwhile: its memory went back then
	}
	a.processEvents()
	if a.cfg.ReleaseThreshold == ^uint64(0) {
		return nil
	}
	_, active := a.st.ActiveNow(0)
	cached := uint64(a.st.ReservedBytes[0].Current - active)
	if cached <= a.cfg.ReleaseThreshold {
		return nil
	}
	target := uint64(a.st.ReservedBytes[0].Current) - (cached - a.cfg.ReleaseThreshold)
	needSync := a.streamFrees(ss) != frees
	var errs []error
	for _, o := range a.poolStates(ss) {
		errs = append(errs, a.releaseStream(o, target, needSync))
	}
	return errors.Join(errs...)
}
