package host

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// grow obtains a new block for a request of size bytes: a block of its
// class from the driver, or a new chunk (expandable segments). When the
// driver is out of memory, or the pin budget refuses, it climbs a ladder:
//  1. release every cached block, or every wholly free chunk (events
//     polled first), and retry;
//  2. wait for the events of free-pending blocks and end the quarantine
//     (a device-wide wait: settleQuarantine), release them, and retry;
//  3. return an error wrapping ErrOutOfMemory and the driver's error.
//
// mu held.
func (a *Allocator) grow(size uint64) (*block, error) {
	rounded, c := a.classes.round(size)
	if a.exp != nil {
		rounded = roundPage(size)
	}
	b, err := a.obtain(rounded, c, size)
	if err == nil || !outOfMemory(err) {
		return b, err
	}
	a.processEvents()
	if a.hasCached() {
		_ = a.releaseCached(false) // what cannot be released stays cached
		if b, err = a.obtain(rounded, c, size); err == nil || !outOfMemory(err) {
			return b, err
		}
	}
	if a.pending > 0 || len(a.quarantine) > 0 {
		e := errors.Join(a.drainPending(false), a.settleQuarantine(false)) // mu dropped while they wait
		if a.closed {
			return nil, ErrClosed
		}
		if e == nil {
			_ = a.releaseCached(false)
			if b, err = a.obtain(rounded, c, size); err == nil || !outOfMemory(err) {
				return b, err
			}
		}
	}
	a.st.NumOOMs++
	if a.hist != nil {
		a.histRecord(stats.TraceOOM, 0, size)
	}
	return nil, fmt.Errorf("%w: %d bytes requested (%d-byte class); %d bytes held, %d allocated: %w",
		ErrOutOfMemory, size, rounded, a.st.ReservedBytes.Current, a.st.AllocatedBytes.Current, err)
}

// outOfMemory reports whether err is the driver's out-of-memory or the pin
// budget's refusal: the errors the ladder climbs for.
func outOfMemory(err error) bool {
	return errors.Is(err, backend.ErrOutOfMemory) || errors.Is(err, ErrBudget)
}

// hasCached reports whether anything could be released: a cached block, or
// with expandable segments a chunk. mu held.
func (a *Allocator) hasCached() bool {
	if a.exp != nil {
		return a.st.Segment.Current > 0
	}
	return a.st.Segment.Current > a.st.Active.Current
}

// obtain gets a block of rounded bytes from the driver and indexes it, or
// with expandable segments a new chunk for a request of size bytes
// (obtainExp).
// The driver calls (MallocHost, or mmap and HostRegister) run with mu
// dropped (callUnlocked): pinning memory can take milliseconds per
// megabyte, and other goroutines' cache hits go on meanwhile. On failure
// nothing changes; if the allocator was closed meanwhile, the block is
// cached for Close to release and ErrClosed is returned. mu held (dropped
// while the driver works).
func (a *Allocator) obtain(rounded uint64, c int, size uint64) (*block, error) {
	if a.exp != nil {
		return a.obtainExp(size)
	}
	if err := a.budget.Reserve(rounded); err != nil {
		a.st.NumBudgetDenials++
		return nil, err
	}
	b := &block{size: rounded, class: c}
	if err := a.callUnlocked(func() error { return a.pin(b) }); err != nil {
		a.budget.Release(rounded)
		return nil, err
	}
	a.blocks[b.ptr] = b
	a.spans.ReplaceOrInsert(span{start: b.ptr, end: b.ptr + uintptr(b.size), b: b})
	a.st.Segment.Add(1)
	a.st.ReservedBytes.Add(int64(b.size))
	a.st.NumHostAlloc++
	if a.hist != nil {
		a.histRecord(stats.TraceSegmentAlloc, b.ptr, b.size)
	}
	if a.closed {
		// Close waits for this call (inflight) and then releases the
		// cache, this block with it (never active: not cache's count).
		b.state = stateCached
		a.free[c] = append(a.free[c], b)
		return nil, ErrClosed
	}
	return b, nil
}

// pin obtains b.size bytes of pinned memory for b, a block in no index:
// MallocHost, or with UseHostRegister an anonymous mapping registered
// with the driver. On failure b is unchanged and nothing is held. It
// reads only what never changes (the driver, the config), so it runs
// without mu.
func (a *Allocator) pin(b *block) error {
	if a.cfg.UseHostRegister {
		mem, err := mapAnonymous(b.size)
		if err != nil {
			return fmt.Errorf("mmap of %d bytes: %w: %w", b.size, backend.ErrOutOfMemory, err)
		}
		p := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
		if err := a.hm.HostRegister(p, b.size, backend.HostRegisterMapped); err != nil {
			_ = unmapAnonymous(mem) // our own fresh mapping: cannot fail
			return err
		}
		b.ptr, b.mem, b.reg = p, mem, true
		return nil
	}
	p, err := a.hm.MallocHost(b.size)
	if err != nil {
		return err
	}
	b.ptr = p
	return nil
}

// release gives cached block b back to the driver: it undoes the
// allocator's registration of it, then frees it (FreeHostWithDevSync if
// sync, else FreeHost; or unpins and unmaps memory from the OS). On failure
// b stays cached and keeps whatever state the driver still holds. mu held.
func (a *Allocator) release(b *block, sync bool) error {
	if b.reg {
		if err := a.hm.HostUnregister(b.ptr); err != nil {
			return err
		}
		b.reg, b.devPtr = false, 0
		if b.mem != nil {
			// Unpinned OS memory must not be served: drop the block even
			// if the mapping cannot be undone.
			err := unmapAnonymous(b.mem)
			a.forget(b)
			return err
		}
	}
	var err error
	if sync {
		err = a.hm.FreeHostWithDevSync(b.ptr)
	} else {
		err = a.hm.FreeHost(b.ptr)
	}
	if err != nil {
		return err
	}
	a.forget(b)
	return nil
}

// forget drops released block b from the indexes and statistics, and
// gives its bytes back to the budget. mu held.
func (a *Allocator) forget(b *block) {
	a.budget.Release(b.size)
	if a.hist != nil {
		a.histRecord(stats.TraceSegmentFree, b.ptr, b.size)
	}
	delete(a.blocks, b.ptr)
	a.spans.Delete(span{start: b.ptr})
	a.st.Segment.Add(-1)
	a.st.ReservedBytes.Add(-int64(b.size))
	a.st.NumHostFree++
	b.mem = nil
}

// releaseCached releases every cached block, or with expandable segments
// every wholly free chunk; those that fail stay cached. mu held.
func (a *Allocator) releaseCached(sync bool) error {
	if a.exp != nil {
		return a.releaseChunks()
	}
	var errs []error
	for c, l := range a.free {
		if len(l) == 0 {
			continue
		}
		kept := l[:0]
		for _, b := range l {
			if err := a.release(b, sync); err != nil {
				errs = append(errs, err)
				kept = append(kept, b)
			}
		}
		clear(l[len(kept):])
		a.free[c] = kept
	}
	return errors.Join(errs...)
}

// EmptyCache gives every cached block back to the driver, after moving the
// free-pending blocks whose events have completed to the cache. It does not
// wait for events: blocks still waiting for them stay. Quarantined blocks
// (Stats.Quarantined) are the exception: they wait for nothing EmptyCache
// could poll, so if there are any it ends their quarantine with a
// device-wide synchronize (settleQuarantine) and gives them back too; with
// none, it makes no wait. Blocks the driver fails to release stay cached,
// blocks it fails to settle stay quarantined, and the errors are returned.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	a.processEvents()
	err := a.settleQuarantine(false) // mu dropped while it waits
	if a.closed {
		return errors.Join(err, ErrClosed)
	}
	return errors.Join(err, a.releaseCached(false))
}

// Close waits for the events of free-pending blocks, ends the quarantine
// (see the package doc), waits for the streams recorded on blocks still
// allocated, gives every block back to the driver
// (FreeHostWithDevSync, so device work still using them completes first),
// unregisters every range registered with Register, and destroys its
// events. Later calls return ErrClosed. If a driver call fails, Close
// returns the error, and a later Close retries what is left.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed && len(a.blocks) == 0 && a.spans.Len() == 0 && a.idleEvents() == 0 && len(a.quarantine) == 0 &&
		(a.exp == nil || len(a.exp.resv) == 0) {
		return ErrClosed
	}
	a.closed = true
	for a.inflight > 0 { // a wait of the ladder or EmptyCache: its events stay valid
		a.quiet.Wait()
	}
	if err := errors.Join(a.drainPending(true), a.settleQuarantine(true)); err != nil {
		return err
	}
	var errs []error
	for _, b := range a.sortedBlocks() {
		if b.state != stateAllocated {
			continue
		}
		if b.pageable {
			a.releasePageable(b)
			continue
		}
		for _, ss := range b.uses {
			// No stream wait can name a destroyed stream: a MallocHost
			// block is given back with FreeHostWithDevSync below, which
			// waits for its work; closing vouches for OS memory's.
			if ss.gone {
				continue
			}
			if err := a.drv.StreamSynchronize(ss.stream); err != nil && !a.sv.Gone(ss.stream) {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		a.st.Allocation.Add(-1)
		a.st.AllocatedBytes.Add(-int64(b.size))
		a.st.RequestedBytes.Add(-int64(b.req))
		b.req = 0
		clear(b.uses)
		b.uses = b.uses[:0]
		a.cache(b)
	}
	errs = append(errs, a.releaseCached(true))
	if a.exp != nil {
		errs = append(errs, a.unreserveAll())
	}
	var regs []*registration
	a.spans.Ascend(func(s span) bool {
		if s.r != nil {
			regs = append(regs, s.r)
		}
		return true
	})
	for _, r := range regs {
		if err := a.unregister(r); err != nil {
			errs = append(errs, err)
		}
	}
	for dev, l := range a.idle {
		for len(l) > 0 {
			if err := a.drv.EventDestroy(l[len(l)-1]); err != nil {
				errs = append(errs, err)
				break
			}
			l = l[:len(l)-1]
		}
		a.idle[dev] = l
	}
	return errors.Join(errs...)
}

// settleQuarantine ends the quarantine of blocks freed after a stream
// recorded on them was destroyed. With a driver that can wait for a whole
// device (backend.DeviceSynchronizer) it waits for every device once
// (Stats.NumDeviceSyncs), with mu dropped unless closing, and caches the
// blocks quarantined before that wait began (one quarantined while it ran
// may have work the wait did not cover, and stays). Otherwise MallocHost
// blocks go back to the driver through FreeHostWithDevSync, which waits for
// the device work that uses them, and, if closing, blocks of OS memory are
// cached for Close to release (nothing can wait for their work: see the
// package doc). Blocks it cannot settle stay quarantined. Without
// quarantined blocks it does nothing. mu held.
func (a *Allocator) settleQuarantine(closing bool) error {
	if len(a.quarantine) == 0 {
		return nil
	}
	if ds, ok := a.drv.(backend.DeviceSynchronizer); ok {
		a.st.NumDeviceSyncs++
		upTo, ndev := a.qseq, len(a.idle)
		wait := func() error {
			for dev := range ndev {
				if err := ds.DeviceSynchronize(dev); err != nil {
					return err
				}
			}
			return nil
		}
		var err error
		if closing {
			err = wait() // Close: every later call returns ErrClosed anyway
		} else {
			err = a.callUnlocked(wait)
		}
		if err != nil {
			return err
		}
		// Every device was idle: the events recorded before are complete.
		a.processEvents()
		kept := a.quarantine[:0]
		for _, b := range a.quarantine {
			if b.qseq > upTo {
				kept = append(kept, b)
				continue
			}
			a.unquarantine(b)
			a.cache(b)
		}
		clear(a.quarantine[len(kept):])
		a.quarantine = kept
		return nil
	}
	var errs []error
	kept := a.quarantine[:0]
	for _, b := range a.quarantine {
		switch {
		case b.mallocHost():
			if err := a.freeWithDevSync(b); err != nil {
				errs = append(errs, err)
				kept = append(kept, b)
			}
		case closing:
			a.unquarantine(b)
			a.cache(b)
		default:
			kept = append(kept, b)
		}
	}
	clear(a.quarantine[len(kept):])
	a.quarantine = kept
	return errors.Join(errs...)
}

// unquarantine counts quarantined block b out of the quarantine; the
// caller lists it out and caches or releases it. mu held.
func (a *Allocator) unquarantine(b *block) {
	b.quarantined = false
	a.st.Quarantined.Add(-1)
	a.st.QuarantinedBytes.Add(-int64(b.size))
}

// freeWithDevSync gives quarantined MallocHost block b back to the driver
// with FreeHostWithDevSync. On failure b stays quarantined. mu held.
func (a *Allocator) freeWithDevSync(b *block) error {
	if b.reg {
		if err := a.hm.HostUnregister(b.ptr); err != nil {
			return err
		}
		b.reg, b.devPtr = false, 0
	}
	if err := a.hm.FreeHostWithDevSync(b.ptr); err != nil {
		return err
	}
	a.st.Active.Add(-1)
	a.st.ActiveBytes.Add(-int64(b.size))
	a.unquarantine(b)
	a.forget(b)
	return nil
}

// sortedBlocks lists every block in address order. mu held.
func (a *Allocator) sortedBlocks() []*block {
	out := make([]*block, 0, len(a.blocks))
	a.spans.Ascend(func(s span) bool {
		if s.b != nil {
			out = append(out, s.b)
		}
		return true
	})
	if a.exp != nil {
		out = a.blocksExp(out)
		slices.SortFunc(out, func(x, y *block) int { return cmp.Compare(x.ptr, y.ptr) })
	}
	return out
}

// mallocHost reports whether b is a MallocHost block (FreeHost gives it
// back): neither OS memory of the size-class policy nor a chunk's block
// nor pageable.
func (b *block) mallocHost() bool { return b.mem == nil && b.id == arena.NoBlock && !b.pageable }

func (a *Allocator) idleEvents() int {
	n := 0
	for _, l := range a.idle {
		n += len(l)
	}
	return n
}

// callUnlocked runs call, a driver wait or a slow driver call, with mu
// dropped, counted in inflight so that Close lets it end before
// destroying what it uses. The caller leaves no block in a transient
// state across it: what it decides after, it decides again from the state
// it finds. mu held on entry and on return.
func (a *Allocator) callUnlocked(call func() error) error {
	a.inflight++
	a.mu.Unlock()
	err := call()
	a.mu.Lock()
	if a.inflight--; a.inflight == 0 {
		a.quiet.Broadcast()
	}
	return err
}
