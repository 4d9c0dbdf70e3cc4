package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// The out-of-memory ladder never fails a Malloc that an immediate retry,
// with nothing changed, would serve (pytorch/pytorch#189504): what other
// goroutines did while the ladder had the lock dropped (a free, a free
// pending on events, a growth or a release in flight) is looked at again
// before it gives up (oom.go). Each test drives one such interleaving
// deterministically with the held driver calls of holdDriver and asserts
// the first Malloc succeeds, or, had it failed, that a retry fails too.

// oomConf are the configurations the interleavings run in: 2 MiB handles
// everywhere, so that the figures are exact.
var oomModes = []interleaveMode{
	{"expandable", "expandable_segments:True,large_segment_size_mb:2,expandable_handle_mb:0"},
	{"classic", "expandable_segments:False,large_segment_size_mb:2"},
}

// busyStream makes s hold its work and queues some: its queued work is
// not complete (so no growth adopts or reclaims its free memory without
// a wait) until a synchronize completes it.
func busyStream(t *testing.T, drv *holdDriver, s backend.Stream) {
	t.Helper()
	require.NoError(t, drv.Hold(s))
	require.NoError(t, drv.Launch(s, 0, 0))
}

// requireRetryConsistent asserts the property: a first Malloc of size on
// s that failed for lack of memory fails again when retried at once.
// It returns the first Malloc's pointer.
func requireRetryConsistent(t *testing.T, a *Allocator, first growResult, size uint64, s backend.Stream) uintptr {
	t.Helper()
	return requireRetryConsistentIn(t, a, a.Malloc, first, size, s)
}

// requireRetryConsistentIn is requireRetryConsistent for the Malloc of a
// pool of a.
func requireRetryConsistentIn(t *testing.T, a *Allocator, malloc func(uint64, backend.Stream) (uintptr, error), first growResult, size uint64, s backend.Stream) uintptr {
	t.Helper()
	if first.err == nil {
		return first.p
	}
	require.ErrorIs(t, first.err, ErrOutOfMemory)
	p, err := malloc(size, s)
	if err == nil {
		require.NoError(t, a.Free(p))
	}
	require.Error(t, err, "Malloc failed (%v), yet an immediate retry with nothing changed succeeded", first.err)
	return 0
}

// TestOOMLadderSeesWhatChangedWhileUnlocked: a Malloc on stream s needs
// 12 MiB of a full 64 MiB device. Its rung 2 waits for stream u (whose
// 4 MiB are free) with the lock dropped; meanwhile another goroutine
// frees 16 MiB: to busy stream t, to another pool on s, or pending on
// an event of busy stream v. Before, the ladder had passed those caches
// and declared out of memory, and the retry found the 16 MiB.
func TestOOMLadderSeesWhatChangedWhileUnlocked(t *testing.T) {
	cases := []struct {
		name string
		// setup allocates the 16 MiB block to free, on t (or in pool
		// other, on s); during frees it while u's wait is held.
		setup  func(t *testing.T, a *Allocator, other *Pool, s, tt, v backend.Stream) uintptr
		during func(t *testing.T, a *Allocator, p uintptr)
	}{
		{
			name: "other stream's cache",
			setup: func(t *testing.T, a *Allocator, _ *Pool, _, tt, _ backend.Stream) uintptr {
				p, err := a.Malloc(16*mib, tt)
				require.NoError(t, err)
				return p
			},
			during: func(t *testing.T, a *Allocator, p uintptr) { require.NoError(t, a.Free(p)) },
		},
		{
			name: "other pool's cache",
			setup: func(t *testing.T, _ *Allocator, other *Pool, s, _, _ backend.Stream) uintptr {
				p, err := other.Malloc(16*mib, s)
				require.NoError(t, err)
				return p
			},
			during: func(t *testing.T, a *Allocator, p uintptr) { require.NoError(t, a.Free(p)) },
		},
		{
			name: "pending event",
			setup: func(t *testing.T, a *Allocator, _ *Pool, _, tt, v backend.Stream) uintptr {
				p, err := a.Malloc(16*mib, tt)
				require.NoError(t, err)
				require.NoError(t, a.RecordStream(p, v))
				return p
			},
			during: func(t *testing.T, a *Allocator, p uintptr) { require.NoError(t, a.Free(p)) },
		},
	}
	for _, m := range oomModes {
		for _, c := range cases {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				a, drv := newInterleave(t, m.conf, emulated.WithCapacity(64*mib))
				ss := streams(t, drv, 4) // ascending: the release visits s and t before u
				s, tt, u, v := ss[0], ss[1], ss[2], ss[3]
				require.Less(t, s, tt)
				require.Less(t, tt, u)
				other, err := a.NewPool(PoolOptions{Name: "other"})
				require.NoError(t, err)
				victim := c.setup(t, a, other, s, tt, v)
				pu, err := a.Malloc(4*mib, u)
				require.NoError(t, err)
				require.NoError(t, a.Free(pu))
				for _, x := range []backend.Stream{tt, u, v} {
					busyStream(t, drv, x)
				}
				fill, err := a.Malloc(44*mib, s)
				require.NoError(t, err)
				free, _, err := drv.MemGetInfo(0)
				require.NoError(t, err)
				require.Zero(t, free, "the device is full")

				drv.hold(backend.OpStreamSync, 1)
				res := growAsync(a, 12*mib, s)
				held := drv.next(t)
				require.Equal(t, u, held.stream, "the ladder's release waits for u")
				c.during(t, a, victim)
				held.goOn(nil)
				p := requireRetryConsistent(t, a, recvGrow(t, res, "Malloc"), 12*mib, s)
				require.NotZero(t, p, "the device had the memory: the first Malloc must succeed")
				require.NoError(t, a.Check())
				require.NoError(t, a.Free(p))
				require.NoError(t, a.Free(fill))
				drainAll(t, a, drv, nil)
			})
		}
	}
}

// poolGrowAsync runs p.Malloc on its own goroutine.
func poolGrowAsync(p *Pool, size uint64, s backend.Stream) <-chan growResult {
	ch := make(chan growResult, 1)
	go func() {
		ptr, err := p.Malloc(size, s)
		ch <- growResult{ptr, err}
	}()
	return ch
}

// TestOOMLadderSeesFreeDuringLastGrowth: the ladder's last growth maps
// with the lock dropped; a block of the requesting stream freed meanwhile
// serves the request (the last look searches the free lists again),
// where before the ladder declared out of memory and the retry found the
// block.
func TestOOMLadderSeesFreeDuringLastGrowth(t *testing.T) {
	// Another tenant holds half the device, so the growth fails in the
	// driver (with the lock dropped), not at the allocator's own cap.
	a, drv := newInterleave(t, oomModes[0].conf, emulated.WithCapacity(128*mib))
	_, err := drv.Occupy(0, 64*mib)
	require.NoError(t, err)
	s := streams(t, drv, 1)[0]
	fill, err := a.Malloc(48*mib, s)
	require.NoError(t, err)
	victim, err := a.Malloc(16*mib, s)
	require.NoError(t, err)

	drv.hold(backend.OpCreate, 1)
	res := growAsync(a, 12*mib, s)
	first := drv.next(t) // the first growth: the device is full
	drv.hold(backend.OpCreate, 1)
	first.goOn(nil)
	last := drv.next(t) // rung 2's growth
	require.NoError(t, a.Free(victim))
	last.goOn(nil)
	p := requireRetryConsistent(t, a, recvGrow(t, res, "Malloc"), 12*mib, s)
	require.NotZero(t, p, "a free block fits: the first Malloc must succeed")
	require.Equal(t, victim, p, "served by the block freed meanwhile")
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(fill))
	drainAll(t, a, drv, nil)
}

// TestOOMLadderWaitsForReleaseInFlight: an EmptyCache on another
// goroutine has marked stream t's 16 MiB for release and waits for t;
// a Malloc that needs that memory waits for the release to end, where
// before it declared out of memory (the blocks were neither free nor
// unmapped yet) and a retry then succeeded.
func TestOOMLadderWaitsForReleaseInFlight(t *testing.T) {
	for _, m := range oomModes {
		t.Run(m.name, func(t *testing.T) {
			a, drv := newInterleave(t, m.conf, emulated.WithCapacity(64*mib))
			ss := streams(t, drv, 2)
			s, tt := ss[0], ss[1]
			pt, err := a.Malloc(16*mib, tt)
			require.NoError(t, err)
			require.NoError(t, a.Free(pt))
			busyStream(t, drv, tt)
			fill, err := a.Malloc(48*mib, s)
			require.NoError(t, err)

			drv.hold(backend.OpStreamSync, 1)
			empty := make(chan error, 1)
			go func() { empty <- a.EmptyCache() }()
			held := drv.next(t)
			require.Equal(t, tt, held.stream)
			res := growAsync(a, 12*mib, s)
			var first growResult
			select {
			case first = <-res: // declared out of memory without waiting
				held.goOn(nil)
			case <-reachedWaits(a, func() bool { return a.inflight == 2 && len(a.growths) == 0 && len(a.releasesLive) == 1 }):
				held.goOn(nil) // the Malloc waits for the release
				first = recvGrow(t, res, "Malloc")
			}
			require.NoError(t, recvGrow(t, empty, "EmptyCache"))
			p := requireRetryConsistent(t, a, first, 12*mib, s)
			require.NotZero(t, p, "the release returns the memory: the first Malloc must succeed")
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Free(fill))
			drainAll(t, a, drv, nil)
		})
	}
}

// TestOOMLadderWaitsForGrowthInFlight: a growth of another goroutine
// holds device memory (or, in a pool with a memory limit, counts against
// the limit) while it maps; when its map fails, that memory comes back.
// A Malloc whose growth it crowded out waits for it rather than declare
// out of memory. The device case waited already; the pool-limit case,
// whose growth started while the ladder released the pool, did not.
func TestOOMLadderWaitsForGrowthInFlight(t *testing.T) {
	for _, limited := range []bool{false, true} {
		name := "device"
		if limited {
			name = "pool-limit"
		}
		t.Run(name, func(t *testing.T) {
			a, drv := newInterleave(t, oomModes[0].conf, emulated.WithCapacity(64*mib))
			ss := streams(t, drv, 3)
			s, tt, u := ss[0], ss[1], ss[2]
			opts := PoolOptions{Name: "p"}
			if limited {
				opts.MemoryLimit = 32 * mib
			}
			pool, err := a.NewPool(opts)
			require.NoError(t, err)
			pu, err := pool.Malloc(4*mib, u)
			require.NoError(t, err)
			require.NoError(t, a.Free(pu))
			busyStream(t, drv, u)
			fill, err := pool.Malloc(16*mib, s)
			require.NoError(t, err)
			var other uintptr
			if !limited {
				// The device is full but for 14 MiB: 12 for the
				// growth in flight, 16 with u's 4 for the request.
				other, err = a.Malloc(30*mib, s)
				require.NoError(t, err)
			}

			drv.hold(backend.OpStreamSync, 1)
			res := poolGrowAsync(pool, 16*mib, s)
			held := drv.next(t) // the ladder releases u's 4 MiB of the pool
			require.Equal(t, u, held.stream)
			drv.hold(backend.OpMap, 1)
			rival := poolGrowAsync(pool, 12*mib, tt)
			mapping := drv.next(t) // the rival's growth, created, maps
			held.goOn(nil)
			var first growResult
			select {
			case first = <-res:
				mapping.goOn(backend.ErrUnavailable)
			case <-reachedWaits(a, func() bool { return a.inflight == 2 && len(a.releasesLive) == 0 }):
				mapping.goOn(backend.ErrUnavailable) // the Malloc waits for the growth
				first = recvGrow(t, res, "Malloc")
			}
			r := recvGrow(t, rival, "rival Malloc")
			require.Error(t, r.err, "the rival's map failed")
			p := requireRetryConsistentIn(t, a, pool.Malloc, first, 16*mib, s)
			require.NotZero(t, p, "the failed growth gave its memory back: the first Malloc must succeed")
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Free(fill))
			if other != 0 {
				require.NoError(t, a.Free(other))
			}
			drainAll(t, a, drv, nil)
		})
	}
}

// TestOOMLadderLastLookIsBounded: memory that a release would return but
// cannot (every synchronize of the stream caching it fails) keeps the
// last look asking for rung 2 again; the ladder still ends, after
// maxLadderTries climbs, and the retry fails as the first Malloc did.
func TestOOMLadderLastLookIsBounded(t *testing.T) {
	a, e := newAlloc(t, oomModes[0].conf, emulated.WithCapacity(64*mib))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(16*mib, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, e.Hold(s))
	require.NoError(t, e.Launch(s, 0, 0)) // busy: no growth adopts its memory
	fill, err := a.Malloc(48*mib, 0)
	require.NoError(t, err)
	require.NoError(t, e.FailRandom(backend.OpStreamSync, 1, 1, backend.ErrUnavailable))

	before := a.Stats().NumAllocRetries
	_, err = a.Malloc(12*mib, 0)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Equal(t, int64(maxLadderTries), a.Stats().NumAllocRetries-before, "rung 2 climbed once per growth tried")
	requireRetryConsistent(t, a, growResult{err: err}, 12*mib, 0)

	require.NoError(t, e.FailRandom(backend.OpStreamSync, 0, 0, backend.ErrUnavailable))
	q, err := a.Malloc(12*mib, 0)
	require.NoError(t, err, "once the stream can be synchronised, its memory serves the request")
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Free(fill))
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, e.StreamDestroy(s))
	mustCheck(t, a, e)
}
