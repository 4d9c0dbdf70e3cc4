package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/google/btree"
	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Allocator is a caching allocator for one device. All methods are safe for
// concurrent use; one mutex serialises them (as PyTorch's per-device
// allocator does), and the cache-hit path holds it for tens of
// nanoseconds.
type Allocator struct {
	drv     backend.Driver
	cfg     Config
	dev     int
	total   uint64 // device capacity, nbytes
	gran    uint64 // driver MINIMUM granularity: the unit of mapping, nbytes
	allowed uint64 // reserved-memory cap from the memory fraction, nbytes

	mu       sync.Mutex
	defaultS backend.Stream                  // the default stream; 0 once Close destroyed it; mu
	closed   bool                            // guarded by mu
	live     ptrTable                        // allocated blocks by address; mu
	streams  map[backend.Stream]*streamState // validated streams in use; mu
	idle     *streamState                    // owner of memory of released streams (see streams.go); mu
	vanished map[backend.Stream]*streamState // streams destroyed behind the allocator's back; mu
	busy     []*streamState                  // streams with queued events, any order; mu
	stranded []*arena.Block                  // PendingFree blocks waiting on a vanished stream's work; mu
	lastS    *streamState                    // most recently used stream; mu
	spare    []*streamState                  // empty states of released streams for reuse, at most maxSpareStates; mu
	// keepEmpty keeps empty expandable reservations while a released
	// stream's memory is returned, for the next stream to map into; mu.
	keepEmpty bool
	pools     [2]pool           // small, large; mu
	segs      []*seg            // every segment, ascending base; mu
	pending   int               // blocks in PendingFree; mu
	events    []backend.Event   // idle events for reuse; mu
	bpool     arena.BlockPool   // recycled block headers; mu
	st        stats.DeviceStats // mu
	counters  segment.Counters  // driver-call figures shared by segments; mu
	scratch   []*arena.Block    // reusable slice for release walks; mu
	hist      *history          // memory history (history.go); nil when off; mu

	zombies        []*zombie        // dropped segments still holding driver state; mu
	scratchEvents  []pendingEvent   // reusable slice for insertEvents; mu
	scratchStreams []backend.Stream // reusable slice for insertEvents; mu
}

// streamState is the per-stream part of the allocator. The allocator's
// mutex guards every field.
type streamState struct {
	stream  backend.Stream
	free    [2]*arena.FreeList // free mapped blocks of this stream, per pool
	queue   []pendingEvent     // events recorded on this stream, oldest first
	busyIdx int                // index in Allocator.busy while queue is not empty, else -1
	active  int                // Allocated and PendingFree blocks of this stream
	// idle: an event recorded on the stream was found complete and no
	// block has been freed to it since, so every block in its free lists
	// may go to another stream (reclaim.go). Cleared by freeBlock.
	idle bool
}

// pendingEvent is an event recorded on a stream that a PendingFree block
// waits for.
type pendingEvent struct {
	ev backend.Event
	b  *arena.Block
}

// pool is the small or the large pool.
type pool struct {
	kind     stats.PoolKind
	idx      int
	pageSize uint64                      // bytes per full-size physical handle (expandable)
	vaSize   uint64                      // bytes of VA per expandable segment
	cache    *segment.HandleCache        // unmapped full-size handles
	unmapped *btree.BTreeG[*arena.Block] // Unmapped blocks by address
	nexp     int                         // expandable segments in this pool
}

// seg is one segment and its blocks.
type seg struct {
	s          *segment.Segment
	r          *arena.Region
	pool       *pool
	expandable bool
}

const (
	smallIdx = 0
	largeIdx = 1
)

// New creates an allocator for cfg.Device over drv. It creates the
// device's default stream (used when Malloc is given stream 0).
func New(drv backend.Driver, cfg Config) (*Allocator, error) {
	if drv == nil {
		return nil, fmt.Errorf("%w: nil driver", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Device >= drv.DeviceCount() {
		return nil, fmt.Errorf("%w: Device: %d, but the driver has %d devices", ErrInvalidConfig, cfg.Device, drv.DeviceCount())
	}
	prop := backend.DeviceProp(cfg.Device)
	gran, err := drv.Granularity(prop, backend.GranularityMinimum)
	if err != nil {
		return nil, err
	}
	for _, ps := range []struct {
		name string
		v    uint64
	}{{"small_segment_size_mb", cfg.SmallSegmentSize}, {"large_segment_size_mb", cfg.LargeSegmentSize}} {
		if gran == 0 || ps.v%gran != 0 {
			return nil, fmt.Errorf("%w: %s: %d bytes is not a multiple of the driver granularity %d", ErrInvalidConfig, ps.name, ps.v, gran)
		}
	}
	_, total, err := drv.MemGetInfo(cfg.Device)
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		drv:      drv,
		cfg:      cfg,
		dev:      cfg.Device,
		total:    total,
		gran:     gran,
		allowed:  total,
		streams:  make(map[backend.Stream]*streamState),
		vanished: make(map[backend.Stream]*streamState),
		idle:     newStreamState(idleStream),
	}
	if cfg.PerProcessMemoryFraction < 1 {
		a.allowed = uint64(cfg.PerProcessMemoryFraction * float64(total))
	}
	if cfg.MaxSplitSize != 0 {
		a.st.MaxSplitSize = int64(cfg.MaxSplitSize)
	} else {
		a.st.MaxSplitSize = math.MaxInt64
	}
	for i, ps := range []uint64{cfg.SmallSegmentSize, cfg.LargeSegmentSize} {
		p := &a.pools[i]
		p.idx = i
		p.kind = stats.SmallPool
		if i == largeIdx {
			p.kind = stats.LargePool
		}
		p.pageSize = ps
		p.vaSize = roundUp(total+total/8, ps)
		p.unmapped = btree.NewG(16, func(x, y *arena.Block) bool { return x.Addr < y.Addr })
		p.cache = segment.NewHandleCache(drv, ps, prop, int(cfg.HandleCacheSize/ps), &a.counters)
	}
	s, err := drv.StreamCreate(cfg.Device)
	if err != nil {
		return nil, err
	}
	a.defaultS = s
	a.streams[s] = newStreamState(s)
	return a, nil
}

func newStreamState(s backend.Stream) *streamState {
	return &streamState{stream: s, free: [2]*arena.FreeList{new(arena.FreeList), new(arena.FreeList)}, busyIdx: -1}
}

// Device is the device ordinal this allocator serves.
func (a *Allocator) Device() int { return a.dev }

// DefaultStream is the stream Malloc uses when given stream 0; 0 once
// Close has destroyed it.
func (a *Allocator) DefaultStream() backend.Stream {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.defaultS
}

// Granularity is the driver's mapping granularity in bytes: the unit in
// which the allocator maps and unmaps device memory, so the multiple that
// OutOfMemoryError.Tried and reserved bytes are rounded to.
func (a *Allocator) Granularity() uint64 { return a.gran }

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config { return a.cfg }

// Driver returns the driver the allocator allocates through.
func (a *Allocator) Driver() backend.Driver { return a.drv }

func roundUp(n, m uint64) uint64   { return (n + m - 1) / m * m }
func roundDown(n, m uint64) uint64 { return n / m * m }

// stream returns the state of s, validating it on first use. mu held.
func (a *Allocator) stream(s backend.Stream) (*streamState, error) {
	if s == 0 {
		s = a.defaultS
	}
	if ss := a.lastS; ss != nil && ss.stream == s {
		return ss, nil
	}
	ss, ok := a.streams[s]
	if !ok {
		if _, gone := a.vanished[s]; gone || s == idleStream {
			return nil, fmt.Errorf("%w: stream %d was destroyed", ErrInvalidStream, s)
		}
		dev, err := a.drv.StreamDevice(s)
		if err != nil {
			return nil, fmt.Errorf("%w: stream %d: %w", ErrInvalidStream, s, err)
		}
		if dev != a.dev {
			return nil, fmt.Errorf("%w: stream %d belongs to device %d, not %d", ErrInvalidStream, s, dev, a.dev)
		}
		ss = a.newState(s)
		a.streams[s] = ss
	}
	a.lastS = ss
	return ss, nil
}

// roundSize rounds a request to a block size: at least 512 bytes, a
// multiple of 512, and, where roundup_power2_divisions sets d > 1 for the
// request's bucket, up to the next 1/d step between powers of two.
func (a *Allocator) roundSize(size uint64) uint64 {
	if size <= minBlockSize {
		return minBlockSize
	}
	// Bucket i holds sizes in [2^i, 2^(i+1)) MiB; sizes below 1 MiB use
	// bucket 0, sizes of 32 GiB and up bucket 15.
	idx := max(bitsLen(size>>20)-1, 0)
	idx = min(idx, numRoundupBuckets-1)
	if d := uint64(a.cfg.RoundupPower2Divisions[idx]); d > 1 && size > minBlockSize*d {
		floor := uint64(1) << (bitsLen(size) - 1)
		if floor != size {
			step := floor / d
			size = roundUp(size, step)
		}
	}
	return roundUp(size, minBlockSize)
}

// poolFor returns the pool serving rounded sizes of n bytes.
func (a *Allocator) poolFor(n uint64) *pool {
	if n <= smallSize {
		return &a.pools[smallIdx]
	}
	return &a.pools[largeIdx]
}

// Malloc allocates size bytes on stream (0 = the default stream) and
// returns the device address. The memory may be used by work queued on
// stream; use RecordStream before using it on another stream.
func (a *Allocator) Malloc(size uint64, stream backend.Stream) (uintptr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, ErrClosed
	}
	if size == 0 {
		return 0, fmt.Errorf("%w: zero bytes", ErrInvalidSize)
	}
	if size > a.total {
		return 0, fmt.Errorf("%w: %d bytes is larger than device %d's %d bytes", ErrInvalidSize, size, a.dev, a.total)
	}
	ss, err := a.stream(stream)
	if err != nil {
		return 0, err
	}
	if a.pending > 0 {
		a.processEvents()
	}
	rounded := a.roundSize(size)
	p := a.poolFor(rounded)
	b := a.bestFit(ss, p, rounded)
	if b == nil {
		if b, err = a.allocSlow(ss, p, rounded, size); err != nil {
			if a.hist != nil {
				a.histOOM(size, ss.stream, err)
			}
			return 0, err
		}
	}
	a.allocFound(ss, p, b, rounded, size)
	if a.hist != nil {
		a.histAlloc(b, size)
	}
	return b.Addr, nil
}

// bestFit returns the best free block of ss in p for rounded bytes, still in
// its free list, or nil. mu held.
func (a *Allocator) bestFit(ss *streamState, p *pool, rounded uint64) *arena.Block {
	b := ss.free[p.idx].BestFit(rounded)
	if b == nil || a.cfg.MaxSplitSize == 0 || a.cfg.ExpandableSegments {
		return b
	}
	// Classic oversize blocks (PyTorch's max_split_size rules).
	if rounded < a.cfg.MaxSplitSize && b.Size >= a.cfg.MaxSplitSize {
		return nil
	}
	if rounded >= a.cfg.MaxSplitSize && b.Size >= rounded+a.cfg.MaxNonSplitRounding {
		return nil
	}
	return b
}

func (a *Allocator) shouldSplit(p *pool, b *arena.Block, rounded uint64) bool {
	rem := b.Size - rounded
	if p.idx == smallIdx || a.cfg.ExpandableSegments {
		return rem >= minBlockSize
	}
	return (a.cfg.MaxSplitSize == 0 || rounded < a.cfg.MaxSplitSize) && rem > smallSize
}

// inactiveSplit reports whether b counts in inactive_split: a free block
// split off a larger classic segment (expandable free handles can always be
// released, so PyTorch leaves them out).
func (a *Allocator) inactiveSplit(b *arena.Block) bool {
	return b.State == arena.Free && b.IsSplit() && !a.cfg.ExpandableSegments
}

func (a *Allocator) countInactive(p *pool, b *arena.Block, sign int64) {
	if !a.cfg.ExpandableSegments && a.inactiveSplit(b) {
		a.st.InactiveSplit.Add(p.kind, sign)
		a.st.InactiveSplitBytes.Add(p.kind, sign*int64(b.Size))
	}
}

// allocFound hands out free block b (in its free list or out of any) for
// a request, splitting off the rest. mu held.
func (a *Allocator) allocFound(ss *streamState, p *pool, b *arena.Block, rounded, size uint64) {
	a.countInactive(p, b, -1)
	fl := ss.free[p.idx]
	switch split, listed := a.shouldSplit(p, b, rounded), fl.Contains(b); {
	case split && listed:
		a.countInactive(p, fl.SplitFront(&a.bpool, b, rounded), +1)
	case split:
		rest := arena.Split(&a.bpool, b, rounded)
		fl.Insert(rest)
		a.countInactive(p, rest, +1)
	case listed:
		fl.Remove(b)
	}
	b.State = arena.Allocated
	b.Requested = size
	ss.active++
	a.live.Put(b.Addr, b)
	n := int64(b.Size)
	a.st.Allocation.Inc(p.kind, 1)
	a.st.AllocatedBytes.Inc(p.kind, n)
	a.st.Active.Inc(p.kind, 1)
	a.st.ActiveBytes.Inc(p.kind, n)
	a.st.RequestedBytes.Inc(p.kind, int64(size))
	if a.cfg.MaxSplitSize != 0 && b.Size >= a.cfg.MaxSplitSize {
		a.st.OversizeAllocations.Add(1)
	}
}

// Free returns ptr to the allocator. If other streams were recorded on it
// with RecordStream, its memory is reused only after events recorded on
// those streams now have completed. On error nothing changes.
func (a *Allocator) Free(ptr uintptr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if ptr == 0 || ptr%minBlockSize != 0 { // never handed out: no lookup
		return a.badPointer(ptr)
	}
	b := a.live.Take(ptr)
	if b == nil {
		return a.badPointer(ptr)
	}
	if len(b.Uses) > 0 {
		if err := a.insertEvents(b); err != nil {
			a.live.Put(ptr, b) // nothing changed
			return err
		}
	}
	if a.hist != nil {
		a.histFreeRequested(b)
	}
	p := &a.pools[poolIdx(b)]
	a.st.Allocation.Dec(p.kind, 1)
	a.st.AllocatedBytes.Dec(p.kind, int64(b.Size))
	if a.cfg.MaxSplitSize != 0 && b.Size >= a.cfg.MaxSplitSize {
		a.st.OversizeAllocations.Add(-1)
	}
	if b.Events > 0 {
		b.State = arena.PendingFree
		a.pending++
		return nil
	}
	a.freeBlock(b)
	return nil
}

func poolIdx(b *arena.Block) int { return int(b.Region.Pool) }

// badPointer classifies a pointer that is not a live allocation. mu held.
//
//   - ErrInteriorPointer: inside an allocated (or pending-free) block, not
//     at its start;
//   - ErrDoubleFree: the start of a pending-free block, or a 512-aligned
//     address inside mapped free memory, where a block may have been
//     handed out and freed already;
//   - ErrUnknownPointer: everything that can never have been handed out:
//     0, an address outside every reservation, one not 512-aligned, or
//     one in the unmapped part of a reservation.
func (a *Allocator) badPointer(ptr uintptr) error {
	sg := a.segAt(ptr)
	if sg == nil {
		return fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	}
	b := sg.r.Find(ptr)
	switch {
	case b == nil:
		return fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	case b.Addr != ptr && (b.State == arena.Allocated || b.State == arena.PendingFree):
		return fmt.Errorf("%w: %#x is %d bytes into the block at %#x", ErrInteriorPointer, ptr, ptr-b.Addr, b.Addr)
	case b.State == arena.PendingFree:
		return fmt.Errorf("%w: %#x (free pending on stream events)", ErrDoubleFree, ptr)
	case b.State == arena.Unmapped:
		return fmt.Errorf("%w: %#x is in unmapped address space of the reservation at %#x", ErrUnknownPointer, ptr, sg.r.Base)
	case ptr%minBlockSize != 0:
		return fmt.Errorf("%w: %#x is not 512-byte aligned", ErrUnknownPointer, ptr)
	default:
		return fmt.Errorf("%w: %#x is not the start of an allocation", ErrDoubleFree, ptr)
	}
}

// segAt returns the segment whose range holds ptr. mu held.
func (a *Allocator) segAt(ptr uintptr) *seg {
	i := sort.Search(len(a.segs), func(i int) bool { return a.segs[i].r.End() > ptr })
	if i < len(a.segs) && a.segs[i].r.Base <= ptr {
		return a.segs[i]
	}
	return nil
}

// freeBlock makes an Allocated or PendingFree block free and coalesces it
// with free neighbours of the same stream. mu held.
func (a *Allocator) freeBlock(b *arena.Block) {
	ss := a.lastS // usually the stream just used
	if ss == nil || ss.stream != b.Stream {
		ss = a.stateOf(b.Stream)
	}
	ss.idle = false
	ss.active--
	p := &a.pools[poolIdx(b)]
	fl := ss.free[p.idx]
	a.st.Active.Dec(p.kind, 1)
	a.st.ActiveBytes.Dec(p.kind, int64(b.Size))
	a.st.RequestedBytes.Dec(p.kind, int64(b.Requested))
	b.State = arena.Free
	b.Requested = 0
	b.Uses = b.Uses[:0]
	a.coalesceInsert(p, fl, b)
	if ss == a.idle {
		a.releaseIdle()
	}
}

// coalesceInsert merges free block b (out of any list) with the free
// neighbours of its stream in fl and inserts the result into fl. mu held.
func (a *Allocator) coalesceInsert(p *pool, fl *arena.FreeList, b *arena.Block) *arena.Block {
	prevFree := b.Prev != nil && b.Prev.State == arena.Free && b.Prev.Stream == b.Stream && fl.Contains(b.Prev)
	if next := b.Next; !prevFree && next != nil && next.State == arena.Free && next.Stream == b.Stream && fl.Contains(next) {
		// The common case, freeing the block just split off a free one.
		a.countInactive(p, next, -1)
		fl.MergeNext(&a.bpool, b)
		a.countInactive(p, b, +1)
		return b
	}
	if prev := b.Prev; prev != nil && prev.State == arena.Free && prev.Stream == b.Stream && fl.Contains(prev) {
		a.countInactive(p, prev, -1)
		fl.Remove(prev)
		arena.Merge(&a.bpool, prev)
		b = prev
	}
	if next := b.Next; next != nil && next.State == arena.Free && next.Stream == b.Stream && fl.Contains(next) {
		a.countInactive(p, next, -1)
		fl.Remove(next)
		arena.Merge(&a.bpool, b)
	}
	fl.Insert(b)
	a.countInactive(p, b, +1)
	return b
}

// RecordStream marks ptr as used by work on stream s: when ptr is freed, its
// memory is reused only after that work completes. Recording the block's
// own allocation stream is a no-op.
func (a *Allocator) RecordStream(ptr uintptr, s backend.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if ptr == 0 || ptr%minBlockSize != 0 { // never handed out: no lookup
		return a.badPointer(ptr)
	}
	b := a.live.Get(ptr)
	if b == nil {
		return a.badPointer(ptr)
	}
	ss, err := a.stream(s)
	if err != nil {
		return err
	}
	if ss.stream == b.Stream {
		return nil
	}
	for _, u := range b.Uses {
		if u == ss.stream {
			return nil
		}
	}
	b.Uses = append(b.Uses, ss.stream)
	return nil
}

// Stats returns a copy of the allocator's statistics.
func (a *Allocator) Stats() stats.DeviceStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.statsLocked()
}

func (a *Allocator) statsLocked() stats.DeviceStats {
	s := a.st
	s.NumDeviceAlloc = a.counters.Maps
	s.NumDeviceFree = a.counters.Unmaps
	s.HandlesCreated = a.counters.HandlesCreated
	s.HandlesFreed = a.counters.HandlesFreed
	s.HandlesReused = a.counters.HandlesReused
	s.NumStreamSyncs = a.counters.StreamSyncs
	s.StrandedBytes = int64(a.strandedBytes())
	return s
}

// ResetPeakStats sets every peak to its current value.
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.ResetPeak()
}

// ResetAccumulatedStats zeroes the accumulated counters.
func (a *Allocator) ResetAccumulatedStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.ResetAccumulated()
	a.counters = segment.Counters{}
}

// Summary is a memory_summary()-style table of the statistics.
func (a *Allocator) Summary() string {
	s := a.Stats()
	return stats.Summary(&s, a.dev, false)
}

// MemoryAllocated is the bytes in allocated blocks (torch.cuda.memory_allocated).
func (a *Allocator) MemoryAllocated() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.st.AllocatedBytes[stats.AllPools].Current)
}

// MemoryReserved is the bytes of mapped device memory (torch.cuda.memory_reserved).
func (a *Allocator) MemoryReserved() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.st.ReservedBytes[stats.AllPools].Current)
}

// Close synchronises, unmaps and releases everything the allocator holds,
// including blocks still allocated, and destroys its events and default
// stream. Later calls of every method return ErrClosed. If a driver call
// fails, Close returns the error and a later Close retries what is left.
//
// Streams destroyed without ReleaseStream are waited for with a device
// synchronize where the driver can do one; where it cannot, Close releases
// their memory regardless: closing the allocator vouches that the device's
// work on its memory is done.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed && len(a.segs) == 0 && a.defaultS == 0 && len(a.events) == 0 && len(a.zombies) == 0 {
		return ErrClosed
	}
	a.closed = true
	var errs []error
	for _, ss := range a.sortedStreams() {
		a.counters.StreamSyncs++
		if err := a.drv.StreamSynchronize(ss.stream); err != nil {
			if !a.streamGone(ss.stream) {
				errs = append(errs, err)
				continue
			}
			a.vanish(ss)
		}
	}
	if err := a.quiesce(); err != nil && !errors.Is(err, errNoDeviceSync) {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	a.eachState(func(ss *streamState) {
		for _, pe := range ss.queue {
			a.events = append(a.events, pe.ev)
		}
		ss.queue = nil
		ss.busyIdx = -1
	})
	a.busy = nil
	a.stranded = nil
	a.pending = 0
	for len(a.segs) > 0 {
		sg := a.segs[len(a.segs)-1]
		mapped := sg.s.MappedBytes()
		err := sg.s.Destroy()
		a.dropSeg(sg, mapped)
		if err != nil { // keep what is left for a later Close to retry
			errs = append(errs, err)
			a.addZombie(sg.s, sg.pool.kind)
		}
	}
	if err := a.destroyZombies(); err != nil {
		errs = append(errs, err)
	}
	for i := range a.pools {
		if err := a.pools[i].cache.Trim(0); err != nil {
			errs = append(errs, err)
		}
	}
	for len(a.events) > 0 {
		if err := a.drv.EventDestroy(a.events[len(a.events)-1]); err != nil {
			errs = append(errs, err)
			break
		}
		a.events = a.events[:len(a.events)-1]
	}
	if a.defaultS != 0 && len(errs) == 0 {
		if err := a.drv.StreamDestroy(a.defaultS); err != nil {
			errs = append(errs, err)
		} else {
			a.defaultS = 0
		}
	}
	a.live.Reset()
	return errors.Join(errs...)
}

// sortedStreams lists the stream states in stream order. mu held.
func (a *Allocator) sortedStreams() []*streamState {
	out := make([]*streamState, 0, len(a.streams))
	for _, ss := range a.streams {
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].stream < out[j].stream })
	return out
}
