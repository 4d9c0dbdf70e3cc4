package allocator

// Memory history: the opt-in record behind PyTorch's
// torch.cuda.memory._record_memory_history, and the per-call-site counters
// behind the device-memory profile.
//
// When recording is off a.hist is nil and every hook is one nil check,
// predicted not taken, so the cache-hit path pays one load and branch.
// When it is on, each alloc/free appends a stats.TraceEntry to a
// preallocated ring (no allocation), updates the counters of its
// (stack, stream, pool) key, and, with Stacks, captures the caller's
// program counters into a preallocated buffer and interns them: only a
// call stack never seen before allocates.

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// MaxStackDepth is the number of frames recorded per call stack; deeper
// stacks are truncated at the outermost frames.
const MaxStackDepth = 32

// MaxStacks bounds the distinct call stacks a history interns. Entries
// whose stack is first seen after the table is full record stack 0 (none),
// so a program that allocates from ever-new stacks (closures generated at
// run time) cannot grow it without bound.
const MaxStacks = 1 << 16

// ErrInvalidHistory is wrapped by RecordHistory's errors for bad options.
var ErrInvalidHistory = errors.New("vmmalloc: invalid history options")

// HistoryOptions configures RecordHistory.
type HistoryOptions struct {
	// MaxEntries is the number of newest entries kept (PyTorch's
	// max_entries); older ones are overwritten and counted as dropped.
	// 0 turns recording off and discards the history; at most
	// stats.MaxHistoryEntries.
	MaxEntries int
	// Stacks records the Go call stack of the caller of Malloc and Free
	// (PyTorch's stacks="python"). Without it, entries and profile records
	// carry no stack.
	Stacks bool
}

// history is the recording state. Every field is guarded by the
// allocator's mu.
type history struct {
	ring   *stats.History
	stacks bool                   // capture call stacks
	pcs    [MaxStackDepth]uintptr // scratch for runtime.Callers

	stackIDs map[[MaxStackDepth]uintptr]uint32 // interned stacks → 1-based id
	stackTab [][]uintptr                       // stackTab[id-1]: the program counters of stack id

	liveStack map[uintptr]uint32     // stack id of each allocated block by address; only with stacks
	prof      map[profKey]*profCount // cumulative counts per call site, since recording began
}

// profKey is the unit the device-memory profile counts by.
type profKey struct {
	stack  uint32
	stream backend.Stream
	pool   stats.PoolKind
}

// profCount is what one profKey allocated and freed; bytes are block
// (rounded) bytes, as allocated_bytes counts them.
type profCount struct {
	allocs, allocBytes int64
	frees, freeBytes   int64
}

// RecordHistory starts, restarts or (with MaxEntries 0) stops recording the
// memory history. Starting or restarting discards any earlier history and
// profile counters; blocks already allocated are counted in the profile as
// allocated before recording began (no stack). Bad options are an error
// wrapping ErrInvalidHistory and change nothing.
func (a *Allocator) RecordHistory(o HistoryOptions) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed { // before the options, as every method checks
		return ErrClosed
	}
	if o.MaxEntries < 0 || o.MaxEntries > stats.MaxHistoryEntries {
		return fmt.Errorf("%w: MaxEntries %d, want 0..%d", ErrInvalidHistory, o.MaxEntries, stats.MaxHistoryEntries)
	}
	if o.MaxEntries == 0 {
		a.hist = nil
		a.setHitOff()
		return nil
	}
	h := &history{
		ring:     stats.NewHistory(o.MaxEntries),
		stacks:   o.Stacks,
		stackIDs: make(map[[MaxStackDepth]uintptr]uint32),
		prof:     make(map[profKey]*profCount),
	}
	if o.Stacks {
		h.liveStack = make(map[uintptr]uint32)
	}
	for _, sg := range a.segs {
		info, _ := a.heap.Region(sg.rid)
		for id := info.Head; id != arena.NoBlock; id = a.heap.Next(id) {
			if b, _ := a.heap.Block(id); b.State == arena.Allocated {
				if a.countPlanned(h, id, b.Stream) {
					continue // a plan region: its planned blocks are counted
				}
				c := h.count(profKey{stream: b.Stream, pool: sg.class.kind})
				c.allocs++
				c.allocBytes += int64(b.Size)
			}
		}
	}
	a.hist = h
	a.setHitOff()
	// A planned step diverges: every block gets its stack.
	return a.stepsEvent(nil, false)
}

// HistoryRecord is a copy of the recorded memory history.
type HistoryRecord struct {
	Device  int
	Entries []stats.TraceEntry // oldest first
	Dropped int64              // entries overwritten since recording began
	// Stacks[id-1] holds the program counters of stack id, innermost
	// first, as runtime.Callers returns them (runtime.CallersFrames
	// resolves them). The stacks are shared with the allocator, which never
	// changes them; callers must not modify them either.
	Stacks [][]uintptr
}

// History returns a copy of the recorded memory history, and false when
// recording is off.
func (a *Allocator) History() (HistoryRecord, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.hist
	if h == nil {
		return HistoryRecord{Device: a.dev}, false
	}
	return HistoryRecord{Device: a.dev, Entries: h.ring.Entries(), Dropped: h.ring.Dropped(), Stacks: h.stackTable()}, true
}

// stackTable copies the stack table (the stacks themselves are immutable).
func (h *history) stackTable() [][]uintptr {
	return append([][]uintptr(nil), h.stackTab...)
}

// MemProfileRecord is one call site of the device-memory profile: what
// Malloc calls from one stack, on one stream, in one pool, allocated and
// freed since recording began. Bytes are block bytes (the rounded sizes
// allocated_bytes counts).
type MemProfileRecord struct {
	AllocBytes, FreeBytes     int64
	AllocObjects, FreeObjects int64
	// Stack holds the program counters of the Malloc caller, innermost
	// first; nil without HistoryOptions.Stacks, and for blocks allocated
	// before recording began. Shared with the allocator: do not modify.
	Stack  []uintptr
	Stream backend.Stream
	Pool   stats.PoolKind
}

// InUseBytes is AllocBytes - FreeBytes.
func (r *MemProfileRecord) InUseBytes() int64 { return r.AllocBytes - r.FreeBytes }

// InUseObjects is AllocObjects - FreeObjects.
func (r *MemProfileRecord) InUseObjects() int64 { return r.AllocObjects - r.FreeObjects }

// MemProfile returns the profile records, in no particular order, and
// false when recording is off. While recording, the in-use bytes of all
// records add up to MemoryAllocated.
func (a *Allocator) MemProfile() ([]MemProfileRecord, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.hist
	if h == nil {
		return nil, false
	}
	out := make([]MemProfileRecord, 0, len(h.prof))
	for k, c := range h.prof {
		r := MemProfileRecord{
			AllocBytes: c.allocBytes, FreeBytes: c.freeBytes,
			AllocObjects: c.allocs, FreeObjects: c.frees,
			Stream: k.stream, Pool: k.pool,
		}
		if k.stack != 0 {
			r.Stack = h.stackTab[k.stack-1]
		}
		out = append(out, r)
	}
	return out, true
}

func (h *history) count(k profKey) *profCount {
	c := h.prof[k]
	if c == nil {
		c = new(profCount)
		h.prof[k] = c
	}
	return c
}

// callerStack captures the stack of the caller of the public method
// (Malloc or Free) whose hist* hook called it, and returns its interned id,
// or 0 without stacks or when the table is full. mu held.
//
//go:noinline
func (h *history) callerStack() uint32 {
	if !h.stacks {
		return 0
	}
	// Frames: runtime.Callers, callerStack, the hist* hook, the general
	// path's body (mallocLocked or freeLocked), the general path
	// (mallocSlow or freeSlow; learnMalloc for a learning step), the
	// public method (Malloc or Free), then its caller.
	clear(h.pcs[:])
	n := runtime.Callers(6, h.pcs[:])
	if n == 0 {
		return 0
	}
	if id, ok := h.stackIDs[h.pcs]; ok {
		return id
	}
	if len(h.stackTab) >= MaxStacks {
		return 0
	}
	h.stackTab = append(h.stackTab, append([]uintptr(nil), h.pcs[:n]...))
	id := uint32(len(h.stackTab))
	h.stackIDs[h.pcs] = id
	return id
}

func (h *history) record(action stats.TraceAction, addr uintptr, size uint64, s backend.Stream, stack uint32, pool PoolID) {
	h.ring.Record(stats.TraceEntry{
		Action: action, Addr: addr, Size: size, Stream: uint64(s),
		TimeNs: time.Now().UnixNano(), Stack: stack, Pool: pool,
	})
}

// blockPool is the PoolID of the pool owning block b. mu held.
func (a *Allocator) blockPool(b arena.BlockInfo) PoolID {
	if o := a.states[b.StreamID]; o != nil {
		return o.pool.id
	}
	return PoolID{}
}

// histAlloc records that Malloc handed out b for size bytes. Called
// directly from Malloc. mu held.
//
//go:noinline
func (a *Allocator) histAlloc(id arena.BlockID, size uint64) {
	b, _ := a.heap.Block(id)
	h := a.hist
	stack := h.callerStack()
	if h.liveStack != nil && stack != 0 {
		h.liveStack[b.Addr] = stack
	}
	c := h.count(profKey{stack: stack, stream: b.Stream, pool: a.classes[a.heap.PoolOf(id)].kind})
	c.allocs++
	c.allocBytes += int64(b.Size)
	h.record(stats.TraceAlloc, b.Addr, size, b.Stream, stack, a.blockPool(b))
}

// histFreeRequested records that Free was called on allocated block b,
// and that it is back in the pool when no stream event holds it (so that
// the direct path pays one recording check). Called directly from Free,
// after events were inserted. mu held.
//
//go:noinline
func (a *Allocator) histFreeRequested(id arena.BlockID) {
	b, _ := a.heap.Block(id)
	h := a.hist
	var allocID uint32
	if h.liveStack != nil {
		allocID = h.liveStack[b.Addr]
		delete(h.liveStack, b.Addr)
	}
	c := h.count(profKey{stack: allocID, stream: b.Stream, pool: a.classes[a.heap.PoolOf(id)].kind})
	c.frees++
	c.freeBytes += int64(b.Size)
	if a.ownerOf(id).pool.asleep {
		return // the trace freed it at Sleep (histSleep)
	}
	h.record(stats.TraceFreeRequested, b.Addr, b.Requested, b.Stream, h.callerStack(), a.blockPool(b))
	if b.Events == 0 {
		h.record(stats.TraceFreeCompleted, b.Addr, b.Requested, b.Stream, 0, a.blockPool(b))
	}
}

// histFreeCompleted records that b, whose free waited on stream events, is
// back in its pool (before freeBlock clears its requested size). mu held.
func (a *Allocator) histFreeCompleted(id arena.BlockID) {
	if a.ownerOf(id).pool.asleep {
		return // the trace freed it at Sleep (histSleep)
	}
	b, _ := a.heap.Block(id)
	a.hist.record(stats.TraceFreeCompleted, b.Addr, b.Requested, b.Stream, 0, a.blockPool(b))
}

// histOOM records a Malloc of size bytes on s that failed with err.
// Called directly from Malloc. mu held.
//
//go:noinline
func (a *Allocator) histOOM(size uint64, s backend.Stream, pool PoolID, err error) {
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) {
		return
	}
	if s == 0 {
		s = a.defaultS
	}
	// As in PyTorch, an oom entry's address field holds the device's free
	// bytes.
	a.hist.record(stats.TraceOOM, uintptr(oom.Free), size, s, a.hist.callerStack(), pool)
}

// histReserve records a change of reserved memory: a segment mapped or
// created (bytes > 0) or unmapped or released (bytes < 0). A no-op when
// recording is off or bytes is 0. mu held.
func (a *Allocator) histReserve(classic bool, addr uintptr, bytes int64, owner *streamState) {
	if a.hist == nil || bytes == 0 {
		return
	}
	var (
		s    backend.Stream
		pool PoolID
	)
	if owner != nil {
		s, pool = owner.stream, owner.pool.id
	}
	var action stats.TraceAction
	switch {
	case classic && bytes > 0:
		action = stats.TraceSegmentAlloc
	case classic:
		action = stats.TraceSegmentFree
	case bytes > 0:
		action = stats.TraceSegmentMap
	default:
		action = stats.TraceSegmentUnmap
	}
	a.hist.record(action, addr, uint64(max(bytes, -bytes)), s, 0, pool)
}

// histHandOver records mapped memory changing streams without a driver
// call (reclaim.go's adoption) as PyTorch's viewer understands ownership:
// an unmap from the old stream, then a map for the new one. Reserved bytes
// only dip between the two, so replaying the history keeps its peak. mu
// held.
func (a *Allocator) histHandOver(addr uintptr, size uint64, from, to backend.Stream, fromPool, toPool PoolID) {
	if a.hist == nil || size == 0 {
		return
	}
	a.hist.record(stats.TraceSegmentUnmap, addr, size, from, 0, fromPool)
	a.hist.record(stats.TraceSegmentMap, addr, size, to, 0, toPool)
}

// histSleep records pool p's memory given back by Sleep (sleeping) or
// mapped again by Wake as PyTorch's viewer must see it to replay the
// trace to the snapshot (which shows an asleep pool's memory unmapped:
// MemorySnapshot): at sleep, a free_requested and free_completed entry
// per allocated block, then segment_unmap entries, one per run of
// adjacent handles of one owner (stream); at wake, segment_map entries,
// then an alloc entry per allocated block (and a free_requested one for
// a block freed while asleep whose free still waits on events), with
// the stack of its Malloc. Frees while asleep record nothing
// (histFreeRequested). The profile counters are not touched: the blocks
// stay allocated. mu held.
func (a *Allocator) histSleep(p *Pool, sl *poolSleep, sleeping bool) {
	h := a.hist
	if h == nil {
		return
	}
	blocks := func() {
		a.sleptSpans(sl, func(start, end uintptr, _ *streamState) {
			for id := a.heap.Find(start); id != arena.NoBlock; id = a.heap.Next(id) {
				b, _ := a.heap.Block(id)
				if b.Addr >= end {
					break
				}
				pool := a.blockPool(b)
				switch {
				case sleeping && b.State == arena.Allocated:
					h.record(stats.TraceFreeRequested, b.Addr, b.Requested, b.Stream, 0, pool)
					h.record(stats.TraceFreeCompleted, b.Addr, b.Requested, b.Stream, 0, pool)
				case !sleeping && (b.State == arena.Allocated || b.State == arena.PendingFree):
					h.record(stats.TraceAlloc, b.Addr, b.Requested, b.Stream, a.blockStack(b), pool)
					if b.State == arena.PendingFree {
						h.record(stats.TraceFreeRequested, b.Addr, b.Requested, b.Stream, 0, pool)
					}
				}
			}
		})
	}
	sign := int64(1)
	if sleeping {
		sign = -1
		blocks()
	}
	a.sleptSpans(sl, func(start, end uintptr, owner *streamState) {
		a.histReserve(false, start, sign*int64(end-start), owner)
	})
	if !sleeping {
		blocks()
	}
}

// sleptSpans calls f with each run of adjacent handles of sl of one
// owner (a handle holds blocks of one owner), in address order. mu held.
func (a *Allocator) sleptSpans(sl *poolSleep, f func(start, end uintptr, owner *streamState)) {
	var (
		start, end uintptr
		owner      *streamState
	)
	for _, r := range sl.runs {
		va := r.sg.base + uintptr(r.off)
		var o *streamState
		if id := a.heap.Find(va); id != arena.NoBlock {
			o = a.ownerOf(id)
		}
		if va != end || o != owner {
			if end > start {
				f(start, end, owner)
			}
			start, owner = va, o
		}
		end = va + uintptr(r.size)
	}
	if end > start {
		f(start, end, owner)
	}
}

// histEmptyCache records a call of EmptyCache. mu held.
func (a *Allocator) histEmptyCache() {
	if a.hist != nil {
		a.hist.record(stats.TraceEmptyCache, 0, 0, 0, 0, PoolID{})
	}
}

// blockStack is the stack id recorded for allocated block b, or 0. mu held.
func (a *Allocator) blockStack(b arena.BlockInfo) uint32 {
	if a.hist == nil || a.hist.liveStack == nil {
		return 0
	}
	return a.hist.liveStack[b.Addr]
}
