package stats

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatAdd(t *testing.T) {
	tests := []struct {
		name   string
		deltas []int64
		want   Stat
	}{
		{"none", nil, Stat{}},
		{"zero delta is a no-op", []int64{0, 0}, Stat{}},
		{"one increase", []int64{5}, Stat{Current: 5, Peak: 5, Allocated: 5}},
		{"up and down", []int64{10, -4, 3, -9}, Stat{Current: 0, Peak: 10, Allocated: 13, Freed: 13}},
		{"peak set by second climb", []int64{4, -4, 7, -2}, Stat{Current: 5, Peak: 7, Allocated: 11, Freed: 6}},
		{"negative first", []int64{-3}, Stat{Current: -3, Peak: 0, Freed: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Stat
			for _, d := range tt.deltas {
				s.Add(d)
			}
			assert.Equal(t, tt.want, s)
		})
	}
}

func TestStatResets(t *testing.T) {
	s := Stat{}
	s.Add(10)
	s.Add(-6)
	s.ResetPeak()
	assert.Equal(t, Stat{Current: 4, Peak: 4, Allocated: 10, Freed: 6}, s)
	s.ResetAccumulated()
	assert.Equal(t, Stat{Current: 4, Peak: 4}, s)
	s.Add(1)
	assert.Equal(t, Stat{Current: 5, Peak: 5, Allocated: 1}, s)
}

func TestPoolKind(t *testing.T) {
	tests := []struct {
		p     PoolKind
		name  string
		valid bool
	}{
		{AllPools, "all", true},
		{SmallPool, "small_pool", true},
		{LargePool, "large_pool", true},
		{NumPoolKinds, "unknown_pool", false},
		{PoolKind(-1), "unknown_pool", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.name, tt.p.String())
		assert.Equal(t, tt.valid, tt.p.Valid(), "pool %d", int(tt.p))
	}
}

func TestStatArrayAdd(t *testing.T) {
	tests := []struct {
		name  string
		pool  PoolKind
		delta int64
		want  StatArray
	}{
		{"small", SmallPool, 3, StatArray{AllPools: {3, 3, 3, 0}, SmallPool: {3, 3, 3, 0}}},
		{"large", LargePool, 7, StatArray{AllPools: {7, 7, 7, 0}, LargePool: {7, 7, 7, 0}}},
		{"aggregate is not counted twice", AllPools, 2, StatArray{AllPools: {2, 2, 2, 0}}},
		{"unknown pool touches only the aggregate", PoolKind(9), 4, StatArray{AllPools: {4, 4, 4, 0}}},
		{"negative pool touches only the aggregate", PoolKind(-1), -4, StatArray{AllPools: {-4, 0, 0, 4}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a StatArray
			require.NotPanics(t, func() { a.Add(tt.pool, tt.delta) })
			assert.Equal(t, tt.want, a)
		})
	}
}

func TestStatArrayAggregateIsSumOfPools(t *testing.T) {
	var a StatArray
	for i, d := range []int64{5, 9, -3, -9, 12, -5} {
		p := SmallPool
		if i%2 == 1 {
			p = LargePool
		}
		a.Add(p, d)
	}
	assert.Equal(t, a[SmallPool].Current+a[LargePool].Current, a[AllPools].Current)
	assert.Equal(t, a[SmallPool].Allocated+a[LargePool].Allocated, a[AllPools].Allocated)
	assert.Equal(t, a[SmallPool].Freed+a[LargePool].Freed, a[AllPools].Freed)
	assert.Equal(t, Stat{Current: 9, Peak: 14, Allocated: 26, Freed: 17}, a[AllPools])
}

func TestDeviceStatsResets(t *testing.T) {
	d := fixture()
	d.ResetPeak()
	for _, a := range d.arrays() {
		for p := range a {
			assert.Equal(t, a[p].Current, a[p].Peak)
		}
	}
	assert.Equal(t, d.OversizeAllocations.Current, d.OversizeAllocations.Peak)
	assert.Equal(t, d.OversizeSegments.Current, d.OversizeSegments.Peak)
	assert.Equal(t, int64(2), d.NumOOMs, "ResetPeak leaves counters")

	d.ResetAccumulated()
	for _, a := range d.arrays() {
		for p := range a {
			assert.Zero(t, a[p].Allocated)
			assert.Zero(t, a[p].Freed)
			assert.Equal(t, a[p].Current, a[p].Peak, "current and peak survive")
		}
	}
	assert.Equal(t, Stat{Current: 1, Peak: 1}, d.OversizeAllocations)
	assert.Equal(t, Stat{Current: 1, Peak: 1}, d.OversizeSegments)
	for _, v := range []int64{d.NumAllocRetries, d.NumOOMs, d.NumSyncAllStreams, d.NumStreamSyncs,
		d.NumDeviceAlloc, d.NumDeviceFree, d.HandlesCreated, d.HandlesFreed, d.HandlesReused} {
		assert.Zero(t, v)
	}
	assert.Equal(t, int64(64<<20), d.MaxSplitSize, "a setting, not a counter")
	assert.Equal(t, int64(44<<20), d.ReservedBytes[AllPools].Current)
}

// fixture is a DeviceStats as an allocator would leave it after a short,
// plausible workload (all byte values exact multiples of 512).
func fixture() *DeviceStats {
	d := &DeviceStats{MaxSplitSize: 64 << 20}
	// Two 20 MiB large segments and one 2 MiB small segment mapped; one
	// large segment released later and re-mapped.
	d.ReservedBytes.Add(LargePool, 20<<20)
	d.ReservedBytes.Add(LargePool, 20<<20)
	d.ReservedBytes.Add(SmallPool, 2<<20)
	d.ReservedBytes.Add(LargePool, -20<<20)
	d.ReservedBytes.Add(LargePool, 22<<20)
	d.Segment.Add(LargePool, 1)
	d.Segment.Add(LargePool, 1)
	d.Segment.Add(SmallPool, 1)
	d.Segment.Add(LargePool, -1)
	d.Segment.Add(LargePool, 1)
	// Allocations: 30 MiB large, 1536 B small, then 10 MiB large freed.
	d.AllocatedBytes.Add(LargePool, 30<<20)
	d.AllocatedBytes.Add(LargePool, 10<<20)
	d.AllocatedBytes.Add(SmallPool, 1536)
	d.AllocatedBytes.Add(LargePool, -10<<20)
	d.RequestedBytes.Add(LargePool, 30<<20-100)
	d.RequestedBytes.Add(LargePool, 10<<20-7)
	d.RequestedBytes.Add(SmallPool, 1500)
	d.RequestedBytes.Add(LargePool, -(10<<20 - 7))
	d.ActiveBytes.Add(LargePool, 30<<20)
	d.ActiveBytes.Add(LargePool, 10<<20)
	d.ActiveBytes.Add(SmallPool, 1536)
	d.Allocation.Add(LargePool, 1)
	d.Allocation.Add(LargePool, 1)
	d.Allocation.Add(SmallPool, 1)
	d.Allocation.Add(LargePool, -1)
	d.Active.Add(LargePool, 1)
	d.Active.Add(LargePool, 1)
	d.Active.Add(SmallPool, 1)
	d.InactiveSplit.Add(SmallPool, 1)
	d.InactiveSplitBytes.Add(SmallPool, 2<<20-1536)
	d.OversizeAllocations.Add(1)
	d.OversizeAllocations.Add(1)
	d.OversizeAllocations.Add(-1)
	d.OversizeSegments.Add(1)
	d.NumAllocRetries = 1
	d.NumOOMs = 2
	d.NumSyncAllStreams = 3
	d.NumStreamSyncs = 4
	d.NumDeviceAlloc = 5
	d.NumDeviceFree = 1
	d.HandlesCreated = 23
	d.HandlesFreed = 10
	d.HandlesReused = 11
	return d
}
