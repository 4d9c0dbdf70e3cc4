package allocator

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// blockStream is the stream id the heap labels the block at p with, from
// Snapshot; 0 when no block starts at p.
func blockStream(t *testing.T, a *Allocator, p uintptr) uint64 {
	t.Helper()
	for _, sg := range a.Snapshot().Segments {
		for _, b := range sg.Blocks {
			if b.Address == p {
				return b.Stream
			}
		}
	}
	return 0
}

// TestReleasedStateNotReusedDuringWait: while a Malloc on s waits for s
// without the lock (defrag before a growth), ReleaseStream(s) returns and
// a new stream s2 is learnt. The state s had may be kept for reuse, but
// not handed to s2 while the Malloc still holds it: the Malloc must fail
// with ErrInvalidStream, or succeed with a block of s, never one of s2
// (which s2 would reuse while work queued on s still uses it).
func TestReleasedStateNotReusedDuringWait(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	var ptrs []uintptr
	for i := 0; i < 8; i++ {
		p, err := a.Malloc(20<<20, s)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
	}
	for i := 0; i < len(ptrs); i += 2 {
		require.NoError(t, a.Free(ptrs[i]))
	}
	d.hold(s, nil)
	type result struct {
		p   uintptr
		err error
	}
	grown := make(chan result, 1)
	go func() {
		p, err := a.Malloc(100<<20, s) // defrag: waits for s with holes marked
		grown <- result{p, err}
	}()
	d.awaitHeld(t)
	require.NoError(t, within(t, "ReleaseStream", func() error { return a.ReleaseStream(s) }))
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	var q uintptr
	require.NoError(t, within(t, "Malloc on a new stream", func() (err error) {
		q, err = a.Malloc(1<<20, s2)
		return err
	}))
	d.release()
	r := <-grown
	if r.err != nil {
		assert.ErrorIs(t, r.err, ErrInvalidStream)
	} else {
		assert.NotEqual(t, uint64(s2), blockStream(t, a, r.p), "Malloc on s returned a block of s2")
		require.NoError(t, a.Free(r.p))
	}
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Check())
	for i := 1; i < len(ptrs); i += 2 {
		require.NoError(t, a.Free(ptrs[i]))
	}
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
	assert.Zero(t, reserved(a))
	assert.Empty(t, d.Violations())
	require.NoError(t, a.Check())
	_ = backend.Stream(0)
}

// TestFaultsDuringLargeGrowthAndDefrag injects each driver fault, at each
// call of its kind, into growths that map 64 MiB handles (segment.MapLarge)
// after a defragmentation that unmaps holes (unmap faults included).
// A failed Malloc changes nothing the caller sees: allocated, active and
// requested bytes and counts; reserved bytes may only have dropped (the
// defrag before the growth is kept); the driver holds exactly what the
// allocator accounts for (Check against the emulator), no handle leaks,
// and the allocator serves the same request once the fault is cleared.
func TestFaultsDuringLargeGrowthAndDefrag(t *testing.T) {
	const mib = 1 << 20
	ops := []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess, backend.OpUnmap, backend.OpFree, backend.OpReserve, backend.OpStreamSync}
	for _, op := range ops {
		for k := 1; k <= 4; k++ {
			t.Run(fmt.Sprintf("%s#%d", op, k), func(t *testing.T) {
				a, e := newAlloc(t, "handle_cache_mb:0", emulated.WithCapacity(8<<30))
				// Holes of 60 MiB between pins, then a peak of 364 MiB
				// allocated is passed, so the 300 MiB growth below first
				// unmaps holes (defrag), then maps 64 MiB handles.
				var held []uintptr
				for _, n := range []uint64{60, 2, 60, 2, 60, 2} {
					p, err := a.Malloc(n*mib, 0)
					require.NoError(t, err)
					held = append(held, p)
				}
				for _, i := range []int{0, 2, 4} {
					require.NoError(t, a.Free(held[i]))
				}
				mustCheck(t, a, e)
				before := a.Stats()
				liveBefore := e.Live()
				require.NoError(t, e.FailNth(op, k, backend.ErrUnavailable))
				p, err := a.Malloc(300*mib, 0)
				fired := e.Failures(op)
				e.ClearFaults()
				after := a.Stats()
				switch op {
				case backend.OpCreate, backend.OpMap, backend.OpSetAccess:
					// The k-th of the growth's five 64 MiB handles fails.
					require.EqualValues(t, 1, fired)
					require.Error(t, err)
				case backend.OpUnmap:
					// The defrag's unmap fails: the growth goes on.
					require.EqualValues(t, 1, fired)
					require.NoError(t, err)
				}
				if err != nil {
					assert.ErrorIs(t, err, backend.ErrUnavailable)
					assert.Zero(t, p)
					for _, c := range []struct {
						name    string
						was, is stats.StatArray
					}{
						{"allocated", before.AllocatedBytes, after.AllocatedBytes},
						{"allocations", before.Allocation, after.Allocation},
						{"active", before.ActiveBytes, after.ActiveBytes},
						{"requested", before.RequestedBytes, after.RequestedBytes},
					} {
						assert.Equal(t, c.was[stats.AllPools].Current, c.is[stats.AllPools].Current, c.name)
					}
					assert.LessOrEqual(t, after.ReservedBytes[stats.AllPools].Current, before.ReservedBytes[stats.AllPools].Current)
					assert.LessOrEqual(t, e.Live().MappedBytes, liveBefore.MappedBytes)
				} else {
					// What the fault did not hit: the defrag unmapped
					// holes, the growth mapped 64 MiB handles.
					if fired == 0 {
						assert.Less(t, after.ReservedBytes[stats.AllPools].Current, before.ReservedBytes[stats.AllPools].Current+300*mib, "defrag unmapped holes")
					}
					var large int
					for _, h := range e.Handles() {
						if h.Size == 64*mib {
							large++
						}
					}
					assert.GreaterOrEqual(t, large, 4, "64 MiB growth handles")
					require.NoError(t, a.Free(p))
				}
				mustCheck(t, a, e)
				live := e.Live()
				assert.Equal(t, uint64(a.MemoryReserved()), live.MappedBytes, "mapped bytes the driver holds")
				assert.Zero(t, live.FreedPending)
				p, err = a.Malloc(300*mib, 0)
				require.NoError(t, err)
				require.NoError(t, a.Free(p))
				for _, i := range []int{1, 3, 5} {
					require.NoError(t, a.Free(held[i]))
				}
				mustCheck(t, a, e)
				require.NoError(t, a.EmptyCache())
				assert.Zero(t, a.MemoryReserved())
				assert.Zero(t, e.Live().Handles, "no handle left once the cache is empty")
				mustCheck(t, a, e)
			})
		}
	}
}

// TestReleaseStreamDuringEmptyCacheWait: EmptyCache waits (without the
// lock) for stream s before unmapping s's free handles, marked Releasing;
// meanwhile ReleaseStream(s) returns and the caller destroys s. Whether
// EmptyCache's wait then succeeds or fails (the stream is gone), the
// marked memory ends with the idle owner and is returned, EmptyCache
// reports no error, and no block is left on the forgotten stream.
func TestReleaseStreamDuringEmptyCacheWait(t *testing.T) {
	for _, c := range []struct {
		name string
		fail error
	}{{"wait succeeds", nil}, {"wait fails: stream destroyed", backend.ErrInvalidArgument}} {
		t.Run(c.name, func(t *testing.T) {
			d := newGateDriver(t, emulated.WithManualCompletion())
			a, err := New(d, DefaultConfig())
			require.NoError(t, err)
			defer a.Close()
			s, err := d.StreamCreate(0)
			require.NoError(t, err)
			keep, err := a.Malloc(1<<20, 0) // the default stream keeps a block
			require.NoError(t, err)
			p, err := a.Malloc(60<<20, s)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.Equal(t, uint64(62<<20), a.MemoryReserved())

			d.hold(s, c.fail)
			emptied := make(chan error, 1)
			go func() { emptied <- a.EmptyCache() }()
			d.awaitHeld(t)
			require.NoError(t, within(t, "ReleaseStream", func() error { return a.ReleaseStream(s) }))
			require.NoError(t, d.StreamDestroy(s))
			d.release()
			require.NoError(t, <-emptied)
			require.NoError(t, a.Check())
			require.NoError(t, a.EmptyCache())
			assert.Equal(t, uint64(2<<20), a.MemoryReserved(), "only the default stream's page is left")
			require.NoError(t, a.Free(keep))
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, a.MemoryReserved())
			assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
			assert.Empty(t, d.Violations())
			require.NoError(t, a.Check())
		})
	}
}

// TestCallsDuringFreeFallbackWait: while Free(p) waits without the lock
// for a stream recorded on p (its event record failed), each other call
// that touches p's streams runs to completion; when the wait ends, p is
// free exactly once, no memory is lost or double counted, and the
// invariants hold.
func TestCallsDuringFreeFallbackWait(t *testing.T) {
	for _, c := range []struct {
		name   string
		during func(a *Allocator, owner, recorded backend.Stream) error
	}{
		{"ReleaseStream of the owner", func(a *Allocator, owner, _ backend.Stream) error { return a.ReleaseStream(owner) }},
		{"ReleaseStream of the recorded stream", func(a *Allocator, _, rec backend.Stream) error { return a.ReleaseStream(rec) }},
		{"EmptyCache", func(a *Allocator, _, _ backend.Stream) error { return a.EmptyCache() }},
		{"Synchronize the owner", func(a *Allocator, owner, _ backend.Stream) error { return a.Synchronize(owner) }},
		{"pair on the owner", func(a *Allocator, owner, _ backend.Stream) error { return pairOn(a, owner)() }},
		{"Malloc 100 MiB on the owner", func(a *Allocator, owner, _ backend.Stream) error {
			q, err := a.Malloc(100<<20, owner)
			if err != nil {
				return err
			}
			return a.Free(q)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newGateDriver(t, emulated.WithManualCompletion())
			a, err := New(d, DefaultConfig())
			require.NoError(t, err)
			defer a.Close()
			owner, err := d.StreamCreate(0)
			require.NoError(t, err)
			rec, err := d.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(30<<20, owner)
			require.NoError(t, err)
			require.NoError(t, d.Launch(rec, p, 4096))
			require.NoError(t, a.RecordStream(p, rec))
			require.NoError(t, d.FailNth(backend.OpEventRecord, 1, backend.ErrUnavailable))

			d.hold(rec, nil)
			freed := make(chan error, 1)
			go func() { freed <- a.Free(p) }()
			d.awaitHeld(t)
			require.NoError(t, within(t, c.name, func() error { return c.during(a, owner, rec) }))
			assert.ErrorIs(t, within(t, "second Free", func() error { return a.Free(p) }), ErrDoubleFree)
			d.release()
			require.NoError(t, <-freed)
			// p is free once: a second Free is refused (ErrUnknownPointer
			// once its memory went back to the driver).
			err = a.Free(p)
			assert.True(t, errors.Is(err, ErrDoubleFree) || errors.Is(err, ErrUnknownPointer), "%v", err)
			require.NoError(t, a.Check())
			assert.Zero(t, a.MemoryAllocated())
			assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, a.MemoryReserved())
			assert.Empty(t, d.Violations())
			require.NoError(t, a.Check())
		})
	}
}

// TestReleaseAndDestroyDuringWaits: a call waits without the lock for
// stream s (Synchronize; a Malloc whose defrag unmaps s's holes;
// EmptyCache) while the caller releases and destroys s; the wait then
// succeeds or fails as on a destroyed stream. The waiting call returns
// nil or ErrInvalidStream, nothing is left on the forgotten stream, and
// all memory goes back.
func TestReleaseAndDestroyDuringWaits(t *testing.T) {
	waiters := []struct {
		name string
		call func(a *Allocator, s backend.Stream) error
	}{
		{"Synchronize", func(a *Allocator, s backend.Stream) error { return a.Synchronize(s) }},
		{"Malloc with defrag", func(a *Allocator, s backend.Stream) error {
			p, err := a.Malloc(100<<20, s)
			if err != nil {
				return err
			}
			return a.Free(p)
		}},
		{"EmptyCache", func(a *Allocator, _ backend.Stream) error { return a.EmptyCache() }},
	}
	for _, w := range waiters {
		for _, fail := range []error{nil, backend.ErrInvalidArgument} {
			t.Run(fmt.Sprintf("%s/%v", w.name, fail), func(t *testing.T) {
				d := newGateDriver(t, emulated.WithManualCompletion())
				a, err := New(d, DefaultConfig())
				require.NoError(t, err)
				defer a.Close()
				s, err := d.StreamCreate(0)
				require.NoError(t, err)
				var ptrs []uintptr
				for i := 0; i < 8; i++ {
					p, err := a.Malloc(20<<20, s)
					require.NoError(t, err)
					require.NoError(t, d.Launch(s, p, 4096))
					ptrs = append(ptrs, p)
				}
				for i := 0; i < len(ptrs); i += 2 {
					require.NoError(t, a.Free(ptrs[i]))
				}
				require.NoError(t, a.Synchronize(s))
				d.hold(s, fail)
				done := make(chan error, 1)
				go func() { done <- w.call(a, s) }()
				d.awaitHeld(t)
				require.NoError(t, within(t, "ReleaseStream", func() error { return a.ReleaseStream(s) }))
				require.NoError(t, d.StreamDestroy(s))
				d.release()
				if err := <-done; err != nil {
					assert.ErrorIs(t, err, ErrInvalidStream)
				}
				require.NoError(t, a.Check())
				for i := 1; i < len(ptrs); i += 2 {
					require.NoError(t, a.Free(ptrs[i]))
				}
				require.NoError(t, a.EmptyCache())
				assert.Zero(t, a.MemoryReserved())
				assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
				assert.Zero(t, a.Stats().StrandedBytes)
				assert.Empty(t, d.Violations())
				require.NoError(t, a.Check())
			})
		}
	}
}

// TestFreeToReleasingStream: while ReleaseStream(s) waits for s, the
// caller queues work on s that uses block p of s, then frees p (its last
// use, queued before the Free, as stream order allows). ReleaseStream must
// not unmap p's memory under that work: it waits for s again.
func TestFreeToReleasingStream(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(40<<20, s)
	require.NoError(t, err)
	d.hold(s, nil)
	released := make(chan error, 1)
	go func() { released <- a.ReleaseStream(s) }()
	d.awaitHeld(t)
	require.NoError(t, d.Launch(s, p, 40<<20)) // queued after the wait began
	require.NoError(t, within(t, "Free", func() error { return a.Free(p) }))
	d.release()
	require.NoError(t, <-released)
	assert.Empty(t, d.Violations(), "memory unmapped under work queued on the stream")
	pending, err := d.Pending(s)
	require.NoError(t, err)
	assert.Zero(t, pending, "ReleaseStream waited for the work queued during its first wait")
	require.NoError(t, a.Check())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryReserved())
	require.NoError(t, a.Check())
}

// TestPendingFreeToReleasingStream: as TestFreeToReleasingStream, but p
// was recorded on another stream s2, so its Free during ReleaseStream's
// wait leaves it pending on s2's event. Once that event completes, p's
// memory (by then the idle owner's, unmapped at once) must not be under
// the work queued on s during the wait.
func TestPendingFreeToReleasingStream(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(40<<20, s)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s2))
	d.hold(s, nil)
	released := make(chan error, 1)
	go func() { released <- a.ReleaseStream(s) }()
	d.awaitHeld(t)
	require.NoError(t, d.Launch(s, p, 40<<20)) // queued after the wait began
	require.NoError(t, within(t, "Free", func() error { return a.Free(p) }))
	d.release()
	require.NoError(t, <-released)
	require.NoError(t, a.Synchronize(s2)) // p's event completes: p is freed
	assert.Empty(t, d.Violations(), "memory unmapped under work queued on the stream")
	require.NoError(t, a.Check())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryReserved())
	assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
	require.NoError(t, a.Check())
}
