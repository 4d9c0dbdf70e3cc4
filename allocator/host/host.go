package host

import (
	"errors"
	"fmt"
	"sync"

	"github.com/google/btree"
	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Allocator is a caching allocator of pinned host memory. All methods are
// safe for concurrent use; one mutex serialises them.
type Allocator struct {
	drv     backend.Driver
	hm      backend.HostMemory
	sv      backend.StreamValidator // asks the driver whether a caller's stream exists; immutable
	cfg     Config
	classes sizeClasses
	budget  *PinBudget // the pin budget every pin asks first (Config.Budget or ProcessPinBudget); immutable
	// exp is the state of expandable segments, nil with the size-class
	// policy (Config.ExpandableSegments false). Its fields: mu.
	exp *segments
	// registerMallocHost: the driver gives MallocHost memory no device
	// address unregistered (it refused HostGetDevicePointer once), so
	// mapBlock registers such blocks (ACL) instead of asking first. mu.
	registerMallocHost bool
	// hist is the memory history (RecordHistory), nil while off. mu.
	hist *stats.History

	mu         sync.Mutex
	closed     bool                            // Close was called; mu
	blocks     map[uintptr]*block              // every block the driver gave us, by host address; mu
	free       [][]*block                      // cached blocks per class, LIFO; mu
	spans      *btree.BTreeG[span]             // blocks and registrations by start address; mu
	streams    map[backend.Stream]*streamState // streams named by RecordStream, live when last asked; mu
	slist      []*streamState                  // the same, in first-use order; mu
	idle       [][]backend.Event               // recorded-and-done or never-recorded events per device; mu
	pending    int                             // blocks in stateFreePending; mu
	gone       int                             // streams in slist the driver no longer knows; mu
	quarantine []*block                        // free-pending blocks whose recorded stream is gone (see the package doc); mu
	st         Stats                           // mu
	scratch    []pendingEvent                  // reusable buffer of insertEvents; mu
	scratchSS  []*streamState                  // the streams of scratch; mu
	// inflight counts the driver calls running with mu dropped (pinning
	// new blocks, the out-of-memory ladder's and EmptyCache's waits:
	// callUnlocked); Close waits for them to end (quiet) before it
	// destroys events or frees memory. mu.
	inflight int
	quiet    sync.Cond // signalled when inflight drops to 0; L is &mu
	// qseq counts quarantines; a block's qseq is the count when it was
	// quarantined, so a device-wide wait ends the quarantine of the blocks
	// quarantined before it began only. mu.
	qseq uint64
}

// blockState is where a block is in its life (see the package doc).
type blockState uint8

const (
	stateAllocated   blockState = iota + 1 // handed out by Malloc
	stateFreePending                       // freed, waiting for events on the streams that used it, or quarantined
	stateCached                            // in its class's free list
)

func (s blockState) String() string {
	switch s {
	case stateAllocated:
		return "allocated"
	case stateFreePending:
		return "free-pending"
	case stateCached:
		return "cached"
	}
	return fmt.Sprintf("blockState(%d)", int(s))
}

// block is an allocation Malloc hands out: with the size-class policy one
// pinned allocation from the driver, never split; with expandable segments
// a block of a chunk's heap (id), page-rounded; or pageable memory
// (MallocWith's fallback). Expandable records are recycled (segments.spare).
type block struct {
	ptr   uintptr       // host address
	size  uint64        // nbytes obtained: the class size, or the page-rounded request
	class int           // index into Allocator.free; -1 unless the size-class policy made it
	id    arena.BlockID // the heap block, with expandable segments; else arena.NoBlock
	// pageable: MallocWith's fallback, OS memory neither pinned nor
	// registered, given back at its Free (mem).
	pageable bool
	req      uint64     // nbytes asked for by the current allocation; 0 unless allocated
	state    blockState //
	devPtr   uintptr    // device address of the block, 0 until known
	reg      bool       // the allocator holds a HostRegister of the whole block
	mem      []byte     // UseHostRegister: the OS mapping (nil with MallocHost)
	// uses are the streams recorded on the current allocation, as the
	// states RecordStream validated: a stream found destroyed since is
	// gone there even if the driver gave its id to a new stream.
	// Capacity kept for reuse.
	uses   []*streamState
	events int // events still pending, while stateFreePending
	// quarantined: free-pending because a stream recorded on it was
	// destroyed; listed in Allocator.quarantine, without events.
	quarantined bool
	qseq        uint64 // Allocator.qseq when last quarantined
}

// registration is a range the program owns and registered through Register.
type registration struct {
	ptr    uintptr
	size   uint64 // nbytes
	flags  backend.HostRegisterFlags
	devPtr uintptr // device address, 0 until DevicePointer asks the driver
}

// span is an entry of the address index: exactly one of b, r and c is set.
// Blocks of expandable segments are not indexed: their chunk is.
type span struct {
	start uintptr
	end   uintptr // exclusive
	b     *block
	r     *registration
	c     *chunk
}

func spanLess(x, y span) bool { return x.start < y.start }

// streamState is a stream RecordStream was given, and the events recorded
// on it that free-pending blocks wait for, oldest first (a stream's events
// complete in order).
type streamState struct {
	stream backend.Stream
	dev    int
	queue  []pendingEvent // events recorded on the stream; the pending ones are queue[head:]
	head   int            // index of the oldest pending event
	gone   bool           // the driver no longer knows the stream: out of Allocator.streams, listed until its queue drains
}

// pending returns the stream's pending events, oldest first.
func (ss *streamState) pending() []pendingEvent { return ss.queue[ss.head:] }

// push appends pe, reusing the space of retired events when the queue is
// full, so that steady state allocates nothing.
func (ss *streamState) push(pe pendingEvent) {
	if len(ss.queue) == cap(ss.queue) && ss.head > 0 {
		n := copy(ss.queue, ss.queue[ss.head:])
		clear(ss.queue[n:])
		ss.queue, ss.head = ss.queue[:n], 0
	}
	ss.queue = append(ss.queue, pe)
}

// pop removes and returns the oldest pending event.
func (ss *streamState) pop() pendingEvent {
	pe := ss.queue[ss.head]
	ss.queue[ss.head] = pendingEvent{}
	if ss.head++; ss.head == len(ss.queue) {
		ss.queue, ss.head = ss.queue[:0], 0
	}
	return pe
}

type pendingEvent struct {
	ev backend.Event
	b  *block
}

// Stats are the host allocator's statistics, in the shape of the device
// allocator's (stats.Stat: current, peak, allocated, freed). Blocks count
// at their class size, or with expandable segments at the request rounded
// up to a page; Segment and ReservedBytes count what is pinned: blocks of
// the size-class policy, or chunks (each one registration).
type Stats struct {
	Allocation      stats.Stat // blocks handed out by Malloc and not yet freed (count)
	AllocatedBytes  stats.Stat // nbytes of those blocks
	RequestedBytes  stats.Stat // nbytes the callers asked for
	Active          stats.Stat // allocated plus free-pending blocks (count)
	ActiveBytes     stats.Stat // nbytes of those blocks
	Segment         stats.Stat // blocks held from the driver (count)
	ReservedBytes   stats.Stat // nbytes of those blocks
	Registered      stats.Stat // ranges registered with Register (count)
	RegisteredBytes stats.Stat // nbytes of those ranges
	// Quarantined counts the free-pending blocks freed after a stream
	// recorded on them was destroyed, which wait for a device-wide
	// synchronize (see the package doc); Allocated is how many blocks ever
	// were.
	Quarantined      stats.Stat
	QuarantinedBytes stats.Stat // nbytes of those blocks

	CacheHits       int64 // Malloc served from the cache
	NumHostAlloc    int64 // blocks obtained from the driver
	NumHostFree     int64 // blocks given back to the driver
	NumEventsCreate int64 // events created (the pool grows to the peak of pending events)
	NumEventRecords int64 // events recorded by Free
	NumSyncFallback int64 // stream waits because an event could not be recorded on a live stream
	NumDeviceSyncs  int64 // device-wide waits that ended a quarantine (EmptyCache, out of memory, Close)
	NumOOMs         int64 // Malloc calls that failed for lack of memory
	// Pageable counts MallocWith's pageable fallbacks still allocated.
	Pageable      stats.Stat
	PageableBytes stats.Stat // nbytes of those (page-rounded)

	NumBudgetDenials     int64 // pins the budget refused (each then climbs the out-of-memory ladder)
	NumPageableFallbacks int64 // MallocWith calls served with pageable memory

	// Budget is the pin budget this allocator shares, as it stood when the
	// statistics were read (process-wide, unless Config.Budget).
	Budget BudgetStats
}

// New creates a host allocator over drv, which must implement
// backend.HostMemory.
func New(drv backend.Driver, cfg Config) (*Allocator, error) {
	if drv == nil {
		return nil, fmt.Errorf("%w: nil driver", ErrInvalidConfig)
	}
	hm, ok := drv.(backend.HostMemory)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoHostMemory, drv.Name())
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	budget := cfg.Budget
	if budget == nil {
		budget = ProcessPinBudget()
	}
	budget.SetLimit(uint64(cfg.PinnedBudgetMB) << 20)
	a := &Allocator{
		budget:  budget,
		drv:     drv,
		hm:      hm,
		sv:      backend.NewStreamValidator(drv, backend.AnyDevice),
		cfg:     cfg,
		classes: sizeClasses{shift: uint(log2(cfg.RoundupDivisions))},
		blocks:  make(map[uintptr]*block),
		spans:   btree.NewG(16, spanLess),
		streams: make(map[backend.Stream]*streamState),
		idle:    make([][]backend.Event, drv.DeviceCount()),
	}
	a.free = make([][]*block, a.classes.count())
	if cfg.ExpandableSegments {
		s, err := newSegments()
		if err != nil {
			return nil, err
		}
		a.exp = s
	}
	a.quiet.L = &a.mu
	return a, nil
}

func log2(n int) int {
	k := 0
	for n > 1 {
		n >>= 1
		k++
	}
	return k
}

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config { return a.cfg }

// Malloc returns size bytes of pinned host memory, at least 4 KiB aligned,
// not initialised. A cached block of the request's size class is reused
// when there is one, without a driver call; otherwise a block is obtained
// from the driver, and if the driver is out of memory the cache is emptied
// and the request retried.
func (a *Allocator) Malloc(size uint64) (uintptr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := a.malloc(size)
	if err != nil {
		return 0, err
	}
	return b.ptr, nil
}

// malloc is Malloc. mu held.
func (a *Allocator) malloc(size uint64) (*block, error) {
	if a.closed { // before the arguments: after Close every call is ErrClosed
		return nil, ErrClosed
	}
	if size == 0 || size > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes (want 1..%d)", ErrInvalidSize, size, uint64(MaxSize))
	}
	if a.pending > 0 {
		a.processEvents()
	}
	var b *block
	if a.exp != nil {
		var err error
		if b, err = a.mallocExp(size); err != nil {
			return nil, err
		}
	} else if _, c := a.classes.round(size); len(a.free[c]) > 0 {
		l := a.free[c]
		b = l[len(l)-1]
		l[len(l)-1] = nil
		a.free[c] = l[:len(l)-1]
		a.st.CacheHits++
	} else {
		var err error
		if b, err = a.grow(size); err != nil {
			return nil, err
		}
	}
	b.state = stateAllocated
	b.req = size
	a.st.Active.Add(1)
	a.st.ActiveBytes.Add(int64(b.size))
	a.st.Allocation.Add(1)
	a.st.AllocatedBytes.Add(int64(b.size))
	a.st.RequestedBytes.Add(int64(size))
	if a.hist != nil {
		a.histRecord(stats.TraceAlloc, b.ptr, b.size)
	}
	return b, nil
}

// Free returns ptr to the cache. If streams were recorded on the block
// (RecordStream), an event is recorded on each and the block is reused only
// once they have all completed; Free does not wait for them. If one of
// those streams has been destroyed since, no event can be recorded on it:
// the block is quarantined, still without waiting (see the package doc,
// "Streams that disappear"), and Free succeeds. Free waits only if the
// driver fails to give or record an event on a live stream: it then
// synchronizes that stream, and if that fails too, returns the error with
// nothing changed.
func (a *Allocator) Free(ptr uintptr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	b := a.lookup(ptr)
	if b == nil || b.state != stateAllocated {
		return a.badPointer(ptr)
	}
	if a.hist != nil {
		a.histRecord(stats.TraceFreeRequested, b.ptr, b.size)
	}
	if b.pageable {
		return a.freePageable(b)
	}
	quarantine := false
	if len(b.uses) > 0 {
		var err error
		if quarantine, err = a.insertEvents(b); err != nil {
			return err
		}
	}
	a.st.Allocation.Add(-1)
	a.st.AllocatedBytes.Add(-int64(b.size))
	a.st.RequestedBytes.Add(-int64(b.req))
	b.req = 0
	clear(b.uses)
	b.uses = b.uses[:0]
	switch {
	case quarantine:
		// No event can order the reuse after the destroyed stream's work.
		b.state = stateFreePending
		b.quarantined = true
		a.qseq++
		b.qseq = a.qseq
		a.quarantine = append(a.quarantine, b)
		a.st.Quarantined.Add(1)
		a.st.QuarantinedBytes.Add(int64(b.size))
	case b.events > 0:
		b.state = stateFreePending
		a.pending++
	default:
		a.cache(b)
	}
	return nil
}

// cache puts a block that is no longer active into its free list (the
// size-class policy) or back into the fast cache or the heap (expandable
// segments). mu held.
func (a *Allocator) cache(b *block) {
	if a.hist != nil {
		a.histRecord(stats.TraceFreeCompleted, b.ptr, b.size)
	}
	if b.pageable {
		a.releasePageable(b)
		return
	}
	a.st.Active.Add(-1)
	a.st.ActiveBytes.Add(-int64(b.size))
	if a.exp != nil {
		a.cacheExp(b)
		return
	}
	b.state = stateCached
	a.free[b.class] = append(a.free[b.class], b)
}

// spanAt returns the block or registration whose range holds p. mu held.
func (a *Allocator) spanAt(p uintptr) (span, bool) {
	var found span
	ok := false
	a.spans.DescendLessOrEqual(span{start: p}, func(s span) bool {
		if p < s.end {
			found, ok = s, true
		}
		return false
	})
	return found, ok
}

// overlaps reports whether [p, end) meets a block or registration. mu held.
func (a *Allocator) overlaps(p, end uintptr) bool {
	if _, ok := a.spanAt(p); ok {
		return true
	}
	hit := false
	a.spans.AscendGreaterOrEqual(span{start: p}, func(s span) bool {
		hit = s.start < end
		return false
	})
	return hit
}

// badPointer classifies a pointer that is not the start of an allocated
// block. mu held.
func (a *Allocator) badPointer(ptr uintptr) error {
	s, ok := a.spanAt(ptr)
	if ok && s.c != nil {
		return a.badPointerExp(ptr, s.c)
	}
	switch {
	case !ok:
		return fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	case s.r != nil:
		return fmt.Errorf("%w: %#x lies in the range registered at %#x (use Unregister)", ErrUnknownPointer, ptr, s.start)
	case s.start != ptr && s.b.state == stateAllocated:
		return fmt.Errorf("%w: %#x is %d bytes into the block at %#x", ErrInteriorPointer, ptr, ptr-s.start, s.start)
	case s.b.state == stateFreePending && s.start == ptr && s.b.quarantined:
		return fmt.Errorf("%w: %#x (quarantined: a stream recorded on it was destroyed)", ErrDoubleFree, ptr)
	case s.b.state == stateFreePending && s.start == ptr:
		return fmt.Errorf("%w: %#x (free pending on stream events)", ErrDoubleFree, ptr)
	default:
		return fmt.Errorf("%w: %#x is not the start of an allocation", ErrDoubleFree, ptr)
	}
}

// RecordStream marks the allocation at ptr as used by work queued on
// stream s (host↔device copies): when ptr is freed, its memory is reused
// only after the work queued on s by then has completed. Recording a
// stream twice is a no-op.
//
// Every call asks the driver whether s still exists (StreamDevice, a
// lookup that waits for nothing), so a stream destroyed after the
// allocator had seen it is refused like one it never saw: with an error
// wrapping ErrInvalidStream and a *backend.StreamError, as the device
// allocator's RecordStream refuses it. The block is left as it was.
func (a *Allocator) RecordStream(ptr uintptr, s backend.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	b := a.lookup(ptr)
	if b == nil || b.state != stateAllocated {
		return a.badPointer(ptr)
	}
	ss, err := a.stream(s)
	if err != nil {
		return err
	}
	for _, u := range b.uses {
		if u == ss {
			return nil
		}
	}
	b.uses = append(b.uses, ss)
	return nil
}

// stream validates s with the driver and returns its state, learning it
// on first use. A stream the allocator knows that the driver no longer
// does, or whose id now names a stream of another device (the driver
// reused the id of a destroyed one), is forgotten: its events still
// pending stay listed, and blocks freed later that name it are
// quarantined. If the driver cannot answer, its error is returned and
// nothing changes. mu held.
func (a *Allocator) stream(s backend.Stream) (*streamState, error) {
	dev, err := a.sv.Validate(s)
	ss, known := a.streams[s]
	switch {
	case err != nil:
		return nil, a.refuseStream(ss, err)
	case known && ss.dev == dev:
		return ss, nil
	case known:
		a.forgetStream(ss)
	}
	ss = &streamState{stream: s, dev: dev}
	a.streams[s] = ss
	a.slist = append(a.slist, ss)
	return ss, nil
}

// refuseStream returns the error for a stream the validator did not
// accept, forgetting its state ss (nil if unknown) when the driver refused
// the stream itself rather than failed to answer. Apart from stream, so
// that a valid stream's check allocates nothing. mu held.
func (a *Allocator) refuseStream(ss *streamState, err error) error {
	var se *backend.StreamError
	if !errors.As(err, &se) {
		return err
	}
	if ss != nil {
		a.forgetStream(ss)
	}
	return fmt.Errorf("%w: %w", ErrInvalidStream, err)
}

// DevicePointer returns the device address of host address p, which lies
// in an allocated block or a range registered with HostRegisterMapped. The
// first call for a MallocHost block registers the block (HostRegister,
// MAPPED) and keeps the registration until the block goes back to the
// driver.
func (a *Allocator) DevicePointer(p uintptr) (uintptr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, ErrClosed
	}
	s, ok := a.spanAt(p)
	if !ok {
		return 0, fmt.Errorf("%w: %#x", ErrUnknownPointer, p)
	}
	off := p - s.start
	if r := s.r; r != nil {
		if r.flags != backend.HostRegisterMapped {
			return 0, fmt.Errorf("%w: %#x", ErrNotMapped, r.ptr)
		}
		if r.devPtr == 0 {
			d, err := a.hm.HostGetDevicePointer(r.ptr)
			if err != nil {
				return 0, err
			}
			r.devPtr = d
		}
		return r.devPtr + off, nil
	}
	if c := s.c; c != nil {
		b := a.blockIn(p)
		if b == nil || b.state != stateAllocated {
			return 0, fmt.Errorf("%w: %#x lies in free pinned memory", ErrUnknownPointer, p)
		}
		return c.devPtr + off, nil
	}
	b := s.b
	if b.state != stateAllocated {
		return 0, fmt.Errorf("%w: %#x lies in a freed block", ErrUnknownPointer, p)
	}
	if b.pageable {
		return 0, fmt.Errorf("%w: %#x is pageable memory (MallocWith's fallback)", ErrNotMapped, p)
	}
	if b.devPtr == 0 {
		if err := a.mapBlock(b); err != nil {
			return 0, err
		}
	}
	return b.devPtr + off, nil
}

// mapBlock learns the device address of block b. A MallocHost block is
// asked for it directly: CUDA maps cuMemHostAlloc memory for the device
// (DEVICEMAP) and refuses to register it (cuMemHostRegister of
// cuMemHostAlloc memory is CUDA_ERROR_INVALID_VALUE, measured on an H200).
// Only where the driver has no address for it unregistered (ACL, and the
// emulator that follows it) is it registered (HostRegister, MAPPED). On
// failure nothing changes, unless the registration cannot be undone: then
// b keeps it (b.reg) for release to undo. mu held.
func (a *Allocator) mapBlock(b *block) error {
	if !b.reg && b.mem == nil && !a.registerMallocHost {
		d, err := a.hm.HostGetDevicePointer(b.ptr)
		switch {
		case err == nil:
			b.devPtr = d
			return nil
		case !errors.Is(err, backend.ErrInvalidArgument):
			return err
		}
		a.registerMallocHost = true // the driver wants a registration: ask it once only
	}
	registered := false
	if !b.reg {
		if err := a.hm.HostRegister(b.ptr, b.size, backend.HostRegisterMapped); err != nil {
			return err
		}
		b.reg, registered = true, true
	}
	d, err := a.hm.HostGetDevicePointer(b.ptr)
	if err != nil {
		if !registered {
			return err
		}
		if e2 := a.hm.HostUnregister(b.ptr); e2 != nil {
			return errors.Join(err, e2)
		}
		b.reg = false
		return err
	}
	b.devPtr = d
	return nil
}

// Stats returns a copy of the statistics.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.st
	st.Budget = a.budget.Stats()
	return st
}

// ResetPeakStats sets every peak to its current value.
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.st.stats() {
		s.ResetPeak()
	}
}

// ResetAccumulatedStats zeroes the allocated/freed totals and the counters.
func (a *Allocator) ResetAccumulatedStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.st.stats() {
		s.ResetAccumulated()
	}
	a.st.CacheHits, a.st.NumHostAlloc, a.st.NumHostFree = 0, 0, 0
	a.st.NumEventsCreate, a.st.NumEventRecords, a.st.NumSyncFallback, a.st.NumDeviceSyncs, a.st.NumOOMs = 0, 0, 0, 0, 0
	a.st.NumBudgetDenials, a.st.NumPageableFallbacks = 0, 0
}

func (s *Stats) stats() []*stats.Stat {
	return []*stats.Stat{&s.Allocation, &s.AllocatedBytes, &s.RequestedBytes, &s.Active, &s.ActiveBytes,
		&s.Segment, &s.ReservedBytes, &s.Registered, &s.RegisteredBytes, &s.Quarantined, &s.QuarantinedBytes,
		&s.Pageable, &s.PageableBytes}
}

// MemoryAllocated is the nbytes of allocated blocks.
func (a *Allocator) MemoryAllocated() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.st.AllocatedBytes.Current)
}

// MemoryReserved is the nbytes of pinned memory held from the driver.
func (a *Allocator) MemoryReserved() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.st.ReservedBytes.Current)
}
