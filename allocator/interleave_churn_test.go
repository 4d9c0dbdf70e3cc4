package allocator

import (
	"errors"
	"fmt"
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

// churnWorker runs rounds on short-lived streams: create a stream,
// allocate (a 70 MiB block among them: a growth in 64 MiB handles), launch
// work on the blocks when launch is set, record the shared side stream on
// them (and launch work there too), free them, sometimes synchronize, then
// ReleaseStream and destroy the stream. Errors other than the documented
// ones go to bad; ok says which are documented for the call.
func churnWorker(a *Allocator, e *emulated.Emulator, drv backend.Driver, side backend.Stream, rounds int, launch bool,
	ok func(call string, err error) bool, bad chan<- error) {
	report := func(call string, err error) bool {
		if err == nil {
			return true
		}
		if !ok(call, err) {
			bad <- fmt.Errorf("%s: %w", call, err)
		}
		return false
	}
	for r := range rounds {
		s, err := drv.StreamCreate(0)
		if err != nil {
			bad <- err
			return
		}
		var ptrs []uintptr
		for i, n := range []uint64{4096, 1 << 20, 3 << 20, 70 << 20, 512} {
			if r%2 == 1 && i == 3 {
				continue
			}
			p, err := a.Malloc(n, s)
			if !report("Malloc", err) {
				continue
			}
			ptrs = append(ptrs, p)
			if launch {
				_ = e.Launch(s, p, n)
			}
			if i%2 == 0 && report("RecordStream", a.RecordStream(p, side)) && launch {
				_ = e.Launch(side, p, min(n, 4096))
			}
		}
		for _, p := range ptrs {
			report("Free", a.Free(p))
		}
		if r%3 == 0 {
			report("Synchronize", a.Synchronize(s))
		}
		report("ReleaseStream", a.ReleaseStream(s))
		_ = drv.StreamSynchronize(s) // nothing of the allocator's is on s any more
		if err := drv.StreamDestroy(s); err != nil {
			bad <- err
		}
	}
}

// TestStreamChurnWithWaits: workers on short-lived streams (each round a
// new stream, released and destroyed at its end, whose state the next one
// may reuse), a shared side stream released again and again while workers
// record it on their blocks, a quarter of event records failing (Free falls
// back to a wait without the lock), slow synchronizes, and a goroutine
// calling EmptyCache, Synchronize, Stats and Check. No call fails other
// than as documented (RecordStream on the side stream while it is being
// released: ErrInvalidStream), the emulator sees no memory reused or
// unmapped under pending work, and the invariants hold after.
func TestStreamChurnWithWaits(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion(), emulated.WithCapacity(16<<30))
	drv := &slowSyncDriver{Emulator: e, wait: 50 * time.Microsecond}
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	side, err := drv.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.FailRandom(backend.OpEventRecord, 0.25, 7, backend.ErrUnavailable))
	ok := func(call string, err error) bool {
		return call == "RecordStream" && errors.Is(err, ErrInvalidStream)
	}
	bad := make(chan error, 1000)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			churnWorker(a, e, drv, side, 12, true, ok, bad)
		}()
	}
	var stop atomic.Bool
	var aux sync.WaitGroup
	aux.Add(1)
	go func() {
		defer aux.Done()
		for i := 0; !stop.Load(); i++ {
			switch i % 5 {
			case 0:
				if err := a.ReleaseStream(side); err != nil && !errors.Is(err, ErrInvalidStream) {
					bad <- fmt.Errorf("ReleaseStream(side): %w", err)
				}
			case 1:
				if err := a.EmptyCache(); err != nil {
					bad <- fmt.Errorf("EmptyCache: %w", err)
				}
			case 2:
				if err := a.Synchronize(0); err != nil {
					bad <- fmt.Errorf("Synchronize: %w", err)
				}
			case 3:
				st := a.Stats()
				if st.AllocatedBytes[stats.AllPools].Current < 0 || st.ReservedBytes[stats.AllPools].Current < st.ActiveBytes[stats.AllPools].Current {
					bad <- fmt.Errorf("Stats: allocated %d, reserved %d < active %d", st.AllocatedBytes[stats.AllPools].Current,
						st.ReservedBytes[stats.AllPools].Current, st.ActiveBytes[stats.AllPools].Current)
				}
			case 4:
				if err := a.Check(); err != nil {
					bad <- fmt.Errorf("Check: %w", err)
				}
			}
		}
	}()
	wg.Wait()
	stop.Store(true)
	aux.Wait()
	close(bad)
	for err := range bad {
		t.Error(err)
	}
	e.ClearFaults()
	require.NoError(t, a.ReleaseStream(side))
	require.NoError(t, a.Check())
	assert.Zero(t, a.MemoryAllocated())
	assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
	assert.Empty(t, e.Violations())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryReserved())
	require.NoError(t, a.Close())
	require.NoError(t, drv.StreamDestroy(side))
	assertNoDriverState(t, e)
}

// streamMilestone is a driver that closes reached once at streams have
// been created through it.
type streamMilestone struct {
	backend.Driver
	at      int64
	n       atomic.Int64
	reached chan struct{} // closed at the at-th StreamCreate (by the test if at is 0)
}

func (d *streamMilestone) StreamCreate(device int) (backend.Stream, error) {
	s, err := d.Driver.StreamCreate(device)
	if d.n.Add(1) == d.at {
		close(d.reached)
	}
	return s, err
}

// TestCloseRacesChurn: Close while workers churn streams, fall back to
// waits (failed event records) and release the side stream. Every call
// returns nil, the documented ErrInvalidStream, or ErrClosed; none hangs;
// after Close every call is ErrClosed and the driver holds nothing.
func TestCloseRacesChurn(t *testing.T) {
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			e := newEmu(t, emulated.WithCapacity(16<<30))
			drv := &slowSyncDriver{Emulator: e, wait: 100 * time.Microsecond}
			a, err := New(drv, DefaultConfig())
			require.NoError(t, err)
			side, err := drv.StreamCreate(0)
			require.NoError(t, err)
			require.NoError(t, e.FailRandom(backend.OpEventRecord, 0.3, uint64(round), backend.ErrUnavailable))
			ok := func(call string, err error) bool {
				return errors.Is(err, ErrClosed) || call == "RecordStream" && errors.Is(err, ErrInvalidStream)
			}
			bad := make(chan error, 1000)
			// Close comes after the workers created round*3 streams (at
			// once in round 0): later and later into the churn, counted
			// in driver calls rather than guessed in time.
			workers := &streamMilestone{Driver: drv, at: int64(round * 3), reached: make(chan struct{})}
			if round == 0 {
				close(workers.reached)
			}
			var wg sync.WaitGroup
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					churnWorker(a, e, workers, side, 8, false, ok, bad)
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					if err := a.ReleaseStream(side); err != nil && !errors.Is(err, ErrInvalidStream) && !errors.Is(err, ErrClosed) {
						bad <- fmt.Errorf("ReleaseStream(side): %w", err)
					}
					if err := a.EmptyCache(); err != nil && !errors.Is(err, ErrClosed) {
						bad <- fmt.Errorf("EmptyCache: %w", err)
					}
				}
			}()
			recvGrow(t, workers.reached, "the workers' streams before Close")
			require.NoError(t, within(t, "Close", a.Close))
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			recvGrow(t, done, "the calls after Close (one hangs)")
			close(bad)
			for err := range bad {
				t.Error(err)
			}
			_, err = a.Malloc(4096, 0)
			assert.ErrorIs(t, err, ErrClosed)
			assert.ErrorIs(t, a.Free(1<<40), ErrClosed)
			assert.ErrorIs(t, a.ReleaseStream(side), ErrClosed)
			assert.ErrorIs(t, a.Synchronize(side), ErrClosed)
			assert.ErrorIs(t, a.EmptyCache(), ErrClosed)
			assert.ErrorIs(t, a.Close(), ErrClosed)
			require.NoError(t, drv.StreamDestroy(side))
			assertNoDriverState(t, e)
		})
	}
}
