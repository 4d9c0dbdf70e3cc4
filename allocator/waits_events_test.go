package allocator

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// eventGateDriver is the emulator whose next EventSynchronize, once armed,
// completes the event's work and then blocks until the test opens the
// gate: its caller is stopped after its wait, before it retakes the lock.
type eventGateDriver struct {
	*emulated.Emulator
	armed   atomic.Bool
	entered chan struct{} // closed when the held EventSynchronize blocks
	open    chan struct{} // closed by the test to let it return
	once    sync.Once
}

func newEventGateDriver(t *testing.T, opts ...emulated.Option) *eventGateDriver {
	t.Helper()
	d := &eventGateDriver{Emulator: newEmu(t, opts...), entered: make(chan struct{}), open: make(chan struct{})}
	t.Cleanup(d.release) // never leave a goroutine blocked
	return d
}

func (d *eventGateDriver) release() { d.once.Do(func() { close(d.open) }) }

// awaitHeld waits until the armed EventSynchronize blocks, failing the
// test after guard.
func (d *eventGateDriver) awaitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-d.entered:
	case <-time.After(guard):
		t.Fatal("the armed EventSynchronize was never called")
	}
}

func (d *eventGateDriver) EventSynchronize(ev backend.Event) error {
	if err := d.Emulator.EventSynchronize(ev); err != nil {
		return err
	}
	if d.armed.CompareAndSwap(true, false) {
		close(d.entered)
		<-d.open
	}
	return nil
}

// TestEmptyCacheEventRecycledDuringWait: EmptyCache waits, without the
// lock, for the event of a block B of stream A recorded on stream O and
// freed. Meanwhile a Malloc on A retires that event (it is complete),
// which returns the event to the idle events and B to A's free list, gets
// B back, records it on O again, queues work on O (held) and frees it:
// the same event (the idle events are a stack) for the same block heads
// O's queue again. EmptyCache must not take the new recording for the one
// it waited for: retiring it would free B with O's work pending, and the
// release that follows would unmap B under that work (an unmap-in-use
// violation; found by TestGrowthStress/classic-gc, whose garbage
// collection threshold runs such releases). B stays pending until O's work
// completes, and the next EmptyCache returns everything.
func TestEmptyCacheEventRecycledDuringWait(t *testing.T) {
	for _, mode := range []interleaveMode{interleaveModes[0], interleaveModes[3]} {
		t.Run(mode.name, func(t *testing.T) {
			drv := newEventGateDriver(t, emulated.WithCapacity(1<<30))
			cfg, err := ParseConfig(mode.conf)
			require.NoError(t, err)
			a, err := New(drv, cfg)
			require.NoError(t, err)
			t.Cleanup(func() {
				drv.release()
				_ = a.Close()
			})
			sA, err := drv.StreamCreate(0)
			require.NoError(t, err)
			sO, err := drv.StreamCreate(0)
			require.NoError(t, err)
			require.NoError(t, drv.Hold(sO))
			const size = 20 << 20
			p, err := a.Malloc(size, sA)
			require.NoError(t, err)
			require.NoError(t, a.RecordStream(p, sO))
			require.NoError(t, drv.Launch(sO, p, 1))
			require.NoError(t, a.Free(p)) // pending on an event on sO

			drv.armed.Store(true)
			ec := make(chan error, 1)
			go func() { ec <- a.EmptyCache() }()
			drv.awaitHeld(t) // sO's first work is complete; EmptyCache is off the lock

			q, err := a.Malloc(size, sA)
			require.NoError(t, err)
			require.Equal(t, p, q, "the Malloc on sA gets the block back (its event retired)")
			require.NoError(t, a.RecordStream(q, sO))
			require.NoError(t, drv.Launch(sO, q, 1))
			require.NoError(t, a.Free(q)) // pending again: the recycled event, on sO
			pending, err := drv.Pending(sO)
			require.NoError(t, err)
			require.Equal(t, 1, pending)

			drv.release()
			require.NoError(t, recvGrow(t, ec, "EmptyCache"))
			assert.Empty(t, drv.Violations(), "a block was released while work recorded on it was pending")
			require.NoError(t, a.Check())
			// The second free came after EmptyCache began waiting: it
			// stays pending, and its memory mapped, until sO's work ends.
			assert.EqualValues(t, size, a.MemoryReserved())
			assert.EqualValues(t, size, drv.Live().MappedBytes)

			require.NoError(t, drv.Complete(sO))
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, a.MemoryReserved())
			assert.Zero(t, drv.Live().Mappings)
			assert.Empty(t, drv.Violations())
			require.NoError(t, a.Check())
		})
	}
}
