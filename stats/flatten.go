package stats

import "strconv"

// metricKind says how an exporter types a value.
type metricKind int

const (
	kindGauge   metricKind = iota // may go up and down (current, peak, settings)
	kindCounter                   // only grows until a ResetAccumulated
)

// statField names one field of a Stat.
type statField struct {
	name string // suffix in flattened keys: "current", "peak", ...
	kind metricKind
	get  func(*Stat) int64
	help string // fmt format of the HELP text; %s is the array's help
}

// statFields lists the fields of a Stat in torch's order.
var statFields = [...]statField{
	{"current", kindGauge, func(s *Stat) int64 { return s.Current }, "Current value of %s."},
	{"peak", kindGauge, func(s *Stat) int64 { return s.Peak }, "Peak value of %s since the last peak reset."},
	{"allocated", kindCounter, func(s *Stat) int64 { return s.Allocated }, "Total increase of %s since the last accumulated reset."},
	{"freed", kindCounter, func(s *Stat) int64 { return s.Freed }, "Total decrease of %s since the last accumulated reset."},
}

// arrayDesc describes one StatArray of DeviceStats.
type arrayDesc struct {
	name  string // key prefix, as torch.cuda.memory_stats() names it
	bytes bool   // values are bytes (else a count of objects)
	help  string // what the array measures
	get   func(*DeviceStats) *StatArray
}

// arrayDescs lists the StatArrays of DeviceStats in torch's order.
var arrayDescs = [...]arrayDesc{
	{"allocation", false, "the number of allocated blocks", func(d *DeviceStats) *StatArray { return &d.Allocation }},
	{"segment", false, "the number of segments", func(d *DeviceStats) *StatArray { return &d.Segment }},
	{"active", false, "the number of active blocks (allocated or pending free)", func(d *DeviceStats) *StatArray { return &d.Active }},
	{"inactive_split", false, "the number of free blocks split off a larger segment", func(d *DeviceStats) *StatArray { return &d.InactiveSplit }},
	{"allocated_bytes", true, "the bytes in allocated blocks", func(d *DeviceStats) *StatArray { return &d.AllocatedBytes }},
	{"reserved_bytes", true, "the bytes of mapped device memory", func(d *DeviceStats) *StatArray { return &d.ReservedBytes }},
	{"active_bytes", true, "the bytes in active blocks", func(d *DeviceStats) *StatArray { return &d.ActiveBytes }},
	{"inactive_split_bytes", true, "the bytes in free blocks split off a larger segment", func(d *DeviceStats) *StatArray { return &d.InactiveSplitBytes }},
	{"requested_bytes", true, "the bytes requested by callers in allocated blocks", func(d *DeviceStats) *StatArray { return &d.RequestedBytes }},
}

// statDesc describes one single Stat of DeviceStats.
type statDesc struct {
	name string
	help string
	get  func(*DeviceStats) *Stat
}

// statDescs lists the single Stats of DeviceStats.
var statDescs = [...]statDesc{
	{"oversize_allocations", "the number of allocations of at least max_split_size", func(d *DeviceStats) *Stat { return &d.OversizeAllocations }},
	{"oversize_segments", "the number of segments of at least max_split_size", func(d *DeviceStats) *Stat { return &d.OversizeSegments }},
}

// scalarDesc describes one plain int64 of DeviceStats.
type scalarDesc struct {
	name string
	kind metricKind
	help string
	get  func(*DeviceStats) int64
}

// scalarDescs lists the scalars of DeviceStats: torch's first, then
// vmmalloc's own.
var scalarDescs = [...]scalarDesc{
	{"num_alloc_retries", kindCounter, "Mallocs that released the cache and retried.", func(d *DeviceStats) int64 { return d.NumAllocRetries }},
	{"num_ooms", kindCounter, "Mallocs that failed with out-of-memory.", func(d *DeviceStats) int64 { return d.NumOOMs }},
	{"num_sync_all_streams", kindCounter, "Times every pending stream event was waited for.", func(d *DeviceStats) int64 { return d.NumSyncAllStreams }},
	{"num_device_alloc", kindCounter, "Driver maps and classic segment creations.", func(d *DeviceStats) int64 { return d.NumDeviceAlloc }},
	{"num_device_free", kindCounter, "Driver unmaps and classic segment frees.", func(d *DeviceStats) int64 { return d.NumDeviceFree }},
	{"max_split_size", kindGauge, "Configured max_split_size in bytes; 0 means unlimited.", func(d *DeviceStats) int64 { return d.MaxSplitSize }},
	{"num_stream_syncs", kindCounter, "Stream synchronisations before an unmap or release.", func(d *DeviceStats) int64 { return d.NumStreamSyncs }},
	{"handles_created", kindCounter, "Physical handles created.", func(d *DeviceStats) int64 { return d.HandlesCreated }},
	{"handles_freed", kindCounter, "Physical handles freed to the driver.", func(d *DeviceStats) int64 { return d.HandlesFreed }},
	{"handles_reused", kindCounter, "Physical handles taken from the handle cache.", func(d *DeviceStats) int64 { return d.HandlesReused }},
	{"cached_handle_bytes", kindGauge, "Bytes of unmapped physical handles in the handle caches (the reserve included).", func(d *DeviceStats) int64 { return d.CachedHandleBytes }},
	{"reserve_handles_created", kindCounter, "Physical handles the handle reserve created off the Malloc path.", func(d *DeviceStats) int64 { return d.ReserveHandlesCreated }},
	{"reserve_failures", kindCounter, "Handle creations of the handle reserve that failed.", func(d *DeviceStats) int64 { return d.ReserveFailures }},
	{"stranded_bytes", kindGauge, "Reserved bytes held for streams destroyed without ReleaseStream.", func(d *DeviceStats) int64 { return d.StrandedBytes }},
	{"exported_handles", kindGauge, "Physical handles shared with other processes (allocator/ipc).", func(d *DeviceStats) int64 { return d.ExportedHandles }},
	{"exported_bytes", kindGauge, "Bytes of the physical handles shared with other processes.", func(d *DeviceStats) int64 { return d.ExportedBytes }},
	{"exporter_held_handles", kindGauge, "Shared handles the allocator has unmapped that exporters hold for open exports.", func(d *DeviceStats) int64 { return d.ExporterHeldHandles }},
	{"exporter_held_bytes", kindGauge, "Bytes of the shared handles that only exporters hold.", func(d *DeviceStats) int64 { return d.ExporterHeldBytes }},
	{"owned_bytes", kindGauge, "Bytes requested by owned buffers not yet freed.", func(d *DeviceStats) int64 { return d.OwnedBytes }},
	{"num_owned_collections", kindCounter, "Garbage collections the out-of-memory ladder ran for owned buffers.", func(d *DeviceStats) int64 { return d.NumOwnedCollections }},
	{"owned_reclaimed_bytes", kindCounter, "Bytes of owned buffers freed by their cleanups.", func(d *DeviceStats) int64 { return d.OwnedReclaimedBytes }},
	{"asleep_bytes", kindGauge, "Bytes of pools that sleep (their handles given back, addresses kept).", func(d *DeviceStats) int64 { return d.AsleepBytes }},
	{"host_backup_bytes", kindGauge, "Bytes of sleeping pools backed up in host memory.", func(d *DeviceStats) int64 { return d.HostBackupBytes }},
}

// reportPools lists the pools in the order reports show them.
var reportPools = [...]PoolKind{AllPools, LargePool, SmallPool}

// NumFlatKeys is the number of keys Flatten returns: four fields for each
// pool of each StatArray, four for each single Stat, and one per scalar.
const NumFlatKeys = 139

// numFlatKeys is NumFlatKeys as the tables above define it.
const numFlatKeys = len(arrayDescs)*int(NumPoolKinds)*len(statFields) +
	len(statDescs)*len(statFields) + len(scalarDescs)

// Compile-time check that NumFlatKeys == numFlatKeys: a negative constant
// converted to uint does not compile.
const (
	_ = uint(NumFlatKeys - numFlatKeys)
	_ = uint(numFlatKeys - NumFlatKeys)
)

// Flatten returns every counter of d under the flat key
// torch.cuda.memory_stats() gives it, plus vmmalloc's own counters:
//
//	<array>.<pool>.<field>  e.g. allocated_bytes.all.current,
//	                        reserved_bytes.large_pool.peak
//	<stat>.<field>          oversize_allocations.current, oversize_segments.freed
//	<scalar>                num_alloc_retries, num_ooms, num_sync_all_streams,
//	                        num_device_alloc, num_device_free, max_split_size,
//	                        num_stream_syncs, handles_created, handles_freed,
//	                        handles_reused, cached_handle_bytes,
//	                        reserve_handles_created, reserve_failures,
//	                        stranded_bytes, exported_handles,
//	                        exported_bytes, exporter_held_handles,
//	                        exporter_held_bytes, owned_bytes,
//	                        num_owned_collections, owned_reclaimed_bytes,
//	                        asleep_bytes, host_backup_bytes
//
// where array is one of allocation, segment, active, inactive_split,
// allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes,
// requested_bytes; pool is all, large_pool or small_pool; and field is
// current, peak, allocated or freed. The map always has NumFlatKeys
// entries. A nil d reads as a zero DeviceStats.
func Flatten(d *DeviceStats) map[string]int64 {
	if d == nil {
		d = &DeviceStats{}
	}
	m := make(map[string]int64, NumFlatKeys)
	for _, a := range arrayDescs {
		arr := a.get(d)
		for p := AllPools; p < NumPoolKinds; p++ {
			prefix := a.name + "." + p.String() + "."
			for _, f := range statFields {
				m[prefix+f.name] = f.get(&arr[p])
			}
		}
	}
	for _, s := range statDescs {
		st := s.get(d)
		for _, f := range statFields {
			m[s.name+"."+f.name] = f.get(st)
		}
	}
	for _, s := range scalarDescs {
		m[s.name] = s.get(d)
	}
	return m
}

// itoa formats v in base 10.
func itoa(v int64) string { return strconv.FormatInt(v, 10) }
