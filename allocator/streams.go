package allocator

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Stream lifecycle.
//
// The allocator learns a stream on its first use (Malloc, RecordStream,
// Synchronize) and keeps a streamState for it: its free lists and the
// events recorded on it. A stream state is in one of three places:
//
//	in use ──ReleaseStream──────────────────────────▶ forgotten (memory to idle)
//	   │                                                   ▲
//	   └─a driver call says it is gone─▶ vanished ──device synchronize──┘
//
//   - In use (Allocator.streams): Malloc may take its free blocks.
//   - ReleaseStream(s) waits for s (without the mutex; s is releasing
//     meanwhile, and calls that would use it fail), completes the events
//     recorded on it before the wait,
//     unmaps its free handles and destroys its free classic segments, and
//     forgets its state. Memory of s that cannot be returned yet (blocks
//     still allocated or pending, and the free rest of handles they share)
//     is relabelled to the idle owner, a stream id no driver hands out
//     (idleStream): no Malloc is served from it, and as its blocks are
//     freed their whole handles are unmapped at once. Its work being
//     complete, no synchronisation is needed for that.
//   - Vanished (Allocator.vanished): a stream destroyed without
//     ReleaseStream, discovered when a driver call on it fails and the
//     driver no longer knows it, or when RecordStream asks the driver
//     about it again (recheckStream, backend.StreamValidator). Work
//     queued on it before its destruction may still be in flight, so its
//     memory is not reused or unmapped until a device-wide synchronize (backend.DeviceSynchronizer:
//     cuCtxSynchronize, aclrtSynchronizeDevice) proves it complete; then it
//     moves to the idle owner like a released stream. A driver without that
//     capability leaves it stranded: counted in DeviceStats.StrandedBytes
//     and OutOfMemoryError.Stranded until Close, which releases it
//     regardless (the caller closing the allocator vouches that the
//     device's work is done).
//
// A block freed after RecordStream on a stream that vanished would wait for
// an event that can no longer be recorded: Free does not wait for the
// device (that would wait for every stream's unrelated work); the block
// stays pending-free (stranded) with a phantom event count, so no other
// stream is handed memory the vanished stream may still write, until the
// next device synchronize the allocator makes anyway (EmptyCache, rung 2
// of the out-of-memory ladder, Synchronize or ReleaseStream of a destroyed
// stream, Close) frees it. The host allocator quarantines such blocks the
// same way.
//
// Only streams with queued events are walked when events are polled
// (Allocator.busy), so per-call work does not grow with the number of
// streams ever used.

// idleStream owns the memory of released and vanished streams. Drivers hand
// out small integers (the emulator) or user-space pointers (CUDA, ACL), never
// this value.
const idleStream = ^backend.Stream(0)

// minInternalStream is the lowest id the allocator gives its own owners:
// idleStream, and the ghost ids of vanished streams whose id a driver
// reused (retireVanishedID), counting down from idleStream-1. Callers'
// streams at or above it are refused.
const minInternalStream = idleStream - 1<<32

// errNoDeviceSync says the driver cannot synchronize a whole device.
var errNoDeviceSync = errors.New("vmmalloc: the driver cannot synchronize the device (no backend.DeviceSynchronizer)")

// ReleaseStream hands stream s back to the allocator before the caller
// destroys it: it waits for the work queued on s, frees the blocks waiting
// only on that work, returns the free memory of s to the driver (its
// handles are unmapped into the handle cache, its free classic segments
// freed), and forgets the state the allocator kept for s. Blocks still
// allocated on s stay valid and are freed with Free as usual; their memory
// is returned when they are. After ReleaseStream, no more work may be
// queued on s that touches its blocks.
//
// A process that uses many short-lived streams (one per request, say)
// calls it before each StreamDestroy so that the allocator's memory and
// per-call work stay bounded. Once s is destroyed, using it again fails
// with ErrInvalidStream; a stream the caller keeps using instead is learnt
// again as a new stream. The default stream cannot be released
// (ErrInvalidStream), nor a stream of another device.
//
// The wait runs without the allocator's lock: calls on other streams go
// on meanwhile, and Malloc, RecordStream, Synchronize and ReleaseStream
// on s fail with ErrInvalidStream until it returns. A block freed
// meanwhile that was recorded on s (RecordStream before this call), or
// that belongs to s, makes ReleaseStream wait for s a second time, so
// work queued on s during the first wait is complete before s's memory
// is returned.
//
// If waiting for s fails, ReleaseStream returns the error and nothing
// changes. If s was destroyed already, its memory is released after a
// device synchronize where the driver can do one (see the package
// comment in streams.go), and ErrInvalidStream is returned otherwise. A
// failed unmap is returned after the stream was released; its memory stays
// with the allocator and a later EmptyCache retries.
func (a *Allocator) ReleaseStream(s backend.Stream) error {
	a.mu.Lock()
	defer a.unlock()
	if a.closed {
		return ErrClosed
	}
	if s == 0 || s == a.defaultS {
		return fmt.Errorf("%w: the default stream belongs to the allocator and cannot be released", ErrInvalidStream)
	}
	ss, ok := a.streams[s]
	if !ok {
		// Never used, or already released: validate it, then nothing is
		// held for it.
		if _, err := a.stream(s); err != nil {
			return err
		}
		ss = a.streams[s]
	}
	if ss.releasing {
		return fmt.Errorf("%w: stream %d is being released by another ReleaseStream", ErrInvalidStream, s)
	}
	// Wait for s without mu. Meanwhile s is releasing: Malloc,
	// RecordStream and Synchronize on it fail with ErrInvalidStream, and
	// its free blocks stay in its free lists, which no other stream's
	// Malloc takes. Only the events queued on s before a wait began are
	// complete after it (retired counts them; processEvents may retire
	// some meanwhile). A Free during the wait of a block recorded on s
	// (RecordStream before this call) queues one more event, and a block
	// of s freed meanwhile (free or pending) may be used by work queued
	// on s after the wait began: s is waited for again (streamState.frees
	// counts such Frees), so the state is forgotten with no event queued
	// and no such work. Each block queues at most one event and is freed
	// at most once, and no Malloc on s starts meanwhile, so the loop
	// ends.
	if err := a.stepsStream(s); err != nil {
		return err
	}
	ss.releasing = true
	if a.lastS == ss {
		a.lastS = nil // the fast path of stream() must not find it
	}
	for {
		upTo := ss.retired + uint64(len(ss.queue))
		frees := a.streamFrees(ss)
		a.counters.StreamSyncs++
		err := a.waitUnlocked(func() error { return a.drv.StreamSynchronize(s) })
		if a.streams[s] != ss {
			// Found destroyed meanwhile by another call (vanish): its
			// memory waits for a device synchronize.
			ss.releasing = false
			return errors.Join(err, fmt.Errorf("%w: stream %d was destroyed while ReleaseStream waited for it", ErrInvalidStream, s))
		}
		if err != nil {
			ss.releasing = false
			if !a.streamGone(s) {
				return err // nothing changed
			}
			a.vanish(ss)
			if qerr := a.quiesce(); qerr != nil {
				return fmt.Errorf("%w: stream %d was destroyed before ReleaseStream; its memory is held until the device is synchronized: %w", ErrInvalidStream, s, qerr)
			}
			return nil
		}
		// A block of s freed during the wait (to s's free lists, or
		// pending on events of other streams) may be used by work queued
		// on s after the wait began (its last use, queued before Free);
		// retire, and the idle owner once the block is free, unmap it
		// without a further wait for s, so wait again.
		freedDuring := a.streamFrees(ss) != frees
		for ss.retired < upTo && len(ss.queue) > 0 { // recorded on s before the wait: complete now
			a.eventDone(ss)
		}
		if len(ss.queue) == 0 && !freedDuring {
			break
		}
	}
	ss.releasing = false
	return a.retire(ss)
}

// stateOf returns the state owning blocks labelled with stream id, or nil.
// mu held.
func (a *Allocator) stateOf(id backend.Stream) *streamState {
	if ss, ok := a.streams[id]; ok {
		return ss
	}
	if id == idleStream {
		return a.def.idle
	}
	return a.vanished[id]
}

// forget removes ss from the streams in use. mu held.
func (a *Allocator) forget(ss *streamState) {
	delete(a.streams, ss.stream)
	if a.lastS == ss {
		a.lastS = nil
	}
}

// markBusy notes that ss has queued events. mu held.
func (a *Allocator) markBusy(ss *streamState) {
	if ss.busyIdx < 0 {
		ss.busyIdx = len(a.busy)
		a.busy = append(a.busy, ss)
	}
}

// unbusy notes that ss has no queued events any more. mu held.
func (a *Allocator) unbusy(ss *streamState) {
	i := ss.busyIdx
	if i < 0 {
		return
	}
	last := a.busy[len(a.busy)-1]
	a.busy[i], last.busyIdx = last, i
	a.busy[len(a.busy)-1] = nil
	a.busy = a.busy[:len(a.busy)-1]
	ss.busyIdx = -1
}

// sortedBusy lists the busy streams in stream order. mu held.
func (a *Allocator) sortedBusy() []*streamState {
	out := append([]*streamState(nil), a.busy...)
	sort.Slice(out, func(i, j int) bool { return out[i].stream < out[j].stream })
	return out
}

// streamGone reports whether the driver no longer knows stream s (it was
// destroyed). StreamDevice is a query, not a work primitive, so a fault
// injected into a synchronisation does not make a live stream look gone.
// mu held.
func (a *Allocator) streamGone(s backend.Stream) bool {
	return a.validator().Gone(s)
}

// vanish moves ss, whose stream the driver no longer knows, out of the
// streams in use. Its memory waits for quiesce. mu held.
func (a *Allocator) vanish(ss *streamState) {
	if a.streams[ss.stream] != ss {
		return
	}
	a.forget(ss)
	a.vanished[ss.stream] = ss
}

// quiesce makes the memory of vanished streams reusable: after a device
// synchronize their recorded events are complete, their memory goes to the
// idle owner and is released, and stranded pending-free blocks are freed.
// Without vanished streams or stranded blocks it does nothing. mu held.
func (a *Allocator) quiesce() error {
	if len(a.vanished) == 0 && len(a.stranded) == 0 {
		return nil
	}
	ds, ok := a.drv.(backend.DeviceSynchronizer)
	if !ok {
		return errNoDeviceSync
	}
	a.counters.StreamSyncs++
	if err := ds.DeviceSynchronize(a.dev); err != nil {
		return err
	}
	ids := make([]backend.Stream, 0, len(a.vanished))
	for id := range a.vanished {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		ss := a.vanished[id]
		for len(ss.queue) > 0 {
			a.eventDone(ss)
		}
		delete(a.vanished, id)
		for _, o := range a.poolStates(ss) {
			a.adoptIntoIdle(o)
			if o != ss {
				a.unregister(o)
			}
		}
		ss.owners = nil
		a.unregister(ss)
	}
	stranded := a.stranded
	a.stranded = nil
	for _, b := range stranded {
		// the phantom event: the device is idle
		if n, err := a.heap.AddEvents(b, -1); err == nil && n == 0 {
			a.pending--
			a.setHitOff()
			_ = a.freeBlock(b)
		}
	}
	return a.releaseIdles()
}

// maxSpareStates bounds the empty stream states kept for reuse.
const maxSpareStates = 16

// newState returns an empty state for stream s, registered with the heap,
// reusing a spare one when there is one and no wait runs without mu: a
// caller waiting holds the state of its stream, which may be retired
// meanwhile, and checks after the wait that the state still owns its
// stream (owns); a spare state reborn for another stream would pass that
// check and serve the wrong stream. mu held.
func (a *Allocator) newState(s backend.Stream) (*streamState, error) {
	if n := len(a.spare); n > 0 && a.inflight == 0 {
		ss := a.spare[n-1]
		ss.stream = s
		if err := a.register(ss); err != nil {
			return nil, err
		}
		a.spare[n-1] = nil
		a.spare = a.spare[:n-1]
		ss.pool, ss.primary = &a.def, ss
		return ss, nil
	}
	ss, err := a.newStreamState(s)
	if err == nil {
		ss.pool, ss.primary = &a.def, ss
	}
	return ss, err
}

// unregister removes ss, which owns no block any more, from the heap. mu
// held.
func (a *Allocator) unregister(ss *streamState) {
	if ss.sid == 0 || a.heap.RemoveStream(ss.sid) != nil {
		return // still owns blocks: Check reports it
	}
	a.states[ss.sid] = nil
	ss.sid = 0
}

// retire returns the memory of ss, a stream in use whose work is complete,
// and forgets it: free handles are unmapped into the handle cache (the
// reservations stay for the next stream), and what is left is handed to
// the idle owner. The emptied state is kept for reuse. mu held.
func (a *Allocator) retire(ss *streamState) error {
	a.keepEmpty = true
	defer func() { a.keepEmpty = false }()
	var err error
	for _, o := range a.poolStates(ss) {
		err = errors.Join(err, a.releaseStream(o, 0, false)) // o still known: dropping a segment finds its blocks' state
		// Blocks left: allocated, pending, free, or Releasing under
		// another call's wait without mu (a release that synchronizes
		// the stream: it commits or aborts them under the idle owner).
		if a.heap.StreamBlocks(o.sid) > 0 {
			a.adoptIntoIdle(o)
			err = errors.Join(err, a.releaseIdle(o.pool.idle))
		}
		if o != ss {
			a.unregister(o)
		}
	}
	ss.owners = ss.owners[:0]
	a.forget(ss)
	a.unregister(ss)
	if len(a.spare) < maxSpareStates && ss.busyIdx < 0 && len(ss.queue) == 0 {
		ss.stream = 0
		a.spare = append(a.spare, ss)
	}
	return err
}

// adoptIntoIdle relabels every block of ss (no longer in use, its work
// complete) as the idle owner's; the heap merges its free blocks with the
// idle owner's. It walks every segment: it runs only when a released stream
// still holds memory. mu held.
func (a *Allocator) adoptIntoIdle(ss *streamState) {
	if a.heap.StreamBlocks(ss.sid) == 0 {
		return
	}
	idle := ss.pool.idle
	_ = a.heap.MoveStream(ss.sid, idle.sid) // both registered
	idle.active += ss.active
	ss.active = 0
}

// releaseIdle unmaps the whole free handles and frees the free classic
// segments of the idle owner. Its memory has no work in flight, so no
// synchronisation is needed. Emptied reservations stay for the streams
// that follow (EmptyCache releases them). mu held.
func (a *Allocator) releaseIdle(idle *streamState) error {
	if a.freeLen(idle) == 0 {
		return nil
	}
	keep := a.keepEmpty
	a.keepEmpty = true
	defer func() { a.keepEmpty = keep }()
	return a.releaseStream(idle, 0, false)
}

// releaseIdles is releaseIdle of every pool's idle owner. mu held.
func (a *Allocator) releaseIdles() error {
	var errs []error
	for _, p := range a.pools {
		if p != nil {
			errs = append(errs, a.releaseIdle(p.idle))
		}
	}
	return errors.Join(errs...)
}

// streamFrees counts the Frees that succeeded on blocks of the stream
// whose primary state is ss, in every pool (streamState.frees). mu held.
func (a *Allocator) streamFrees(ss *streamState) uint64 {
	n := ss.frees
	for _, o := range ss.owners {
		if o != nil {
			n += o.frees
		}
	}
	return n
}

// strandedBytes is the memory of vanished streams not yet proven idle: their
// free blocks and the pending-free blocks waiting on them. mu held.
func (a *Allocator) strandedBytes() uint64 {
	var n uint64
	for _, ss := range a.vanished {
		for _, o := range a.poolStates(ss) {
			n += a.freeBytes(o)
		}
	}
	for _, b := range a.stranded {
		n += a.heap.Size(b)
	}
	return n
}

// eachState calls f for every stream state: in use, vanished, idle. mu held.
func (a *Allocator) eachState(f func(*streamState)) {
	for _, ss := range a.streams {
		for _, o := range a.poolStates(ss) {
			f(o)
		}
	}
	for _, ss := range a.vanished {
		for _, o := range a.poolStates(ss) {
			f(o)
		}
	}
	for _, p := range a.pools {
		if p != nil {
			f(p.idle)
		}
	}
}

// retireVanishedID frees the id of vanished stream ss for the new stream a
// driver gave it. A device synchronize retires every vanished stream (their
// memory becomes reusable); where the driver cannot do one, ss's blocks and
// state move to a ghost id of the allocator's own, so the new stream starts
// empty and ss's memory stays stranded until a later device synchronize or
// Close. mu held.
func (a *Allocator) retireVanishedID(ss *streamState) {
	if a.quiesce() == nil {
		if _, still := a.vanished[ss.stream]; !still {
			return
		}
	}
	a.ghosts++
	ghost := idleStream - backend.Stream(a.ghosts)
	delete(a.vanished, ss.stream)
	for _, o := range a.poolStates(ss) {
		o.stream = ghost
		a.heap.RenameStream(o.sid, ghost) // blocks are owned by o.sid: they follow
	}
	a.vanished[ghost] = ss
}
