package fuzz

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
	"github.com/vmmalloc/vmmalloc/stats"
)

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30

	// maxOps bounds the operations one fuzz input decodes into.
	maxOps = 300
	// traceKeep is how many of the last operations a failure report lists.
	traceKeep = 60
)

// harnessConfig describes one allocator under test.
type harnessConfig struct {
	conf      string // allocator config string, as ParseConfig reads it
	capacity  uint64 // nbytes of device memory per device
	real      bool   // back the emulator with real memory (Linux)
	streams   int    // streams besides the allocator's default one
	closeLive bool   // finish closes with blocks still allocated instead of freeing them
	manual    bool   // every stream is held (WithManualCompletion)
	// pools adds private pools (limited, isolated, classic; pools_test.go)
	// that Mallocs draw from, and a registrar hook whose ordering
	// guarantees are checked after every operation.
	pools bool
}

// liveBlock is the model of one allocated block.
type liveBlock struct {
	ptr    uintptr
	size   uint64         // nbytes asked for
	stream backend.Stream // allocation stream (the default stream resolved)
	tag    uint64         // seed of the block's pattern (real memory)
	work   map[backend.Stream]uint64
	// work: per stream, the sequence number of the last launch on it that
	// touches the block; nil if none.
	shared bool // RecordStream of a stream other than its own succeeded
	// retired: its stream was released or destroyed, so the allocator may
	// have relabelled it to its idle owner.
	retired bool
	pool    int // index in harness.pools; 0 is the default pool
}

// guard is a freed range that work on stream s (up to its seq-th launch)
// may still touch: no other stream may be handed any of it before that work
// completes.
type guard struct {
	lo, hi  uintptr
	s       backend.Stream
	seq     uint64
	foreign bool   // s is not the block's allocation stream: the block is pending-free
	tag     uint64 // the block's pattern
	size    uint64 // nbytes asked for (pattern length)
}

// armedFault is an injected FailNth that has not fired yet.
type armedFault struct {
	op     backend.Op
	target int64 // the call count of op at which it fires
}

// harness runs operations against an allocator and a reference model and
// checks them after every one. See the package documentation.
type harness struct {
	t   testing.TB
	cfg harnessConfig
	e   *emulated.Emulator
	a   *allocator.Allocator
	chk *handlecheck.Checker // the driver a runs on; e beneath it

	streams   []backend.Stream          // [0] is the allocator's default stream
	foreign   backend.Stream            // a stream of device 1
	submitted map[backend.Stream]uint64 // launches made per stream

	// otherPtrs are live blocks of another allocator: pointers this
	// allocator never handed out.
	otherPtrs []uintptr

	live         []*liveBlock
	byPtr        map[uintptr]*liveBlock
	maybePending map[uintptr]uint64 // freed blocks that may wait on events: ptr → nbytes asked
	freed        []uintptr          // recently freed pointers, for double frees
	guards       []guard
	nMalloc      int64 // successful Mallocs
	sumRequested int64 // nbytes asked by successful Mallocs
	nextTag      uint64
	armed        []armedFault
	firedAny     bool // an armed fault has fired
	closed       bool
	// quietUntilFault skips verification until an armed fault fires (the
	// fault sweep: the prefix is the clean run, verified once).
	quietUntilFault bool
	maxOps          int // operations run decodes at most; 0 means the package's maxOps
	// fullEvery > 1 makes every operation's check light (Check, footprint
	// counts, violations) except every fullEvery-th, which is full.
	fullEvery int

	ops       int
	trace     []string
	keepTrace bool // keep the whole trace (tests that inspect it)

	pools []*allocator.Pool // [0] the default pool; private ones with cfg.pools
	reg   *registrar        // the registrar hook's model; nil without cfg.pools

	// Sleep and wake (sleep_test.go), per pool index.
	asleep    []bool                // the pool is not awake
	sleepMode []allocator.SleepMode // the mode of its last Sleep
	pinned    *host.Allocator       // pinned host memory for backups; nil until used
}

func newHarness(t testing.TB, hc harnessConfig) *harness {
	t.Helper()
	if hc.real && runtime.GOOS != "linux" {
		t.Skip("real-memory backing needs Linux")
	}
	opts := []emulated.Option{emulated.WithDevices(2), emulated.WithCapacity(hc.capacity)}
	if hc.manual {
		opts = append(opts, emulated.WithManualCompletion())
	}
	if hc.real {
		opts = append(opts, emulated.WithRealMemory(), emulated.WithGranularity(64*kib),
			emulated.WithHostCapacity(16*mib))
	}
	e, err := emulated.New(opts...)
	require.NoError(t, err)
	cfg, err := allocator.ParseConfig(hc.conf)
	require.NoError(t, err, "config %q", hc.conf)
	// The allocator runs over the handle-lifetime checker: a handle mapped
	// twice, mapped or freed after its free, freed while mapped, or an id
	// reused while live fails the run at the next operation.
	chk := handlecheck.New(e)
	a, err := allocator.New(chk.Driver(), cfg)
	require.NoError(t, err)
	h := &harness{
		t: t, cfg: hc, e: e, a: a, chk: chk,
		submitted:    map[backend.Stream]uint64{},
		byPtr:        map[uintptr]*liveBlock{},
		maybePending: map[uintptr]uint64{},
	}
	h.streams = append(h.streams, a.DefaultStream())
	for i := 0; i < hc.streams; i++ {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		h.streams = append(h.streams, s)
	}
	h.foreign, err = e.StreamCreate(1)
	require.NoError(t, err)
	h.pools = []*allocator.Pool{a.DefaultPool()}
	if hc.pools {
		h.addPools()
	}
	h.asleep = make([]bool, len(h.pools))
	h.sleepMode = make([]allocator.SleepMode, len(h.pools))
	// Another allocator, in a world of its own whose first addresses are
	// taken, so its blocks lie where this allocator's reservations may or
	// may not be.
	oe, err := emulated.New(emulated.WithCapacity(hc.capacity))
	require.NoError(t, err)
	_, err = oe.ReserveAddress(3*gib + 6*mib)
	require.NoError(t, err)
	oa, err := allocator.New(oe, allocator.DefaultConfig())
	require.NoError(t, err)
	for _, n := range []uint64{512, 3 * kib, mib + 1} {
		p, err := oa.Malloc(n, 0)
		require.NoError(t, err)
		h.otherPtrs = append(h.otherPtrs, p)
	}
	t.Cleanup(func() {
		if !h.closed {
			_ = h.a.Close()
		}
		if h.pinned != nil {
			_ = h.pinned.Close()
		}
		_ = oa.Close()
		_ = oe.Close()
		_ = h.e.Close()
	})
	return h
}

// logf appends to the operation trace.
func (h *harness) logf(format string, args ...any) {
	h.trace = append(h.trace, fmt.Sprintf(format, args...))
	if len(h.trace) > 2*traceKeep && !h.keepTrace {
		h.trace = append(h.trace[:0], h.trace[len(h.trace)-traceKeep:]...)
	}
}

// fatalf fails the test with the last operations.
func (h *harness) fatalf(format string, args ...any) {
	h.t.Helper()
	tr := h.trace
	if len(tr) > traceKeep {
		tr = tr[len(tr)-traceKeep:]
	}
	res, maps, cached := h.a.Footprint()
	require.FailNow(h.t, fmt.Sprintf(format, args...),
		"config %q capacity %d real %v; after %d operations, the last:\n  %s\n"+
			"allocator footprint: reservations %v, mappings %v, %d cached handles\n"+
			"emulator: reservations %v, mappings %v",
		h.cfg.conf, h.cfg.capacity, h.cfg.real, h.ops, strings.Join(tr, "\n  "),
		res, maps, cached, h.e.Reservations(), h.e.Mappings())
}

// sentinels are the error kinds every allocator error must wrap one of.
var sentinels = []error{
	allocator.ErrInvalidSize, allocator.ErrUnknownPointer, allocator.ErrInteriorPointer,
	allocator.ErrDoubleFree, allocator.ErrInvalidStream, allocator.ErrClosed,
	allocator.ErrInvalidConfig, allocator.ErrOutOfMemory,
	backend.ErrOutOfMemory, backend.ErrInvalidArgument, backend.ErrNotSupported,
	backend.ErrNotPermitted, backend.ErrUnavailable,
	allocator.ErrPoolBusy, allocator.ErrSegmentHook, allocator.ErrInvalidPool,
	allocator.ErrPoolAsleep, allocator.ErrPoolAwake, allocator.ErrSleepInProgress, allocator.ErrPoolExported,
}

func typed(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// arm makes the n-th next call of op fail with kind.
func (h *harness) arm(op backend.Op, n int, kind error) {
	require.NoError(h.t, h.e.FailNth(op, n, kind))
	h.armed = append(h.armed, armedFault{op: op, target: h.e.Calls(op) + int64(n)})
}

// callMarks records the call counts of the armed ops before an operation.
func (h *harness) callMarks() []int64 {
	m := make([]int64, len(h.armed))
	for i, f := range h.armed {
		m[i] = h.e.Calls(f.op)
	}
	return m
}

// fired reports whether an armed fault fired since marks, and forgets
// the faults that have fired.
func (h *harness) fired(marks []int64) bool {
	hit := false
	kept := h.armed[:0]
	for i, f := range h.armed {
		now := h.e.Calls(f.op)
		if marks[i] < f.target && f.target <= now {
			hit = true
			h.firedAny = true
			h.logf("  (injected %v fault fired)", f.op)
		}
		if now < f.target {
			kept = append(kept, f)
		}
	}
	h.armed = kept
	return hit
}

// completed is the number of launches on s that have completed (all of
// them once s is destroyed and its work done).
func (h *harness) completed(s backend.Stream) uint64 {
	n, err := h.e.Pending(s)
	if errors.Is(err, backend.ErrInvalidArgument) {
		return h.submitted[s]
	}
	require.NoError(h.t, err)
	return h.submitted[s] - uint64(n)
}

// launch queues work on s touching the block.
func (h *harness) launch(b *liveBlock, s backend.Stream) {
	require.NoError(h.t, h.e.Launch(s, b.ptr, b.size))
	h.submitted[s]++
	if b.work == nil {
		b.work = map[backend.Stream]uint64{}
	}
	b.work[s] = h.submitted[s]
}

// streamArg maps a byte to a stream: its low six bits index h.streams;
// index 0 without the 0x80 bit passes 0 ("the default stream") to the
// allocator. Bit 0x40 is left to the caller (launch work).
func (h *harness) streamArg(x byte) (arg, resolved backend.Stream) {
	i := int(x&0x3f) % len(h.streams)
	if i == 0 && x&0x80 == 0 {
		return 0, h.streams[0]
	}
	return h.streams[i], h.streams[i]
}

// sizeFor maps a size class and a 16-bit value to a request size, scaled
// to the device capacity so that out-of-memory paths are reached.
func (h *harness) sizeFor(class byte, v uint16) uint64 {
	c := h.cfg.capacity
	x := uint64(v)
	switch class % 8 {
	case 0: // tiny
		return 1 + x%4096
	case 1: // small pool
		return 1 + (x*16)%mib
	case 2: // around the small/large pool boundary
		return mib - 1 + x%3
	case 3: // just above it
		return mib + x*64
	case 4: // up to an eighth of the device
		return 1 + x*(c/8)/65536
	case 5: // whole 2 MiB pages
		return (x%16 + 1) * 2 * mib
	case 6: // a quarter to three quarters of the device
		return c/4 + x*(c/2)/65536
	default: // around the capacity; above it is an invalid size
		return c - c/16 + x*(c/8)/65536
	}
}

// mallocOp calls Malloc and checks and records the result.
func (h *harness) mallocOp(size uint64, arg, s backend.Stream, launch bool, pool int) {
	if h.asleep[pool] {
		h.asleepMalloc(size, arg, pool)
		return
	}
	h.logf("Malloc(%d, stream %d) in pool %d", size, arg, pool)
	marks := h.callMarks()
	before := h.a.Stats()
	ptr, err := h.pools[pool].Malloc(size, arg)
	fired := h.fired(marks)
	if err != nil {
		h.logf("  -> %v", err)
		if !typed(err) {
			h.fatalf("Malloc(%d) returned an untyped error: %v", size, err)
		}
		if size > h.cfg.capacity {
			if !errors.Is(err, allocator.ErrInvalidSize) {
				h.fatalf("Malloc(%d) above capacity: want ErrInvalidSize, got %v", size, err)
			}
			if after := h.a.Stats(); after != before {
				h.fatalf("a rejected Malloc changed the statistics")
			}
			return
		}
		if !fired {
			h.checkGenuineOOM(size, err, h.pools[pool])
		}
		return
	}
	h.logf("  -> %#x", ptr)
	if size > h.cfg.capacity {
		h.fatalf("Malloc(%d) above the %d-byte capacity succeeded", size, h.cfg.capacity)
	}
	if ptr%512 != 0 {
		h.fatalf("Malloc(%d) = %#x is not 512-aligned", size, ptr)
	}
	if old, ok := h.byPtr[ptr]; ok {
		h.fatalf("Malloc(%d) = %#x, already live (%d bytes)", size, ptr, old.size)
	}
	for _, b := range h.live {
		if ptr < b.ptr+uintptr(b.size) && b.ptr < ptr+uintptr(size) {
			h.fatalf("Malloc(%d) = %#x overlaps live block %#x+%d", size, ptr, b.ptr, b.size)
		}
	}
	h.checkGuards(ptr, size, s)
	delete(h.maybePending, ptr)
	h.nextTag++
	b := &liveBlock{ptr: ptr, size: size, stream: s, tag: h.nextTag, pool: pool}
	h.live = append(h.live, b)
	h.byPtr[ptr] = b
	h.nMalloc++
	h.sumRequested += int64(size)
	if h.cfg.real {
		h.fill(b)
	}
	if launch {
		h.launch(b, s)
	}
}

// checkGenuineOOM requires that a Malloc failure with no fault injected is
// a real out-of-memory error.
func (h *harness) checkGenuineOOM(size uint64, err error, pool *allocator.Pool) {
	var oom *allocator.OutOfMemoryError
	if !errors.As(err, &oom) {
		h.fatalf("Malloc(%d) failed with no fault injected and not out of memory: %v", size, err)
	}
	if oom.PoolLimit != 0 {
		h.checkLimitOOM(size, oom, pool)
		return
	}
	if !errors.Is(err, allocator.ErrOutOfMemory) || !errors.Is(err, backend.ErrOutOfMemory) {
		h.fatalf("OutOfMemoryError does not match both sentinels: %v", err)
	}
	if oom.Requested != size {
		h.fatalf("OutOfMemoryError.Requested %d, asked %d", oom.Requested, size)
	}
	capped := oom.Allowed != 0 && oom.Reserved+oom.Tried > oom.Allowed
	if !oom.AddrSpaceVA && !capped && oom.Free >= oom.Tried {
		h.fatalf("out of memory with %d bytes free for %d tried: %v", oom.Free, oom.Tried, err)
	}
	if _, _, cached := h.a.Footprint(); cached != 0 {
		h.fatalf("out of memory with %d physical handles still cached", cached)
	}
}

// checkGuards requires that a block handed to stream s overlaps no freed
// range whose work on another stream is still pending.
func (h *harness) checkGuards(ptr uintptr, size uint64, s backend.Stream) {
	kept := h.guards[:0]
	for _, g := range h.guards {
		if h.completed(g.s) >= g.seq {
			continue
		}
		kept = append(kept, g)
		if g.s != s && ptr < g.hi && g.lo < ptr+uintptr(size) {
			h.fatalf("Malloc on stream %d = %#x+%d overlaps [%#x,%#x) freed while stream %d's work #%d (completed %d) still uses it",
				s, ptr, size, g.lo, g.hi, g.s, g.seq, h.completed(g.s))
		}
	}
	h.guards = kept
}

// freeOp frees the i-th live block.
func (h *harness) freeOp(i int) {
	b := h.live[i]
	h.logf("Free(%#x) [%d bytes, stream %d]", b.ptr, b.size, b.stream)
	marks := h.callMarks()
	err := h.a.Free(b.ptr)
	fired := h.fired(marks)
	if err != nil {
		h.logf("  -> %v", err)
		if !typed(err) {
			h.fatalf("Free returned an untyped error: %v", err)
		}
		if !fired {
			h.fatalf("Free(%#x) failed with no fault injected: %v", b.ptr, err)
		}
		return
	}
	for s, seq := range b.work {
		if h.completed(s) < seq {
			h.guards = append(h.guards, guard{
				lo: b.ptr, hi: b.ptr + uintptr(b.size), s: s, seq: seq,
				foreign: s != b.stream, tag: b.tag, size: b.size,
			})
		}
	}
	if b.shared {
		h.maybePending[b.ptr] = b.size
	}
	h.live[i] = h.live[len(h.live)-1]
	h.live = h.live[:len(h.live)-1]
	delete(h.byPtr, b.ptr)
	h.freed = append(h.freed, b.ptr)
	if len(h.freed) > 16 {
		h.freed = h.freed[1:]
	}
}

// recordOp calls RecordStream on the i-th live block, and launches work on
// the stream touching it if launch is set.
func (h *harness) recordOp(i int, s backend.Stream, launch bool) {
	b := h.live[i]
	if h.asleep[b.pool] {
		h.asleepRecord(b, s)
		return
	}
	h.logf("RecordStream(%#x, %d) launch=%v", b.ptr, s, launch)
	before := h.e.CallCounts()
	if err := h.a.RecordStream(b.ptr, s); err != nil {
		h.fatalf("RecordStream(%#x, %d): %v", b.ptr, s, err)
	}
	if after := h.e.CallCounts(); after != before {
		h.fatalf("RecordStream called the driver")
	}
	if s != b.stream || b.retired {
		// A block of a stream released and kept belongs to the
		// allocator's idle owner: the stream, learnt again, is another
		// stream to it, so Free may wait for an event on it.
		b.shared = true
	}
	if launch {
		h.launch(b, s)
	}
}

// badOp feeds bad input; it must fail with the right sentinel and change
// nothing.
func (h *harness) badOp(x byte) {
	before := h.a.Stats()
	calls := h.e.CallCounts()
	var err error
	var want []error
	switch x % 8 {
	case 7:
		h.logf("ReleaseStream(default)")
		err, want = h.a.ReleaseStream(0), []error{allocator.ErrInvalidStream}
	case 0:
		h.logf("Free(unknown)")
		err, want = h.a.Free(0x1234), []error{allocator.ErrUnknownPointer}
	case 1: // an interior pointer of a live block
		var b *liveBlock
		for _, c := range h.live {
			if c.size > 512 {
				b = c
				break
			}
		}
		if b == nil {
			return
		}
		h.logf("Free(%#x+512)", b.ptr)
		err, want = h.a.Free(b.ptr+512), []error{allocator.ErrInteriorPointer}
	case 2: // a pointer freed before and not handed out again
		var p uintptr
		for _, q := range h.freed {
			if _, ok := h.byPtr[q]; !ok {
				p = q
			}
		}
		if p == 0 {
			return
		}
		h.logf("Free(%#x) again", p)
		err = h.a.Free(p)
		want = []error{allocator.ErrDoubleFree, allocator.ErrInteriorPointer, allocator.ErrUnknownPointer}
	case 3: // a stream of another device
		h.logf("Malloc(4096, foreign stream %d)", h.foreign)
		_, err = h.a.Malloc(4096, h.foreign)
		want = []error{allocator.ErrInvalidStream}
		if h.asleep[0] {
			// An asleep pool refuses every Malloc before it looks at the
			// arguments (no driver call asks about the stream).
			want = []error{allocator.ErrPoolAsleep}
		}
	case 5, 6: // handled by retireOp
		return
	default:
		if len(h.live) == 0 {
			return
		}
		h.logf("RecordStream(%#x, foreign stream %d)", h.live[0].ptr, h.foreign)
		err, want = h.a.RecordStream(h.live[0].ptr, h.foreign), []error{allocator.ErrInvalidStream}
		if h.asleep[h.live[0].pool] {
			// As asleepRecord: refused for the pool's state first, with
			// no driver call asking about the stream.
			want = []error{allocator.ErrPoolAsleep}
		}
	}
	if err == nil {
		h.fatalf("bad input accepted")
	}
	ok := false
	for _, w := range want {
		ok = ok || errors.Is(err, w)
	}
	if !ok {
		h.fatalf("bad input: got %v, want one of %v", err, want)
	}
	if after := h.a.Stats(); after != before {
		h.fatalf("bad input changed the statistics: %v", err)
	}
	if after := h.e.CallCounts(); after != calls {
		h.fatalf("bad input reached the driver: %v", err)
	}
}

// anyPointer: a Free or RecordStream index byte at or above it draws the
// pointer from the whole address space (pointerArg) instead of taking a
// live block.
const anyPointer = 0xf0

// pointerArg maps an index byte x (≥ anyPointer: its low four bits pick the
// kind) and a byte y to a pointer anywhere: a live block's start (so a
// valid call still happens), 0, 1, ^0, interior and unaligned addresses of
// live blocks, freed pointers, addresses just before, at and after each
// reservation and mapping, unmapped addresses deep inside a reservation,
// and another allocator's pointers. It says what it drew.
func (h *harness) pointerArg(x, y byte) (uintptr, string) {
	pick := func(n int) int { return int(y) % n }
	switch x & 0x0f {
	case 0:
		return 0, "null"
	case 1:
		return 1, "one"
	case 2:
		if y&1 != 0 {
			return ^uintptr(0) &^ 511, "top aligned"
		}
		return ^uintptr(0), "top"
	case 3, 4:
		if len(h.live) == 0 {
			return 0, "null"
		}
		b := h.live[pick(len(h.live))]
		return b.ptr, "live"
	case 5, 6:
		if len(h.live) == 0 {
			return 0x1234, "small"
		}
		b := h.live[pick(len(h.live))]
		offs := []uint64{1, 8, 511, 512, b.size - 1, b.size, b.size + 511, (b.size + 511) &^ 511}
		return b.ptr + uintptr(offs[int(y>>4)%len(offs)]), "near a live block"
	case 7:
		if len(h.freed) == 0 {
			return 512, "512"
		}
		return h.freed[pick(len(h.freed))], "freed"
	case 8, 9, 10:
		res, maps, _ := h.a.Footprint()
		rs := append(res, maps...)
		if len(rs) == 0 {
			return 0x100000000000, "where a reservation will be"
		}
		r := rs[pick(len(rs))]
		at := []uintptr{r.Addr - 512, r.Addr - 1, r.Addr, r.Addr + 512, r.Addr + uintptr(r.Size) - 512,
			r.Addr + uintptr(r.Size) - 1, r.Addr + uintptr(r.Size), r.Addr + uintptr(r.Size) + 512}
		return at[int(y>>3)%len(at)], "around a reservation or mapping"
	case 11:
		res, _, _ := h.a.Footprint()
		if len(res) == 0 {
			return 0x100000000000, "where a reservation will be"
		}
		r := res[pick(len(res))]
		return (r.Addr + uintptr(r.Size)/2 + uintptr(y)*512) &^ 511, "deep in a reservation"
	default:
		return h.otherPtrs[pick(len(h.otherPtrs))], "another allocator's"
	}
}

// liveIndex is the index of the live block starting at ptr, or -1.
func (h *harness) liveIndex(ptr uintptr) int {
	if _, ok := h.byPtr[ptr]; !ok {
		return -1
	}
	for i, b := range h.live {
		if b.ptr == ptr {
			return i
		}
	}
	return -1
}

// rejectedOp runs a call on a pointer that is not a live block's start: it
// must fail with a pointer sentinel (ErrInteriorPointer exactly when ptr is
// inside a live block as the model knows it; ErrUnknownPointer when it lies
// outside every reservation) and change nothing: statistics, Check, the
// driver's call counts, the model.
func (h *harness) rejectedOp(name string, ptr uintptr, call func() error) {
	h.logf("%s", name)
	before := h.a.Stats()
	calls := h.e.CallCounts()
	err := call()
	h.logf("  -> %v", err)
	if err == nil {
		h.fatalf("%s: accepted a pointer that is not a live block", name)
	}
	want := []error{allocator.ErrUnknownPointer, allocator.ErrInteriorPointer, allocator.ErrDoubleFree}
	inside := false
	for _, b := range h.live {
		if ptr > b.ptr && ptr < b.ptr+uintptr(b.size) {
			inside = true
		}
	}
	res, _, _ := h.a.Footprint()
	outside := true
	for _, r := range res {
		if ptr >= r.Addr && ptr-r.Addr < uintptr(r.Size) {
			outside = false
		}
	}
	switch {
	case inside:
		want = []error{allocator.ErrInteriorPointer}
	case outside || ptr%512 != 0 && !inside:
		want = []error{allocator.ErrUnknownPointer, allocator.ErrInteriorPointer}
		if outside {
			want = want[:1]
		}
	}
	ok := false
	for _, w := range want {
		ok = ok || errors.Is(err, w)
	}
	if !ok {
		h.fatalf("%s: got %v, want one of %v", name, err, want)
	}
	if after := h.a.Stats(); after != before {
		h.fatalf("%s: a rejected call changed the statistics", name)
	}
	if after := h.e.CallCounts(); after != calls {
		h.fatalf("%s: a rejected call reached the driver", name)
	}
	if err := h.a.Check(); err != nil {
		h.fatalf("%s: Check after a rejected call: %v", name, err)
	}
}

// retireOp retires stream 1+x%(n-1) of the program's streams (never the
// default one) and puts a new stream in its place: with release, through
// ReleaseStream and then StreamDestroy (or, with bit 0x80, ReleaseStream
// only, the stream kept and used again); without, by destroying it behind
// the allocator's back, work still pending on it. The live blocks of the
// stream stay live and freeable.
func (h *harness) retireOp(x byte, release bool) {
	if len(h.streams) < 2 {
		return
	}
	i := 1 + int(x)%(len(h.streams)-1)
	s := h.streams[i]
	if release {
		h.logf("ReleaseStream(%d), StreamDestroy", s)
		marks := h.callMarks()
		err := h.a.ReleaseStream(s)
		fired := h.fired(marks)
		if err != nil {
			h.logf("  -> %v", err)
			if !typed(err) {
				h.fatalf("ReleaseStream returned an untyped error: %v", err)
			}
			if !fired {
				h.fatalf("ReleaseStream(%d) failed with no fault injected: %v", s, err)
			}
			for _, b := range h.live { // a failed unmap comes after the release
				if b.stream == s {
					b.retired = true
				}
			}
			return
		}
		if n, err := h.e.Pending(s); err == nil && n > 0 {
			h.fatalf("ReleaseStream(%d) left %d work items pending", s, n)
		}
		if x&0x80 != 0 { // released but kept: used again, it is a new stream
			h.logf("  (stream %d kept alive)", s)
			for _, b := range h.live {
				if b.stream == s {
					b.retired = true
				}
			}
			return
		}
	} else {
		h.logf("StreamDestroy(%d) without ReleaseStream", s)
	}
	require.NoError(h.t, h.e.StreamDestroy(s))
	for _, b := range h.live {
		if b.stream == s {
			b.retired = true
		}
	}
	ns, err := h.e.StreamCreate(0)
	require.NoError(h.t, err)
	h.streams[i] = ns
}

// cacheOp runs EmptyCache or Synchronize(s).
func (h *harness) cacheOp(name string, f func() error) {
	h.logf("%s", name)
	marks := h.callMarks()
	err := f()
	fired := h.fired(marks)
	if err != nil {
		h.logf("  -> %v", err)
		if !typed(err) {
			h.fatalf("%s returned an untyped error: %v", name, err)
		}
		if !fired {
			h.fatalf("%s failed with no fault injected: %v", name, err)
		}
	}
}

// Operation kinds, weighted by how often they appear in opTable.
type opKind byte

const (
	kMalloc opKind = iota
	kFree
	kRecord
	kComplete
	kCompleteAll
	kEmptyCache
	kSynchronize
	kFault
	kClearFaults
	kBad
	kResetPeak
)

var opTable = [32]opKind{
	kMalloc, kMalloc, kMalloc, kMalloc, kMalloc, kMalloc, kMalloc, kMalloc, kMalloc, kMalloc,
	kFree, kFree, kFree, kFree, kFree, kFree, kFree,
	kRecord, kRecord, kRecord,
	kComplete, kComplete, kComplete,
	kCompleteAll,
	kEmptyCache, kEmptyCache,
	kSynchronize, kSynchronize,
	kFault, kFault,
	kClearFaults,
	kBad,
}

// opByte is the first byte that decodes to k (used by the encoder).
func opByte(k opKind) byte {
	for i, x := range opTable {
		if x == k {
			return byte(i)
		}
	}
	panic("unknown op kind")
}

// faultOps are the primitives the allocator calls after New.
var faultOps = []backend.Op{
	backend.OpReserve, backend.OpRelease, backend.OpCreate, backend.OpFree, backend.OpMap,
	backend.OpUnmap, backend.OpSetAccess, backend.OpStreamSync, backend.OpEventCreate,
	backend.OpEventRecord, backend.OpEventQuery, backend.OpEventSync,
}

var faultKinds = []error{backend.ErrOutOfMemory, backend.ErrUnavailable, backend.ErrInvalidArgument}

// decoder reads the fuzzer's bytes; past the end it reads zeros.
type decoder struct{ b []byte }

func (d *decoder) empty() bool { return len(d.b) == 0 }

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		return 0
	}
	x := d.b[0]
	d.b = d.b[1:]
	return x
}

func (d *decoder) u16() uint16 { return uint16(d.byte()) | uint16(d.byte())<<8 }

// run decodes and runs operations until the input ends.
func (h *harness) run(data []byte) {
	d := decoder{b: data}
	limit := h.maxOps
	if limit == 0 {
		limit = maxOps
	}
	for n := 0; n < limit && !d.empty(); n++ {
		h.step(&d)
		h.ops++
		if h.chk.Count() != 0 { // one atomic load
			h.fatalf("%v", h.chk.Err())
		}
		switch {
		case h.quietUntilFault && !h.firedAny:
		case h.fullEvery > 1 && h.ops%h.fullEvery != 0:
			h.verifyLight()
		default:
			h.verify()
		}
	}
}

// step decodes and runs one operation.
func (h *harness) step(d *decoder) {
	op := d.byte()
	if isSleepOp(op) {
		h.sleepOp(d.byte())
		return
	}
	switch opTable[op%32] {
	case kMalloc:
		class, v, sx := d.byte(), d.u16(), d.byte()
		arg, s := h.streamArg(sx)
		pool := 0
		if h.cfg.pools { // the class byte's high bits, unused by sizeFor
			pool = int(class>>3) % len(h.pools)
		}
		h.mallocOp(h.sizeFor(class, v), arg, s, sx&0x40 != 0, pool)
	case kFree:
		x := d.byte()
		if x >= anyPointer {
			ptr, what := h.pointerArg(x, d.byte())
			if i := h.liveIndex(ptr); i >= 0 {
				h.freeOp(i)
			} else {
				h.rejectedOp(fmt.Sprintf("Free(%#x) [%s]", ptr, what), ptr, func() error { return h.a.Free(ptr) })
			}
		} else if len(h.live) > 0 {
			h.freeOp(int(x) % len(h.live))
		}
	case kRecord:
		x, sx := d.byte(), d.byte()
		_, s := h.streamArg(sx)
		if x >= anyPointer {
			ptr, what := h.pointerArg(x, d.byte())
			if i := h.liveIndex(ptr); i >= 0 {
				h.recordOp(i, s, sx&0x40 != 0)
			} else {
				h.rejectedOp(fmt.Sprintf("RecordStream(%#x, %d) [%s]", ptr, s, what), ptr, func() error { return h.a.RecordStream(ptr, s) })
			}
		} else if len(h.live) > 0 {
			h.recordOp(int(x)%len(h.live), s, sx&0x40 != 0)
		}
	case kComplete:
		sx, n := d.byte(), int(d.byte()%4)
		_, s := h.streamArg(sx)
		pending, err := h.e.Pending(s)
		require.NoError(h.t, err)
		if n == 0 || n > pending {
			n = pending
		}
		h.logf("CompleteN(stream %d, %d of %d)", s, n, pending)
		require.NoError(h.t, h.e.CompleteN(s, n))
	case kCompleteAll:
		h.logf("CompleteAll")
		require.NoError(h.t, h.e.CompleteAll())
	case kEmptyCache:
		h.cacheOp("EmptyCache", h.a.EmptyCache)
	case kSynchronize:
		arg, _ := h.streamArg(d.byte())
		h.cacheOp(fmt.Sprintf("Synchronize(%d)", arg), func() error { return h.a.Synchronize(arg) })
	case kFault:
		ox, n, kx := d.byte(), int(d.byte()%8)+1, d.byte()
		op, kind := faultOps[int(ox)%len(faultOps)], faultKinds[int(kx)%len(faultKinds)]
		h.logf("FailNth(%v, %d, %v)", op, n, kind)
		h.arm(op, n, kind)
	case kClearFaults:
		h.logf("ClearFaults")
		h.e.ClearFaults()
		h.armed = nil
	case kBad:
		switch x := d.byte(); x % 8 {
		case 5:
			h.retireOp(d.byte(), true)
		case 6:
			h.retireOp(d.byte(), false)
		default:
			h.badOp(x)
		}
	case kResetPeak:
		h.a.ResetPeakStats()
	}
}

// verify checks the allocator against the emulator and the model.
func (h *harness) verify() {
	h.t.Helper()
	if err := h.a.Check(); err != nil {
		h.fatalf("Check: %v", err)
	}
	h.verifyFootprint()
	snap := h.a.Snapshot()
	type info struct {
		size, requested uint64
		stream          uint64
		state           stats.BlockState
	}
	active := map[uintptr]info{}
	for _, sg := range snap.Segments {
		for _, b := range sg.Blocks {
			if b.State == stats.BlockActiveAllocated || b.State == stats.BlockActivePendingFree {
				active[b.Address] = info{b.Size, b.RequestedSize, b.Stream, b.State}
			}
		}
	}
	var allocBytes, reqBytes, activeBytes, mappedBytes int64
	// Everything the allocator maps, zombie segments (failed teardowns)
	// included: Footprint lists one mapping per handle.
	_, mappings, _ := h.a.Footprint()
	for _, m := range mappings {
		mappedBytes += int64(m.Size)
	}
	nPending := 0
	for addr, in := range active {
		activeBytes += int64(in.size)
		reqBytes += int64(in.requested)
		if in.state == stats.BlockActiveAllocated {
			if _, ok := h.byPtr[addr]; !ok {
				h.fatalf("allocated block %#x+%d is not live in the model", addr, in.size)
			}
			continue
		}
		nPending++
		want, ok := h.maybePending[addr]
		if !ok || want != in.requested {
			h.fatalf("pending-free block %#x (%d requested) was never freed after RecordStream (model %d, %v)", addr, in.requested, want, ok)
		}
	}
	sorted := make([]*liveBlock, len(h.live))
	copy(sorted, h.live)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ptr < sorted[j].ptr })
	for i, b := range sorted {
		in, ok := active[b.ptr]
		switch {
		case !ok || in.state != stats.BlockActiveAllocated:
			h.fatalf("live block %#x is not allocated in the snapshot (%v)", b.ptr, in.state)
		case in.size < b.size:
			h.fatalf("block %#x is %d bytes, %d asked", b.ptr, in.size, b.size)
		case in.requested != b.size:
			h.fatalf("block %#x records %d bytes asked, model %d", b.ptr, in.requested, b.size)
		case in.stream != uint64(b.stream) && !(b.retired && in.stream == uint64(^backend.Stream(0))):
			h.fatalf("block %#x on stream %d, allocated on %d", b.ptr, in.stream, b.stream)
		case b.ptr%512 != 0 || in.size%512 != 0:
			h.fatalf("block %#x+%d not 512-aligned", b.ptr, in.size)
		}
		if i+1 < len(sorted) && b.ptr+uintptr(in.size) > sorted[i+1].ptr {
			h.fatalf("live blocks %#x+%d and %#x overlap", b.ptr, in.size, sorted[i+1].ptr)
		}
		allocBytes += int64(in.size)
	}
	st := h.a.Stats()
	all := stats.AllPools
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"allocation.current", st.Allocation[all].Current, int64(len(h.live))},
		{"allocation.allocated", st.Allocation[all].Allocated, h.nMalloc},
		{"allocated_bytes.current", st.AllocatedBytes[all].Current, allocBytes},
		{"requested_bytes.current", st.RequestedBytes[all].Current, reqBytes},
		{"requested_bytes.allocated", st.RequestedBytes[all].Allocated, h.sumRequested},
		{"active.current", st.Active[all].Current, int64(len(h.live) + nPending)},
		{"active_bytes.current", st.ActiveBytes[all].Current, activeBytes},
		{"reserved_bytes.current", st.ReservedBytes[all].Current, mappedBytes},
	} {
		if c.got != c.want {
			h.fatalf("stat %s is %d, model %d", c.name, c.got, c.want)
		}
	}
	for _, sa := range []*stats.StatArray{&st.Allocation, &st.AllocatedBytes, &st.RequestedBytes, &st.Active, &st.ActiveBytes, &st.ReservedBytes, &st.Segment} {
		for k := range sa {
			if s := sa[k]; s.Allocated-s.Freed != s.Current || s.Peak < s.Current {
				h.fatalf("stat %+v is inconsistent", s)
			}
		}
	}
	if h.cfg.real {
		h.verifyPatterns()
	}
	if h.cfg.pools {
		h.verifyPools(snap)
	}
}

// verifyLight runs Check and compares the footprint's counts with the
// emulator's.
func (h *harness) verifyLight() {
	h.t.Helper()
	if err := h.a.Check(); err != nil {
		h.fatalf("Check: %v", err)
	}
	res, maps, cached := h.a.Footprint()
	live := h.e.Live()
	if live.Reservations != len(res) || live.Mappings != len(maps) || live.Handles != len(maps)+cached {
		h.fatalf("allocator holds %d reservations, %d mappings, %d cached handles; emulator %d, %d, %d handles",
			len(res), len(maps), cached, live.Reservations, live.Mappings, live.Handles)
	}
	if v := h.e.Violations(); len(v) > 0 {
		h.fatalf("emulator violation: %v", v[0])
	}
}

// verifyFootprint compares what the allocator says it holds with what the
// emulator says it handed out.
func (h *harness) verifyFootprint() {
	res, maps, cached := h.a.Footprint()
	sortRanges(res)
	sortRanges(maps)
	eres := h.e.Reservations()
	if len(eres) != len(res) {
		h.fatalf("allocator holds %d reservations, emulator %d", len(res), len(eres))
	}
	for i, r := range eres {
		if r.VA != res[i].Addr || r.Size != res[i].Size {
			h.fatalf("reservation %d: allocator %#x+%d, emulator %#x+%d", i, res[i].Addr, res[i].Size, r.VA, r.Size)
		}
	}
	emaps := h.e.Mappings()
	if len(emaps) != len(maps) {
		h.fatalf("allocator holds %d mappings, emulator %d", len(maps), len(emaps))
	}
	for i, m := range emaps {
		if m.VA != maps[i].Addr || m.Size != maps[i].Size {
			h.fatalf("mapping %d: allocator %#x+%d, emulator %#x+%d", i, maps[i].Addr, maps[i].Size, m.VA, m.Size)
		}
	}
	live := h.e.Live()
	if live.Handles != len(maps)+cached || live.FreedPending != 0 {
		h.fatalf("emulator holds %d handles (%d freed-pending), allocator %d mapped + %d cached",
			live.Handles, live.FreedPending, len(maps), cached)
	}
	if v := h.e.Violations(); len(v) > 0 {
		h.fatalf("emulator violation: %v", v[0])
	}
}

func sortRanges(r []allocator.Range) {
	sort.Slice(r, func(i, j int) bool { return r[i].Addr < r[j].Addr })
}

// patternWord is word i of the pattern of tag.
func patternWord(tag uint64, i int) uint64 {
	return tag*0x9e3779b97f4a7c15 ^ (uint64(i)+1)*0xbf58476d1ce4e5b9
}

// bytesOf returns the real memory of [ptr, ptr+size), failing the test if it
// is not mapped and accessible.
func (h *harness) bytesOf(what string, ptr uintptr, size uint64) []byte {
	b, err := h.e.Bytes(ptr, size)
	if err != nil {
		h.fatalf("%s %#x+%d is not accessible: %v", what, ptr, size, err)
	}
	return b
}

// words splits real memory into its 8-byte words and its tail.
func words(b []byte) ([]uint64, []byte) {
	n := len(b) / 8
	if n == 0 {
		return nil, b
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n), b[n*8:]
}

// fullPattern is the size up to which a block's pattern covers every
// byte. Larger blocks get one word in every 512-byte unit (the allocator's
// granule: a block is never smaller or misaligned, so a unit handed out
// twice, or remapped to other memory, loses the word) plus their last
// word, which keeps real-memory fuzzing fast.
const fullPattern = 4 * kib

// sparse lists the word offsets of a large block's pattern.
func sparse(size uint64, f func(off uint64, i int)) {
	i := 0
	for off := uint64(0); off+8 <= size; off += 512 {
		f(off, i)
		i++
	}
	f(size-8, -1)
}

// fill writes the block's pattern into its memory.
func (h *harness) fill(b *liveBlock) {
	mem := h.bytesOf("new block", b.ptr, b.size)
	if b.size > fullPattern {
		sparse(b.size, func(off uint64, i int) {
			binary.LittleEndian.PutUint64(mem[off:], patternWord(b.tag, i))
		})
		return
	}
	w, tail := words(mem)
	for i := range w {
		w[i] = patternWord(b.tag, i)
	}
	for i := range tail {
		tail[i] = byte(b.tag + uint64(i))
	}
}

// checkPattern verifies a pattern written by fill.
func (h *harness) checkPattern(what string, ptr uintptr, size, tag uint64) {
	mem := h.bytesOf(what, ptr, size)
	if size > fullPattern {
		sparse(size, func(off uint64, i int) {
			if got := binary.LittleEndian.Uint64(mem[off:]); got != patternWord(tag, i) {
				h.fatalf("%s %#x+%d corrupted at byte %d: %#x, want %#x", what, ptr, size, off, got, patternWord(tag, i))
			}
		})
		return
	}
	w, tail := words(mem)
	for i := range w {
		if w[i] != patternWord(tag, i) {
			h.fatalf("%s %#x+%d corrupted at byte %d: %#x, want %#x", what, ptr, size, i*8, w[i], patternWord(tag, i))
		}
	}
	for i := range tail {
		if tail[i] != byte(tag+uint64(i)) {
			h.fatalf("%s %#x+%d corrupted in its last bytes", what, ptr, size)
		}
	}
}

// verifyPatterns checks every live block and every freed block another
// stream still uses.
func (h *harness) verifyPatterns() {
	for _, b := range h.live {
		if !h.asleep[b.pool] {
			h.checkPattern("live block", b.ptr, b.size, b.tag)
		}
	}
	for _, g := range h.guards {
		if g.foreign && h.completed(g.s) < g.seq {
			h.checkPattern("pending-free block", g.lo, g.size, g.tag)
		}
	}
}

// finish completes all work, clears faults, frees everything (unless
// closeLive), empties the cache, closes the allocator, and requires that
// nothing is left in the emulator.
func (h *harness) finish() {
	h.t.Helper()
	h.logf("finish")
	h.e.ClearFaults()
	h.armed = nil
	require.NoError(h.t, h.e.CompleteAll())
	if !h.cfg.closeLive {
		for len(h.live) > 0 {
			h.freeOp(len(h.live) - 1)
		}
		if err := h.a.EmptyCache(); err != nil {
			h.fatalf("EmptyCache after freeing everything: %v", err)
		}
		h.wakeAll()
		if err := h.a.EmptyCache(); err != nil {
			h.fatalf("EmptyCache after waking every pool: %v", err)
		}
		h.closePools()
		h.verify()
		st := h.a.Stats()
		if st.ReservedBytes[stats.AllPools].Current != 0 || st.Active[stats.AllPools].Current != 0 {
			h.fatalf("after freeing everything and EmptyCache: %d bytes reserved, %d blocks active",
				st.ReservedBytes[stats.AllPools].Current, st.Active[stats.AllPools].Current)
		}
		if live := h.e.Live(); live.Mappings+live.Handles+live.Reservations != 0 {
			h.fatalf("after EmptyCache the emulator holds %d mappings, %d handles, %d reservations",
				live.Mappings, live.Handles, live.Reservations)
		}
	}
	if err := h.a.Close(); err != nil {
		h.fatalf("Close: %v", err)
	}
	h.closed = true
	h.requireEmpty()
	h.requireDeregistered()
}

// closeArmed closes the allocator with the injected faults still armed;
// an error must be typed and come from a fault, and a second Close after
// ClearFaults must finish the job.
func (h *harness) closeArmed() {
	h.t.Helper()
	h.logf("Close (faults armed)")
	marks := h.callMarks()
	err := h.a.Close()
	fired := h.fired(marks)
	h.e.ClearFaults()
	h.armed = nil
	if err != nil {
		h.logf("  -> %v", err)
		if !typed(err) {
			h.fatalf("Close returned an untyped error: %v", err)
		}
		if !fired {
			h.fatalf("Close failed with no fault injected: %v", err)
		}
		if err := h.a.Close(); err != nil {
			h.fatalf("Close after a failed Close: %v", err)
		}
	} else if err := h.a.Close(); !errors.Is(err, allocator.ErrClosed) {
		h.fatalf("second Close: want ErrClosed, got %v", err)
	}
	h.closed = true
	h.requireEmpty()
}

// requireEmpty requires that the emulator holds nothing of the allocator.
func (h *harness) requireEmpty() {
	if err := h.chk.Err(); err != nil {
		h.fatalf("%v", err)
	}
	live := h.e.Live()
	if live.Handles != 0 || live.Mappings != 0 || live.Reservations != 0 || live.Events != 0 {
		h.fatalf("after Close the emulator holds %d handles, %d mappings, %d reservations, %d events",
			live.Handles, live.Mappings, live.Reservations, live.Events)
	}
	for i, d := range live.Devices {
		if d.Physical != 0 {
			h.fatalf("after Close device %d still has %d bytes of physical memory", i, d.Physical)
		}
	}
	if v := h.e.Violations(); len(v) > 0 {
		h.fatalf("emulator violation: %v", v[0])
	}
}
