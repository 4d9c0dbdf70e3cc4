package allocator

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// slowSyncDriver is the emulator whose stream synchronizes take wall time
// (so that the allocator's waits without its mutex overlap other calls).
type slowSyncDriver struct {
	*emulated.Emulator
	wait time.Duration
}

func (d *slowSyncDriver) StreamSynchronize(s backend.Stream) error {
	time.Sleep(d.wait)
	return d.Emulator.StreamSynchronize(s)
}

// TestWaitsWithoutLockAreSafe runs, on held streams (work stays pending
// until a synchronize), goroutines that launch work on their blocks, free
// them, grow past the defrag limit (a release that waits for the stream
// without the mutex), synchronize and empty the cache, all at once. The
// emulator records any unmap of memory that pending work still touches;
// there must be none, and the allocator's invariants must hold after.
func TestWaitsWithoutLockAreSafe(t *testing.T) {
	e, err := emulated.New(emulated.WithManualCompletion())
	require.NoError(t, err)
	drv := &slowSyncDriver{Emulator: e, wait: time.Millisecond}
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	const workers = 3
	streams := make([]backend.Stream, workers)
	for i := range streams {
		streams[i], err = drv.StreamCreate(0)
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*100)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(s backend.Stream, w int) {
			defer wg.Done()
			for round := 0; round < 6; round++ {
				var ptrs []uintptr
				for i := 0; i < 6; i++ {
					p, err := a.Malloc(uint64(2+i%3)<<20, s)
					if err != nil {
						errs <- err
						return
					}
					if err := e.Launch(s, p, 1<<20); err != nil {
						errs <- err
						return
					}
					ptrs = append(ptrs, p)
				}
				for i := 0; i < len(ptrs); i += 2 {
					if err := a.Free(ptrs[i]); err != nil {
						errs <- err
					}
				}
				// Larger than every hole: grows, unmapping the holes after
				// a synchronize made without the mutex.
				big, err := a.Malloc(24<<20, s)
				if err != nil {
					errs <- err
					return
				}
				if err := e.Launch(s, big, 1<<20); err != nil {
					errs <- err
				}
				for i := 1; i < len(ptrs); i += 2 {
					if err := a.Free(ptrs[i]); err != nil {
						errs <- err
					}
				}
				if err := a.Free(big); err != nil {
					errs <- err
				}
				switch (round + w) % 3 {
				case 0:
					err = a.Synchronize(s)
				case 1:
					err = a.EmptyCache()
				}
				if err != nil {
					errs <- err
				}
			}
		}(streams[w], w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Empty(t, e.Violations(), "memory unmapped under pending work")
	require.NoError(t, a.Check())
	require.NoError(t, a.EmptyCache())
	assert.Empty(t, e.Violations())
	require.NoError(t, a.Check())
	assert.Zero(t, a.MemoryAllocated())
}
