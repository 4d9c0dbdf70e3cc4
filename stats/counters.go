package stats

// HotCounters is a DeviceStats whose five hot StatArrays (Allocation, Active,
// AllocatedBytes, ActiveBytes, RequestedBytes) are kept with fewer stores
// on an allocator's cache hit: CountMalloc and CountFree write what only
// they can know at the moment, and Settled derives the rest.
//
// Active and ActiveBytes are not stored at all but for their peaks: they
// exceed Allocation and AllocatedBytes by the blocks pending free (pend),
// which only the slow paths move (CountPending, CountPendingFreed), and a
// block becomes active exactly when it is allocated, so their Allocated is
// Allocation's. What is stored, per hot StatArray:
//
//	pool p  Current, Peak  always exact (Active's Current: ActiveNow)
//	pool p  Allocated      exact (a malloc raises it; Active's: derived)
//	pool p  Freed          stale: derived as Allocated − Current + base[p]
//	all     Current, Peak  always exact (a peak is a peak of the sum at one time)
//	all     Allocated      stale: derived as the sum of the pools'
//	all     Freed          stale: derived as the sum of the pools'
//
// base[p] is the pool's Current at the last ResetAccumulated (0 at first):
// the invariant of Stat (Current == Allocated − Freed + that value) is what
// lets a free store Current alone. Every other field of the embedded
// DeviceStats is exact at all times; Current and Peak of every entry but
// Active's and ActiveBytes' Current may be read directly (growth policy and
// Check do), those two through ActiveNow or Settled, and Allocated and
// Freed of the hot arrays only through Settled.
//
// Allocation, AllocatedBytes and RequestedBytes may also move through
// their StatArray's Add, Inc or Dec, naming SmallPool or LargePool, so
// that the aggregate's accumulated counters are the sum of the pools'.
// Active and ActiveBytes move only through the Count methods. The owner's
// lock guards a HotCounters as it guards a DeviceStats.
type HotCounters struct {
	DeviceStats
	base [numHot][NumPoolKinds]int64 // Current of each pool at the last ResetAccumulated; [AllPools] unused
	// pend is, per entry, the blocks (n) and bytes pending free: Active
	// less Allocation, ActiveBytes less AllocatedBytes.
	pend [NumPoolKinds]pendingFree
}

// pendingFree counts blocks freed while stream work still uses them.
type pendingFree struct{ n, bytes int64 }

// numHot is the number of hot StatArrays (see HotCounters.hot).
const numHot = 5

// hot lists the StatArrays that CountMalloc and CountFree move.
func (c *HotCounters) hot() [numHot]*StatArray {
	return [numHot]*StatArray{&c.Allocation, &c.Active, &c.AllocatedBytes, &c.ActiveBytes, &c.RequestedBytes}
}

// up raises pool entry s (and aggregate all) by n ≥ 0: Current and
// Allocated of the pool, Current of the aggregate, and each Peak when
// passed (one compare each; a store only on a new peak).
func up(all, s *Stat, n int64) {
	s.Current += n
	s.Allocated += n
	if s.Current > s.Peak {
		s.Peak = s.Current
	}
	all.Current += n
	if all.Current > all.Peak {
		all.Peak = all.Current
	}
}

// upTied is up for Allocation or AllocatedBytes while no block is pending
// free, when the Active array (peaks ts of entry s, tall of all) equals
// it: the Active peak is never below this array's, so it can be passed
// only where this array's peak is.
func upTied(all, s *Stat, n int64, tall, ts *int64) {
	s.Current += n
	s.Allocated += n
	if s.Current > s.Peak {
		s.Peak = s.Current
		*ts = max(*ts, s.Current)
	}
	all.Current += n
	if all.Current > all.Peak {
		all.Peak = all.Current
		*tall = max(*tall, all.Current)
	}
}

// CountMalloc counts a block of n bytes handed out from pool p (SmallPool
// or LargePool) for a request of req bytes: Allocation, AllocatedBytes,
// Active, ActiveBytes and RequestedBytes. It is DeviceStats.CountMalloc
// with the aggregate's Allocated left to Settled.
func (c *HotCounters) CountMalloc(p PoolKind, n, req int64) {
	if c.pend[AllPools].n != 0 {
		// Some block is pending free, so Active exceeds Allocation: its
		// peaks are compared on their own. Written out here, with no
		// call, so that CountMalloc needs no stack check.
		up(&c.Allocation[AllPools], &c.Allocation[p], 1)
		up(&c.AllocatedBytes[AllPools], &c.AllocatedBytes[p], n)
		up(&c.RequestedBytes[AllPools], &c.RequestedBytes[p], req)
		c.activePeaks(AllPools)
		c.activePeaks(p)
		return
	}
	upTied(&c.Allocation[AllPools], &c.Allocation[p], 1, &c.Active[AllPools].Peak, &c.Active[p].Peak)
	upTied(&c.AllocatedBytes[AllPools], &c.AllocatedBytes[p], n, &c.ActiveBytes[AllPools].Peak, &c.ActiveBytes[p].Peak)
	up(&c.RequestedBytes[AllPools], &c.RequestedBytes[p], req)
}

// CountMallocBoth is CountMalloc of agg and of own in one call: the cache
// hit of a private pool, which counts its own record and the aggregate's.
func CountMallocBoth(agg, own *HotCounters, p PoolKind, n, req int64) {
	if agg.pend[AllPools].n != 0 || own.pend[AllPools].n != 0 {
		agg.CountMalloc(p, n, req)
		own.CountMalloc(p, n, req)
		return
	}
	upTied(&agg.Allocation[AllPools], &agg.Allocation[p], 1, &agg.Active[AllPools].Peak, &agg.Active[p].Peak)
	upTied(&agg.AllocatedBytes[AllPools], &agg.AllocatedBytes[p], n, &agg.ActiveBytes[AllPools].Peak, &agg.ActiveBytes[p].Peak)
	up(&agg.RequestedBytes[AllPools], &agg.RequestedBytes[p], req)
	upTied(&own.Allocation[AllPools], &own.Allocation[p], 1, &own.Active[AllPools].Peak, &own.Active[p].Peak)
	upTied(&own.AllocatedBytes[AllPools], &own.AllocatedBytes[p], n, &own.ActiveBytes[AllPools].Peak, &own.ActiveBytes[p].Peak)
	up(&own.RequestedBytes[AllPools], &own.RequestedBytes[p], req)
}

// activePeaks raises the peaks of Active and ActiveBytes of entry k to
// their Current (Allocation's and AllocatedBytes' plus the blocks pending
// free), where they are passed.
func (c *HotCounters) activePeaks(k PoolKind) {
	c.Active[k].Peak = max(c.Active[k].Peak, c.Allocation[k].Current+c.pend[k].n)
	c.ActiveBytes[k].Peak = max(c.ActiveBytes[k].Peak, c.AllocatedBytes[k].Current+c.pend[k].bytes)
}

// CountFree undoes CountMalloc for a block freed without waiting for
// events: it lowers Current of p and of the aggregate, and leaves Freed to
// Settled.
func (c *HotCounters) CountFree(p PoolKind, n, req int64) {
	c.Allocation[AllPools].Current--
	c.Allocation[p].Current--
	c.AllocatedBytes[AllPools].Current -= n
	c.AllocatedBytes[p].Current -= n
	c.RequestedBytes[AllPools].Current -= req
	c.RequestedBytes[p].Current -= req
}

// CountPending counts the free of an allocated block of n bytes of pool p
// that stays active until stream work on it completes: it leaves
// Allocation and AllocatedBytes, not Active, ActiveBytes or
// RequestedBytes.
func (c *HotCounters) CountPending(p PoolKind, n int64) {
	for _, k := range [2]PoolKind{AllPools, p} {
		c.Allocation[k].Current--
		c.AllocatedBytes[k].Current -= n
		c.pend[k].n++
		c.pend[k].bytes += n
	}
}

// CountPendingFreed counts the end of a block counted by CountPending
// (its events completed, or its memory was dropped): it leaves Active,
// ActiveBytes and RequestedBytes.
func (c *HotCounters) CountPendingFreed(p PoolKind, n, req int64) {
	for _, k := range [2]PoolKind{AllPools, p} {
		c.pend[k].n--
		c.pend[k].bytes -= n
		c.RequestedBytes[k].Current -= req
	}
}

// ActiveNow returns Current of Active and ActiveBytes for entry k: the
// blocks allocated or pending free, and their bytes.
func (c *HotCounters) ActiveNow(k PoolKind) (blocks, bytes int64) {
	return c.Allocation[k].Current + c.pend[k].n, c.AllocatedBytes[k].Current + c.pend[k].bytes
}

// settle makes every field of the embedded DeviceStats exact.
func (c *HotCounters) settle() {
	for k := range NumPoolKinds {
		c.Active[k].Current, c.ActiveBytes[k].Current = c.ActiveNow(k)
		c.Active[k].Allocated = c.Allocation[k].Allocated
		c.ActiveBytes[k].Allocated = c.AllocatedBytes[k].Allocated
	}
	for i, a := range c.hot() {
		a[AllPools].Allocated, a[AllPools].Freed = 0, 0
		for k := SmallPool; k < NumPoolKinds; k++ {
			s := &a[k]
			s.Freed = s.Allocated - s.Current + c.base[i][k]
			a[AllPools].Allocated += s.Allocated
			a[AllPools].Freed += s.Freed
		}
	}
}

// Settled returns the statistics with every field exact: a plain
// DeviceStats.
func (c *HotCounters) Settled() DeviceStats {
	c.settle()
	return c.DeviceStats
}

// ResetPeak sets every peak to its current value, as
// DeviceStats.ResetPeak does.
func (c *HotCounters) ResetPeak() {
	c.settle()
	c.DeviceStats.ResetPeak()
}

// ResetAccumulated zeroes every accumulated counter, as
// DeviceStats.ResetAccumulated does, and restarts the derivation of the
// hot arrays' Freed from the pools' Current now.
func (c *HotCounters) ResetAccumulated() {
	c.settle()
	c.DeviceStats.ResetAccumulated()
	for i, a := range c.hot() {
		for k := SmallPool; k < NumPoolKinds; k++ {
			c.base[i][k] = a[k].Current
		}
	}
}
