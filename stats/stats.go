// Package stats holds the allocator's counters and the data types it
// reports: Stat (current/peak/allocated/freed), per-pool StatArrays, the
// DeviceStats record modelled on PyTorch's DeviceStats, memory snapshots,
// and the text summary and exporters built from them.
//
// stats is a leaf package: it imports nothing of vmmalloc, so allocators,
// replay tools and exporters can all share its types. Nothing here locks;
// the owner of a DeviceStats or a History guards it (the allocator's device
// mutex). The reporting functions only read the record they are given, so
// the owner takes its lock (or copies the record, which is a plain value)
// before calling them.
//
// # Counters
//
// A Stat moves only through Add. Every positive delta raises Current and
// Allocated (and Peak when Current passes it); every negative delta lowers
// Current and raises Freed, so at any time
//
//	Current == Allocated - Freed + (Current at the last ResetAccumulated)
//
// and Peak >= Current. ResetPeak (torch.cuda.reset_peak_memory_stats) sets
// Peak to Current; ResetAccumulated (torch.cuda.reset_accumulated_memory_stats)
// zeroes Allocated, Freed and the event counters but leaves Current and
// Peak alone. A StatArray keeps one Stat per pool plus the aggregate; as
// long as every delta names SmallPool or LargePool, StatArray.Add keeps the
// aggregate equal to the sum of the pools.
//
// An allocator's cache hit moves five StatArrays at once. HotCounters (a
// DeviceStats with a little more state) lets it store fewer fields: a
// malloc stores the pool's Current and Allocated and the aggregate's
// Current of three of them, and compares each Peak (a store only on a new
// peak); a free stores the three pairs of Currents only. Active and
// ActiveBytes are the other two plus the blocks pending free, which only
// slow paths move (CountPending, CountPendingFreed); their peaks are
// compared only where Allocation's and AllocatedBytes' move. The pools'
// Freed and the aggregate's Allocated and Freed follow from the invariant
// above and from the pools' values at the last ResetAccumulated, and
// HotCounters.Settled derives them when the record is read. Current and
// Peak are exact at all times (Active's Current through ActiveNow), so
// policy code reads them directly.
//
// The block states the counters follow are PyTorch's:
//
//	          malloc                 free (no stream uses)
//	inactive -------> allocated ----------------------------> inactive
//	                      |                                      ^
//	                      | free (stream uses pending)           | events done
//	                      v                                      |
//	               active_pending_free ---------------------------+
//
// allocation/allocated_bytes/requested_bytes count the allocated state;
// active/active_bytes count allocated plus active_pending_free;
// inactive_split counts free blocks cut from a larger classic segment;
// segment/reserved_bytes count what the driver has mapped. An unmapped
// block (a hole in an expandable segment) counts in none of them.
//
// # Reports
//
// Flatten names every counter as torch.cuda.memory_stats() does
// ("reserved_bytes.large_pool.peak"), plus vmmalloc's driver counters.
// Summary renders the memory_summary() table. WriteJSON exports the
// flattened record, and Metrics describes it as metric families for
// exporters (the Prometheus collector and expvar publisher of package
// allocator/metrics). SegmentTable lists the
// segments of a Snapshot. History is the fixed-size ring of TraceEntry
// records behind torch.cuda.memory._record_memory_history. All output is
// deterministic: the same record always yields the same bytes.
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
	AllPools     PoolKind = iota // aggregate of every pool
	SmallPool                    // blocks of at most 1 MiB
	LargePool                    // blocks above 1 MiB
	NumPoolKinds                 // number of entries in a StatArray; not a pool
)

// String returns the pool's name as it appears in flattened keys:
// "all", "small_pool" or "large_pool" ("unknown_pool" otherwise).
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

// Valid reports whether p names one of the entries of a StatArray
// (AllPools, SmallPool or LargePool).
func (p PoolKind) Valid() bool { return p >= AllPools && p < NumPoolKinds }

// StatArray is a Stat for the aggregate and for each pool.
type StatArray [NumPoolKinds]Stat

// Add applies delta to the aggregate and to pool p (SmallPool or
// LargePool). With p == AllPools, or a p that is not Valid, only the
// aggregate changes: the aggregate is never counted twice and an unknown
// pool never indexes out of range.
func (a *StatArray) Add(p PoolKind, delta int64) {
	a[AllPools].Add(delta)
	if p != AllPools && p.Valid() {
		a[p].Add(delta)
	}
}

// Inc adds n ≥ 0 to the aggregate and to pool p, which must be SmallPool
// or LargePool. It is Add without the checks, for hot paths.
func (a *StatArray) Inc(p PoolKind, n int64) {
	a[AllPools].inc(n)
	a[p].inc(n)
}

// Dec subtracts n ≥ 0 from the aggregate and from pool p, which must be
// SmallPool or LargePool. It is Add without the checks, for hot paths.
func (a *StatArray) Dec(p PoolKind, n int64) {
	a[AllPools].Current -= n
	a[AllPools].Freed += n
	a[p].Current -= n
	a[p].Freed += n
}

func (s *Stat) inc(n int64) {
	s.Current += n
	s.Allocated += n
	if s.Current > s.Peak { // rarely: a store only on a new peak
		s.Peak = s.Current
	}
}

func (s *Stat) dec(n int64) {
	s.Current -= n
	s.Freed += n
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
	// The handle caches and the reserve (handle_reserve_mb) that keeps
	// them stocked: bytes of unmapped handles cached (a gauge), and the
	// handles the reserve's background refill created and failed to
	// create (counters; HandlesCreated includes the created ones).
	CachedHandleBytes     int64
	ReserveHandlesCreated int64
	ReserveFailures       int64
	MaxSplitSize          int64 // configured max_split_size in bytes; 0 = unlimited
	StrandedBytes         int64 // of reserved bytes, those held for streams destroyed without ReleaseStream until a device synchronize shows them idle
	// Physical handles shared with other processes (allocator/ipc), while
	// the allocator maps them or an exporter still holds them, and their
	// bytes; of those, the ones the allocator has unmapped (not in
	// ReservedBytes) that exporters hold for open exports. Gauges.
	ExportedHandles     int64
	ExportedBytes       int64
	ExporterHeldHandles int64
	ExporterHeldBytes   int64

	OwnedBytes          int64 // bytes requested by owned buffers not yet freed (allocator.Buffer)
	NumOwnedCollections int64 // garbage collections the out-of-memory ladder ran for owned buffers
	OwnedReclaimedBytes int64 // bytes of owned buffers freed by their cleanups (dropped without Free)

	// Sleep and wake of pools (allocator Pool.Sleep): device bytes of
	// sleeping pools' handles, given back to the driver and not in
	// ReservedBytes; host bytes of their backups and kept buffers.
	AsleepBytes     int64
	HostBackupBytes int64
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
	d.ReserveHandlesCreated, d.ReserveFailures = 0, 0
	d.NumOwnedCollections, d.OwnedReclaimedBytes = 0, 0
}

func (d *DeviceStats) arrays() []*StatArray {
	return []*StatArray{&d.Allocation, &d.Segment, &d.Active, &d.InactiveSplit,
		&d.AllocatedBytes, &d.ReservedBytes, &d.ActiveBytes, &d.InactiveSplitBytes, &d.RequestedBytes}
}
