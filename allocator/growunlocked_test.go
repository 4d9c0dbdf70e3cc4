package allocator

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// mapGateDriver is a holdDriver (interleave_growth_test.go) for one
// primitive op (OpCreate, OpMap, OpSetAccess or OpUnmap): once armed, its
// next call of op blocks until the test opens the gate, then fails with
// fail if it is set.
type mapGateDriver struct {
	*holdDriver
	op   backend.Op
	fail error     // returned by the gated call instead of calling the driver
	held *heldCall // the blocked call, between waitEntered and open
}

func newMapGateDriver(t *testing.T, op backend.Op, opts ...emulated.Option) *mapGateDriver {
	t.Helper()
	return &mapGateDriver{holdDriver: newHoldDriver(t, opts...), op: op}
}

// arm makes the next call of op block.
func (d *mapGateDriver) arm() { d.hold(d.op, 1) }

// waitEntered waits until the gated call blocks.
func (d *mapGateDriver) waitEntered(t *testing.T) {
	t.Helper()
	d.held = d.next(t)
}

// open lets the gated call go on (idempotent); with none blocked, every
// later call passes. Callers also defer it after deferring the
// allocator's Close, so that a failed test never leaves Close waiting.
func (d *mapGateDriver) open() {
	if c := d.held; c != nil {
		d.held = nil
		c.goOn(d.fail)
		return
	}
	d.releaseAll()
}

type growResult struct {
	p   uintptr
	err error
}

// growAsync runs Malloc on its own goroutine.
func growAsync(a *Allocator, size uint64, s backend.Stream) <-chan growResult {
	ch := make(chan growResult, 1)
	go func() {
		p, err := a.Malloc(size, s)
		ch <- growResult{p, err}
	}()
	return ch
}

func recvGrow[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("%s did not complete", what)
		panic("unreachable")
	}
}

// inflightWaits is Allocator.inflight, read under the lock.
func (a *Allocator) inflightWaits() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inflight
}

// TestGrowthDriverCallsWithoutLock blocks a growth inside each of its
// driver calls (handle creation, map, set access) and proves that
// meanwhile another goroutine's cache-hit Malloc and Free on another
// stream complete, Stats answers, and the growth's memory is counted only
// once it is committed.
func TestGrowthDriverCallsWithoutLock(t *testing.T) {
	for _, op := range []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess} {
		t.Run(op.String(), func(t *testing.T) {
			drv := newMapGateDriver(t, op)
			a, err := New(drv, DefaultConfig())
			require.NoError(t, err)
			defer a.Close()
			defer drv.open()
			s1, err := drv.StreamCreate(0)
			require.NoError(t, err)
			s2, err := drv.StreamCreate(0)
			require.NoError(t, err)
			warm, err := a.Malloc(1<<20, s2)
			require.NoError(t, err)
			require.NoError(t, a.Free(warm))
			before := a.MemoryReserved()

			drv.arm()
			grow := growAsync(a, 48<<20, s1)
			drv.waitEntered(t)

			hits := make(chan error, 1)
			go func() {
				for i := 0; i < 1000; i++ {
					p, err := a.Malloc(1<<20, s2)
					if err == nil {
						err = a.Free(p)
					}
					if err != nil {
						hits <- err
						return
					}
				}
				hits <- nil
			}()
			require.NoError(t, recvGrow(t, hits, "cache-hit Malloc/Free during the growth's driver call"))
			assert.Equal(t, before, a.MemoryReserved(), "reserved counts the growth before it is committed")
			assert.Equal(t, before, uint64(a.Stats().ReservedBytes[0].Current))

			drv.open()
			r := recvGrow(t, grow, "the growing Malloc")
			require.NoError(t, r.err)
			assert.Equal(t, before+48<<20, a.MemoryReserved())
			require.NoError(t, a.Check())
			require.NoError(t, a.Free(r.p))
			require.NoError(t, a.Check())
		})
	}
}

// TestMallocWaitsForGrowthInFlight: with room for one 48 MiB growth under
// the memory fraction cap, a Malloc that needs memory while another
// goroutine's growth maps without the lock waits for it; when that growth
// fails, the waiting Malloc gets the memory instead of an out-of-memory
// error.
func TestMallocWaitsForGrowthInFlight(t *testing.T) {
	drv := newMapGateDriver(t, backend.OpMap, emulated.WithCapacity(128<<20))
	drv.fail = backend.Errorf(backend.OpMap, backend.ErrInvalidArgument, "", "injected")
	cfg := DefaultConfig()
	cfg.PerProcessMemoryFraction = 0.5 // 64 MiB
	a, err := New(drv, cfg)
	require.NoError(t, err)
	defer a.Close()
	defer drv.open()
	s1, err := drv.StreamCreate(0)
	require.NoError(t, err)
	s2, err := drv.StreamCreate(0)
	require.NoError(t, err)

	drv.arm()
	first := growAsync(a, 48<<20, s1)
	drv.waitEntered(t)
	second := growAsync(a, 48<<20, s2)
	waitInflight(t, a, 2) // the growth, and the second Malloc waiting for it
	drv.open()

	r1 := recvGrow(t, first, "the failing growth")
	require.ErrorIs(t, r1.err, backend.ErrInvalidArgument)
	r2 := recvGrow(t, second, "the waiting Malloc")
	require.NoError(t, r2.err, "the waiting Malloc failed while the growth in flight held the memory")
	assert.Equal(t, uint64(48<<20), a.MemoryReserved())
	assert.Zero(t, a.Stats().NumOOMs)
	require.NoError(t, a.Check())
	require.NoError(t, a.Free(r2.p))
}

// TestReleaseStreamDuringGrowth releases the stream whose Malloc is
// mapping without the lock: ReleaseStream completes meanwhile, the Malloc
// fails with ErrInvalidStream, and the memory it mapped goes to the idle
// owner, so EmptyCache returns all of it to the driver.
func TestReleaseStreamDuringGrowth(t *testing.T) {
	drv := newMapGateDriver(t, backend.OpMap)
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	defer drv.open()
	s1, err := drv.StreamCreate(0)
	require.NoError(t, err)

	drv.arm()
	grow := growAsync(a, 48<<20, s1)
	drv.waitEntered(t)
	rel := make(chan error, 1)
	go func() { rel <- a.ReleaseStream(s1) }()
	require.NoError(t, recvGrow(t, rel, "ReleaseStream during a growth"))
	drv.open()

	r := recvGrow(t, grow, "the growing Malloc")
	require.ErrorIs(t, r.err, ErrInvalidStream)
	require.NoError(t, a.Check())
	assert.Equal(t, uint64(48<<20), a.MemoryReserved(), "the mapped memory is counted where it went")
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Check())
	assert.Zero(t, a.MemoryReserved())
	live := drv.Live()
	assert.Zero(t, live.Mappings)
	assert.Zero(t, live.Handles)
}

// TestCloseDuringGrowth closes the allocator while a growth maps without
// the lock: Close waits for it, and afterwards the driver holds nothing
// of the allocator's.
func TestCloseDuringGrowth(t *testing.T) {
	drv := newMapGateDriver(t, backend.OpMap)
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	s1, err := drv.StreamCreate(0)
	require.NoError(t, err)

	drv.arm()
	grow := growAsync(a, 48<<20, s1)
	drv.waitEntered(t)
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	checked := make(chan error, 1)
	go func() { checked <- a.Check() }()
	// Both wait for the growth: neither can return before it ends.
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a growth mapped", err)
	case <-reachedWaits(a, func() bool { return a.quiescing == 2 }):
	case <-time.After(guard):
		t.Fatal("Close and Check never waited for the growth")
	}
	drv.open()
	r := recvGrow(t, grow, "the growing Malloc")
	if r.err != nil {
		require.ErrorIs(t, r.err, ErrClosed)
	}
	require.NoError(t, recvGrow(t, closed, "Close"))
	if err := recvGrow(t, checked, "Check"); err != nil {
		require.ErrorIs(t, err, ErrClosed)
	}
	live := drv.Live()
	assert.Zero(t, live.Mappings)
	assert.Zero(t, live.Handles)
	assert.Zero(t, live.Reservations)
}

// TestGrowthFaultsWithoutLock injects a failure at each driver step of a
// 48 MiB growth (three handles: 20, 20 and 8 MiB) made without the lock,
// while another goroutine's cache hits run on another stream: the Malloc
// fails with the injected error, nothing is counted, no handle leaks, and
// the next Malloc succeeds.
func TestGrowthFaultsWithoutLock(t *testing.T) {
	cases := []struct {
		op backend.Op
		n  int
	}{
		{backend.OpCreate, 1}, {backend.OpCreate, 3},
		{backend.OpMap, 1}, {backend.OpMap, 2}, {backend.OpMap, 3},
		{backend.OpSetAccess, 1}, {backend.OpSetAccess, 3},
	}
	for _, tc := range cases {
		t.Run(tc.op.String()+"#"+string(rune('0'+tc.n)), func(t *testing.T) {
			e, err := emulated.New()
			require.NoError(t, err)
			defer e.Close()
			a, err := New(e, DefaultConfig())
			require.NoError(t, err)
			defer a.Close()
			s1, err := e.StreamCreate(0)
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			warm, err := a.Malloc(1<<20, s2)
			require.NoError(t, err)
			require.NoError(t, a.Free(warm))
			before := a.MemoryReserved()
			liveBefore := e.Live()

			stop := make(chan struct{})
			hits := make(chan error, 1)
			go func() {
				for {
					select {
					case <-stop:
						hits <- nil
						return
					default:
					}
					p, err := a.Malloc(1<<20, s2)
					if err == nil {
						err = a.Free(p)
					}
					if err != nil {
						hits <- err
						return
					}
				}
			}()
			require.NoError(t, e.FailNth(tc.op, tc.n, backend.ErrInvalidArgument))
			_, err = a.Malloc(48<<20, s1)
			close(stop)
			require.NoError(t, recvGrow(t, hits, "cache hits"))
			require.ErrorIs(t, err, backend.ErrInvalidArgument)
			var be *backend.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, tc.op, be.Op)
			assert.Equal(t, before, a.MemoryReserved())
			require.NoError(t, a.Check())
			live := e.Live()
			assert.Equal(t, liveBefore.Mappings, live.Mappings, "mapping leaked")
			assert.Equal(t, liveBefore.Handles, live.Handles, "handle leaked")

			p, err := a.Malloc(48<<20, s1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Check())
		})
	}
}

// TestReleaseUnmapsWithoutLock blocks EmptyCache's first driver Unmap (of
// a free 48 MiB block of one stream, after that stream's synchronize)
// and proves that meanwhile cache hits on another stream complete, the
// memory stays counted until the unmap commits, and afterwards every
// free handle is gone.
func TestReleaseUnmapsWithoutLock(t *testing.T) {
	drv := newMapGateDriver(t, backend.OpUnmap)
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	defer drv.open()
	s1, err := drv.StreamCreate(0)
	require.NoError(t, err)
	s2, err := drv.StreamCreate(0)
	require.NoError(t, err)
	keep, err := a.Malloc(4096, s2) // keeps s2's small page mapped
	require.NoError(t, err)
	big, err := a.Malloc(48<<20, s1)
	require.NoError(t, err)
	require.NoError(t, a.Free(big))
	before := a.MemoryReserved()

	drv.arm()
	emptied := make(chan error, 1)
	go func() { emptied <- a.EmptyCache() }()
	drv.waitEntered(t)
	hits := make(chan error, 1)
	go func() {
		for i := 0; i < 1000; i++ {
			p, err := a.Malloc(1<<20, s2)
			if err == nil {
				err = a.Free(p)
			}
			if err != nil {
				hits <- err
				return
			}
		}
		hits <- nil
	}()
	require.NoError(t, recvGrow(t, hits, "cache-hit Malloc/Free during a release's unmap"))
	assert.Equal(t, before, a.MemoryReserved(), "reserved dropped before the unmap committed")
	drv.open()
	require.NoError(t, recvGrow(t, emptied, "EmptyCache"))
	assert.Equal(t, before-48<<20, a.MemoryReserved())
	require.NoError(t, a.Check())
	require.NoError(t, a.Free(keep))
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Check())
	assert.Zero(t, a.MemoryReserved())
	live := drv.Live()
	assert.Zero(t, live.Mappings)
	assert.Zero(t, live.Handles)
}

// TestReleaseUnmapFaultWithoutLock fails the second driver Unmap of a
// release made without the lock (a free 48 MiB block: handles of 20, 20
// and 8 MiB): EmptyCache reports it, the first handle is released and
// uncounted, the rest stays mapped and free, and the next EmptyCache
// releases it.
func TestReleaseUnmapFaultWithoutLock(t *testing.T) {
	e, err := emulated.New()
	require.NoError(t, err)
	defer e.Close()
	a, err := New(e, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s1, err := e.StreamCreate(0)
	require.NoError(t, err)
	big, err := a.Malloc(48<<20, s1)
	require.NoError(t, err)
	require.NoError(t, a.Free(big))
	require.NoError(t, e.FailNth(backend.OpUnmap, 2, backend.ErrInvalidArgument))
	err = a.EmptyCache()
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	assert.Equal(t, uint64(28<<20), a.MemoryReserved())
	require.NoError(t, a.Check())
	assert.Equal(t, 2, e.Live().Mappings)
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Check())
	assert.Zero(t, a.MemoryReserved())
	assert.Zero(t, e.Live().Mappings)
	assert.Zero(t, e.Live().Handles)
}

// TestAwaitGrowthsIgnoresLaterGrowths: a Malloc waiting for the growth in
// flight returns when that growth ends, even if another growth has
// started meanwhile (a goroutine growing again and again must not starve
// it). The growths are simulated by their tickets.
func TestAwaitGrowthsIgnoresLaterGrowths(t *testing.T) {
	a, e := newAlloc(t, "")
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	a.mu.Lock()
	ss, err := a.stream(s)
	a.growSeq, a.growths = 1, []uint64{1}
	a.mu.Unlock()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, err := a.awaitGrowths(ss, &a.classes[largeIdx], 1<<20)
		done <- err
	}()
	waitInflight(t, a, 1)
	a.mu.Lock()
	a.growSeq, a.growths = 2, []uint64{2} // 1 ended, 2 started
	a.grown.Broadcast()
	a.mu.Unlock()
	require.NoError(t, recvGrow(t, done, "awaitGrowths"))
	a.mu.Lock()
	a.growths = nil
	a.mu.Unlock()
}

// TestGrowthNeighbourTakenMeanwhile: a growth counts on the free block of
// its stream just below the range it maps (it maps only the rest); while
// it maps without the lock, another goroutine allocates that block. The
// growth keeps what it mapped free on the stream and grows again, so its
// Malloc still gets a block of the size it asked for.
func TestGrowthNeighbourTakenMeanwhile(t *testing.T) {
	const mib = 1 << 20
	drv := newMapGateDriver(t, backend.OpMap)
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	defer drv.open()
	s1, err := drv.StreamCreate(0)
	require.NoError(t, err)
	low, err := a.Malloc(20*mib, s1)
	require.NoError(t, err)
	require.NoError(t, a.Free(low)) // [0, 20) MiB free on s1

	drv.arm()
	grow := growAsync(a, 30*mib, s1) // maps [20, 30) to merge with [0, 20)
	drv.waitEntered(t)
	taken, err := a.Malloc(20*mib, s1) // the neighbour, meanwhile
	require.NoError(t, err)
	assert.Equal(t, low, taken)
	drv.open()

	r := recvGrow(t, grow, "the growing Malloc")
	require.NoError(t, r.err)
	assert.Equal(t, low+20*mib, r.p, "the block starts at the range mapped first")
	assert.Equal(t, uint64(50*mib), a.MemoryReserved())
	assert.Equal(t, uint64(50*mib), a.MemoryAllocated())
	require.NoError(t, a.Check())
	require.NoError(t, a.Free(r.p))
	require.NoError(t, a.Free(taken))
	require.NoError(t, a.Check())
}
