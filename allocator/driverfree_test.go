package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// driverFree is the device's free memory as the driver reports it.
func driverFree(t testing.TB, a *Allocator, e *emulated.Emulator) uint64 {
	t.Helper()
	free, _, err := e.MemGetInfo(a.Device())
	require.NoError(t, err)
	return free
}

// TestReturnsMemoryToDriver: every call documented to return memory to
// the driver leaves the device's free memory, as the driver reports it
// (MemGetInfo), at least where it was before the memory was taken, and
// the free plus the handle cache exactly where they were: a private pool
// that grew to a few hundred MiB, freed everything and was closed, or
// emptied its cache, or slept; the allocator's EmptyCache. The handle
// cache (handle_cache_mb) must not keep what such a call gives back: a
// tenant that leaves must leave the device as it found it. Handles the
// cache held before (the default pool's) stay cached, but for those the
// pool's growth took, which are freed rather than put back; EmptyCache
// empties the cache.
func TestReturnsMemoryToDriver(t *testing.T) {
	const mib = 1 << 20
	kinds := []struct {
		name string
		opts PoolOptions
	}{
		{"expandable", PoolOptions{}},
		{"classic", PoolOptions{Segments: SegmentsClassic}},
		{"isolated", PoolOptions{Isolated: true}},
		{"aligned", PoolOptions{Alignment: 4 * mib}},
	}
	paths := []struct {
		name string
		// give returns p's memory, all of it freed, to the driver.
		give func(a *Allocator, p *Pool) error
		// sleeps: the path needs expandable segments.
		sleeps bool
	}{
		{"Pool.Close", func(_ *Allocator, p *Pool) error { return p.Close() }, false},
		{"Pool.EmptyCache", func(_ *Allocator, p *Pool) error { return p.EmptyCache() }, false},
		{"Allocator.EmptyCache", func(a *Allocator, _ *Pool) error { return a.EmptyCache() }, false},
		{"ReleaseStream+Close", func(a *Allocator, p *Pool) error {
			return p.Close() // the pool's memory is on a released stream (below)
		}, false},
		{"Sleep(Discard)", func(_ *Allocator, p *Pool) error {
			return p.Sleep(SleepOptions{Mode: Discard})
		}, true},
		{"Sleep(Discard)+Close", func(_ *Allocator, p *Pool) error {
			if err := p.Sleep(SleepOptions{Mode: Discard}); err != nil {
				return err
			}
			return p.Close()
		}, true},
	}
	for _, kind := range kinds {
		for _, path := range paths {
			if path.sleeps && kind.opts.Segments == SegmentsClassic {
				continue
			}
			t.Run(kind.name+"/"+path.name, func(t *testing.T) {
				a, e := newAlloc(t, "handle_cache_mb:512", emulated.WithCapacity(2*gib))
				// The default pool puts handles in the cache first (a
				// released stream's memory): they are not the pool's to
				// give back.
				s0, err := e.StreamCreate(a.Device())
				require.NoError(t, err)
				x, err := a.Malloc(40*mib, s0)
				require.NoError(t, err)
				require.NoError(t, a.Free(x))
				require.NoError(t, a.ReleaseStream(s0))
				require.NoError(t, e.StreamDestroy(s0))
				cachedBefore := a.cachedHandleBytes()
				require.Positive(t, cachedBefore)
				before := driverFree(t, a, e)

				p, err := a.NewPool(kind.opts)
				require.NoError(t, err)
				s := a.DefaultStream()
				if path.name == "ReleaseStream+Close" {
					s, err = e.StreamCreate(a.Device())
					require.NoError(t, err)
				}
				var ptrs []uintptr
				for i, n := range []uint64{100 * mib, 3 * mib, 700 << 10, 150 * mib, 20 * mib, 5000} {
					q, err := p.Malloc(n, s)
					require.NoError(t, err, "malloc %d", i)
					ptrs = append(ptrs, q)
				}
				grown := driverFree(t, a, e)
				require.Greater(t, before-grown, uint64(250*mib), "the pool grew by a few hundred MiB")
				for _, q := range ptrs {
					require.NoError(t, a.Free(q))
				}
				if path.name == "ReleaseStream+Close" {
					require.NoError(t, a.ReleaseStream(s))
					require.NoError(t, e.StreamDestroy(s))
				}
				require.NoError(t, path.give(a, p))
				mustCheck(t, a, e)
				after, cached := driverFree(t, a, e), a.cachedHandleBytes()
				if path.name == "Allocator.EmptyCache" || path.name == "Pool.EmptyCache" {
					// EmptyCache empties the device-wide cache too.
					assert.Zero(t, cached)
					assert.Equal(t, before+cachedBefore, after, "driver free memory")
					return
				}
				// What the pool's growth took from the cache is freed, not
				// put back; nothing of the pool's stays cached.
				assert.LessOrEqual(t, cached, cachedBefore, "the pool's handles stay in the handle cache")
				assert.Equal(t, before+cachedBefore, after+cached,
					"driver free memory %d MiB, %d MiB cached; before the pool: %d MiB, %d MiB cached",
					after/mib, cached/mib, before/mib, cachedBefore/mib)
				if p.SleepState() == Asleep {
					require.NoError(t, p.Wake())
					require.NoError(t, p.Close())
				}
			})
		}
	}
}
