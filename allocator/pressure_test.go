package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
