package host

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// newHost makes a host allocator over a fresh emulator; conf is a config
// string. Cleanup closes it and asserts the driver holds nothing of it.
func newHost(t testing.TB, conf string, opts ...emulated.Option) (*Allocator, *emulated.Emulator) {
	t.Helper()
	return newHostOver(t, conf, func(e *emulated.Emulator) backend.Driver { return e }, opts...)
}

// withoutDeviceSync is the emulator without its DeviceSynchronizer
// capability, as a driver that cannot wait for a whole device.
type withoutDeviceSync struct {
	backend.Driver
	backend.HostMemory
}

// newHostNoDeviceSync is newHost over withoutDeviceSync.
func newHostNoDeviceSync(t testing.TB, conf string, opts ...emulated.Option) (*Allocator, *emulated.Emulator) {
	t.Helper()
	return newHostOver(t, conf, func(e *emulated.Emulator) backend.Driver { return withoutDeviceSync{e, e} }, opts...)
}

func newHostOver(t testing.TB, conf string, wrap func(*emulated.Emulator) backend.Driver, opts ...emulated.Option) (*Allocator, *emulated.Emulator) {
	t.Helper()
	e, err := emulated.New(opts...)
	require.NoError(t, err)
	if !strings.Contains(conf, "expandable_segments") {
		// The tests that launch emulated work on blocks need MallocHost
		// memory (the emulator's stream work sees no other host memory):
		// they pin the size-class policy unless they name one.
		conf = "expandable_segments:False," + conf
	}
	if !strings.Contains(conf, "pinned_budget_mb") {
		conf += ",pinned_budget_mb:0" // unlimited unless the test sets a budget
	}
	cfg, err := ParseConfig(conf)
	require.NoError(t, err)
	cfg.Budget = NewPinBudget(0) // its own budget, so that tests do not share the process's
	a, err := New(wrap(e), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		e.ClearFaults()
		if err := a.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
		assertNothingHeld(t, e)
	})
	return a, e
}

func assertNothingHeld(t testing.TB, e *emulated.Emulator) {
	t.Helper()
	l := e.Live()
	assert.Zero(t, l.HostAllocs, "MallocHost blocks left")
	assert.Zero(t, l.HostRegs, "registrations left")
	assert.Zero(t, l.Events, "events left")
	assert.Empty(t, e.Violations())
}

// mustCheck runs Check and compares the allocator's holdings with the
// emulator's, whose only user it is.
func mustCheck(t testing.TB, a *Allocator, e *emulated.Emulator) {
	t.Helper()
	require.NoError(t, a.Check())
	a.mu.Lock()
	regs, hostBlocks := 0, 0
	var hostBytes uint64
	for _, b := range a.blocks {
		if b.reg {
			regs++
		}
		if b.mallocHost() {
			hostBlocks++
			hostBytes += b.size
		}
	}
	regs += int(a.st.Registered.Current)
	if a.exp != nil {
		regs += int(a.st.Segment.Current) // every chunk is one registration
	}
	events := a.idleEvents()
	for _, ss := range a.slist {
		events += len(ss.pending())
	}
	a.mu.Unlock()
	l := e.Live()
	require.Equal(t, hostBlocks, l.HostAllocs, "MallocHost blocks")
	require.Equal(t, hostBytes, l.HostBytes, "MallocHost bytes")
	require.Equal(t, regs, l.HostRegs, "registrations")
	require.Equal(t, events, l.Events, "events")
	require.Empty(t, e.Violations())
}

func TestSizeClasses(t *testing.T) {
	for _, tc := range []struct {
		div     int
		n, size uint64
		class   int
	}{
		{1, 1, 4 * kib, 0},
		{1, 4 * kib, 4 * kib, 0},
		{1, 4*kib + 1, 8 * kib, 1},
		{1, 8*kib + 1, 16 * kib, 2},
		{1, 3 * mib, 4 * mib, 10},
		{4, 4*kib + 1, 8 * kib, 4},   // steps below a page are clamped to a page
		{4, 16*kib + 1, 20 * kib, 9}, // 2^14 + 1·2^12
		{4, 20 * kib, 20 * kib, 9},   //
		{4, 3 * mib, 3 * mib, 38},    // 2^21 + 2·2^19: (21-12)·4 + 2
		{4, 3*mib + 1, 3*mib + 512*kib, 39},
		{8, 3*mib + 1, 3*mib + 256*kib, 77},
		{1, MaxSize, MaxSize, 50},
		{8, MaxSize, MaxSize, 400},
	} {
		c := sizeClasses{shift: uint(log2(tc.div))}
		size, class := c.round(tc.n)
		assert.Equal(t, tc.size, size, "div %d, %d bytes", tc.div, tc.n)
		assert.Equal(t, tc.class, class, "div %d, %d bytes", tc.div, tc.n)
		assert.Less(t, class, c.count())
	}
}

// Every class is a whole number of pages at least as large as the request,
// wastes at most one step, is its own class, and classes order as sizes do.
func TestSizeClassProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, div := range []int{1, 2, 4, 8} {
		c := sizeClasses{shift: uint(log2(div))}
		bySize := map[uint64]int{}
		for i := 0; i < 20000; i++ {
			n := 1 + r.Uint64N(uint64(1)<<r.UintN(62))
			size, class := c.round(n)
			require.GreaterOrEqual(t, size, n)
			require.Zero(t, size%pageSize)
			k := 63 - uint(bitsLeadingZeros(n))
			require.Less(t, size-n, max(uint64(1)<<k/uint64(div), pageSize)+1, "n=%d", n)
			s2, c2 := c.round(size)
			require.Equal(t, size, s2)
			require.Equal(t, class, c2)
			if prev, ok := bySize[size]; ok {
				require.Equal(t, prev, class)
			}
			bySize[size] = class
		}
		sizes := make([]uint64, 0, len(bySize))
		for s := range bySize {
			sizes = append(sizes, s)
		}
		for _, x := range sizes {
			for _, y := range sizes[:min(len(sizes), 50)] {
				require.Equal(t, x < y, bySize[x] < bySize[y], "div %d: sizes %d, %d", div, x, y)
			}
		}
	}
}

func bitsLeadingZeros(n uint64) int {
	k := 0
	for m := uint64(1) << 63; m != 0 && n&m == 0; m >>= 1 {
		k++
	}
	return k
}

func TestCacheHitMakesNoDriverCall(t *testing.T) {
	for _, conf := range []string{"", "pinned_use_host_register:True"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newHost(t, conf)
			p, err := a.Malloc(100 * kib)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			before := e.CallCounts()
			q, err := a.Malloc(99 * kib) // same class: 104 KiB
			require.NoError(t, err)
			assert.Equal(t, p, q)
			require.NoError(t, a.Free(q))
			assert.Equal(t, before, e.CallCounts())
			st := a.Stats()
			assert.Equal(t, int64(1), st.CacheHits)
			assert.Equal(t, int64(1), st.NumHostAlloc)
			assert.Equal(t, int64(104*kib), st.ReservedBytes.Current)
			assert.Equal(t, int64(104*kib), st.AllocatedBytes.Peak)
			assert.Equal(t, int64(2*104*kib), st.AllocatedBytes.Allocated)
			assert.Zero(t, st.AllocatedBytes.Current)
			mustCheck(t, a, e)
		})
	}
}

func TestStatsFollowTheBlockStates(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(5000) // 8 KiB class
	require.NoError(t, err)
	q, err := a.Malloc(1)
	require.NoError(t, err)
	st := a.Stats()
	assert.Equal(t, int64(2), st.Allocation.Current)
	assert.Equal(t, int64(12*kib), st.AllocatedBytes.Current)
	assert.Equal(t, int64(5001), st.RequestedBytes.Current)
	require.NoError(t, e.Launch(s, p, 5000))
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	st = a.Stats()
	assert.Zero(t, st.Allocation.Current)
	assert.Equal(t, int64(1), st.Active.Current, "p is free-pending")
	assert.Equal(t, int64(8*kib), st.ActiveBytes.Current)
	assert.Equal(t, int64(2), st.Segment.Current)
	assert.Equal(t, int64(1), st.NumEventRecords)
	mustCheck(t, a, e)
	require.NoError(t, e.Complete(s))
	require.NoError(t, a.EmptyCache())
	st = a.Stats()
	assert.Zero(t, st.Active.Current)
	assert.Zero(t, st.Segment.Current)
	assert.Equal(t, int64(2), st.Segment.Peak)
	assert.Equal(t, int64(2), st.NumHostFree)
	a.ResetPeakStats()
	a.ResetAccumulatedStats()
	st = a.Stats()
	assert.Zero(t, st.Segment.Peak)
	assert.Zero(t, st.Segment.Allocated)
	assert.Zero(t, st.NumHostFree)
	mustCheck(t, a, e)
}

// A block used by work on a stream is reused only once that work has
// completed, and Free never waits for it.
func TestRecordStreamDelaysReuse(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	s1, err := e.StreamCreate(0)
	require.NoError(t, err)
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(64 * kib)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s1, p, 64*kib)) // a copy from p, pending
	require.NoError(t, e.Launch(s2, p, 4*kib))
	require.NoError(t, a.RecordStream(p, s1))
	require.NoError(t, a.RecordStream(p, s2))
	require.NoError(t, a.RecordStream(p, s1)) // twice: no-op
	before := e.CallCounts()
	require.NoError(t, a.Free(p))
	after := e.CallCounts()
	assert.Equal(t, before[backend.OpEventRecord]+2, after[backend.OpEventRecord])
	for _, op := range []backend.Op{backend.OpStreamSync, backend.OpEventSync, backend.OpDeviceSync} {
		assert.Equal(t, before[op], after[op], "Free waited: %v", op)
	}
	require.ErrorIs(t, a.Free(p), ErrDoubleFree)

	q, err := a.Malloc(64 * kib)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "p reused while copies on s1 and s2 are pending")
	require.NoError(t, a.EmptyCache()) // must not free p either
	mustCheck(t, a, e)
	require.NoError(t, e.Complete(s1))
	r, err := a.Malloc(64 * kib)
	require.NoError(t, err)
	assert.NotEqual(t, p, r, "p reused while the copy on s2 is pending")
	require.NoError(t, e.Complete(s2))
	u, err := a.Malloc(64 * kib)
	require.NoError(t, err)
	assert.Equal(t, p, u)
	for _, x := range []uintptr{q, r, u} {
		require.NoError(t, a.Free(x))
	}
	mustCheck(t, a, e)
}

// In steady state Free creates no event: the pool grows to the peak number
// of pending events.
func TestEventsArePooled(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		var ps []uintptr
		for j := 0; j < 3; j++ {
			p, err := a.Malloc(uint64(j+1) * 8 * kib)
			require.NoError(t, err)
			require.NoError(t, e.Launch(s, p, 4*kib))
			require.NoError(t, a.RecordStream(p, s))
			ps = append(ps, p)
		}
		for _, p := range ps {
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, e.Complete(s))
	}
	st := a.Stats()
	assert.Equal(t, int64(3), st.NumEventsCreate)
	assert.Equal(t, int64(300), st.NumEventRecords)
	assert.Equal(t, int64(3), e.Calls(backend.OpEventCreate))
	assert.Equal(t, int64(3), st.NumHostAlloc)
	mustCheck(t, a, e)
}

func TestDevicePointer(t *testing.T) {
	for _, conf := range []string{"", "pinned_use_host_register:True"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newHost(t, conf)
			p, err := a.Malloc(10 * kib)
			require.NoError(t, err)
			d, err := a.DevicePointer(p)
			require.NoError(t, err)
			want, err := e.HostGetDevicePointer(p)
			require.NoError(t, err)
			assert.Equal(t, want, d)
			d2, err := a.DevicePointer(p + 5000)
			require.NoError(t, err)
			assert.Equal(t, d+5000, d2)
			_, err = a.DevicePointer(p + 16*kib) // past the block
			require.ErrorIs(t, err, ErrUnknownPointer)
			mustCheck(t, a, e)
			require.NoError(t, a.Free(p))
			_, err = a.DevicePointer(p)
			require.ErrorIs(t, err, ErrUnknownPointer)
			q, err := a.Malloc(10 * kib) // the cached block keeps its device address
			require.NoError(t, err)
			require.Equal(t, p, q)
			d3, err := a.DevicePointer(q)
			require.NoError(t, err)
			assert.Equal(t, d, d3)
			require.NoError(t, a.Free(q))
			require.NoError(t, a.EmptyCache()) // unregisters before FreeHost (R19)
			assert.Zero(t, e.Live().HostRegs)
			mustCheck(t, a, e)
		})
	}
}

// mmapPages maps n bytes the test owns, for Register.
func mmapPages(t testing.TB, n int) uintptr {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	return uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
}

func TestRegister(t *testing.T) {
	a, e := newHost(t, "")
	p := mmapPages(t, 64*kib)
	require.NoError(t, a.Register(p, 32*kib, backend.HostRegisterMapped))
	require.NoError(t, a.Register(p+32*kib, 100, backend.HostRegisterPinned))
	d, err := a.DevicePointer(p + 10)
	require.NoError(t, err)
	want, err := e.HostGetDevicePointer(p + 10)
	require.NoError(t, err)
	assert.Equal(t, want, d)
	_, err = a.DevicePointer(p + 32*kib)
	require.ErrorIs(t, err, ErrNotMapped)
	require.ErrorIs(t, a.Free(p), ErrUnknownPointer)
	st := a.Stats()
	assert.Equal(t, int64(2), st.Registered.Current)
	assert.Equal(t, int64(32*kib+100), st.RegisteredBytes.Current)
	mustCheck(t, a, e)
	require.ErrorIs(t, a.Unregister(p+4*kib), ErrInteriorPointer)
	require.NoError(t, a.Unregister(p))
	require.ErrorIs(t, a.Unregister(p), ErrNotRegistered)
	_, err = a.DevicePointer(p)
	require.ErrorIs(t, err, ErrUnknownPointer)
	assert.Equal(t, 1, e.Live().HostRegs)
	mustCheck(t, a, e)
	// Close unregisters the rest.
}

// Bad input returns its typed error and changes nothing, in the allocator
// or the driver.
func TestBadInputChangesNothing(t *testing.T) {
	for _, conf := range []string{"expandable_segments:False", "expandable_segments:True"} {
		t.Run(conf, func(t *testing.T) { testBadInputChangesNothing(t, conf) })
	}
}

// testBadInputChangesNothing is TestBadInputChangesNothing under policy
// conf.
func testBadInputChangesNothing(t *testing.T, conf string) {
	a, e := newHost(t, conf, emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	gone, err := e.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.StreamDestroy(gone))
	other, err := emulated.New()
	require.NoError(t, err)
	foreign, err := other.StreamCreate(0)
	require.NoError(t, err)
	_ = foreign
	p, err := a.Malloc(20 * kib)
	require.NoError(t, err)
	freed, err := a.Malloc(4 * kib)
	require.NoError(t, err)
	require.NoError(t, a.Free(freed))
	pending, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	if conf == "expandable_segments:False" {
		// The emulator's stream work sees MallocHost memory only; under
		// manual completion the event RecordStream records stays pending
		// either way.
		require.NoError(t, e.Launch(s, pending, 1))
	}
	require.NoError(t, a.RecordStream(pending, s))
	require.NoError(t, a.Free(pending))
	own := mmapPages(t, 64*kib)
	require.NoError(t, a.Register(own, 16*kib, backend.HostRegisterMapped))

	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"Malloc 0", func() error { _, err := a.Malloc(0); return err }, ErrInvalidSize},
		{"Malloc MaxSize+1", func() error { _, err := a.Malloc(MaxSize + 1); return err }, ErrInvalidSize},
		{"Malloc 2^64-1", func() error { _, err := a.Malloc(math.MaxUint64); return err }, ErrInvalidSize},
		{"Free 0", func() error { return a.Free(0) }, ErrUnknownPointer},
		{"Free unknown", func() error { return a.Free(12345) }, ErrUnknownPointer},
		{"Free max", func() error { return a.Free(math.MaxUint64 &^ 0) }, ErrUnknownPointer},
		{"Free interior", func() error { return a.Free(p + 1) }, ErrInteriorPointer},
		{"Free cached", func() error { return a.Free(freed) }, ErrDoubleFree},
		{"Free pending", func() error { return a.Free(pending) }, ErrDoubleFree},
		{"Free registered", func() error { return a.Free(own) }, ErrUnknownPointer},
		{"RecordStream stream 0", func() error { return a.RecordStream(p, 0) }, ErrInvalidStream},
		{"RecordStream destroyed", func() error { return a.RecordStream(p, gone) }, ErrInvalidStream},
		{"RecordStream unknown", func() error { return a.RecordStream(p, 999999) }, ErrInvalidStream},
		{"RecordStream freed", func() error { return a.RecordStream(freed, s) }, ErrDoubleFree},
		{"RecordStream interior", func() error { return a.RecordStream(p+8, s) }, ErrInteriorPointer},
		{"DevicePointer unknown", func() error { _, err := a.DevicePointer(7); return err }, ErrUnknownPointer},
		{"DevicePointer freed", func() error { _, err := a.DevicePointer(freed); return err }, ErrUnknownPointer},
		{"Register 0", func() error { return a.Register(0, 4*kib, backend.HostRegisterMapped) }, ErrMisaligned},
		{"Register misaligned", func() error { return a.Register(own+32*kib+64, 4*kib, backend.HostRegisterMapped) }, ErrMisaligned},
		{"Register size 0", func() error { return a.Register(own+32*kib, 0, backend.HostRegisterMapped) }, ErrInvalidSize},
		{"Register wraps", func() error { return a.Register(own+32*kib, math.MaxUint64, backend.HostRegisterMapped) }, ErrInvalidSize},
		{"Register to 2^64", func() error { return a.Register(own, -uint64(own), backend.HostRegisterMapped) }, ErrInvalidSize},
		{"Register IOMEMORY", func() error { return a.Register(own+32*kib, 4*kib, backend.HostRegisterIOMemory) }, ErrInvalidFlags},
		{"Register READONLY", func() error { return a.Register(own+32*kib, 4*kib, backend.HostRegisterReadOnly) }, ErrInvalidFlags},
		{"Register flags 3", func() error { return a.Register(own+32*kib, 4*kib, 3) }, ErrInvalidFlags},
		{"Register over registration", func() error { return a.Register(own+12*kib, 8*kib, backend.HostRegisterMapped) }, ErrOverlap},
		{"Register under registration", func() error { return a.Register(own-4*kib, 8*kib, backend.HostRegisterPinned) }, ErrOverlap},
		{"Register over a block", func() error { return a.Register(p, 4*kib, backend.HostRegisterMapped) }, ErrOverlap},
		{"Register over a cached block", func() error { return a.Register(freed, 4*kib, backend.HostRegisterMapped) }, ErrOverlap},
		{"Unregister unknown", func() error { return a.Unregister(own + 32*kib) }, ErrNotRegistered},
		{"Unregister block", func() error { return a.Unregister(p) }, ErrNotRegistered},
		{"Unregister interior", func() error { return a.Unregister(own + 4*kib) }, ErrInteriorPointer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, calls := a.Stats(), e.CallCounts()
			err := tc.call()
			require.ErrorIs(t, err, tc.want)
			assert.Equal(t, before, a.Stats())
			assert.Equal(t, calls, e.CallCounts(), "a driver call was made")
			mustCheck(t, a, e)
		})
	}
	require.NoError(t, e.CompleteAll())
}

func TestUseAfterClose(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(4 * kib)
	require.NoError(t, err)
	q, err := a.Malloc(4 * kib)
	require.NoError(t, err)
	_, err = a.DevicePointer(q)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, p, 4*kib))
	require.NoError(t, e.Launch(s, q, 4*kib))
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p)) // pending
	own := mmapPages(t, 4*kib)
	require.NoError(t, a.Register(own, 4*kib, backend.HostRegisterPinned))
	require.NoError(t, a.Close()) // q still allocated, with pending work: FreeHostWithDevSync
	assertNothingHeld(t, e)
	for name, call := range map[string]func() error{
		"Malloc":        func() error { _, err := a.Malloc(1); return err },
		"Free":          func() error { return a.Free(q) },
		"RecordStream":  func() error { return a.RecordStream(q, s) },
		"DevicePointer": func() error { _, err := a.DevicePointer(q); return err },
		"Register":      func() error { return a.Register(own, 4*kib, backend.HostRegisterPinned) },
		"Unregister":    func() error { return a.Unregister(own) },
		"EmptyCache":    func() error { return a.EmptyCache() },
		"Check":         func() error { return a.Check() },
		"Close":         func() error { return a.Close() },
	} {
		require.ErrorIs(t, call(), ErrClosed, name)
	}
}

func TestNewRefusesDriverWithoutHostMemory(t *testing.T) {
	e, err := emulated.New()
	require.NoError(t, err)
	_, err = New(struct{ backend.Driver }{e}, DefaultConfig())
	require.ErrorIs(t, err, ErrNoHostMemory)
	_, err = New(nil, DefaultConfig())
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(e, Config{RoundupDivisions: 3})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestOutOfMemoryLadder(t *testing.T) {
	a, e := newHost(t, "", emulated.WithHostCapacity(64*kib), emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	small, err := a.Malloc(16 * kib)
	require.NoError(t, err)
	mid, err := a.Malloc(32 * kib)
	require.NoError(t, err)
	require.NoError(t, a.Free(small)) // cached
	require.NoError(t, e.Launch(s, mid, 1))
	require.NoError(t, a.RecordStream(mid, s))
	require.NoError(t, a.Free(mid)) // free-pending
	// 64 KiB fits only once both the cached and the pending block are gone.
	big, err := a.Malloc(64 * kib)
	require.NoError(t, err)
	assert.Zero(t, a.Stats().NumOOMs)
	assert.Equal(t, int64(1), e.Calls(backend.OpEventSync), "rung 2 waits for the pending event")
	assert.Empty(t, e.Violations(), "nothing freed under pending work")
	mustCheck(t, a, e)

	before := a.Stats()
	_, err = a.Malloc(4 * kib)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.ErrorIs(t, err, backend.ErrOutOfMemory)
	st := a.Stats()
	assert.Equal(t, int64(1), st.NumOOMs)
	st.NumOOMs = before.NumOOMs
	assert.Equal(t, before, st)
	require.NoError(t, a.Free(big))
	mustCheck(t, a, e)
}

// A request no driver can meet fails with ErrOutOfMemory and changes
// nothing, in both block sources.
func TestHugeRequestIsOutOfMemory(t *testing.T) {
	for _, conf := range []string{"", "pinned_use_host_register:True", "expandable_segments:True"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newHost(t, conf)
			p, err := a.Malloc(4 * kib)
			require.NoError(t, err)
			require.NoError(t, a.Free(p)) // cached: the ladder releases it
			for _, n := range []uint64{MaxSize, MaxSize - 1, 1 << 50} {
				_, err := a.Malloc(n)
				require.ErrorIs(t, err, ErrOutOfMemory, "%d bytes", n)
				require.ErrorIs(t, err, backend.ErrOutOfMemory)
			}
			st := a.Stats()
			assert.Equal(t, int64(3), st.NumOOMs)
			assert.Zero(t, st.Segment.Current)
			assert.Zero(t, st.Allocation.Current)
			mustCheck(t, a, e)
		})
	}
}

// Many goroutines share one allocator; run with -race.
func TestConcurrentUse(t *testing.T) {
	a, e := newHost(t, "")
	var streams []backend.Stream
	for i := 0; i < 4; i++ {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			var live []uintptr
			for i := 0; i < 500; i++ {
				if len(live) > 0 && r.IntN(2) == 0 {
					j := r.IntN(len(live))
					p := live[j]
					live = append(live[:j], live[j+1:]...)
					if r.IntN(2) == 0 {
						if err := a.RecordStream(p, streams[r.IntN(len(streams))]); err != nil {
							errs <- err
							return
						}
					}
					if r.IntN(4) == 0 {
						if _, err := a.DevicePointer(p + 1); err != nil {
							errs <- err
							return
						}
					}
					if err := a.Free(p); err != nil {
						errs <- err
						return
					}
					continue
				}
				p, err := a.Malloc(1 + r.Uint64N(256*kib))
				if err != nil {
					errs <- err
					return
				}
				live = append(live, p)
				if r.IntN(50) == 0 {
					if err := a.EmptyCache(); err != nil {
						errs <- err
						return
					}
				}
			}
			for _, p := range live {
				if err := a.Free(p); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	mustCheck(t, a, e)
	assert.Zero(t, a.Stats().Allocation.Current)
}

// A stream destroyed after RecordStream can be neither recorded on nor
// waited for: with a driver that cannot wait for a whole device, Free
// quarantines the block without waiting, and the block is given back with
// FreeHostWithDevSync, which completes the work that still uses it, when
// memory runs out or at Close.
func TestFreeAfterStreamDestroyed(t *testing.T) {
	a, e := newHostNoDeviceSync(t, "", emulated.WithManualCompletion(), emulated.WithHostCapacity(64*kib))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	_, err = a.DevicePointer(p) // registered: must be undone before the free
	require.NoError(t, err)
	q, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, p, 8*kib))
	require.NoError(t, e.Launch(s, q, 8*kib))
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.RecordStream(q, s))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, a.Free(p))
	st := a.Stats()
	assert.Equal(t, int64(2), st.Active.Current, "p quarantined, q allocated")
	assert.Equal(t, stats.Stat{Current: 1, Peak: 1, Allocated: 1}, st.Quarantined)
	assert.Equal(t, stats.Stat{Current: 8 * kib, Peak: 8 * kib, Allocated: 8 * kib}, st.QuarantinedBytes)
	assert.Zero(t, st.NumSyncFallback, "no wait was tried on the destroyed stream")
	assert.Equal(t, 2, e.Live().PendingWork, "Free did not wait")
	require.ErrorIs(t, a.Free(p), ErrDoubleFree)
	mustCheck(t, a, e)
	// The allocator has forgotten s: RecordStream refuses it, and q's Free
	// finds it gone without asking the driver to record on it.
	r, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	require.ErrorIs(t, a.RecordStream(r, s), ErrInvalidStream)
	require.NoError(t, a.Free(r))
	records := e.Calls(backend.OpEventRecord)
	require.NoError(t, a.Free(q))
	assert.Equal(t, records, e.Calls(backend.OpEventRecord))
	assert.Equal(t, int64(2), a.Stats().Quarantined.Current)
	mustCheck(t, a, e)
	// Out of memory: the quarantined blocks go back through
	// FreeHostWithDevSync (r, cached, is released too).
	big, err := a.Malloc(64 * kib)
	require.NoError(t, err)
	assert.Zero(t, e.Live().PendingWork)
	assert.Empty(t, e.Violations())
	st = a.Stats()
	assert.Equal(t, int64(1), st.Segment.Current)
	assert.Equal(t, int64(1), st.Active.Current)
	assert.Zero(t, st.Quarantined.Current)
	assert.Zero(t, st.QuarantinedBytes.Current)
	require.NoError(t, a.Free(big))
	mustCheck(t, a, e)
}

// In pinned_use_host_register mode nothing can wait for the work of a
// destroyed stream on OS memory, so a quarantined block is never reused and
// is released only at Close.
func TestQuarantinedOSMemoryWaitsForClose(t *testing.T) {
	a, e := newHostNoDeviceSync(t, "pinned_use_host_register:True")
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	q, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	assert.NotEqual(t, p, q)
	assert.Equal(t, int64(2), a.Stats().Segment.Current)
	mustCheck(t, a, e)
	require.NoError(t, a.Close())
	assertNothingHeld(t, e)
}

// Goroutines free blocks recorded on held streams while another completes
// the streams' work: stream-ordered reuse under concurrency (run with
// -race). No block may be handed out while work queued on it is pending.
func TestConcurrentStreamOrderedReuse(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	var streams []backend.Stream
	for i := 0; i < 3; i++ {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	// inUse counts, per block address, the work items queued on it and not
	// yet known complete; guarded by mu.
	var mu sync.Mutex
	inUse := map[uintptr]int{}
	type item struct {
		p uintptr
		s backend.Stream
	}
	var queued []item // launched work in launch order per stream; guarded by mu
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the device: completes one stream's work from time to time
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := streams[i%len(streams)]
			mu.Lock()
			if err := e.Complete(s); err == nil {
				kept := queued[:0]
				for _, it := range queued {
					if it.s == s {
						inUse[it.p]--
					} else {
						kept = append(kept, it)
					}
				}
				queued = kept
			}
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for i := 0; i < 300; i++ {
				p, err := a.Malloc(uint64(1+r.IntN(4)) * 16 * kib)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				busy := inUse[p]
				s := streams[r.IntN(len(streams))]
				err = e.Launch(s, p, 4*kib)
				if err == nil {
					inUse[p]++
					queued = append(queued, item{p, s})
				}
				mu.Unlock()
				if busy > 0 {
					errs <- fmt.Errorf("block %#x handed out with %d work items pending", p, busy)
					return
				}
				if err == nil {
					err = a.RecordStream(p, s)
				}
				if err == nil {
					err = a.Free(p)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(stop)
	<-done
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, e.CompleteAll())
	require.NoError(t, a.EmptyCache())
	mustCheck(t, a, e)
	assert.Zero(t, a.Stats().Segment.Current)
}

// What only the driver knows, such as a range registered behind the
// allocator's back, comes back as the driver's *backend.Error, and changes
// nothing.
func TestRegisterDriverRefusal(t *testing.T) {
	a, e := newHost(t, "")
	p := mmapPages(t, 16*kib)
	require.NoError(t, e.HostRegister(p+4*kib, 4*kib, backend.HostRegisterPinned))
	defer func() { require.NoError(t, e.HostUnregister(p+4*kib)) }()
	before := a.Stats()
	err := a.Register(p, 16*kib, backend.HostRegisterMapped)
	var be *backend.Error
	require.True(t, errors.As(err, &be), "%v", err)
	assert.Equal(t, backend.OpHostRegister, be.Op)
	assert.Equal(t, "R19", be.Rule)
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	assert.Equal(t, before, a.Stats())
	_, err = a.DevicePointer(p)
	require.ErrorIs(t, err, ErrUnknownPointer)
	require.NoError(t, a.Check())
}

// With a driver that can wait for a whole device, Free of a block whose
// stream was destroyed still does not wait (a device synchronize there
// would wait for unrelated work): the block is quarantined and
// counted, never reused while the destroyed stream's work may touch it,
// and EmptyCache ends the quarantine with one device synchronize, after
// which the block is reused.
func TestFreeAfterStreamDestroyedDeviceSync(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	other, err := e.StreamCreate(0) // unrelated work Free must not wait for
	require.NoError(t, err)
	p, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, p, 8*kib))
	require.NoError(t, e.Launch(other, 0, 0))
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, e.StreamDestroy(s))
	calls := e.CallCounts()
	require.NoError(t, a.Free(p))
	after := e.CallCounts()
	for _, op := range []backend.Op{backend.OpDeviceSync, backend.OpStreamSync, backend.OpEventSync} {
		assert.Equal(t, calls[op], after[op], "Free waited: %v", op)
	}
	assert.Equal(t, 2, e.Live().PendingWork, "neither the destroyed stream's work nor the other's completed")
	st := a.Stats()
	assert.Equal(t, int64(1), st.Quarantined.Current)
	assert.Equal(t, int64(8*kib), st.QuarantinedBytes.Current)
	assert.Equal(t, int64(1), st.Active.Current, "quarantined blocks are active")
	require.ErrorIs(t, a.Free(p), ErrDoubleFree)
	mustCheck(t, a, e)

	q, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "a quarantined block is not reused")
	require.NoError(t, a.Free(q))

	require.NoError(t, a.EmptyCache())
	assert.Equal(t, calls[backend.OpDeviceSync]+1, e.Calls(backend.OpDeviceSync), "one device synchronize")
	assert.Zero(t, e.Live().PendingWork, "the destroyed stream's work completed")
	st = a.Stats()
	assert.Zero(t, st.Quarantined.Current)
	assert.Zero(t, st.QuarantinedBytes.Current)
	assert.Equal(t, int64(1), st.NumDeviceSyncs)
	assert.Zero(t, st.Segment.Current, "both blocks given back")
	assert.Empty(t, e.Violations())
	mustCheck(t, a, e)
	syncs := e.Calls(backend.OpDeviceSync)
	require.NoError(t, a.EmptyCache())
	assert.Equal(t, syncs, e.Calls(backend.OpDeviceSync), "no quarantine, no wait")
	require.NoError(t, e.StreamDestroy(other))
}
