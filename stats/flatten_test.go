package stats

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flatKeyPointers maps every key torch.cuda.memory_stats() (plus
// vmmalloc's extras) should have to the field of d it must read. It is
// written out independently of the implementation's tables.
func flatKeyPointers(d *DeviceStats) map[string]*int64 {
	m := map[string]*int64{}
	arrays := map[string]*StatArray{
		"allocation":           &d.Allocation,
		"segment":              &d.Segment,
		"active":               &d.Active,
		"inactive_split":       &d.InactiveSplit,
		"allocated_bytes":      &d.AllocatedBytes,
		"reserved_bytes":       &d.ReservedBytes,
		"active_bytes":         &d.ActiveBytes,
		"inactive_split_bytes": &d.InactiveSplitBytes,
		"requested_bytes":      &d.RequestedBytes,
	}
	stat := func(prefix string, s *Stat) {
		m[prefix+".current"] = &s.Current
		m[prefix+".peak"] = &s.Peak
		m[prefix+".allocated"] = &s.Allocated
		m[prefix+".freed"] = &s.Freed
	}
	for name, a := range arrays {
		stat(name+".all", &a[AllPools])
		stat(name+".small_pool", &a[SmallPool])
		stat(name+".large_pool", &a[LargePool])
	}
	stat("oversize_allocations", &d.OversizeAllocations)
	stat("oversize_segments", &d.OversizeSegments)
	m["num_alloc_retries"] = &d.NumAllocRetries
	m["num_ooms"] = &d.NumOOMs
	m["num_sync_all_streams"] = &d.NumSyncAllStreams
	m["num_stream_syncs"] = &d.NumStreamSyncs
	m["num_device_alloc"] = &d.NumDeviceAlloc
	m["num_device_free"] = &d.NumDeviceFree
	m["handles_created"] = &d.HandlesCreated
	m["handles_freed"] = &d.HandlesFreed
	m["handles_reused"] = &d.HandlesReused
	m["cached_handle_bytes"] = &d.CachedHandleBytes
	m["reserve_handles_created"] = &d.ReserveHandlesCreated
	m["reserve_failures"] = &d.ReserveFailures
	m["max_split_size"] = &d.MaxSplitSize
	m["stranded_bytes"] = &d.StrandedBytes
	m["exported_handles"] = &d.ExportedHandles
	m["exported_bytes"] = &d.ExportedBytes
	m["exporter_held_handles"] = &d.ExporterHeldHandles
	m["exporter_held_bytes"] = &d.ExporterHeldBytes
	m["owned_bytes"] = &d.OwnedBytes
	m["num_owned_collections"] = &d.NumOwnedCollections
	m["owned_reclaimed_bytes"] = &d.OwnedReclaimedBytes
	m["asleep_bytes"] = &d.AsleepBytes
	m["host_backup_bytes"] = &d.HostBackupBytes
	return m
}

func TestFlattenEveryKeyReadsItsOwnField(t *testing.T) {
	d := &DeviceStats{}
	ptrs := flatKeyPointers(d)
	require.Len(t, ptrs, 139)
	require.Equal(t, 139, NumFlatKeys)

	// Give every field a distinct value so that a key reading the wrong
	// field cannot pass.
	keys := make([]string, 0, len(ptrs))
	for k := range ptrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		*ptrs[k] = int64(1000 + i)
	}

	got := Flatten(d)
	require.Len(t, got, len(ptrs))
	for i, k := range keys {
		v, ok := got[k]
		if assert.True(t, ok, "missing key %q", k) {
			assert.Equal(t, int64(1000+i), v, "key %q", k)
		}
	}
}

func TestFlattenKnownValues(t *testing.T) {
	m := Flatten(fixture())
	tests := []struct {
		key  string
		want int64
	}{
		{"allocated_bytes.all.current", 30<<20 + 1536},
		{"allocated_bytes.all.peak", 40<<20 + 1536},
		{"allocated_bytes.large_pool.freed", 10 << 20},
		{"allocated_bytes.small_pool.allocated", 1536},
		{"reserved_bytes.all.current", 44 << 20},
		{"reserved_bytes.large_pool.peak", 42 << 20},
		{"reserved_bytes.large_pool.allocated", 62 << 20},
		{"reserved_bytes.large_pool.freed", 20 << 20},
		{"requested_bytes.all.current", 30<<20 + 1400},
		{"requested_bytes.all.peak", 40<<20 + 1393},
		{"inactive_split_bytes.small_pool.current", 2<<20 - 1536},
		{"inactive_split_bytes.large_pool.current", 0},
		{"segment.all.allocated", 4},
		{"segment.large_pool.freed", 1},
		{"allocation.all.peak", 3},
		{"active.large_pool.current", 2},
		{"oversize_allocations.current", 1},
		{"oversize_allocations.peak", 2},
		{"oversize_segments.allocated", 1},
		{"num_alloc_retries", 1},
		{"num_ooms", 2},
		{"num_sync_all_streams", 3},
		{"num_stream_syncs", 4},
		{"num_device_alloc", 5},
		{"num_device_free", 1},
		{"handles_created", 23},
		{"handles_freed", 10},
		{"handles_reused", 11},
		{"max_split_size", 64 << 20},
	}
	for _, tt := range tests {
		v, ok := m[tt.key]
		require.True(t, ok, "missing key %q", tt.key)
		assert.Equal(t, tt.want, v, "key %q", tt.key)
	}
}

func TestFlattenNilIsZero(t *testing.T) {
	m := Flatten(nil)
	require.Len(t, m, NumFlatKeys)
	for k, v := range m {
		assert.Zero(t, v, k)
	}
	assert.Equal(t, Flatten(&DeviceStats{}), m)
}

func TestFlattenDoesNotModify(t *testing.T) {
	d := fixture()
	before := *d
	_ = Flatten(d)
	assert.Equal(t, before, *d)
}
