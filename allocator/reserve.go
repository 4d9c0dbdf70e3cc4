package allocator

import (
	"sync"

	"github.com/vmmalloc/vmmalloc/backend"
)

// The handle reserve: a growing Malloc maps handles, it does not create
// them.
//
// Creating a physical handle is the dearest VMM call on some devices (193
// µs on an A100 against 1.45 µs to map it: emulated.CostProfile "a100"),
// and a growth's full-size pieces come from the handle cache when it
// holds their size (segment.MapOp). With handle_reserve_mb set, a
// goroutine per Allocator keeps each size class's cache stocked with at
// least that many bytes of handles (the small pool an eighth of it), of
// the size the class's last growth cut its full pieces in (a page, the
// growth-handle size, or the granule under pressure), created off the
// caller's path, as vAttention and kvcached prepare handles before they
// commit them. The cache's budget is handle_cache_mb plus the reserve,
// so the reserve is part of the cache:
//
//   - refilled after every growth (kickReserve) and once at New, one
//     CreatePhysical at a time, with mu dropped (waitUnlocked: Check,
//     snapshots and Close wait for a create in flight, and Close stops
//     the goroutine before it takes mu);
//   - never past the pressure line (pressure.go): reserved bytes, growths
//     in flight, every cached handle and the handle being created stay
//     within pressureNum/pressureDen of the memory the process may use
//     (the device, per_process_memory_fraction), so under pressure the
//     reserve does not refill;
//   - given back first: rung 1 of the out-of-memory ladder frees the
//     cached handles, the reserve with them, and EmptyCache too;
//   - no pool's: its handles count against a pool's memory limit only
//     once a growth of that pool maps them, as any cached handle;
//   - a failed create is counted (DeviceStats.ReserveFailures) and the
//     refill stops until the next growth kicks it, as a growth's failed
//     create fails only that growth.
//
// DeviceStats.ReserveHandlesCreated counts the handles it created and
// CachedHandleBytes the bytes of every cached handle, the reserve's
// included. The tail piece of a growth that is not a whole piece is
// still created on the caller's path (the cache holds only full-size
// handles), and so is every piece when the reserve is empty.
type handleReserve struct {
	// budget is, per size class, the cached bytes the refill keeps
	// (handle_reserve_mb for the large pool, an eighth for the small
	// one). Fixed at New; 0: no reserve.
	budget [2]uint64
	// stock is, per size class, the handle size the refill creates: the
	// full pieces of the class's last growth (the page until one). mu.
	stock [2]uint64
	// creating is the bytes of the handle the refill is creating with mu
	// dropped, counted against the pressure line. mu.
	creating uint64
	// created and failed count the refill's CreatePhysical calls that
	// succeeded and failed. mu.
	created, failed int64
	// manual: no goroutine; kicks do nothing and tests call
	// refillReserve (the test hook). Fixed at New.
	manual bool
	kick   chan struct{} // cap 1: wakes the goroutine; nil when off
	stop   chan struct{} // closed by Close
	done   chan struct{} // closed when the goroutine returns
	once   sync.Once     // closes stop
}

// reserveManual, set by tests before New, makes the next Allocators'
// reserves manual (no goroutine). Tests in this package do not run in
// parallel.
var reserveManual bool

// startReserve sets up the reserve from the config and starts its
// goroutine. Before the Allocator is shared.
func (a *Allocator) startReserve() {
	r := &a.reserve
	if a.cfg.HandleReserve == 0 {
		return
	}
	r.budget[largeIdx] = a.cfg.HandleReserve
	r.budget[1-largeIdx] = a.cfg.HandleReserve / 8
	for i := range a.classes {
		r.stock[i] = a.classes[i].pageSize
		a.classes[i].cache.SetMaxBytes(a.classes[i].cache.MaxBytes() + r.budget[i])
	}
	r.manual = reserveManual
	if r.manual {
		return
	}
	r.kick, r.stop, r.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	r.kick <- struct{}{} // stock up at once
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			case <-r.kick:
				a.refillReserve()
			}
		}
	}()
}

// stopReserve stops the reserve's goroutine and waits for it to return.
// mu not held (the goroutine takes it).
func (a *Allocator) stopReserve() {
	r := &a.reserve
	if r.stop == nil {
		return
	}
	r.once.Do(func() { close(r.stop) })
	<-r.done
}

// kickReserve notes that a growth of class cl cut its full pieces in
// handles of piece bytes and wakes the refill without waiting. mu held.
func (a *Allocator) kickReserve(cl *sizeClass, piece uint64) {
	r := &a.reserve
	if r.budget[cl.idx] == 0 {
		return
	}
	if piece != 0 {
		r.stock[cl.idx] = piece
	}
	select {
	case r.kick <- struct{}{}:
	default: // already kicked, or manual (nil channel)
	}
}

// reserveWant returns the size class whose cache is below its reserve
// and the size of the handle to create for it, large pool first; nil
// when every class is stocked or one more handle would cross the
// pressure line. mu held.
func (a *Allocator) reserveWant() (*sizeClass, uint64) {
	r := &a.reserve
	for _, i := range []int{largeIdx, 1 - largeIdx} {
		cl := &a.classes[i]
		size := r.stock[i]
		if r.budget[i] == 0 || cl.cache.Bytes() >= r.budget[i] {
			continue
		}
		held := uint64(a.st.ReservedBytes[0].Current) + a.mappingBytes + a.cachedHandleBytes() + r.creating
		if held+size > uint64(a.pressureAt) {
			return nil, 0
		}
		return cl, size
	}
	return nil, 0
}

// refillReserve creates handles, one at a time with mu dropped, until
// every class's cache holds its reserve (reserveWant), the Allocator is
// closed, or a create fails. mu not held.
func (a *Allocator) refillReserve() {
	a.mu.Lock()
	defer a.unlock()
	r := &a.reserve
	for !a.closed {
		select {
		case <-r.stop: // Close is waiting for the goroutine
			return
		default:
		}
		cl, size := a.reserveWant()
		if cl == nil {
			return
		}
		var h backend.Handle
		prop := cl.cache.Prop()
		r.creating += size
		err := a.waitUnlocked(func() (err error) {
			h, err = a.drv.CreatePhysical(size, prop)
			return err
		})
		r.creating -= size
		if err != nil {
			r.failed++
			return // the next growth kicks again
		}
		r.created++
		a.counters.HandlesCreated++
		// Into the cache even if Close began meanwhile: Close frees the
		// caches after its waits, this one included. A failed free of a
		// size the cache does not hold keeps the handle cached.
		_ = cl.cache.Add(h, size)
	}
}

// checkReserve is Check's part for the reserve (the driver check counts
// its cached handles with the rest). mu held, no wait in flight.
func (a *Allocator) checkReserve() error {
	r := &a.reserve
	if r.creating != 0 {
		return corrupt("handle reserve: %d bytes being created with no wait in flight", r.creating)
	}
	for i := range a.classes {
		if r.budget[i] == 0 {
			continue
		}
		cl := &a.classes[i]
		if r.stock[i] == 0 || r.stock[i]%a.gran != 0 {
			return corrupt("handle reserve: class %d stocks %d-byte handles, not whole granules", i, r.stock[i])
		}
		if cl.cache.MaxBytes() < r.budget[i] {
			return corrupt("handle reserve: class %d's cache budget %d is below its reserve %d", i, cl.cache.MaxBytes(), r.budget[i])
		}
	}
	if r.created < 0 || r.failed < 0 {
		return corrupt("handle reserve: negative counts %d created, %d failed", r.created, r.failed)
	}
	return nil
}
