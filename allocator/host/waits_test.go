package host

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// gated is the emulator whose calls named in held (gateWaits: its
// EventSynchronize and DeviceSynchronize; gatePin: its MallocHost)
// announce themselves on entered and then wait for release: a driver
// call the test holds open. Once release is closed, they pass
// unannounced.
type gated struct {
	*emulated.Emulator
	held    *atomic.Uint32 // gateWaits, gatePin
	entered chan string
	release chan struct{}
}

const (
	gateWaits uint32 = 1 << iota
	gatePin
)

func (g gated) EventSynchronize(ev backend.Event) error {
	g.hold(gateWaits, "event")
	return g.Emulator.EventSynchronize(ev)
}

func (g gated) DeviceSynchronize(dev int) error {
	g.hold(gateWaits, "device")
	return g.Emulator.DeviceSynchronize(dev)
}

func (g gated) MallocHost(n uint64) (uintptr, error) {
	g.hold(gatePin, "pin")
	return g.Emulator.MallocHost(n)
}

// hold announces the call as kind and blocks until release is closed, if
// held names gate and release is still open.
func (g gated) hold(gate uint32, kind string) {
	if g.held.Load()&gate == 0 {
		return
	}
	select {
	case g.entered <- kind:
		<-g.release
	case <-g.release:
	}
}

// newGated makes a host allocator over a gated emulator that holds the
// calls in held.
func newGated(t *testing.T, held uint32, opts ...emulated.Option) (*Allocator, *emulated.Emulator, gated) {
	t.Helper()
	var g gated
	a, e := newHostOver(t, "", func(e *emulated.Emulator) backend.Driver {
		g = gated{Emulator: e, held: new(atomic.Uint32), entered: make(chan string), release: make(chan struct{})}
		g.held.Store(held)
		return g
	}, opts...)
	return a, e, g
}

// closeDuring starts Close and returns its result's channel once Close
// has marked a closed, and so waits for the calls running without mu.
func closeDuring(a *Allocator) <-chan error {
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	for {
		a.mu.Lock()
		c := a.closed
		a.mu.Unlock()
		if c {
			return closed
		}
		runtime.Gosched()
	}
}

// whileHeld runs f while a driver wait is held open and fails the test if
// f does not return before the wait is let go: a call blocked behind the
// wait (mu held across it) would never return. The bound only turns that
// deadlock into a failure; it orders nothing.
func whileHeld(t *testing.T, g gated, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		close(g.release) // let the wait end, and f with it
		<-done
		t.Fatal("a call waited for another goroutine's driver wait (mu held across it)")
	}
}

// Rung 2 of the out-of-memory ladder waits for the pending events with mu
// dropped: meanwhile other goroutines free, hit the cache and record
// streams; after the wait the ladder releases what it finds and retries.
func TestLadderWaitsWithoutLock(t *testing.T) {
	a, e, g := newGated(t, gateWaits, emulated.WithHostCapacity(64*kib), emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	live, err := a.Malloc(16 * kib)
	require.NoError(t, err)
	mid, err := a.Malloc(32 * kib)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, mid, 1))
	require.NoError(t, a.RecordStream(mid, s))
	require.NoError(t, a.Free(mid)) // free-pending: 48 of 64 KiB held

	type result struct {
		p   uintptr
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := a.Malloc(32 * kib) // fits only once mid's event is waited for
		got <- result{p, err}
	}()
	require.Equal(t, "event", <-g.entered)
	whileHeld(t, g, func() {
		assert.NoError(t, a.Free(live))
		p, err := a.Malloc(16 * kib) // a cache hit on live's block
		assert.NoError(t, err)
		assert.Equal(t, live, p)
		assert.NoError(t, a.Free(p))
		assert.NoError(t, a.Check())
	})
	close(g.release)
	r := <-got
	require.NoError(t, r.err)
	require.NotZero(t, r.p)
	assert.Zero(t, a.Stats().NumOOMs)
	assert.Empty(t, e.Violations(), "nothing reused or freed under pending work")
	require.NoError(t, e.Complete(s))
	require.NoError(t, a.Free(r.p))
	mustCheck(t, a, e)
}

// EmptyCache's device-wide wait (ending a quarantine) runs with mu
// dropped, and ends the quarantine only of the blocks quarantined before
// it began: a block quarantined during the wait may have work the wait
// did not cover.
func TestEmptyCacheQuarantineWaitWithoutLock(t *testing.T) {
	a, e, g := newGated(t, gateWaits, emulated.WithManualCompletion())
	quarantine := func() uintptr {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		p, err := a.Malloc(8 * kib)
		require.NoError(t, err)
		require.NoError(t, e.Launch(s, p, 1))
		require.NoError(t, a.RecordStream(p, s))
		require.NoError(t, e.StreamDestroy(s)) // its work still runs
		require.NoError(t, a.Free(p))
		return p
	}
	first := quarantine()
	require.Equal(t, int64(1), a.Stats().Quarantined.Current)

	done := make(chan error, 1)
	go func() { done <- a.EmptyCache() }()
	require.Equal(t, "device", <-g.entered)
	var second uintptr
	whileHeld(t, g, func() {
		second = quarantine() // after the wait began
		p, err := a.Malloc(4 * kib)
		assert.NoError(t, err)
		assert.NoError(t, a.Free(p))
	})
	require.NotEqual(t, first, second)
	close(g.release)
	require.NoError(t, <-done)
	st := a.Stats()
	assert.Equal(t, int64(1), st.Quarantined.Current, "the block quarantined during the wait stays")
	assert.Equal(t, int64(8*kib), st.QuarantinedBytes.Current)
	assert.Equal(t, int64(1), st.NumDeviceSyncs)
	assert.Empty(t, e.Violations())
	mustCheck(t, a, e)

	// The next EmptyCache (its wait let through) settles it.
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().Quarantined.Current)
	mustCheck(t, a, e)
}

// Close during another goroutine's unlocked wait lets that wait end before
// it destroys anything; the waiting call then reports ErrClosed.
func TestCloseDuringUnlockedWait(t *testing.T) {
	a, e, g := newGated(t, gateWaits, emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, a.Free(p)) // quarantined

	emptied := make(chan error, 1)
	go func() { emptied <- a.EmptyCache() }()
	require.Equal(t, "device", <-g.entered)
	closed := closeDuring(a)
	close(g.release)
	require.ErrorIs(t, <-emptied, ErrClosed)
	require.NoError(t, <-closed) // its own device wait is let through
	assertNothingHeld(t, e)
}

// A Malloc that pins a new block does so with mu dropped: other
// goroutines' cache hits, frees and statistics go on meanwhile.
func TestPinningWithoutLock(t *testing.T) {
	a, e, g := newGated(t, 0)
	p, err := a.Malloc(4 * kib)
	require.NoError(t, err)
	require.NoError(t, a.Free(p)) // cached
	g.held.Store(gatePin)

	type result struct {
		p   uintptr
		err error
	}
	got := make(chan result, 1)
	go func() {
		q, err := a.Malloc(1 << 20) // a class with nothing cached: pins
		got <- result{q, err}
	}()
	require.Equal(t, "pin", <-g.entered)
	g.held.Store(0)
	whileHeld(t, g, func() {
		q, err := a.Malloc(4 * kib)
		assert.NoError(t, err)
		assert.Equal(t, p, q, "a cache hit")
		assert.NoError(t, a.Free(q))
		assert.Equal(t, int64(1), a.Stats().Segment.Current, "the block being pinned is not counted yet")
		assert.NoError(t, a.Check())
	})
	close(g.release)
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, a.Free(r.p))
	assert.Equal(t, int64(2), a.Stats().Segment.Current)
	mustCheck(t, a, e)
}

// Close while a Malloc pins: Close lets the pinning end, the Malloc
// returns ErrClosed, and the block it pinned is released with the rest.
func TestCloseDuringPinning(t *testing.T) {
	a, e, g := newGated(t, gatePin)
	got := make(chan error, 1)
	go func() {
		_, err := a.Malloc(4 * kib)
		got <- err
	}()
	require.Equal(t, "pin", <-g.entered)
	closed := closeDuring(a)
	close(g.release)
	require.ErrorIs(t, <-got, ErrClosed)
	require.NoError(t, <-closed)
	assertNothingHeld(t, e)
}
