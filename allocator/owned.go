package allocator

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
)

// Owned buffers: device memory whose lifetime a Go value decides.
//
// Go frameworks wrap device memory in Go values and let the garbage
// collector decide when they die. A Buffer is such a value: NewBuffer
// allocates with Malloc and registers a cleanup (runtime.AddCleanup) that
// Frees the memory once the Buffer is unreachable. The garbage collector
// knows nothing of device memory, though: a program that drops Buffers
// fills the device while its Go heap stays small, and no collection comes.
// So the out-of-memory ladder has a rung for them (collectOwned): when owned
// Buffers hold memory, before the ladder releases the cache (rung 2) it
// runs a garbage collection, waits, with Allocator.mu dropped (the
// cleanups Free, which takes it), for the cleanups of the Buffers that
// collection found unreachable, and retries. owned_buffer_gc:False turns
// the rung off; the OutOfMemoryError then names the bytes owned Buffers
// hold (Owned).
//
// Waiting is exact, not timed. The set records each live Buffer by a weak
// pointer. runtime.GC returns after the cycle's sweep, which clears the
// weak pointers of the objects it found unreachable and queues their
// cleanups together, so after it the Buffers whose weak pointer is nil are
// exactly those whose cleanups are queued or running (or, if another cycle
// is sweeping, about to be queued). The rung marks those entries, counts
// them in ownedSet.awaiting, and waits on ownedSet.done until every marked
// entry's cleanup has returned from Free and dropped the count.
//
// Lock order: ownedSet.mu is never taken with Allocator.mu held, and
// Allocator.mu is never taken with ownedSet.mu held; the ladder reads only
// ownedSet.bytes (atomic) under Allocator.mu. Buffer.mu is taken before
// either (Buffer.Free calls Allocator.Free).

// Buffer is device memory owned by a Go value: Free returns it at once;
// if the Buffer becomes unreachable before that, a cleanup frees it some
// time after a garbage collection, and the out-of-memory ladder runs such
// a collection before it reports out of memory.
//
// The address is valid while the Buffer is reachable and not freed: code
// that hands Ptr to device work must keep the Buffer reachable
// (runtime.KeepAlive) until that work is queued. Work already queued on
// the Buffer's stream is safe when the cleanup frees it, as with Free
// (stream-ordered reuse); work queued on other streams needs RecordStream.
type Buffer struct {
	a      *Allocator
	ptr    uintptr        // device address; immutable
	size   uint64         // nbytes requested; immutable
	stream backend.Stream // the allocation stream; immutable
	id     uint64         // key in Allocator.owned.live; immutable

	mu      sync.Mutex      // guards freed and the cleanup's Stop
	freed   bool            // Free succeeded (or found the allocator closed); mu
	cleanup runtime.Cleanup // frees ptr once the Buffer is unreachable; stopped by Free
}

// ownedSet is the allocator's record of live Buffers.
type ownedSet struct {
	// bytes is the nbytes requested by live Buffers (added after their
	// Malloc, dropped after their Free). Atomic: the ladder reads it
	// under Allocator.mu, where mu below may not be taken.
	bytes atomic.Uint64
	// cleaned is the nbytes requested by Buffers their cleanup freed,
	// ever; cleanedBase its value at the last ResetAccumulatedStats (the
	// statistics report the difference). Atomic: cleanups add to it
	// without Allocator.mu.
	cleaned, cleanedBase atomic.Uint64

	// collecting counts Mallocs in the collection rung (from the start of
	// its collection to the end of its retry); Mallocs that would grow
	// wait for them (awaitCollections, on collected, L = &Allocator.mu),
	// so that the memory a collection returns goes to the Malloc that
	// waited for it first, as PyTorch's ladder, run under one lock, gives
	// it. Allocator.mu.
	collecting int
	collected  sync.Cond

	mu   sync.Mutex // guards the fields below; never held with Allocator.mu
	done sync.Cond  // L = &mu; broadcast when awaiting drops to 0
	// live maps a Buffer id to its entry, from NewBuffer until its Free or
	// cleanup returned from Allocator.Free. mu.
	live   map[uint64]*ownedEntry
	nextID uint64 // last id issued; mu
	// awaiting counts entries marked collected whose cleanup has not yet
	// returned. mu.
	awaiting int
}

// ownedEntry is one live Buffer. Guarded by ownedSet.mu.
type ownedEntry struct {
	buf  weak.Pointer[Buffer] // nil once the collector found it unreachable
	size uint64               // nbytes requested
	// collected: a collection found buf unreachable and waits for the
	// cleanup (counted in ownedSet.awaiting).
	collected bool
}

// ownedRef is the cleanup's argument: what freeing a Buffer needs, without
// a reference to the Buffer itself.
type ownedRef struct {
	a   *Allocator
	id  uint64
	ptr uintptr
}

func (o *ownedSet) init(amu *sync.Mutex) {
	o.collected.L = amu
	o.done.L = &o.mu
	o.live = make(map[uint64]*ownedEntry)
}

// NewBuffer allocates size bytes on stream (0 = the default stream) as
// Malloc does, owned by the returned Buffer: its Free, or a cleanup once it
// is unreachable, returns the memory. Errors are Malloc's.
func (a *Allocator) NewBuffer(size uint64, stream backend.Stream) (*Buffer, error) {
	ptr, err := a.Malloc(size, stream)
	if err != nil {
		return nil, err
	}
	if stream == 0 {
		stream = a.DefaultStream()
	}
	b := &Buffer{a: a, ptr: ptr, size: size, stream: stream}
	o := &a.owned
	o.mu.Lock()
	o.nextID++
	b.id = o.nextID
	o.live[b.id] = &ownedEntry{buf: weak.Make(b), size: size}
	o.mu.Unlock()
	o.bytes.Add(size)
	b.cleanup = runtime.AddCleanup(b, freeCollected, ownedRef{a: a, id: b.id, ptr: ptr})
	return b, nil
}

// freeCollected is the cleanup of an unreachable Buffer. The entry stays
// in the set until Free has returned, so a collection that marked it
// waits for the memory to be free, not just for the cleanup to start.
func freeCollected(r ownedRef) {
	o := &r.a.owned
	// An error leaves the block allocated (Free changes nothing on error;
	// after Close there is nothing left to free); the statistics keep
	// counting it, and Check stays true.
	if err := r.a.Free(r.ptr); err == nil {
		o.cleaned.Add(o.forget(r.id))
		return
	}
	o.forget(r.id)
}

// forget removes entry id after its memory was freed, releases a
// collection waiting for it, and returns its size. mu not held.
func (o *ownedSet) forget(id uint64) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.live[id]
	if !ok {
		return 0
	}
	delete(o.live, id)
	o.bytes.Add(^(e.size - 1)) // subtract
	if e.collected {
		if o.awaiting--; o.awaiting == 0 {
			o.done.Broadcast()
		}
	}
	return e.size
}

// collect runs a garbage collection, waits until every Buffer it found
// unreachable has been freed by its cleanup, and returns the bytes
// cleanups freed meanwhile (those Buffers', and any other cleanup's that
// ran during the call, a concurrent collection's too). Neither lock held.
func (o *ownedSet) collect() uint64 {
	before := o.cleaned.Load()
	runtime.GC() // returns once the cycle's sweep has queued the cleanups
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.live {
		if !e.collected && e.buf.Value() == nil {
			e.collected = true
			o.awaiting++
		}
	}
	for o.awaiting > 0 {
		o.done.Wait()
	}
	return o.cleaned.Load() - before
}

// collectOwned is the garbage-collection rung of the out-of-memory ladder
// (see owned.go's doc): if owned Buffers hold memory and owned_buffer_gc
// is on, it collects them with mu dropped, then retries: the best fit on
// ss, then a growth. done reports that it has an answer (a block, or an
// error other than out-of-memory); otherwise the ladder goes on. mu held
// on entry and on return.
func (a *Allocator) collectOwned(ss *streamState, cl *sizeClass, rounded uint64) (b arena.BlockID, done bool, err error) {
	if !a.cfg.OwnedBufferGC || a.owned.bytes.Load() == 0 {
		return arena.NoBlock, false, nil
	}
	stream := ss.stream
	a.owned.collecting++
	defer func() {
		if a.owned.collecting--; a.owned.collecting == 0 {
			a.owned.collected.Broadcast()
		}
	}()
	_ = a.waitUnlocked(func() error { a.owned.collect(); return nil })
	a.st.NumOwnedCollections++
	switch {
	case a.closed:
		return arena.NoBlock, true, ErrClosed
	case !a.owns(ss) || ss.stream != stream:
		return arena.NoBlock, true, fmt.Errorf("%w: stream %d was released while a Malloc on it waited", ErrInvalidStream, stream)
	}
	if a.pending > 0 {
		a.processEvents()
	}
	if b, _, _ = a.bestFit(ss, cl, rounded); b != arena.NoBlock {
		return b, true, nil
	}
	if b, err = a.grow(ss, cl, rounded); err == nil || !isOOM(err) {
		return b, true, err
	}
	return arena.NoBlock, false, nil
}

// awaitCollections waits, with mu dropped, while Mallocs are in the
// collection rung, and returns a free block of ss for rounded bytes if one
// has appeared (NoBlock if none), or ErrClosed or ErrInvalidStream if the
// allocator was closed or ss released meanwhile. mu held on entry and on
// return.
func (a *Allocator) awaitCollections(ss *streamState, cl *sizeClass, rounded uint64) (arena.BlockID, error) {
	if a.owned.collecting == 0 {
		return arena.NoBlock, nil
	}
	stream := ss.stream
	a.inflight++ // Close and Check wait for this waiter too
	for a.owned.collecting > 0 {
		a.owned.collected.Wait()
	}
	if a.inflight--; a.inflight == 0 {
		a.quiet.Broadcast()
	}
	return a.refitAfterWait(ss, stream, cl, rounded)
}

// CollectBuffers runs a garbage collection and waits until the cleanups of
// every owned Buffer it found unreachable have freed their memory; it
// returns the bytes cleanups freed meanwhile (requested sizes). A framework can call it at the end
// of a step to return dropped Buffers' memory before the next step needs
// it; the out-of-memory ladder does the same on demand. It must not be
// called from a cleanup, nor while holding a lock that a cleanup takes.
func (a *Allocator) CollectBuffers() (uint64, error) {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	return a.owned.collect(), nil
}

// Ptr is the buffer's device address. It stays valid while the Buffer is
// reachable and not freed.
func (b *Buffer) Ptr() uintptr { return b.ptr }

// Size is the number of bytes asked for.
func (b *Buffer) Size() uint64 { return b.size }

// Device is the device ordinal of the allocator the buffer came from.
func (b *Buffer) Device() int { return b.a.dev }

// Stream is the stream the buffer was allocated on (the default stream's
// id when NewBuffer was given 0).
func (b *Buffer) Stream() backend.Stream { return b.stream }

// Free returns the buffer's memory to the allocator now and stops its
// cleanup. It is idempotent: a Buffer already freed returns nil (ErrClosed
// once the allocator is closed). If the allocator's Free fails, nothing
// changes: the Buffer stays live and its cleanup armed.
func (b *Buffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		if b.a.isClosed() {
			return ErrClosed
		}
		return nil
	}
	err := b.a.Free(b.ptr)
	if err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	// Close released the memory with everything else; the Buffer is done.
	b.freed = true
	b.cleanup.Stop() // b is reachable (the deferred Unlock uses it): not queued
	b.a.owned.forget(b.id)
	return err
}

// RecordStream marks the buffer as used by work on stream s, as
// Allocator.RecordStream does: when the buffer is freed, by Free or by its
// cleanup, its memory is reused only after that work completes.
func (b *Buffer) RecordStream(s backend.Stream) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return fmt.Errorf("%w: buffer at %#x", ErrDoubleFree, b.ptr)
	}
	return b.a.RecordStream(b.ptr, s)
}

func (a *Allocator) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}
