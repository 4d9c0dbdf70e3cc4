package stats

// HotCounters is a DeviceStats whose five hot StatArrays (Allocation, Active,
// AllocatedBytes, ActiveBytes, RequestedBytes) are kept with fewer stores
// on an allocator's cache hit: CountMalloc and CountFree write what only
// they can know at the moment, and Settled derives the rest.
//
// What is stored, per hot StatArray:
//
//	pool p  Current, Peak  always exact
//	pool p  Allocated      exact (a malloc raises it)
//	pool p  Freed          stale: derived as Allocated − Current + base[p]
//	all     Current, Peak  always exact (a peak is a peak of the sum at one time)
//	all     Allocated      stale: derived as the sum of the pools'
//	all     Freed          stale: derived as the sum of the pools'
//
// base[p] is the pool's Current at the last ResetAccumulated (0 at first):
// the invariant of Stat (Current == Allocated − Freed + that value) is what
// lets a free store Current alone. Every other field of the embedded
// DeviceStats is exact at all times; Current and Peak of every entry may be
// read directly (growth policy and Check do), Allocated and Freed of the
// hot arrays only through Settled.
//
// Every delta applied to a hot array, through HotCounters or through its
// StatArray's Add, Inc or Dec, must name SmallPool or LargePool, so that the
// aggregate's accumulated counters are the sum of the pools'. The owner's
// lock guards a HotCounters as it guards a DeviceStats.
type HotCounters struct {
	DeviceStats
	base [numHot][NumPoolKinds]int64 // Current of each pool at the last ResetAccumulated; [AllPools] unused
}

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

// CountMalloc counts a block of n bytes handed out from pool p (SmallPool
// or LargePool) for a request of req bytes: Allocation, AllocatedBytes,
// Active, ActiveBytes and RequestedBytes. It is DeviceStats.CountMalloc
// with the aggregate's Allocated left to Settled.
func (c *HotCounters) CountMalloc(p PoolKind, n, req int64) {
	up(&c.Allocation[AllPools], &c.Allocation[p], 1)
	up(&c.Active[AllPools], &c.Active[p], 1)
	up(&c.AllocatedBytes[AllPools], &c.AllocatedBytes[p], n)
	up(&c.ActiveBytes[AllPools], &c.ActiveBytes[p], n)
	up(&c.RequestedBytes[AllPools], &c.RequestedBytes[p], req)
}

// CountFree undoes CountMalloc for a block freed without waiting for
// events: it lowers Current of p and of the aggregate, and leaves Freed to
// Settled.
func (c *HotCounters) CountFree(p PoolKind, n, req int64) {
	c.Allocation[AllPools].Current--
	c.Allocation[p].Current--
	c.Active[AllPools].Current--
	c.Active[p].Current--
	c.AllocatedBytes[AllPools].Current -= n
	c.AllocatedBytes[p].Current -= n
	c.ActiveBytes[AllPools].Current -= n
	c.ActiveBytes[p].Current -= n
	c.RequestedBytes[AllPools].Current -= req
	c.RequestedBytes[p].Current -= req
}

// settle makes every field of the embedded DeviceStats exact.
func (c *HotCounters) settle() {
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

// ResetAccumulated zeroes every accumulated counter, as
// DeviceStats.ResetAccumulated does, and restarts the derivation of the
// hot arrays' Freed from the pools' Current now.
func (c *HotCounters) ResetAccumulated() {
	c.DeviceStats.ResetAccumulated()
	for i, a := range c.hot() {
		for k := SmallPool; k < NumPoolKinds; k++ {
			c.base[i][k] = a[k].Current
		}
	}
}
