package host

import (
	"errors"

	"github.com/vmmalloc/vmmalloc/backend"
)

// insertEvents records an event on every stream in b.uses, so that b is
// reused only once they complete. An event comes from the idle pool of the
// stream's device, or is created when the pool is empty (so the pool grows
// to the peak number of pending events and no more).
//
// A stream the driver no longer knows (destroyed since RecordStream) can
// take no event and be waited for by no stream wait: insertEvents then
// returns quarantine, without waiting, and gives back the events it took;
// the caller quarantines b. Whether a stream is gone is asked of the driver
// (StreamValidator.Gone), never read from a failed call's error, so a
// fault on a live stream does not look like a destroyed one.
//
// If an event cannot be created or recorded on a live stream, it waits
// for that stream instead. If that fails too, every event taken goes back
// to the pool and the error is returned with b unchanged. mu held.
func (a *Allocator) insertEvents(b *block) (quarantine bool, err error) {
	rec := a.scratch[:0]
	for _, ss := range b.uses {
		if ss.gone { // RecordStream validated it, and a later call found it gone
			quarantine = true
			break
		}
		u := ss.stream
		ev, e := a.getEvent(ss.dev)
		if e == nil {
			if e = a.drv.EventRecord(ev, u); e == nil {
				rec = append(rec, pendingEvent{ev: ev, b: b})
				a.scratchSS = append(a.scratchSS, ss)
				continue
			}
			a.idle[ss.dev] = append(a.idle[ss.dev], ev)
		}
		if a.sv.Gone(u) {
			a.forgetStream(ss)
			quarantine = true
			break
		}
		a.st.NumSyncFallback++
		if e2 := a.drv.StreamSynchronize(u); e2 != nil {
			if a.sv.Gone(u) { // destroyed meanwhile
				a.forgetStream(ss)
				quarantine = true
				break
			}
			err = errors.Join(e, e2)
			break
		}
	}
	for i, pe := range rec {
		ss := a.scratchSS[i]
		if err != nil || quarantine {
			a.idle[ss.dev] = append(a.idle[ss.dev], pe.ev)
			continue
		}
		ss.push(pe)
		b.events++
		a.st.NumEventRecords++
	}
	clear(rec)
	clear(a.scratchSS)
	a.scratch = rec[:0]
	a.scratchSS = a.scratchSS[:0]
	return quarantine, err
}

// forgetStream drops a stream the driver no longer knows; it stays listed
// while events recorded on it before are pending (its work still runs,
// and they complete with it). mu held.
func (a *Allocator) forgetStream(ss *streamState) {
	if ss.gone {
		return
	}
	if a.streams[ss.stream] == ss {
		delete(a.streams, ss.stream)
	}
	ss.gone = true
	a.gone++
	a.dropDrainedStreams()
}

// dropDrainedStreams unlists gone streams without pending events. mu held.
func (a *Allocator) dropDrainedStreams() {
	kept := a.slist[:0]
	for _, ss := range a.slist {
		if !ss.gone || len(ss.pending()) > 0 {
			kept = append(kept, ss)
		} else {
			a.gone--
		}
	}
	clear(a.slist[len(kept):])
	a.slist = kept
}

// getEvent takes an idle event of device dev or creates one. mu held.
func (a *Allocator) getEvent(dev int) (backend.Event, error) {
	if l := a.idle[dev]; len(l) > 0 {
		ev := l[len(l)-1]
		a.idle[dev] = l[:len(l)-1]
		return ev, nil
	}
	ev, err := a.drv.EventCreate(dev)
	if err == nil {
		a.st.NumEventsCreate++
	}
	return ev, err
}

// eventDone retires the oldest event of ss; the block it held is cached
// once its last event is done. mu held.
func (a *Allocator) eventDone(ss *streamState) {
	pe := ss.pop()
	a.idle[ss.dev] = append(a.idle[ss.dev], pe.ev)
	pe.b.events--
	if pe.b.events == 0 {
		a.pending--
		a.cache(pe.b)
	}
}

// processEvents retires completed events without waiting: each stream's
// queue is polled oldest first and polling stops at the first event not yet
// complete, or whose query fails (a failed query never frees a block
// early). mu held.
func (a *Allocator) processEvents() {
	for _, ss := range a.slist {
		for len(ss.pending()) > 0 {
			done, err := a.drv.EventQuery(ss.pending()[0].ev)
			if err != nil || !done {
				break
			}
			a.eventDone(ss)
		}
	}
	if a.gone > 0 {
		a.dropDrainedStreams()
	}
}

// drainPending waits for the newest pending event of every stream (a
// stream's events complete in order, so that is all of them) and retires
// the events before it. Events recorded meanwhile are not waited for.
//
// Unless closing, it waits with mu dropped and then retires only what
// EventQuery finds complete (processEvents): an event retired and recorded
// again by another goroutine while this one waited makes the wait longer,
// never frees a block early. Closing (Close: every later call returns
// ErrClosed anyway) it waits with mu held, so nothing can be recorded
// meanwhile and every pending event is retired after the wait. A failed
// wait retires nothing more and returns the error. mu held.
func (a *Allocator) drainPending(closing bool) error {
	var evs []backend.Event
	for _, ss := range a.slist {
		if p := ss.pending(); len(p) > 0 {
			evs = append(evs, p[len(p)-1].ev)
		}
	}
	if len(evs) == 0 {
		return nil
	}
	wait := func() error {
		for _, ev := range evs {
			if err := a.drv.EventSynchronize(ev); err != nil {
				return err
			}
		}
		return nil
	}
	if !closing {
		err := a.callUnlocked(wait)
		a.processEvents()
		return err
	}
	if err := wait(); err != nil {
		return err
	}
	for _, ss := range a.slist {
		for len(ss.pending()) > 0 {
			a.eventDone(ss)
		}
	}
	if a.gone > 0 {
		a.dropDrainedStreams()
	}
	return nil
}
