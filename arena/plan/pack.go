package plan

import (
	"cmp"
	"math"
	"slices"
	"sort"
)

// Pack returns an offset for each interval, each a multiple of align (a
// power of two), such that no two intervals whose lifetimes overlap share
// an address, and the region's size: the largest offset plus size, rounded
// up to align. It minimises the size heuristically (see the package doc).
// Bad input yields an error from Validate and no offsets; a packing whose
// end would not fit in 64 bits yields ErrOverflow.
func Pack(ivs []Interval, align uint64) (offsets []uint64, size uint64, err error) {
	if err := Validate(ivs, align); err != nil {
		return nil, 0, err
	}
	if len(ivs) == 0 {
		return []uint64{}, 0, nil
	}
	return newPacker(ivs, align).run()
}

// packer holds one Pack call's state: the intervals on a compressed time
// axis and the occupancy index that every greedy pass rebuilds.
//
// Time is compressed to slots, one per distinct Birth: an interval
// occupies slots [lo, hi), lo the rank of its Birth among the distinct
// births and hi the number of distinct births before its Death. Two
// intervals overlap in time exactly when their slot ranges do.
//
// The occupancy index is a segment tree over the slots (node 1 the root,
// node v's children 2v and 2v+1, leaf of slot t at leaves+t). A placed
// interval is recorded in cover of each node of its canonical cover (the
// O(log T) maximal nodes whose slot ranges tile [lo, hi)), and in sub of
// those nodes and all their ancestors. So cover[v] is the addresses held
// throughout v's range by intervals covering it there, and sub[v] the
// addresses held at some slot of v's range by intervals covering a node
// in v's subtree. The addresses held at some slot of [lo, hi) are then the
// union of sub[c] for the canonical nodes c of [lo, hi) and cover[a] for
// their ancestors a: O(log T) span sets, each coalesced.
type packer struct {
	ivs   []Interval
	sizes []uint64 // rounded up to align
	lo    []int32  // first slot
	hi    []int32  // one past the last slot
	lower uint64   // PeakLive: no packing is smaller

	leaves int       // a power of two >= the number of slots
	cover  []spanSet // by node
	sub    []spanSet // by node
	stamp  []uint32  // by node: the last insertion that touched sub
	clock  uint32

	offsets []uint64  // the pass in progress
	sets    []spanSet // scratch: the span sets a query consults
	canon   []int32   // scratch: canonical nodes
}

func newPacker(ivs []Interval, align uint64) *packer {
	n := len(ivs)
	p := &packer{
		ivs:     ivs,
		sizes:   make([]uint64, n),
		lo:      make([]int32, n),
		hi:      make([]int32, n),
		offsets: make([]uint64, n),
		lower:   PeakLive(ivs, align),
	}
	births := make([]uint64, n)
	for i, iv := range ivs {
		p.sizes[i] = roundUp(iv.Size, align)
		births[i] = iv.Birth
	}
	slices.Sort(births)
	births = slices.Compact(births)
	for i, iv := range ivs {
		lo, _ := slices.BinarySearch(births, iv.Birth)
		hi, _ := slices.BinarySearch(births, iv.Death) // births before Death
		p.lo[i], p.hi[i] = int32(lo), int32(hi)
	}
	p.leaves = 1
	for p.leaves < len(births) {
		p.leaves *= 2
	}
	p.cover = make([]spanSet, 2*p.leaves)
	p.sub = make([]spanSet, 2*p.leaves)
	p.stamp = make([]uint32, 2*p.leaves)
	return p
}

// reset forgets every placement, keeping the sets' memory.
func (p *packer) reset() {
	for v := range p.cover {
		p.cover[v] = p.cover[v][:0]
		p.sub[v] = p.sub[v][:0]
	}
}

// canonical sets p.canon to the canonical cover of slots [lo, hi).
func (p *packer) canonical(lo, hi int32) {
	p.canon = p.canon[:0]
	l, r := int(lo)+p.leaves, int(hi)+p.leaves
	for l < r {
		if l&1 == 1 {
			p.canon = append(p.canon, int32(l))
			l++
		}
		if r&1 == 1 {
			r--
			p.canon = append(p.canon, int32(r))
		}
		l, r = l/2, r/2
	}
}

// place records interval i at off.
func (p *packer) place(i int32, off uint64) {
	p.offsets[i] = off
	end := off + p.sizes[i]
	p.canonical(p.lo[i], p.hi[i])
	p.clock++
	for _, c := range p.canon {
		p.cover[c].add(off, end)
		for v := c; v >= 1 && p.stamp[v] != p.clock; v /= 2 {
			p.stamp[v] = p.clock
			p.sub[v].add(off, end)
		}
	}
}

// lowest returns the lowest offset at which interval i fits among the
// placed intervals it overlaps in time (it may overflow: the caller
// checks).
func (p *packer) lowest(i int32) uint64 {
	p.canonical(p.lo[i], p.hi[i])
	p.sets = p.sets[:0]
	p.clock++
	for _, c := range p.canon {
		if len(p.sub[c]) > 0 {
			p.sets = append(p.sets, p.sub[c])
		}
		for v := c / 2; v >= 1 && p.stamp[v] != p.clock; v /= 2 {
			p.stamp[v] = p.clock
			if len(p.cover[v]) > 0 {
				p.sets = append(p.sets, p.cover[v])
			}
		}
	}
	// Leapfrog: each set pushes the candidate past its conflicts until a
	// whole round leaves it where it is.
	s, off := p.sizes[i], uint64(0)
	for k, still := 0, 0; still < len(p.sets); k = (k + 1) % len(p.sets) {
		if next := p.sets[k].firstFree(off, s); next != off {
			off, still = next, 1
		} else {
			still++
		}
	}
	return off
}

// greedy places the intervals in order, each at the lowest offset where it
// fits, and returns the region's size. It stops early, with ok false, once
// the size exceeds limit (a larger packing is not wanted) or
// an end would overflow 64 bits (then bad is the interval).
func (p *packer) greedy(order []int32, limit uint64) (size uint64, bad int32, ok bool) {
	p.reset()
	for _, i := range order {
		off := p.lowest(i)
		if off > math.MaxUint64-p.sizes[i] {
			return 0, i, false
		}
		p.place(i, off)
		if size = max(size, off+p.sizes[i]); size > limit {
			return size, -1, false
		}
	}
	return size, -1, true
}

func (p *packer) run() ([]uint64, uint64, error) {
	n := len(p.ivs)
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	life := func(i int32) uint64 { return p.ivs[i].Death - p.ivs[i].Birth }
	slices.SortFunc(order, func(a, b int32) int {
		if c := cmp.Compare(p.sizes[b], p.sizes[a]); c != 0 {
			return c
		}
		if c := cmp.Compare(life(b), life(a)); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	size, bad, ok := p.greedy(order, math.MaxUint64)
	if !ok && bad >= 0 {
		return nil, 0, &IntervalError{Index: int(bad), Interval: p.ivs[bad], Err: ErrOverflow}
	}
	return p.offsets, size, nil
}

var _ = sort.Search
