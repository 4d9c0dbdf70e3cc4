package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// poolHandles maps every mapped handle start to the pool whose blocks lie
// in it, failing if two pools share one.
func poolHandles(t *testing.T, a *Allocator) map[uintptr]*Pool {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[uintptr]*Pool{}
	for _, sg := range a.segs {
		r, _ := a.heap.Region(sg.rid)
		for id := r.Head; id != 0; id = a.heap.Next(id) {
			b, _ := a.heap.Block(id)
			if b.StreamID == 0 {
				continue
			}
			p := a.states[b.StreamID].pool
			for off := uint64(b.Addr - sg.base); off < uint64(b.End()-sg.base); {
				start, size, ok := sg.s.HandleRange(off)
				require.True(t, ok)
				h := sg.base + uintptr(start)
				if q, seen := out[h]; seen {
					require.Same(t, q, p, "handle %#x shared by pools %q and %q", h, q.Name(), p.Name())
				}
				out[h] = p
				off = start + size
			}
		}
	}
	return out
}

func TestPoolMallocFreeKeepsPoolsApart(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(4*gib))
	p1, err := a.NewPool(PoolOptions{Name: "train"})
	require.NoError(t, err)
	p2, err := a.NewPool(PoolOptions{Name: "serve"})
	require.NoError(t, err)
	assert.Equal(t, PoolID{0, 1}, p1.ID())
	assert.Equal(t, PoolID{0, 2}, p2.ID())
	assert.Equal(t, PoolID{}, a.DefaultPool().ID())

	x, err := p1.Malloc(3<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(x))
	// p1's cached block is never handed to p2 or to the default pool.
	y, err := p2.Malloc(3<<20, 0)
	require.NoError(t, err)
	assert.NotEqual(t, x, y)
	z, err := a.Malloc(3<<20, 0)
	require.NoError(t, err)
	assert.NotEqual(t, x, z)
	assert.NotEqual(t, y, z)
	// p1 reuses its own.
	x2, err := p1.Malloc(3<<20, 0)
	require.NoError(t, err)
	assert.Equal(t, x, x2)
	poolHandles(t, a)
	mustCheck(t, a, e)

	for _, c := range []struct {
		p    *Pool
		want int64
	}{{p1, 3 << 20}, {p2, 3 << 20}, {a.DefaultPool(), 3 << 20}} {
		s := c.p.Stats()
		assert.Equal(t, c.want, s.AllocatedBytes[stats.AllPools].Current, c.p.Name())
		assert.Equal(t, int64(1), s.Allocation[stats.AllPools].Current, c.p.Name())
	}
	all := a.Stats()
	assert.Equal(t, int64(9<<20), all.AllocatedBytes[stats.AllPools].Current)
	var reserved int64
	for _, p := range a.Pools() {
		reserved += p.Stats().ReservedBytes[stats.AllPools].Current
	}
	assert.Equal(t, all.ReservedBytes[stats.AllPools].Current, reserved)
	for _, ptr := range []uintptr{x2, y, z} {
		require.NoError(t, a.Free(ptr))
	}
	mustCheck(t, a, e)
}

// TestPoolSharesReservations: pools share the device's VA reservations,
// so the address-space bound (4.5× device memory) holds with 64 pools on
// many streams.
func TestPoolSharesReservations(t *testing.T) {
	const capacity = 2 * gib
	a, e := newAlloc(t, "", emulated.WithCapacity(capacity))
	var streams []backend.Stream
	for i := 0; i < 4; i++ {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	var ptrs []uintptr
	for i := 0; i < maxPools; i++ {
		p, err := a.NewPool(PoolOptions{})
		require.NoError(t, err)
		for j, s := range streams {
			size := uint64(512 << (i % 12))
			if j%2 == 1 {
				size = 6 << 20
			}
			ptr, err := p.Malloc(size, s)
			require.NoError(t, err)
			ptrs = append(ptrs, ptr)
		}
	}
	_, err := a.NewPool(PoolOptions{})
	require.ErrorIs(t, err, ErrInvalidConfig, "more than 64 pools")
	var va uint64
	for _, r := range e.Reservations() {
		va += r.Size
	}
	assert.LessOrEqual(t, va, uint64(capacity)*9/2)
	poolHandles(t, a)
	mustCheck(t, a, e)
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
	for _, s := range streams {
		require.NoError(t, a.ReleaseStream(s))
		require.NoError(t, e.StreamDestroy(s))
	}
	mustCheck(t, a, e)
}

// TestPoolOOMTakesBackOtherPoolsCache: a pool that cannot grow takes the
// free cached memory of every other pool first (verl#6912). Under
// pressure it adopts their idle handles where they are mapped, with no
// driver call; with a segment hook attached (hooks report each range with
// its pool) the out-of-memory ladder unmaps them instead and the growth
// maps fresh memory after one retry.
func TestPoolOOMTakesBackOtherPoolsCache(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hook    bool
		retries int64
		maps    bool // the second pool's Malloc maps memory
	}{
		{"adopted in place", false, 0, false},
		{"ladder with a hook", true, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, "", emulated.WithCapacity(1*gib))
			if tc.hook {
				_, err := a.AddSegmentHook(SegmentHook{Unmapped: func(SegmentRange) {}})
				require.NoError(t, err)
			}
			p1, err := a.NewPool(PoolOptions{Name: "a"})
			require.NoError(t, err)
			p2, err := a.NewPool(PoolOptions{Name: "b"})
			require.NoError(t, err)
			x, err := p1.Malloc(700<<20, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(x))
			assert.Equal(t, uint64(700<<20), p1.MemoryReserved())
			maps := e.Calls(backend.OpMap)
			before := a.Stats()
			y, err := p2.Malloc(700<<20, 0)
			require.NoError(t, err, "p1's cache must be taken back")
			assert.Zero(t, p1.MemoryReserved())
			assert.Equal(t, uint64(700<<20), p2.MemoryReserved())
			assert.Equal(t, tc.retries, p2.Stats().NumAllocRetries)
			assert.Equal(t, tc.maps, e.Calls(backend.OpMap) > maps)
			after := a.Stats()
			// The aggregate counts the hand-over as an unmap and a map: its
			// current and peak stay.
			assert.Equal(t, before.ReservedBytes[stats.AllPools].Current, after.ReservedBytes[stats.AllPools].Current)
			assert.Equal(t, before.ReservedBytes[stats.AllPools].Peak, after.ReservedBytes[stats.AllPools].Peak)
			mustCheck(t, a, e)
			require.NoError(t, a.Free(y))
			mustCheck(t, a, e)
		})
	}
}

// TestPoolAdoptionRules: a pool under pressure adopts another pool's idle
// handles only where the rules allow: never past its own memory limit,
// never from a pool that is asleep, and never while the device has room
// (no pressure), where each pool keeps its cache.
func TestPoolAdoptionRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    uint64 // of the first pool's freed allocation
		limit   uint64 // the second pool's memory limit (0: none)
		held    uint64 // the second pool's live bytes before the request
		sleep   bool   // the first pool sleeps before the second grows
		adopted bool
	}{
		{"under pressure", 700 << 20, 0, 0, false, true},
		{"room left", 200 << 20, 0, 0, false, false},
		{"past the taker's limit", 700 << 20, 450 << 20, 200 << 20, false, false},
		{"lender asleep", 700 << 20, 0, 0, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, "", emulated.WithCapacity(1*gib))
			p1, err := a.NewPool(PoolOptions{Name: "a"})
			require.NoError(t, err)
			p2, err := a.NewPool(PoolOptions{Name: "b", MemoryLimit: tc.limit})
			require.NoError(t, err)
			x, err := p1.Malloc(tc.size, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(x))
			if tc.held > 0 {
				_, err := p2.Malloc(tc.held, 0)
				require.NoError(t, err)
			}
			if tc.sleep {
				require.NoError(t, p1.Sleep(SleepOptions{}))
			}
			lent := p1.MemoryReserved()
			y, err := p2.Malloc(300<<20, 0)
			switch {
			case tc.limit != 0:
				var oom *OutOfMemoryError
				require.ErrorAs(t, err, &oom)
				assert.Equal(t, tc.limit, oom.PoolLimit)
				assert.Equal(t, lent, p1.MemoryReserved(), "p1 keeps its cache")
			case tc.adopted:
				require.NoError(t, err)
				assert.Equal(t, lent-300<<20, p1.MemoryReserved(), "p2 took whole handles worth its request")
			default:
				require.NoError(t, err)
				if !tc.sleep {
					assert.Equal(t, lent, p1.MemoryReserved(), "p1 keeps its cache")
				}
			}
			mustCheck(t, a, e)
			if err == nil {
				require.NoError(t, a.Free(y))
				mustCheck(t, a, e)
			}
		})
	}
}

func TestPoolMemoryLimit(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf, emulated.WithCapacity(1*gib))
			p, err := a.NewPool(PoolOptions{Name: "capped", MemoryLimit: 64 << 20})
			require.NoError(t, err)
			other, err := a.Malloc(100<<20, 0) // the default pool is not capped
			require.NoError(t, err)
			x, err := p.Malloc(40<<20, 0)
			require.NoError(t, err)
			before := a.Stats()
			_, err = p.Malloc(40<<20, 0)
			var oom *OutOfMemoryError
			require.ErrorAs(t, err, &oom)
			require.ErrorIs(t, err, ErrOutOfMemory)
			assert.Equal(t, "capped", oom.PoolName)
			assert.Equal(t, uint64(64<<20), oom.PoolLimit)
			assert.Equal(t, p.ID(), oom.Pool)
			assert.Contains(t, err.Error(), `pool "capped", whose memory limit of 64 MiB is reached`)
			assert.LessOrEqual(t, p.MemoryReserved(), uint64(64<<20))
			// The default pool's memory was not touched by the capped
			// pool's failure.
			assert.Equal(t, before.ReservedBytes[stats.AllPools].Current, a.Stats().ReservedBytes[stats.AllPools].Current)
			assert.Equal(t, int64(1), p.Stats().NumOOMs)
			require.NoError(t, a.Free(x))
			// After the free the pool fits again.
			y, err := p.Malloc(60<<20, 0)
			require.NoError(t, err)
			mustCheck(t, a, e)
			require.NoError(t, a.Free(y))
			require.NoError(t, a.Free(other))
		})
	}
}

func TestPoolOptionsMisuse(t *testing.T) {
	a, e := newAlloc(t, "")
	other, _ := newAlloc(t, "")
	foreign, err := other.NewPool(PoolOptions{})
	require.NoError(t, err)
	_ = foreign
	p, err := a.NewPool(PoolOptions{ID: PoolID{7, 0}})
	require.NoError(t, err)
	before := a.Stats()
	for _, c := range []struct {
		name string
		o    PoolOptions
		want error
	}{
		{"limit below a granule", PoolOptions{MemoryLimit: 1}, ErrInvalidConfig},
		{"limit just below a granule", PoolOptions{MemoryLimit: a.Granularity() - 1}, ErrInvalidConfig},
		{"bad segment kind", PoolOptions{Segments: SegmentKind(9)}, ErrInvalidConfig},
		{"negative segment kind", PoolOptions{Segments: SegmentKind(-1)}, ErrInvalidConfig},
		{"duplicate id", PoolOptions{ID: PoolID{7, 0}}, ErrInvalidConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := a.NewPool(c.o)
			require.ErrorIs(t, err, c.want)
			assert.Len(t, a.Pools(), 2)
		})
	}
	// Limits 0 (none) and 2^64−1 (none in effect): no overflow.
	for _, limit := range []uint64{0, math.MaxUint64} {
		q, err := a.NewPool(PoolOptions{MemoryLimit: limit})
		require.NoError(t, err)
		ptr, err := q.Malloc(300<<20, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(ptr))
		require.NoError(t, q.Close())
	}
	assert.Equal(t, uint64(0), a.DefaultPool().MemoryLimit())
	require.ErrorIs(t, a.DefaultPool().Close(), ErrInvalidPool)
	// Closed pools refuse everything but stay harmless.
	require.NoError(t, p.Close())
	_, err = p.Malloc(1, 0)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, p.Close(), ErrClosed)
	require.ErrorIs(t, p.EmptyCache(), ErrClosed)
	assert.Equal(t, before.Allocation[0].Current, a.Stats().Allocation[0].Current)
	mustCheck(t, a, e)
	// After the allocator closes, pools return ErrClosed.
	q, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	require.NoError(t, a.Close())
	_, err = q.Malloc(1, 0)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, q.Close(), ErrClosed)
	_, err = a.NewPool(PoolOptions{})
	require.ErrorIs(t, err, ErrClosed)
}

func TestPoolCloseRefusedWhileLive(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	p, err := a.NewPool(PoolOptions{Name: "graph"})
	require.NoError(t, err)
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	x, err := p.Malloc(5<<20, 0)
	require.NoError(t, err)
	err = p.Close()
	require.ErrorIs(t, err, ErrPoolBusy)
	assert.Contains(t, err.Error(), `pool "graph" has 1 allocations`)
	// A pointer freed with a pending use keeps the pool busy too.
	require.NoError(t, a.RecordStream(x, s2))
	require.NoError(t, a.Free(x))
	require.ErrorIs(t, p.Close(), ErrPoolBusy)
	require.NoError(t, e.CompleteAll())
	require.NoError(t, a.Synchronize(s2))
	require.NoError(t, a.EmptyCache()) // completes the event
	require.NoError(t, p.Close())
	assert.Zero(t, p.MemoryReserved())
	mustCheck(t, a, e)
	require.NoError(t, a.ReleaseStream(s2))
	require.NoError(t, e.StreamDestroy(s2))
}

// TestPoolEmptyCacheTouchesOnlyItsPool: empty_cache inside a pool is not a
// no-op (pytorch#158152) and leaves the other pools' caches alone.
func TestPoolEmptyCacheTouchesOnlyItsPool(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf)
			p1, err := a.NewPool(PoolOptions{})
			require.NoError(t, err)
			p2, err := a.NewPool(PoolOptions{})
			require.NoError(t, err)
			for _, p := range []*Pool{p1, p2, a.DefaultPool()} {
				x, err := p.Malloc(30<<20, 0)
				require.NoError(t, err)
				require.NoError(t, a.Free(x))
			}
			r2, r0 := p2.MemoryReserved(), a.DefaultPool().MemoryReserved()
			require.NotZero(t, p1.MemoryReserved())
			require.NoError(t, p1.EmptyCache())
			assert.Zero(t, p1.MemoryReserved())
			assert.Equal(t, r2, p2.MemoryReserved())
			assert.Equal(t, r0, a.DefaultPool().MemoryReserved())
			mustCheck(t, a, e)
		})
	}
}

// TestPoolSegmentKinds: a pool keeps the segment kind it asks for,
// whatever the allocator's (pytorch#147851).
func TestPoolSegmentKinds(t *testing.T) {
	a, e := newAlloc(t, "expandable_segments:False")
	exp, err := a.NewPool(PoolOptions{Segments: SegmentsExpandable})
	require.NoError(t, err)
	cls, err := a.NewPool(PoolOptions{Segments: SegmentsClassic})
	require.NoError(t, err)
	assert.True(t, exp.Expandable())
	assert.False(t, cls.Expandable())
	assert.False(t, a.DefaultPool().Expandable())
	var ptrs []uintptr
	for i := 0; i < 6; i++ {
		for _, p := range []*Pool{exp, cls, a.DefaultPool()} {
			ptr, err := p.Malloc(uint64(i+1)<<20+4096, 0)
			require.NoError(t, err)
			ptrs = append(ptrs, ptr)
		}
	}
	// Free every other allocation so classic pools get split free blocks
	// (inactive_split), which Check recounts per pool.
	for i := 0; i < len(ptrs); i += 2 {
		require.NoError(t, a.Free(ptrs[i]))
	}
	mustCheck(t, a, e)
	assert.Zero(t, exp.Stats().InactiveSplit[stats.AllPools].Current)
	// Classic segments count in their pools, shared expandable
	// reservations in the default pool's record.
	assert.Equal(t, int64(2), cls.Stats().Segment[stats.AllPools].Current)
	assert.Zero(t, exp.Stats().Segment[stats.AllPools].Current)
	assert.Positive(t, cls.Stats().InactiveSplit[stats.AllPools].Current)
	for i := 1; i < len(ptrs); i += 2 {
		require.NoError(t, a.Free(ptrs[i]))
	}
	mustCheck(t, a, e)
}

// TestPoolReleaseStreamAndVanish: a released or destroyed stream's memory
// in a private pool goes to that pool's idle owner.
func TestPoolReleaseStreamAndVanish(t *testing.T) {
	a, e := newAlloc(t, "")
	p, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	x, err := p.Malloc(5<<20, s)
	require.NoError(t, err)
	y, err := p.Malloc(7<<20, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(y))
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, e.StreamDestroy(s))
	mustCheck(t, a, e)
	assert.Equal(t, int64(5<<20), p.Stats().AllocatedBytes[stats.AllPools].Current)
	require.NoError(t, a.Free(x)) // freed into the pool's idle owner and unmapped
	assert.Zero(t, p.MemoryReserved())
	mustCheck(t, a, e)

	// A stream destroyed behind the allocator's back: its pool memory
	// waits for a device synchronize, which the emulator does.
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	z, err := p.Malloc(5<<20, s2)
	require.NoError(t, err)
	require.NoError(t, a.Free(z))
	require.NoError(t, e.StreamDestroy(s2))
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, p.MemoryReserved())
	mustCheck(t, a, e)
	require.NoError(t, p.Close())
	mustCheck(t, a, e)
}

// TestPoolFaultsRollBack injects a fault at each driver call of pool
// growths and releases; every failure leaves the allocator consistent.
func TestPoolFaultsRollBack(t *testing.T) {
	ops := []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess, backend.OpUnmap, backend.OpFree, backend.OpReserve, backend.OpStreamSync, backend.OpEventRecord}
	for _, op := range ops {
		for n := 1; n <= 3; n++ {
			t.Run(fmt.Sprintf("%v/%d", op, n), func(t *testing.T) {
				a, e := newAlloc(t, "")
				p, err := a.NewPool(PoolOptions{MemoryLimit: 256 << 20})
				require.NoError(t, err)
				q, err := a.NewPool(PoolOptions{Segments: SegmentsClassic})
				require.NoError(t, err)
				require.NoError(t, e.FailNth(op, n, backend.ErrOutOfMemory))
				var live []uintptr
				for i := 0; i < 6; i++ {
					for _, pl := range []*Pool{p, q, a.DefaultPool()} {
						if ptr, err := pl.Malloc(uint64(i+1)*9<<20, 0); err == nil {
							live = append(live, ptr)
						}
					}
					_ = p.EmptyCache()
					require.NoError(t, a.Check())
				}
				e.ClearFaults()
				for _, ptr := range live {
					require.NoError(t, a.Free(ptr))
				}
				_ = a.EmptyCache()
				mustCheck(t, a, e)
				require.NoError(t, p.Close())
				require.NoError(t, q.Close())
				mustCheck(t, a, e)
			})
		}
	}
}

// TestPoolsRace: many goroutines on many pools and streams, with pool
// creation, closing and emptying; run with -race.
func TestPoolsRace(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(2*gib))
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			s, err := e.StreamCreate(0)
			if err != nil {
				errs <- err
				return
			}
			for round := 0; round < 4; round++ {
				p, err := a.NewPool(PoolOptions{MemoryLimit: uint64(64+rng.IntN(128)) << 20})
				if err != nil {
					errs <- err
					return
				}
				var live []uintptr
				for i := 0; i < 60; i++ {
					pl := p
					if rng.IntN(3) == 0 {
						pl = a.DefaultPool()
					}
					st := s
					if rng.IntN(2) == 0 {
						st = 0
					}
					ptr, err := pl.Malloc(uint64(1+rng.IntN(8<<20)), st)
					if err != nil {
						if !errors.Is(err, ErrOutOfMemory) {
							errs <- err
							return
						}
					} else {
						live = append(live, ptr)
					}
					if len(live) > 0 && rng.IntN(2) == 0 {
						j := rng.IntN(len(live))
						if err := a.Free(live[j]); err != nil {
							errs <- err
							return
						}
						live = append(live[:j], live[j+1:]...)
					}
					if i%20 == 0 {
						_ = p.Stats()
						if err := p.EmptyCache(); err != nil {
							errs <- err
							return
						}
					}
				}
				for _, ptr := range live {
					if err := a.Free(ptr); err != nil {
						errs <- err
						return
					}
				}
				if err := p.Close(); err != nil {
					errs <- err
					return
				}
			}
			if err := a.ReleaseStream(s); err != nil {
				errs <- err
				return
			}
			errs <- e.StreamDestroy(s)
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	mustCheck(t, a, e)
	assert.Len(t, a.Pools(), 1)
}

// TestPoolInHistoryAndSnapshot: trace entries, snapshot blocks, the
// memory viewer's segment_pool_id and Summary carry the pool.
func TestPoolInHistoryAndSnapshot(t *testing.T) {
	a, e := newAlloc(t, "")
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 100}))
	p, err := a.NewPool(PoolOptions{Name: "graph", ID: PoolID{3, 0}, MemoryLimit: 1 << 30})
	require.NoError(t, err)
	x, err := p.Malloc(5<<20, 0)
	require.NoError(t, err)
	y, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	h, ok := a.History()
	require.True(t, ok)
	pools := map[stats.TraceAction][]PoolID{}
	for _, en := range h.Entries {
		pools[en.Action] = append(pools[en.Action], PoolID(en.Pool))
	}
	assert.Equal(t, []PoolID{{3, 0}, {}}, pools[stats.TraceAlloc])
	assert.Equal(t, []PoolID{{3, 0}, {}}, pools[stats.TraceSegmentMap])
	snap := a.Snapshot()
	var seen []PoolID
	for _, sg := range snap.Segments {
		for _, b := range sg.Blocks {
			if b.State == stats.BlockActiveAllocated {
				seen = append(seen, PoolID(b.Pool))
			}
		}
	}
	assert.ElementsMatch(t, []PoolID{{3, 0}, {}}, seen)
	var buf bytes.Buffer
	require.NoError(t, a.WriteSnapshot(&buf))
	// segment_pool_id (3, 0) pickled as two small ints and a TUPLE2.
	assert.Contains(t, buf.String(), "segment_pool_idK\x03K\x00\x86")
	sum := a.Summary()
	assert.Contains(t, sum, "(3,0)      graph            expandable    1.0 GiB")
	assert.Contains(t, sum, "(0,0)      default")
	require.NoError(t, a.Free(x))
	require.NoError(t, a.Free(y))
	mustCheck(t, a, e)
}

// TestPoolAlignment: an aligned pool's allocations and the handles behind
// them start at multiples of the alignment and have sizes that are
// multiples of it, however other pools' handles fragment the shared
// reservations.
func TestPoolAlignment(t *testing.T) {
	a, e := newAlloc(t, "")
	const align = 8 << 20
	p, err := a.NewPool(PoolOptions{Alignment: align})
	require.NoError(t, err)
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 5))
	var live, other []uintptr
	for i := 0; i < 200; i++ {
		// The default pool maps odd-sized ranges between the aligned
		// pool's, so unmapped runs start anywhere on the granule grid.
		if o, err := a.Malloc(uint64(1+rng.IntN(5<<20)), 0); err == nil {
			other = append(other, o)
		}
		s := backend.Stream(0)
		if rng.IntN(2) == 0 {
			s = s2
		}
		ptr, err := p.Malloc(uint64(1+rng.IntN(30<<20)), s)
		require.NoError(t, err)
		require.Zero(t, ptr%align, "allocation %#x", ptr)
		size, spans, err := a.Spans(ptr)
		require.NoError(t, err)
		require.Zero(t, size%align)
		for _, sp := range spans {
			require.Zero(t, sp.VA%align, "handle %#x", sp.VA)
			require.Zero(t, sp.Size%align, "handle %#x+%d", sp.VA, sp.Size)
		}
		live = append(live, ptr)
		if rng.IntN(3) > 0 {
			j := rng.IntN(len(live))
			require.NoError(t, a.Free(live[j]))
			live = append(live[:j], live[j+1:]...)
		}
		if len(other) > 0 && rng.IntN(2) == 0 {
			j := rng.IntN(len(other))
			require.NoError(t, a.Free(other[j]))
			other = append(other[:j], other[j+1:]...)
		}
		if i%40 == 0 {
			require.NoError(t, p.EmptyCache())
			mustCheck(t, a, e)
		}
	}
	for _, ptr := range append(live, other...) {
		require.NoError(t, a.Free(ptr))
	}
	mustCheck(t, a, e)
	require.NoError(t, a.ReleaseStream(s2))
	require.NoError(t, e.StreamDestroy(s2))

	for _, c := range []struct {
		name string
		o    PoolOptions
	}{
		{"not a power of two", PoolOptions{Alignment: 3 << 20}},
		{"below the granularity", PoolOptions{Alignment: 1 << 20}},
		{"one byte", PoolOptions{Alignment: 1}},
		{"above the device", PoolOptions{Alignment: 1 << 62}},
		{"classic segments", PoolOptions{Alignment: 8 << 20, Segments: SegmentsClassic}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := len(a.Pools())
			_, err := a.NewPool(c.o)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Len(t, a.Pools(), n)
		})
	}
	q, err := a.NewPool(PoolOptions{Alignment: a.Granularity()}) // the granule: no constraint
	require.NoError(t, err)
	require.NoError(t, q.Close())
}

// TestPoolIsolated: every live allocation of an isolated pool lies in
// handles no other allocation (of any pool) shares; a freed allocation's
// handles serve the next allocation of the same mapped size on its stream.
func TestPoolIsolated(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf)
			p, err := a.NewPool(PoolOptions{Isolated: true})
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(9, 9))
			live := map[uintptr]bool{} // ptr → isolated
			check := func() {
				owner := map[uintptr]uintptr{} // handle VA → the live allocation in it
				for ptr := range live {
					_, spans, err := a.Spans(ptr)
					require.NoError(t, err)
					for _, sp := range spans {
						if q, ok := owner[sp.VA]; ok && (live[q] || live[ptr]) {
							t.Fatalf("isolated allocation shares handle %#x: %#x and %#x", sp.VA, q, ptr)
						}
						owner[sp.VA] = ptr
					}
				}
			}
			for i := 0; i < 150; i++ {
				s := backend.Stream(0)
				if rng.IntN(2) == 0 {
					s = s2
				}
				size := uint64(1 + rng.IntN(6<<20))
				if rng.IntN(4) == 0 {
					size = 4096 // small ones, which a shared pool would pack into one handle
				}
				if ptr, err := p.Malloc(size, s); err == nil {
					live[ptr] = true
				} else {
					require.ErrorIs(t, err, ErrOutOfMemory)
				}
				if ptr, err := a.Malloc(4096, s); err == nil {
					live[ptr] = false
				}
				check()
				if rng.IntN(2) == 0 {
					for ptr := range live {
						require.NoError(t, a.Free(ptr))
						delete(live, ptr)
						break
					}
				}
				if i%50 == 49 {
					require.NoError(t, p.EmptyCache())
					mustCheck(t, a, e)
				}
			}
			// Reuse: the same size on the same stream takes the freed
			// allocation's handles back.
			x, err := p.Malloc(4096, s2)
			require.NoError(t, err)
			require.NoError(t, a.Free(x))
			y, err := p.Malloc(4096, s2)
			require.NoError(t, err)
			assert.Equal(t, x, y)
			require.NoError(t, a.Free(y))
			for ptr := range live {
				require.NoError(t, a.Free(ptr))
			}
			mustCheck(t, a, e)
			require.NoError(t, a.ReleaseStream(s2))
			require.NoError(t, e.StreamDestroy(s2))
			mustCheck(t, a, e)
			require.NoError(t, p.Close())
			mustCheck(t, a, e)
		})
	}
}
