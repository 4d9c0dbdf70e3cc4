package allocator

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestSleepFreeReleasesBackup: Free of a block of a pool asleep in
// Offload gives back its run's pinned backup as soon as the last block
// the backup holds is freed, not at Wake or Close: the pinned host memory
// the driver counts falls with each backup emptied, and is zero once
// every block is freed, with or without KeepHostBuffers. The asleep pool,
// with nothing allocated, then closes without a Wake and leaves the
// device's free memory as it was before the pool grew.
func TestSleepFreeReleasesBackup(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			a, e, p, live := sleepSetup(t, "large_segment_size_mb:2,small_segment_size_mb:2,handle_cache_mb:64")
			host := newPinnedHost(e)
			require.NoError(t, p.Sleep(SleepOptions{Mode: Offload, Host: host, KeepHostBuffers: keep}))
			pinned := e.Live().HostBytes
			require.Positive(t, pinned)
			require.Equal(t, uint64(a.Stats().HostBackupBytes), pinned, "backups as the driver counts them")
			drops := 0
			for i, b := range live {
				require.NoError(t, a.Free(b.p))
				now := e.Live().HostBytes
				assert.LessOrEqual(t, now, pinned, "free %d", i)
				if now < pinned {
					drops++
				}
				pinned = now
				assert.Equal(t, uint64(a.Stats().HostBackupBytes), now, "free %d: backups held, as the driver counts them", i)
				mustCheck(t, a, e)
			}
			assert.Zero(t, pinned, "every backup's pinned memory is given back")
			assert.Zero(t, host.Live())
			assert.GreaterOrEqual(t, drops, 2, "each backup goes with its last block")
			assert.Equal(t, Asleep, p.SleepState())

			require.NoError(t, p.Close(), "an asleep pool with nothing allocated closes without Wake")
			mustCheck(t, a, e)
			assert.Zero(t, e.Live().Mappings)
			assert.Zero(t, e.Live().HandleBytes-a.cachedHandleBytes(), "no handle of the pool's but the cache's")
			assert.ErrorIs(t, p.Wake(), ErrClosed)
		})
	}
}

// TestCloseAsleep: Close of an asleep pool that still has allocations is
// refused (ErrPoolAsleep, nothing changed); once they are freed it closes
// without Wake, in Discard and Offload.
func TestCloseAsleep(t *testing.T) {
	for _, mode := range []SleepMode{Discard, Offload} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			a, e := newAlloc(t, "", emulated.WithRealMemory(), emulated.WithCapacity(256<<20))
			p, err := a.NewPool(PoolOptions{Name: "tenant"})
			require.NoError(t, err)
			x, err := p.Malloc(30<<20, 0)
			require.NoError(t, err)
			y, err := p.Malloc(50<<20, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(y)) // free cache
			before := driverFree(t, a, e)
			require.NoError(t, p.Sleep(SleepOptions{Mode: mode, Host: newPinnedHost(e)}))
			err = p.Close()
			require.ErrorIs(t, err, ErrPoolAsleep)
			assert.Equal(t, Asleep, p.SleepState())
			mustCheck(t, a, e)
			require.NoError(t, a.Free(x))
			require.NoError(t, p.Close())
			mustCheck(t, a, e)
			assert.Zero(t, e.Live().HostBytes)
			assert.Equal(t, before+80<<20, driverFree(t, a, e)+a.cachedHandleBytes())
		})
	}
}

// TestWakeFreeCacheOptional: the free cache is mapped back only if the
// device has room (after the out-of-memory ladder): a device without room
// for the cache still wakes the handles that hold allocations (their
// contents restored), and a pool with nothing allocated wakes, for zero
// live bytes, on a full device.
func TestWakeFreeCacheOptional(t *testing.T) {
	const mib = 1 << 20
	for _, mode := range []SleepMode{Discard, Offload} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			a, e := newAlloc(t, "handle_cache_mb:0", emulated.WithRealMemory(), emulated.WithCapacity(256*mib))
			s := a.DefaultStream()
			p, err := a.NewPool(PoolOptions{Name: "rollout"})
			require.NoError(t, err)
			other, err := a.NewPool(PoolOptions{Name: "train"})
			require.NoError(t, err)
			w, err := p.Malloc(40*mib, 0)
			require.NoError(t, err)
			kv, err := p.Malloc(150*mib, 0)
			require.NoError(t, err)
			weights := []patterned{fill(t, e, s, w, 40*mib, 9)}
			require.NoError(t, a.Free(kv)) // 150 MiB of free cache
			require.NoError(t, p.Sleep(SleepOptions{Mode: mode, Host: newPinnedHost(e)}))
			// The trainer takes all but room for the allocations.
			g, err := other.Malloc(200*mib, 0)
			require.NoError(t, err)
			require.Less(t, driverFree(t, a, e), uint64(100*mib))

			require.NoError(t, p.Wake(), "room for the allocations, not for the cache")
			assert.Equal(t, Awake, p.SleepState())
			assert.Less(t, p.MemoryReserved(), uint64(100*mib), "the free cache was given up")
			assert.GreaterOrEqual(t, p.MemoryReserved(), uint64(40*mib))
			assert.Positive(t, other.MemoryReserved(), "another pool's memory is not taken for a cache")
			if mode == Offload {
				verify(t, e, s, weights)
			}
			mustCheck(t, a, e)

			// Nothing allocated: a wake on a full device maps nothing.
			require.NoError(t, a.Free(w))
			require.NoError(t, p.Sleep(SleepOptions{Mode: mode, Host: newPinnedHost(e)}))
			h, err := other.Malloc(driverFree(t, a, e)-2*mib, 0)
			require.NoError(t, err)
			require.NoError(t, p.Wake(), "zero live bytes: no out-of-memory error")
			assert.Zero(t, p.MemoryReserved())
			mustCheck(t, a, e)
			require.NoError(t, a.Free(g))
			require.NoError(t, a.Free(h))
		})
	}
}

// TestEmptyCacheWhileAsleep: the pool's EmptyCache while it is asleep
// gives up its free cache (Wake maps only what holds allocations, with
// their contents); Allocator.EmptyCache leaves an asleep pool as it is.
func TestEmptyCacheWhileAsleep(t *testing.T) {
	const mib = 1 << 20
	a, e := newAlloc(t, "", emulated.WithRealMemory(), emulated.WithCapacity(256*mib))
	s := a.DefaultStream()
	p, err := a.NewPool(PoolOptions{Name: "rollout"})
	require.NoError(t, err)
	w, err := p.Malloc(20*mib, 0)
	require.NoError(t, err)
	weights := []patterned{fill(t, e, s, w, 20*mib, 3)}
	kv, err := p.Malloc(100*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(kv))
	reserved := p.MemoryReserved()
	require.GreaterOrEqual(t, reserved, uint64(120*mib))
	opts := SleepOptions{Mode: Offload, Host: newPinnedHost(e)}

	require.NoError(t, p.Sleep(opts))
	require.NoError(t, a.EmptyCache())
	require.NoError(t, p.Wake())
	assert.Equal(t, reserved, p.MemoryReserved(), "Allocator.EmptyCache skips an asleep pool")
	verify(t, e, s, weights)

	require.NoError(t, p.Sleep(opts))
	asleep := p.Stats().AsleepBytes
	require.NoError(t, p.EmptyCache())
	assert.Less(t, p.Stats().AsleepBytes, asleep, "the free cache is given up")
	mustCheck(t, a, e)
	require.NoError(t, p.Wake())
	assert.Less(t, p.MemoryReserved(), uint64(30*mib), "Wake maps only what holds allocations")
	verify(t, e, s, weights)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(w))
}
