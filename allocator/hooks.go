package allocator

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/segment"
)

// Segment hooks: collective-library registration.
//
// NCCL, HCCL and RDMA verbs must register memory before a kernel uses it
// and deregister it before it is unmapped. A SegmentHook sees the
// allocator's physical memory as the driver maps it:
//
//   - Mapped(r) runs after r is mapped and accessible and before any
//     pointer into it is returned (growth reports the range it maps, which
//     may span several handles: r.Handles lists them). An error (or a
//     panic) fails the growth: the hooks that accepted r get Unmapped(r),
//     the range is unmapped and its handles go back, exactly as after a
//     failed driver Map, and Malloc returns a *SegmentHookError wrapping
//     the hook's error.
//   - Unmapped(r) runs before r is unmapped, while it is still mapped and
//     idle (its stream work complete, no block in it allocated).
//
// A registrar built on it never sees a pointer it has not registered and
// never has memory unmapped under a registration; a remap of an address
// is an Unmapped report followed by a Mapped one. AddSegmentHook first
// reports everything mapped now (PyTorch's snapshot catch-up) from one
// consistent view: it waits until no growth or release is in flight, and
// the hook's calls are serialised by its own mutex, taken before the
// allocator's mutex is dropped, so a range mapped or unmapped meanwhile
// is reported after the catch-up, never missed or twice. Close reports
// the unmap of everything still mapped. RemoveSegmentHook stops the calls:
// once it returns, none runs.
//
// Callbacks run without the allocator's mutex: growth's driver calls and
// the callbacks both run in the window where the growth's range is marked
// Mapping (mapGrowth), and an unmap's callbacks run where its range is
// marked Releasing (releaseStreamPool, flushUnmaps). A slow callback so
// stalls only the growth or release that reports to it (and others that
// report to the same hook), never a cache hit. A callback may call the
// read-only methods (Stats, Spans, MemoryAllocated, MemoryReserved, Pools,
// Pool.Stats); it must not call Malloc, Free, EmptyCache, Synchronize,
// ReleaseStream, Check, the snapshots, Close, AddSegmentHook or
// RemoveSegmentHook, which may wait for the growth or release running it.
//
// Releases that ran under the mutex before hooks existed (the idle
// owner's memory, reclaim, a stream's retirement) are queued while a hook
// is attached: their ranges are marked Releasing (nothing allocates them)
// and the queue is flushed, callbacks then driver unmaps, before the call
// that queued them returns (unlock) or, in growth, before it maps.

// SegmentRange is a range of device memory mapped for one pool, as a
// segment hook sees it.
type SegmentRange struct {
	Device  int
	Pool    PoolID
	Addr    uintptr      // first byte
	Size    uint64       // nbytes
	Handles []HandleSpan // the physical handles behind it, in address order, covering it exactly
}

// SegmentHook observes the allocator's mapped memory (see the comment
// above; PyTorch's attachAllocatorTraceTracker for SEGMENT_MAP and
// SEGMENT_UNMAP). Either function may be nil.
type SegmentHook struct {
	// Mapped is called with each range after it is mapped and before any
	// pointer into it is returned; an error fails the growth.
	Mapped func(SegmentRange) error
	// Unmapped is called with each range before it is unmapped, while it
	// is still mapped and idle.
	Unmapped func(SegmentRange)
	// Pool limits the hook to one pool's memory; nil: every pool.
	Pool *Pool
}

// HookID names an attached hook.
type HookID uint64

// ErrSegmentHook is wrapped by a *SegmentHookError.
var ErrSegmentHook = errors.New("vmmalloc: segment hook failed")

// SegmentHookError is returned by a Malloc whose growth a hook's Mapped
// callback refused (or panicked in), and by AddSegmentHook when its
// catch-up was refused. errors.Is matches ErrSegmentHook and the hook's
// error.
type SegmentHookError struct {
	Hook  HookID
	Range SegmentRange
	Err   error // the hook's error (a panic's value is wrapped)
}

func (e *SegmentHookError) Error() string {
	return fmt.Sprintf("vmmalloc: segment hook %d refused the mapping of [%#x, +%#x) in pool (%d,%d): %v",
		e.Hook, e.Range.Addr, e.Range.Size, e.Range.Pool[0], e.Range.Pool[1], e.Err)
}

// Unwrap returns ErrSegmentHook and the hook's error.
func (e *SegmentHookError) Unwrap() []error { return []error{ErrSegmentHook, e.Err} }

// hook is an attached SegmentHook.
type hook struct {
	id HookID
	h  SegmentHook
	// mu serialises the hook's calls; taken without Allocator.mu (and
	// Allocator.mu may be taken under it, by a callback's Stats).
	mu      sync.Mutex
	removed atomic.Bool // set by RemoveSegmentHook; no call starts after
}

// wants reports whether h observes pool memory of id.
func (h *hook) wants(pool PoolID) bool { return h.h.Pool == nil || h.h.Pool.id == pool }

// mapped reports r to h; a panic is an error. h.mu is taken here.
func (h *hook) mapped(r SegmentRange) (err error) {
	if h.h.Mapped == nil || !h.wants(r.Pool) {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.removed.Load() {
		return nil
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("hook panicked: %v", v)
		}
	}()
	return h.h.Mapped(r)
}

// unmapped reports r to h; a panic is recovered (the unmap goes on).
func (h *hook) unmapped(r SegmentRange) {
	if h.h.Unmapped == nil || !h.wants(r.Pool) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.removed.Load() {
		return
	}
	defer func() { _ = recover() }()
	h.h.Unmapped(r)
}

// reportMapped reports r to every hook in hs, in order; if one refuses,
// those that accepted get Unmapped(r), in reverse order, and the refusal
// is returned. Called without mu.
func reportMapped(hs []*hook, r SegmentRange) error {
	for i, h := range hs {
		if err := h.mapped(r); err != nil {
			for j := i - 1; j >= 0; j-- {
				hs[j].unmapped(r)
			}
			return &SegmentHookError{Hook: h.id, Range: r, Err: err}
		}
	}
	return nil
}

// reportUnmapped reports each range to every hook in hs. Called without
// mu.
func reportUnmapped(hs []*hook, rs []SegmentRange) {
	for _, r := range rs {
		for _, h := range hs {
			h.unmapped(r)
		}
	}
}

// AddSegmentHook attaches h: it first reports every range mapped now to
// h.Mapped (the catch-up), then every later map and unmap. If the catch-up
// is refused, the ranges h accepted are reported to h.Unmapped, h is not
// attached, and a *SegmentHookError is returned.
func (a *Allocator) AddSegmentHook(h SegmentHook) (HookID, error) {
	a.mu.Lock()
	defer a.unlock()
	if a.closed {
		return 0, ErrClosed
	}
	if h.Mapped == nil && h.Unmapped == nil {
		return 0, fmt.Errorf("%w: a segment hook with neither Mapped nor Unmapped", ErrInvalidConfig)
	}
	if p := h.Pool; p != nil {
		if p.a != a {
			return 0, fmt.Errorf("%w: pool %q belongs to another allocator", ErrInvalidPool, p.name)
		}
		if err := p.live(); err != nil {
			return 0, err
		}
	}
	// One consistent view: no growth or release in flight, none queued.
	for {
		a.quiesceWaits()
		if len(a.unmapQueue) == 0 {
			break
		}
		_ = a.flushUnmaps()
	}
	if a.closed {
		return 0, ErrClosed
	}
	a.hookSeq++
	hk := &hook{id: a.hookSeq, h: h}
	rs := a.mappedRanges()
	// Calls from growths that start once mu is dropped wait for hk.mu,
	// so they come after the catch-up.
	hk.mu.Lock()
	a.hooks = append(a.hooks, hk)
	var refused error
	_ = a.waitUnlocked(func() error {
		defer hk.mu.Unlock()
		for i, r := range rs {
			if h.Mapped == nil || !hk.wants(r.Pool) {
				continue
			}
			if err := callMapped(h.Mapped, r); err != nil {
				for j := i - 1; j >= 0; j-- {
					if h.Unmapped != nil && hk.wants(rs[j].Pool) {
						callUnmapped(h.Unmapped, rs[j])
					}
				}
				hk.removed.Store(true)
				refused = &SegmentHookError{Hook: hk.id, Range: r, Err: err}
				return nil
			}
		}
		return nil
	})
	if refused != nil {
		a.dropHook(hk)
		return 0, refused
	}
	return hk.id, nil
}

func callMapped(f func(SegmentRange) error, r SegmentRange) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("hook panicked: %v", v)
		}
	}()
	return f(r)
}

func callUnmapped(f func(SegmentRange), r SegmentRange) {
	defer func() { _ = recover() }()
	f(r)
}

// RemoveSegmentHook detaches hook id: once it returns, the hook is not
// called again (a call in flight on another goroutine is waited for).
// Call it from outside the hook's callbacks.
func (a *Allocator) RemoveSegmentHook(id HookID) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return ErrClosed
	}
	var hk *hook
	for _, h := range a.hooks {
		if h.id == id {
			hk = h
		}
	}
	if hk == nil {
		a.mu.Unlock()
		return fmt.Errorf("%w: no segment hook %d is attached", ErrInvalidConfig, id)
	}
	hk.removed.Store(true)
	a.dropHook(hk)
	a.mu.Unlock()
	hk.mu.Lock() // a call in flight ends first
	hk.mu.Unlock()
	return nil
}

// dropHook removes hk from the attached hooks. mu held.
func (a *Allocator) dropHook(hk *hook) {
	for i, h := range a.hooks {
		if h == hk {
			a.hooks = append(a.hooks[:i:i], a.hooks[i+1:]...)
			return
		}
	}
}

// hookList is a copy of the attached hooks, for calls made without mu
// (nil when none). mu held.
func (a *Allocator) hookList() []*hook {
	if len(a.hooks) == 0 {
		return nil
	}
	return append([]*hook(nil), a.hooks...)
}

// segRange describes [addr, addr+n) of segment sg, mapped for pool p, with
// the handles behind it (whole handles: the range starts and ends on
// handle boundaries). mu held.
func (a *Allocator) segRange(sg *seg, p *Pool, addr uintptr, n uint64) SegmentRange {
	r := SegmentRange{Device: a.dev, Pool: p.id, Addr: addr, Size: n}
	for off, end := uint64(addr-sg.base), uint64(addr-sg.base)+n; off < end; {
		start, size, ok := sg.s.HandleRange(off)
		if !ok {
			break
		}
		r.Handles = append(r.Handles, HandleSpan{VA: sg.base + uintptr(start), Size: size})
		off = start + size
	}
	return r
}

// mappedRanges lists every mapped range: per segment, the maximal runs of
// adjacent mapped blocks of one pool. mu held, no wait in flight.
func (a *Allocator) mappedRanges() []SegmentRange {
	var out []SegmentRange
	h := a.heap
	for _, sg := range a.segs {
		info, _ := h.Region(sg.rid)
		var (
			start uintptr
			n     uint64
			pool  *Pool
		)
		flush := func() {
			if n > 0 {
				out = append(out, a.segRange(sg, pool, start, n))
			}
			n = 0
		}
		for id := info.Head; id != arena.NoBlock; id = h.Next(id) {
			b, _ := h.Block(id)
			if b.State == arena.Unmapped || b.StreamID == 0 || a.states[b.StreamID].pool.asleep {
				flush()
				continue
			}
			p := a.states[b.StreamID].pool
			if n > 0 && p != pool {
				flush()
			}
			if n == 0 {
				start, pool = b.Addr, p
			}
			n += b.Size
		}
		flush()
	}
	return out
}

// unmapEntry is a release queued while hooks are attached (releaseBlock):
// rel is the Releasing block of owner ss, op the segment's unmap begun for
// an expandable range (nil for a classic segment, destroyed whole).
type unmapEntry struct {
	ss  *streamState
	sg  *seg
	rel arena.BlockID
	op  *segment.UnmapOp
	n   uint64 // nbytes
}

// queueRelease marks [lo, hi) of free block b of ss (segment offsets;
// the whole block for a classic segment) for a release that flushUnmaps
// reports and makes. mu held.
func (a *Allocator) queueRelease(ss *streamState, sg *seg, b arena.BlockID, lo, hi uint64) error {
	info, _ := a.heap.Block(b)
	rel, err := a.heap.BeginRelease(b, lo-uint64(info.Addr-sg.base), hi-lo)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	e := unmapEntry{ss: ss, sg: sg, rel: rel, n: hi - lo}
	if sg.expandable {
		if e.op, err = sg.s.BeginUnmap(lo, hi-lo); err != nil {
			_, _ = a.heap.AbortRelease(rel)
			return err
		}
	}
	a.unmapQueue = append(a.unmapQueue, e)
	a.queuedBytes += hi - lo
	return nil
}

// flushUnmaps reports the queued releases to the hooks and makes them:
// callbacks and the driver's unmaps run with mu dropped (waitUnlocked),
// then the unmaps are ended and committed. A range the driver failed to
// unmap is reported Mapped again (it stays mapped and free). mu held (and
// dropped while it runs).
func (a *Allocator) flushUnmaps() error {
	var errs []error
	for len(a.unmapQueue) > 0 {
		q := a.unmapQueue
		a.unmapQueue = nil
		rs := make([]SegmentRange, len(q))
		for i, e := range q {
			rs[i] = a.segRange(e.sg, e.ss.pool, a.heap.Addr(e.rel), e.n)
			a.queuedBytes -= e.n
		}
		hs := a.hookList()
		ticket := a.beginRelease()
		_ = a.waitUnlocked(func() error {
			reportUnmapped(hs, rs)
			for _, e := range q {
				if e.op != nil {
					e.op.Run()
				}
			}
			return nil
		})
		a.endRelease(ticket) // waiters wake once the commits below are made
		var again []SegmentRange
		for i, e := range q {
			if e.op == nil {
				if _, err := a.heap.AbortRelease(e.rel); err != nil {
					errs = append(errs, fmt.Errorf("%w: %w", ErrCorrupt, err))
					continue
				}
				if err := a.destroyClassic(e.sg); err != nil {
					errs = append(errs, err)
					if e.sg.s.MappedBytes() > 0 && a.segOf[e.sg.rid] == e.sg {
						again = append(again, rs[i])
					}
				}
				continue
			}
			done, uerr := e.sg.s.EndUnmap(e.op)
			if done < e.n {
				r := rs[i]
				again = append(again, a.segRange(e.sg, e.ss.pool, r.Addr+uintptr(done), e.n-done))
			}
			if err := a.commitReleased(e.ss, e.rel, e.sg, done, uerr); err != nil {
				errs = append(errs, err)
			}
		}
		if len(again) > 0 && len(hs) > 0 {
			_ = a.waitUnlocked(func() error {
				for _, r := range again {
					_ = reportMapped(hs, r) // best effort: it stays mapped either way
				}
				return nil
			})
		}
	}
	return errors.Join(errs...)
}

// unlock flushes the releases queued for hooks, then unlocks mu: the end
// of every call that may release memory while hooks are attached.
func (a *Allocator) unlock() {
	if len(a.unmapQueue) > 0 {
		_ = a.flushUnmaps()
	}
	a.mu.Unlock()
}
