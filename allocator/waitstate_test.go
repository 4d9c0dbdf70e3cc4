package allocator

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// guard bounds every wait of a test for another goroutine: a last resort
// against a hang, never a synchronisation. It is long enough for a loaded
// 2-core machine under -race; a test that reaches it has a bug (a call
// blocked that must not be, or a signal that never comes).
const guard = 3 * time.Minute

// reachedWaits returns a channel closed once cond, evaluated with a.mu
// held, is true. cond reads what waitsChanged signals: a.inflight (driver
// waits and growths without the lock, Mallocs waiting for a growth) and
// a.quiescing (Close, Check and snapshots waiting for those). The
// allocator broadcasts a.waitWatch at every change of either, so the
// channel closes as soon as the state is reached, without polling.
//
// The goroutine it starts ends when cond becomes true; one whose state
// never comes stays blocked, which only a test that has already failed
// (at its guard) leaves behind.
func reachedWaits(a *Allocator, cond func() bool) <-chan struct{} {
	reached := make(chan struct{})
	a.mu.Lock()
	if a.waitWatch == nil {
		a.waitWatch = sync.NewCond(&a.mu)
	}
	w := a.waitWatch
	a.mu.Unlock()
	go func() {
		a.mu.Lock()
		for !cond() {
			w.Wait()
		}
		a.mu.Unlock()
		close(reached)
	}()
	return reached
}

// awaitWaits blocks until cond (as for reachedWaits) holds, failing the
// test after guard.
func awaitWaits(t *testing.T, a *Allocator, what string, cond func() bool) {
	t.Helper()
	select {
	case <-reachedWaits(a, cond):
	case <-time.After(guard):
		a.mu.Lock()
		inflight, quiescing := a.inflight, a.quiescing
		a.mu.Unlock()
		require.FailNow(t, "never reached: "+what, "inflight %d, quiescing %d", inflight, quiescing)
	}
}

// waitInflight waits until exactly n calls wait or map without the lock.
func waitInflight(t *testing.T, a *Allocator, n int) {
	t.Helper()
	awaitWaits(t, a, "calls in flight", func() bool { return a.inflight == n })
}

// waitQuiescing waits until n calls (Close, Check, snapshots) wait in
// quiesceWaits for the calls in flight; such a call cannot return before
// every call in flight has ended.
func waitQuiescing(t *testing.T, a *Allocator, n int) {
	t.Helper()
	awaitWaits(t, a, "calls waiting for quiescence", func() bool { return a.quiescing == n })
}

// TestWaitWatchSeesEveryWait: the states the tests wait for are signalled,
// not polled: a growth mapping without the lock (inflight 1), a Malloc
// waiting for it (2), a Check waiting for both (quiescing 1), and all of
// them over once the Map goes on; the Check cannot return before.
func TestWaitWatchSeesEveryWait(t *testing.T) {
	drv := newMapGateDriver(t, backend.OpMap, emulated.WithCapacity(128<<20))
	cfg := DefaultConfig()
	cfg.PerProcessMemoryFraction = 0.5 // 64 MiB: room for one growth
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
	waitInflight(t, a, 1)
	second := growAsync(a, 8<<20, s2) // needs memory: waits for the growth
	waitInflight(t, a, 2)
	checked := make(chan error, 1)
	go func() { checked <- a.Check() }()
	waitQuiescing(t, a, 1)
	select {
	case err := <-checked:
		t.Fatalf("Check returned (%v) while a growth mapped", err)
	default:
	}
	drv.open()
	require.NoError(t, recvGrow(t, first, "the growth").err)
	r2 := recvGrow(t, second, "the Malloc waiting for it")
	require.NoError(t, r2.err)
	require.NoError(t, recvGrow(t, checked, "Check"))
	awaitWaits(t, a, "no call in flight", func() bool { return a.inflight == 0 && a.quiescing == 0 })
	require.NoError(t, a.Free(r2.p))
	require.NoError(t, a.Check())
}

// TestHoldDriverLetsGoExactlyTheHeldCall: a hold of one call blocks the
// first call of its op and no other, whichever goroutine comes first;
// next hands that call to the test (whether it blocked before or after
// next was called) and goOn returns exactly what the test sends. A hold
// cannot be taken back by a count: a call may already be blocked on it.
func TestHoldDriverLetsGoExactlyTheHeldCall(t *testing.T) {
	d := newHoldDriver(t)
	assert.Panics(t, func() { d.hold(backend.OpUnmap, -1) })
	assert.Panics(t, func() { d.hold(backend.OpUnmap, 0) })
	d.hold(backend.OpUnmap, 1)
	results := make(chan error, 2)
	for _, va := range []uintptr{1 << 30, 2 << 30} {
		go func() { results <- d.passAt(backend.OpUnmap, 0, va) }()
	}
	// One of the two passes at once; the other is held.
	require.NoError(t, recvGrow(t, results, "the call not held"))
	c := d.next(t)
	assert.Equal(t, backend.OpUnmap, c.op)
	assert.Contains(t, []uintptr{1 << 30, 2 << 30}, c.va)
	injected := errors.New("injected")
	c.goOn(injected)
	assert.Same(t, injected, recvGrow(t, results, "the held call"))
	assert.NoError(t, d.passAt(backend.OpUnmap, 0, 3<<30), "the hold covered one call only")
}
