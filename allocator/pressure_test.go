package allocator

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// handleSizes counts the mapped handles of a by size in MiB.
func handleSizes(a *Allocator) map[uint64]int {
	_, maps, _ := a.Footprint()
	n := map[uint64]int{}
	for _, m := range maps {
		n[m.Size>>20]++
	}
	return n
}

// TestGrowthUnderPressureMapsGranules: a growth that keeps reserved memory
// within half of what the process may use (the device, the memory
// fraction, a pool's limit) maps 64 MiB growth handles; one past it maps
// granule handles, which releases can unmap one by one.
func TestGrowthUnderPressureMapsGranules(t *testing.T) {
	tests := []struct {
		name     string
		conf     string
		capacity uint64
		limit    uint64 // a private pool's MemoryLimit; 0: the default pool
	}{
		{"device", "", 1 * gib, 0},
		{"per_process_memory_fraction", "per_process_memory_fraction:0.5", 2 * gib, 0},
		{"pool limit", "", 8 * gib, 640 * mib},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, tc.conf, emulated.WithCapacity(tc.capacity))
			malloc := a.Malloc
			if tc.limit != 0 {
				p, err := a.NewPool(PoolOptions{MemoryLimit: tc.limit})
				require.NoError(t, err)
				malloc = p.Malloc
			}
			x, err := malloc(320*mib, 0) // 320 of 1024 (or 640) MiB: room
			require.NoError(t, err)
			assert.Equal(t, map[uint64]int{64: 5}, handleSizes(a))
			y, err := malloc(320*mib, 0) // 640 MiB: past half
			require.NoError(t, err)
			assert.Equal(t, map[uint64]int{64: 5, 2: 160}, handleSizes(a))
			mustCheck(t, a, e)
			// Freed, y's granules are unmapped one by one: a release of 10
			// MiB returns exactly 10 MiB.
			require.NoError(t, a.Free(y))
			z, err := malloc(310*mib, 0)
			require.NoError(t, err)
			assert.Equal(t, z, y, "the hole's best fit")
			require.NoError(t, a.EmptyCache())
			assert.Equal(t, uint64(630*mib), a.MemoryReserved(), "y's 5 free granules unmapped")
			mustCheck(t, a, e)
			require.NoError(t, a.Free(x))
			require.NoError(t, a.Free(z))
		})
	}
}

// TestHandleCacheHonoursBudget: with release_threshold_mb:0 every free
// handle is unmapped at Synchronize; the handle cache keeps them up to
// handle_cache_mb whatever their size (64 MiB growth handles, 20 MiB
// pages), and a later growth of the same shape reuses them all.
func TestHandleCacheHonoursBudget(t *testing.T) {
	const blocks, block = 10, 320 * mib // 5 growth handles or 16 pages each
	tests := []struct {
		conf   string
		cached uint64 // bytes cached after Synchronize
	}{
		{"release_threshold_mb:0,handle_cache_mb:8192", blocks * block},
		{"release_threshold_mb:0,handle_cache_mb:8192,expandable_handle_mb:0", blocks * block},
		// A budget below what is freed: as many 64 MiB handles as fit.
		{"release_threshold_mb:0,handle_cache_mb:1000", 15 * 64 * mib},
		{"release_threshold_mb:0,handle_cache_mb:1000,expandable_handle_mb:0", 50 * 20 * mib},
	}
	for _, tc := range tests {
		t.Run(tc.conf, func(t *testing.T) {
			a, e := newAlloc(t, tc.conf)
			var ps []uintptr
			for range blocks {
				p, err := a.Malloc(block, 0)
				require.NoError(t, err)
				ps = append(ps, p)
			}
			for _, p := range ps {
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, a.Synchronize(0))
			assert.Zero(t, a.MemoryReserved())
			a.mu.Lock()
			cached := a.cachedHandleBytes()
			a.mu.Unlock()
			assert.Equal(t, tc.cached, cached)
			free, total, err := e.MemGetInfo(0)
			require.NoError(t, err)
			assert.Equal(t, total-tc.cached, free, "the cache holds device memory")
			mustCheck(t, a, e)

			before := a.Stats()
			for i := range ps {
				var err error
				ps[i], err = a.Malloc(block, 0)
				require.NoError(t, err)
			}
			after := a.Stats()
			handles := int64(blocks * 5)
			each := uint64(64 * mib)
			if a.cfg.ExpandableHandleSize == 0 {
				handles, each = blocks*16, 20*mib
			}
			assert.Equal(t, int64(tc.cached/each), after.HandlesReused-before.HandlesReused)
			assert.Equal(t, handles-int64(tc.cached/each), after.HandlesCreated-before.HandlesCreated)
			mustCheck(t, a, e)
			for _, p := range ps {
				require.NoError(t, a.Free(p))
			}
		})
	}
}

// pressureRig maps, on a 1 GiB device, x (320 MiB: five 64 MiB growth
// handles, mapped with room) and y (640 MiB: granule handles, past half of
// the device), and frees x: five wholly free growth handles under pressure.
func pressureRig(t *testing.T) (a *Allocator, e *emulated.Emulator, x, y uintptr) {
	t.Helper()
	a, e = newAlloc(t, "", emulated.WithCapacity(1*gib))
	x, err := a.Malloc(320*mib, 0)
	require.NoError(t, err)
	y, err = a.Malloc(640*mib, 0)
	require.NoError(t, err)
	require.Equal(t, map[uint64]int{64: 5, 2: 320}, handleSizes(a))
	require.NoError(t, a.Free(x))
	mustCheck(t, a, e)
	return a, e, x, y
}

// deviceFree is the device memory the driver has not handed out.
func deviceFree(t *testing.T, e *emulated.Emulator) uint64 {
	t.Helper()
	free, _, err := e.MemGetInfo(0)
	require.NoError(t, err)
	return free
}

// TestPressureUnmapsRatherThanCuts: under pressure a Malloc whose best fit
// would cut a wholly free growth handle unmaps it (after its stream's
// work) and fits again; with the five of x unmapped one by one, the
// request is a growth of granules at x's address, and none of the 64 MiB
// handles stays cached. With room (an 8 GiB device) the same request cuts
// x's first handle, as before.
func TestPressureUnmapsRatherThanCuts(t *testing.T) {
	a, e, x, _ := pressureRig(t)
	syncs := e.CallCounts()[backend.OpStreamSync]
	z, err := a.Malloc(10*mib, 0)
	require.NoError(t, err)
	assert.Equal(t, x, z, "granules mapped where x's handles were")
	assert.Equal(t, map[uint64]int{2: 325}, handleSizes(a))
	assert.Equal(t, uint64(650*mib), a.MemoryReserved())
	assert.Equal(t, uint64(gib-650*mib), deviceFree(t, e), "the growth handles were freed, not cached")
	assert.Equal(t, syncs+5, e.CallCounts()[backend.OpStreamSync], "one wait per handle unmapped")
	mustCheck(t, a, e)

	// The cache hit under pressure: an exact fit is served as before.
	require.NoError(t, a.Free(z))
	w, err := a.Malloc(10*mib, 0)
	require.NoError(t, err)
	assert.Equal(t, z, w)
	mustCheck(t, a, e)

	room, re := newAlloc(t, "", emulated.WithCapacity(8*gib))
	rx, err := room.Malloc(320*mib, 0)
	require.NoError(t, err)
	_, err = room.Malloc(640*mib, 0)
	require.NoError(t, err)
	require.NoError(t, room.Free(rx))
	rz, err := room.Malloc(10*mib, 0)
	require.NoError(t, err)
	assert.Equal(t, rx, rz)
	assert.Equal(t, map[uint64]int{64: 15}, handleSizes(room), "no pressure: the handle is cut")
	mustCheck(t, room, re)
}

// growthRig maps, on a 1 GiB device, x (128 MiB: two growth handles), w
// (320 MiB: five more, within half) and v (320 MiB: granules, past half),
// and frees x: a free run of two growth handles too small for 200 MiB.
func growthRig(t *testing.T) (a *Allocator, e *emulated.Emulator) {
	t.Helper()
	a, e = newAlloc(t, "", emulated.WithCapacity(1*gib))
	x, err := a.Malloc(128*mib, 0)
	require.NoError(t, err)
	_, err = a.Malloc(320*mib, 0)
	require.NoError(t, err)
	_, err = a.Malloc(320*mib, 0)
	require.NoError(t, err)
	require.Equal(t, map[uint64]int{64: 7, 2: 160}, handleSizes(a))
	require.NoError(t, a.Free(x))
	return a, e
}

// TestPressureGrowthUnmapsFreeGrowthHandles: a growth under pressure first
// unmaps the growing stream's wholly free growth handles, so the memory
// they held is mapped again in granules where the heap grows.
func TestPressureGrowthUnmapsFreeGrowthHandles(t *testing.T) {
	a, e := growthRig(t)
	_, err := a.Malloc(200*mib, 0) // x's 128 MiB cannot hold it: a growth
	require.NoError(t, err)
	assert.Equal(t, map[uint64]int{64: 5, 2: 260}, handleSizes(a), "x's handles unmapped")
	assert.Equal(t, uint64(840*mib), a.MemoryReserved())
	assert.Equal(t, uint64(gib-840*mib), deviceFree(t, e))
	mustCheck(t, a, e)
}

// TestPressureReleaseFaults: a driver call of the pressure release that
// fails (the stream's wait, an unmap, the free of an unmapped growth
// handle) rolls back to a consistent state and the Malloc is served all
// the same: what stays mapped stays usable, and a handle whose free
// failed stays cached until the out-of-memory ladder or Close frees it.
func TestPressureReleaseFaults(t *testing.T) {
	rigs := []struct {
		name string
		rig  func(*testing.T) (*Allocator, *emulated.Emulator)
		size uint64 // the Malloc under pressure
		kept uint64 // reserved bytes once it is freed and the cache emptied
	}{
		{"cut", func(t *testing.T) (*Allocator, *emulated.Emulator) {
			a, e, _, _ := pressureRig(t)
			return a, e
		}, 10 * mib, 640 * mib},
		{"growth", growthRig, 200 * mib, 640 * mib},
	}
	for _, r := range rigs {
		for _, op := range []backend.Op{backend.OpStreamSync, backend.OpUnmap, backend.OpFree} {
			for _, k := range []int{1, 2, 5} {
				t.Run(fmt.Sprintf("%s/%v#%d", r.name, op, k), func(t *testing.T) {
					a, e := r.rig(t)
					require.NoError(t, e.FailNth(op, k, backend.ErrUnavailable))
					z, err := a.Malloc(r.size, 0)
					require.NoError(t, err)
					mustCheck(t, a, e)
					if k == 1 {
						assert.Positive(t, e.Failures(op), "the fault fired")
					}
					require.NoError(t, a.Free(z))
					if err := a.EmptyCache(); err != nil { // a later call of op was the one to fail
						require.ErrorIs(t, err, backend.ErrUnavailable)
						mustCheck(t, a, e)
						require.NoError(t, a.EmptyCache())
					}
					mustCheck(t, a, e)
					assert.Equal(t, r.kept, a.MemoryReserved(), "only what is allocated stays")
				})
			}
		}
	}
}

// BenchmarkMallocUnderPressure: the price of the pressure response on a
// Malloc+Free pair that its cache hit serves with room. "exact" reuses a
// freed 4 MiB block (a cache hit under pressure too); "cut" takes 2 MiB
// from the start of a free 8 MiB block of granules, which under pressure
// leaves a granule or more, so it takes the slow path (fitPressed: no
// growth handle to unmap there). Room: an 8 GiB device; pressure: 1 GiB
// with 640 MiB in use.
func BenchmarkMallocUnderPressure(b *testing.B) {
	for _, dev := range []struct {
		name     string
		capacity uint64
	}{{"room", 8 * gib}, {"pressure", 1 * gib}} {
		for _, c := range []struct {
			name       string
			hole, size uint64
		}{{"exact", 4 * mib, 4 * mib}, {"cut", 8 * mib, 2 * mib}} {
			b.Run(dev.name+"/"+c.name, func(b *testing.B) {
				a, _ := newAlloc(b, "", emulated.WithCapacity(dev.capacity))
				_, err := a.Malloc(640*mib, 0)
				require.NoError(b, err)
				h, err := a.Malloc(c.hole, 0)
				require.NoError(b, err)
				_, err = a.Malloc(2*mib, 0) // keeps the hole from merging with the top
				require.NoError(b, err)
				require.NoError(b, a.Free(h))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					p, err := a.Malloc(c.size, 0)
					if err != nil {
						b.Fatal(err)
					}
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
