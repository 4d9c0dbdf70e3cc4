package stats

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// CountMalloc and CountFree are the allocator's Inc and Dec calls in one:
// every field, peaks included, must come out as the separate calls leave
// it.
func TestCountMallocFreeMatchIncDec(t *testing.T) {
	steps := []struct {
		malloc bool
		p      PoolKind
		n, req int64
	}{
		{true, SmallPool, 4096, 4000},
		{true, LargePool, 2 << 20, 2<<20 - 1},
		{false, SmallPool, 4096, 4000},
		{true, SmallPool, 512, 1},
		{true, SmallPool, 1024, 1000},
		{false, LargePool, 2 << 20, 2<<20 - 1},
		{false, SmallPool, 512, 1},
		{true, LargePool, 4 << 20, 3 << 20},
	}
	var got, want DeviceStats
	for i, s := range steps {
		if s.malloc {
			got.CountMalloc(s.p, s.n, s.req)
			want.Allocation.Inc(s.p, 1)
			want.AllocatedBytes.Inc(s.p, s.n)
			want.Active.Inc(s.p, 1)
			want.ActiveBytes.Inc(s.p, s.n)
			want.RequestedBytes.Inc(s.p, s.req)
		} else {
			got.CountFree(s.p, s.n, s.req)
			want.Allocation.Dec(s.p, 1)
			want.AllocatedBytes.Dec(s.p, s.n)
			want.Active.Dec(s.p, 1)
			want.ActiveBytes.Dec(s.p, s.n)
			want.RequestedBytes.Dec(s.p, s.req)
		}
		assert.Equal(t, want, got, "after step %d", i)
	}
	assert.Equal(t, Stat{Current: 4<<20 + 1024, Peak: 4<<20 + 1024, Allocated: 6<<20 + 4096 + 1536, Freed: 2<<20 + 4096 + 512},
		got.AllocatedBytes[AllPools])
	assert.Equal(t, Stat{Current: 1, Peak: 2, Allocated: 3, Freed: 2}, got.Allocation[SmallPool])
}
