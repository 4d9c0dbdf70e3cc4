package allocator

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// gateDriver is the emulator whose next StreamSynchronize of one stream
// completes the stream's work, then blocks until the test opens the gate,
// and then returns fail (nil: success). Later synchronizes pass through.
type gateDriver struct {
	*emulated.Emulator
	gated   atomic.Uint64 // the stream to hold; 0: none
	fail    error
	entered chan struct{} // closed when the held synchronize begins to block
	open    chan struct{} // closed by the test to let it return
	once    sync.Once
}

func newGateDriver(t *testing.T, opts ...emulated.Option) *gateDriver {
	t.Helper()
	d := &gateDriver{Emulator: newEmu(t, opts...), entered: make(chan struct{}), open: make(chan struct{})}
	t.Cleanup(d.release) // never leave a goroutine blocked
	return d
}

// hold arms the gate on stream s, failing the held call with fail.
func (d *gateDriver) hold(s backend.Stream, fail error) {
	d.fail = fail
	d.gated.Store(uint64(s))
}

func (d *gateDriver) release() { d.once.Do(func() { close(d.open) }) }

// awaitHeld waits until the held synchronize blocks, failing the test
// after guard.
func (d *gateDriver) awaitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-d.entered:
	case <-time.After(guard):
		t.Fatal("the held StreamSynchronize was never called")
	}
}

func (d *gateDriver) StreamSynchronize(s backend.Stream) error {
	if err := d.Emulator.StreamSynchronize(s); err != nil {
		return err
	}
	if s != 0 && d.gated.CompareAndSwap(uint64(s), 0) {
		close(d.entered)
		<-d.open
		return d.fail
	}
	return nil
}

// within runs f on its own goroutine and fails the test unless it returns
// while another goroutine's driver call is held: a call stuck behind that
// wait never returns, so the test fails at guard.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(guard):
		t.Fatalf("%s did not return while another goroutine's synchronize was held: it waits under the lock", what)
		return nil
	}
}

func pairOn(a *Allocator, s backend.Stream) func() error {
	return func() error {
		p, err := a.Malloc(4096, s)
		if err != nil {
			return err
		}
		return a.Free(p)
	}
}

// TestReleaseStreamWaitsWithoutLock: while ReleaseStream(s1) waits for s1,
// another stream's Malloc and Free complete; calls that would use s1 get
// ErrInvalidStream; an event recorded on s1 before the wait is complete
// after it, one recorded during the wait only after a second wait.
func TestReleaseStreamWaitsWithoutLock(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s1, err := d.StreamCreate(0)
	require.NoError(t, err)
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, pairOn(a, s2)())

	p1, err := a.Malloc(3<<20, s1) // free memory of s1 to return
	require.NoError(t, err)
	require.NoError(t, a.Free(p1))
	before, err := a.Malloc(1<<20, s2) // its event on s1 is queued before the wait
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(before, s1))
	require.NoError(t, a.Free(before))
	during, err := a.Malloc(1<<20, s2) // its event on s1 is queued during the wait
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(during, s1))
	reserved0 := reserved(a)

	syncs0 := a.Stats().NumStreamSyncs
	d.hold(s1, nil)
	errc := make(chan error, 1)
	go func() { errc <- a.ReleaseStream(s1) }()
	d.awaitHeld(t)

	require.NoError(t, within(t, "Malloc+Free on another stream", pairOn(a, s2)))
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Malloc", func() error { _, err := a.Malloc(4096, s1); return err }},
		{"RecordStream", func() error { return a.RecordStream(during, s1) }},
		{"Synchronize", func() error { return a.Synchronize(s1) }},
		{"ReleaseStream", func() error { return a.ReleaseStream(s1) }},
	} {
		err := within(t, c.name, c.call)
		assert.ErrorIs(t, err, ErrInvalidStream, c.name)
		assert.ErrorContains(t, err, "being released", c.name)
	}
	require.NoError(t, within(t, "Free", func() error { return a.Free(during) }))

	d.release()
	require.NoError(t, <-errc)
	st := a.Stats()
	// The event recorded during the first wait is not taken as complete
	// by it: ReleaseStream waits again, and only then frees the block.
	assert.Equal(t, syncs0+2, st.NumStreamSyncs, "one wait for the events queued before it, one for the event queued during it")
	assert.Zero(t, st.Active[stats.AllPools].Current)
	assert.Zero(t, st.AllocatedBytes[stats.AllPools].Current)
	assert.Less(t, reserved(a), reserved0, "s1's free handles were unmapped")
	assert.Empty(t, d.Violations())
	require.NoError(t, a.Check())
}

// TestReleaseStreamWaitFailureChangesNothing: a synchronize that fails
// during ReleaseStream's wait leaves every statistic as it was and the
// stream usable, and a later ReleaseStream succeeds.
func TestReleaseStreamWaitFailureChangesNothing(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s1, err := d.StreamCreate(0)
	require.NoError(t, err)
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	p1, err := a.Malloc(3<<20, s1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p1))
	kept, err := a.Malloc(1<<20, s1)
	require.NoError(t, err)
	q, err := a.Malloc(1<<20, s2)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(q, s1))
	require.NoError(t, a.Free(q))
	st0 := a.Stats()

	d.hold(s1, backend.ErrUnavailable)
	go func() { <-d.entered; d.release() }()
	err = a.ReleaseStream(s1)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	st1 := a.Stats()
	assert.Equal(t, st0.NumStreamSyncs+1, st1.NumStreamSyncs)
	st1.NumStreamSyncs = st0.NumStreamSyncs
	assert.Equal(t, st0, st1, "a failed wait changes nothing")
	require.NoError(t, a.Check())

	p, err := a.Malloc(4096, s1) // still in use, not releasing
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.ReleaseStream(s1))
	assert.Equal(t, int64(1), a.Stats().Allocation[stats.AllPools].Current, "the block still allocated on s1 stays valid")
	require.NoError(t, a.Free(kept))
	assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
	assert.Empty(t, d.Violations())
	require.NoError(t, a.Check())
}

// TestFreeFallbackSyncWithoutLock: when an event cannot be recorded on a
// stream recorded with RecordStream, Free waits for that stream without
// the lock: another stream's pair completes meanwhile, a second Free or a
// RecordStream of the same pointer fails with ErrDoubleFree, and a failed
// wait leaves the block allocated.
func TestFreeFallbackSyncWithoutLock(t *testing.T) {
	for _, c := range []struct {
		name string
		fail error
	}{{"wait succeeds", nil}, {"wait fails", backend.ErrUnavailable}} {
		t.Run(c.name, func(t *testing.T) {
			d := newGateDriver(t, emulated.WithManualCompletion())
			a, err := New(d, DefaultConfig())
			require.NoError(t, err)
			defer a.Close()
			var s [3]backend.Stream
			for i := range s {
				s[i], err = d.StreamCreate(0)
				require.NoError(t, err)
			}
			require.NoError(t, pairOn(a, s[2])())
			p, err := a.Malloc(1<<20, s[0])
			require.NoError(t, err)
			require.NoError(t, a.RecordStream(p, s[1]))
			require.NoError(t, d.FailNth(backend.OpEventRecord, 1, backend.ErrUnavailable))
			st0 := a.Stats()

			d.hold(s[1], c.fail)
			errc := make(chan error, 1)
			go func() { errc <- a.Free(p) }()
			d.awaitHeld(t)
			require.NoError(t, within(t, "Malloc+Free on another stream", pairOn(a, s[2])))
			assert.ErrorIs(t, within(t, "second Free", func() error { return a.Free(p) }), ErrDoubleFree)
			assert.ErrorIs(t, within(t, "RecordStream", func() error { return a.RecordStream(p, s[2]) }), ErrDoubleFree)
			d.release()
			err = <-errc
			if c.fail != nil {
				require.ErrorIs(t, err, c.fail)
				// The pair on s[2] ran meanwhile (it may have mapped
				// memory): compare what Free of p would change.
				st1 := a.Stats()
				for _, f := range []func(*stats.DeviceStats) stats.StatArray{
					func(d *stats.DeviceStats) stats.StatArray { return d.Allocation },
					func(d *stats.DeviceStats) stats.StatArray { return d.AllocatedBytes },
					func(d *stats.DeviceStats) stats.StatArray { return d.Active },
					func(d *stats.DeviceStats) stats.StatArray { return d.ActiveBytes },
					func(d *stats.DeviceStats) stats.StatArray { return d.RequestedBytes },
				} {
					assert.Equal(t, f(&st0)[stats.AllPools].Current, f(&st1)[stats.AllPools].Current, "a failed wait changes nothing")
				}
				assert.Equal(t, int64(1<<20), a.Stats().AllocatedBytes[stats.AllPools].Current, "p is still allocated")
				require.NoError(t, a.Check())
				require.NoError(t, a.Free(p)) // the event is recorded this time
				require.NoError(t, d.Complete(s[1]))
				require.NoError(t, pairOn(a, s[2])())
			} else {
				require.NoError(t, err)
			}
			assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
			assert.Zero(t, a.MemoryAllocated())
			assert.Empty(t, d.Violations())
			require.NoError(t, a.Check())
		})
	}
}

// TestCloseWaitsWithoutLock: while Close waits for a stream, other calls
// return ErrClosed at once and read-only ones answer; a concurrent Close
// returns ErrClosed only after the first one finished.
func TestCloseWaitsWithoutLock(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(1<<20, s)
	require.NoError(t, err)

	d.hold(s, nil)
	first := make(chan error, 1)
	go func() { first <- a.Close() }()
	d.awaitHeld(t)
	_, err = a.Malloc(4096, s)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, within(t, "Free", func() error { return a.Free(p) }), ErrClosed)
	assert.ErrorIs(t, within(t, "EmptyCache", a.EmptyCache), ErrClosed)
	require.NoError(t, within(t, "Stats", func() error { _ = a.Stats(); return nil }))
	second := make(chan error, 1)
	go func() { second <- a.Close() }()
	// The second Close waits for the first one's synchronize: it cannot
	// return before the gate opens.
	select {
	case err := <-second:
		t.Fatalf("the second Close returned %v while the first was still waiting", err)
	case <-reachedWaits(a, func() bool { return a.quiescing == 1 }):
	case <-time.After(guard):
		t.Fatal("the second Close never waited for the first")
	}
	d.release()
	require.NoError(t, <-first)
	assert.ErrorIs(t, <-second, ErrClosed)
	assert.ErrorIs(t, a.Close(), ErrClosed)
	assert.Empty(t, d.Violations())
}

// TestReleaseStreamAndFreeFallbackUnderLoad runs, on held streams (work
// stays pending until a synchronize), workers that launch work on their
// blocks, record a shared side stream on them and free them, while
// another goroutine releases the side stream again and again (it is
// learnt again on its next use) and a third of event records fail, so
// Free falls back to a wait. Every wait runs without the lock. The
// emulator records any unmap or reuse of memory that pending work still
// touches; there must be none, every error must be the documented one,
// and the allocator's invariants must hold after.
func TestReleaseStreamAndFreeFallbackUnderLoad(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion())
	drv := &slowSyncDriver{Emulator: e, wait: 200 * time.Microsecond}
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	require.NoError(t, e.FailRandom(backend.OpEventRecord, 0.3, 7, backend.ErrUnavailable))
	side, err := e.StreamCreate(0)
	require.NoError(t, err)
	const workers = 3
	var (
		wg, workersWG sync.WaitGroup
		stop          atomic.Bool
		releases      atomic.Int64
		errs          = make(chan error, 1000)
	)
	wg.Add(1)
	go func() { // the releaser: at least once, however late it runs
		defer wg.Done()
		for first := true; first || !stop.Load(); first = false {
			err := a.ReleaseStream(side)
			if err != nil && !errors.Is(err, ErrInvalidStream) { // another call's use of side may race it
				errs <- err
			}
			releases.Add(1)
			time.Sleep(100 * time.Microsecond)
		}
	}()
	for w := 0; w < workers; w++ {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		workersWG.Add(1)
		go func(s backend.Stream) {
			defer workersWG.Done()
			for round := 0; round < 40; round++ {
				var ptrs []uintptr
				for i := 0; i < 4; i++ {
					p, err := a.Malloc(uint64(1+i)<<19, s)
					if err != nil {
						errs <- err
						return
					}
					if err := e.Launch(s, p, 4096); err != nil {
						errs <- err
						return
					}
					if err := a.RecordStream(p, side); err != nil {
						if !errors.Is(err, ErrInvalidStream) { // side is being released
							errs <- err
						}
					} else if err := e.Launch(side, p, 4096); err != nil {
						errs <- err
					}
					ptrs = append(ptrs, p)
				}
				for _, p := range ptrs {
					if err := a.Free(p); err != nil && !errors.Is(err, backend.ErrUnavailable) {
						errs <- err
					} else if err != nil {
						if err := a.Free(p); err != nil && !errors.Is(err, backend.ErrUnavailable) { // retried
							errs <- err
						}
					}
				}
				if round%8 == 0 {
					if err := a.Synchronize(s); err != nil {
						errs <- err
					}
				}
			}
		}(s)
	}
	finished := make(chan struct{})
	go func() { workersWG.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(guard):
		t.Fatal("workers did not finish")
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, e.FailRandom(backend.OpEventRecord, 0, 0, backend.ErrUnavailable))
	assert.Positive(t, releases.Load())
	assert.Positive(t, e.Failures(backend.OpEventRecord), "some Free fell back to a wait")
	assert.Empty(t, e.Violations(), "memory reused or unmapped under pending work")
	require.NoError(t, a.Check())
	require.NoError(t, e.CompleteAll())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
	assert.Empty(t, e.Violations())
	require.NoError(t, a.Check())
}

// TestReleaseStreamDuringGrowthWait: ReleaseStream(s) while a Malloc on s
// waits (without the lock) for s before unmapping s's free handles marked
// Releasing: the release takes effect once that wait is done, the Malloc
// fails with ErrInvalidStream or succeeds, and the invariants hold.
func TestReleaseStreamDuringGrowthWait(t *testing.T) {
	for _, c := range []struct {
		name string
		fail error
	}{{"growth wait succeeds", nil}, {"growth wait fails", backend.ErrUnavailable}} {
		t.Run(c.name, func(t *testing.T) {
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
			d.hold(s, c.fail)
			grown := make(chan error, 1)
			go func() {
				p, err := a.Malloc(100<<20, s) // defrag: waits for s with holes marked
				if err == nil {
					err = a.Free(p)
				}
				grown <- err
			}()
			d.awaitHeld(t)
			released := make(chan error, 1)
			go func() { released <- a.ReleaseStream(s) }()
			// ReleaseStream's own wait is not held: it returns while the
			// growth still waits with s's holes marked Releasing.
			require.NoError(t, within(t, "ReleaseStream", func() error { return <-released }))
			d.release()
			if err := <-grown; err != nil {
				assert.ErrorIs(t, err, ErrInvalidStream)
			}
			require.NoError(t, a.Check())
			s2, err := d.StreamCreate(0) // may reuse the released stream's state
			require.NoError(t, err)
			require.NoError(t, pairOn(a, s2)())
			require.NoError(t, pairOn(a, s)()) // s kept alive: learnt again
			require.NoError(t, a.Check())
			for i := 1; i < len(ptrs); i += 2 {
				require.NoError(t, a.Free(ptrs[i]))
			}
			require.NoError(t, a.Check())
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
			assert.Zero(t, reserved(a))
			assert.Empty(t, d.Violations())
			require.NoError(t, a.Check())
		})
	}
}
