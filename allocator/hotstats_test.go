package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Cache hits store fewer statistics (stats.HotCounters); Stats must still
// report every field exactly, across an accumulated reset, for both pools
// and the aggregate.
func TestStatsExactAfterCacheHits(t *testing.T) {
	a, _ := newAlloc(t, "")
	p1, err := a.Malloc(4096, 0) // grows: the general path
	require.NoError(t, err)
	require.NoError(t, a.Free(p1)) // cache hit
	p2, err := a.Malloc(4000, 0)   // cache hit: 4096 bytes
	require.NoError(t, err)
	p3, err := a.Malloc(2*mib, 0) // large pool
	require.NoError(t, err)

	s := a.Stats()
	assert.Equal(t, stats.Stat{Current: 1, Peak: 1, Allocated: 2, Freed: 1}, s.Allocation[stats.SmallPool])
	assert.Equal(t, stats.Stat{Current: 1, Peak: 1, Allocated: 1, Freed: 0}, s.Allocation[stats.LargePool])
	assert.Equal(t, stats.Stat{Current: 2, Peak: 2, Allocated: 3, Freed: 1}, s.Allocation[stats.AllPools])
	assert.Equal(t, stats.Stat{Current: 4000 + 2*mib, Peak: 4000 + 2*mib, Allocated: 8096 + 2*mib, Freed: 4096}, s.RequestedBytes[stats.AllPools])
	assert.Equal(t, s.AllocatedBytes, s.ActiveBytes)

	a.ResetAccumulatedStats()
	require.NoError(t, a.Free(p2))
	p4, err := a.Malloc(1000, 0)
	require.NoError(t, err)
	s = a.Stats()
	assert.Equal(t, stats.Stat{Current: 1, Peak: 1, Allocated: 1, Freed: 1}, s.Allocation[stats.SmallPool])
	assert.Equal(t, stats.Stat{Current: 2, Peak: 2, Allocated: 1, Freed: 1}, s.Allocation[stats.AllPools])
	assert.Equal(t, stats.Stat{Current: 1024 + 2*mib, Peak: 4096 + 2*mib, Allocated: 1024, Freed: 4096}, s.AllocatedBytes[stats.AllPools])
	assert.Equal(t, stats.Stat{Current: 1, Peak: 1, Allocated: 0, Freed: 0}, s.Active[stats.LargePool])

	require.NoError(t, a.Free(p3))
	require.NoError(t, a.Free(p4))
	s = a.Stats()
	for _, arr := range []stats.StatArray{s.Allocation, s.Active, s.AllocatedBytes, s.ActiveBytes, s.RequestedBytes} {
		for k := stats.AllPools; k < stats.NumPoolKinds; k++ {
			assert.Zero(t, arr[k].Current, "pool %s", k)
		}
	}
	// Freed − Allocated is what was live at the reset.
	assert.Equal(t, stats.Stat{Peak: 2, Allocated: 1, Freed: 3}, s.Allocation[stats.AllPools])
	assert.Equal(t, stats.Stat{Peak: 1, Allocated: 0, Freed: 1}, s.Allocation[stats.LargePool])
	assert.Equal(t, stats.Stat{Peak: 4096 + 2*mib, Allocated: 1024, Freed: 4096 + 1024 + 2*mib}, s.ActiveBytes[stats.AllPools])
	require.NoError(t, a.Check())
}
