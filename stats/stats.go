// Package stats holds the allocator's counters and the data types it
// reports: Stat (current/peak/allocated/freed), per-pool StatArrays, the
// DeviceStats record modelled on PyTorch's DeviceStats, memory snapshots,
// and the text summary and exporters built from them.
//
// stats is a leaf package: it imports nothing of vmmalloc, so allocators,
// replay tools and exporters can all share its types. Nothing here locks;
// the owner of a DeviceStats guards it (the allocator's device mutex).
package stats

// Stat tracks one quantity over time. Units are the caller's (bytes or a
// count of objects).
type Stat struct {
	Current   int64 // value now
	Peak      int64 // highest Current since creation or ResetPeak
	Allocated int64 // sum of all increases since creation or ResetAccumulated
	Freed     int64 // sum of all decreases since creation or ResetAccumulated
}

// Add changes Current by delta (which may be negative) and updates Peak,
// Allocated and Freed.
func (s *Stat) Add(delta int64) {
	if delta == 0 {
		return
	}
	s.Current += delta
	if delta > 0 {
		s.Allocated += delta
		if s.Current > s.Peak {
			s.Peak = s.Current
		}
	} else {
		s.Freed -= delta
	}
}

// ResetPeak sets Peak to Current.
func (s *Stat) ResetPeak() { s.Peak = s.Current }

// ResetAccumulated zeroes Allocated and Freed.
func (s *Stat) ResetAccumulated() { s.Allocated, s.Freed = 0, 0 }

// PoolKind indexes a StatArray.
type PoolKind int

const (
	AllPools  PoolKind = iota // aggregate of every pool
	SmallPool                 // blocks of at most 1 MiB
	LargePool                 // blocks above 1 MiB
	NumPoolKinds
)

func (p PoolKind) String() string {
	switch p {
	case AllPools:
		return "all"
	case SmallPool:
		return "small_pool"
	case LargePool:
		return "large_pool"
	}
	return "unknown_pool"
}

// StatArray is a Stat for the aggregate and for each pool.
type StatArray [NumPoolKinds]Stat

// Add applies delta to the aggregate and to pool p.
func (a *StatArray) Add(p PoolKind, delta int64) {
	a[AllPools].Add(delta)
	a[p].Add(delta)
}

// ResetPeak resets the peak of every entry.
func (a *StatArray) ResetPeak() {
	for i := range a {
		a[i].ResetPeak()
	}
}

// ResetAccumulated resets the accumulated counters of every entry.
func (a *StatArray) ResetAccumulated() {
	for i := range a {
		a[i].ResetAccumulated()
	}
}

// DeviceStats is the statistics record of one device's allocator. Names
// follow torch.cuda.memory_stats().
type DeviceStats struct {
	Allocation    StatArray // number of allocated blocks
	Segment       StatArray // number of segments (reservations)
	Active        StatArray // number of active blocks (allocated or pending free)
	InactiveSplit StatArray // number of free blocks that are split off a larger segment

	AllocatedBytes     StatArray // bytes in allocated blocks (rounded sizes)
	ReservedBytes      StatArray // bytes of mapped device memory
	ActiveBytes        StatArray // bytes in active blocks
	InactiveSplitBytes StatArray // bytes in inactive split blocks
	RequestedBytes     StatArray // bytes requested by callers (unrounded)

	OversizeAllocations Stat // allocations of at least max_split_size
	OversizeSegments    Stat // segments of at least max_split_size

	NumAllocRetries   int64 // mallocs that freed the cache and retried
	NumOOMs           int64 // mallocs that failed with out-of-memory
	NumSyncAllStreams int64 // times every pending event was waited for
	NumStreamSyncs    int64 // stream synchronisations before unmap or release
	NumDeviceAlloc    int64 // driver maps (pages mapped) / classic segment creations
	NumDeviceFree     int64 // driver unmaps (pages unmapped) / classic segment frees
	HandlesCreated    int64 // physical handles created
	HandlesFreed      int64 // physical handles freed to the driver
	HandlesReused     int64 // physical handles taken from the handle cache
	MaxSplitSize      int64 // configured max_split_size in bytes; 0 = unlimited
}

// ResetPeak resets every peak to its current value
// (torch.cuda.reset_peak_memory_stats).
func (d *DeviceStats) ResetPeak() {
	for _, a := range d.arrays() {
		a.ResetPeak()
	}
	d.OversizeAllocations.ResetPeak()
	d.OversizeSegments.ResetPeak()
}

// ResetAccumulated zeroes every accumulated counter
// (torch.cuda.reset_accumulated_memory_stats).
func (d *DeviceStats) ResetAccumulated() {
	for _, a := range d.arrays() {
		a.ResetAccumulated()
	}
	d.OversizeAllocations.ResetAccumulated()
	d.OversizeSegments.ResetAccumulated()
	d.NumAllocRetries, d.NumOOMs, d.NumSyncAllStreams, d.NumStreamSyncs = 0, 0, 0, 0
	d.NumDeviceAlloc, d.NumDeviceFree = 0, 0
	d.HandlesCreated, d.HandlesFreed, d.HandlesReused = 0, 0, 0
}

func (d *DeviceStats) arrays() []*StatArray {
	return []*StatArray{&d.Allocation, &d.Segment, &d.Active, &d.InactiveSplit,
		&d.AllocatedBytes, &d.ReservedBytes, &d.ActiveBytes, &d.InactiveSplitBytes, &d.RequestedBytes}
}
