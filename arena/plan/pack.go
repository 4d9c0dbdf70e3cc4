package plan

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
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
	stamp  []uint32  // by node: the last place or lowest call that visited it
	clock  uint32    // numbers the place and lowest calls

	offsets []uint64 // the pass in progress
	sets    []cursor // scratch: the span sets a query consults
	work    int      // nodes visited and cursor steps taken so far: the cost
	canon   []int32  // scratch: canonical nodes
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
	if p.clock > math.MaxUint32/2 { // never let the clock wrap onto a stamp
		clear(p.stamp)
		p.clock = 0
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
		// sub[v] holds sub of v's children, so once a sub already held
		// the span, every ancestor's does too.
		for v := c; v >= 1 && p.stamp[v] != p.clock; v /= 2 {
			p.stamp[v] = p.clock
			p.work++
			if !p.sub[v].add(off, end) {
				break
			}
		}
	}
	p.work += len(p.canon)
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
			p.sets = append(p.sets, cursor{set: p.sub[c]})
		}
		for v := c / 2; v >= 1 && p.stamp[v] != p.clock; v /= 2 {
			p.stamp[v] = p.clock
			if len(p.cover[v]) > 0 {
				p.sets = append(p.sets, cursor{set: p.cover[v]})
			}
			p.work++
		}
	}
	off, steps := lowestFree(p.sets, p.sizes[i])
	p.work += len(p.canon) + steps
	return off
}

// greedy places the intervals in order, each at the lowest offset where it
// fits, and returns the region's size. It stops early, with ok false, once
// the size exceeds limit (a larger packing is not wanted) or an end would
// overflow 64 bits (then bad is the interval).
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

// Effort bounds, in units of packer.work (tree nodes visited and cursor
// steps, some nanoseconds each). The first order is always packed in full;
// the other orders and the improvement passes start only while the work of
// all passes after the first is within workBudget (a few tenths of a
// second), and at most maxImprovePasses improvement passes run.
const (
	workBudget       = 1 << 24
	maxImprovePasses = 64
	maxStalePasses   = 16 // kept packings in a row no smaller than the best
)

// numOrders is the number of initial orders.
const numOrders = 4

// order returns initial order k: 0, decreasing size (ties: longer
// lifetime first); 1, decreasing lifetime (ties: larger first); 2,
// decreasing area, size × lifetime (ties: larger first); 3, decreasing
// contention (ties: larger, then longer, first). Remaining ties go to the
// lower index, so a plan is a function of its input.
func (p *packer) order(k int) []int32 {
	life := func(i int32) uint64 { return p.ivs[i].Death - p.ivs[i].Birth }
	bySize := func(a, b int32) int { return cmp.Compare(p.sizes[b], p.sizes[a]) }
	byLife := func(a, b int32) int { return cmp.Compare(life(b), life(a)) }
	var keys []func(a, b int32) int
	switch k {
	case 0:
		keys = []func(a, b int32) int{bySize, byLife}
	case 1:
		keys = []func(a, b int32) int{byLife, bySize}
	case 2:
		byArea := func(a, b int32) int {
			ah, al := bits.Mul64(p.sizes[a], life(a))
			bh, bl := bits.Mul64(p.sizes[b], life(b))
			if c := cmp.Compare(bh, ah); c != 0 {
				return c
			}
			return cmp.Compare(bl, al)
		}
		keys = []func(a, b int32) int{byArea, bySize}
	default:
		crowd := p.contention()
		byCrowd := func(a, b int32) int { return cmp.Compare(crowd[b], crowd[a]) }
		keys = []func(a, b int32) int{byCrowd, bySize, byLife}
	}
	o := make([]int32, len(p.ivs))
	for i := range o {
		o[i] = int32(i)
	}
	slices.SortFunc(o, func(a, b int32) int {
		for _, key := range keys {
			if c := key(a, b); c != 0 {
				return c
			}
		}
		return cmp.Compare(a, b)
	})
	return o
}

// contention returns, for each interval, the most bytes live at any slot
// of its lifetime (modulo 2^64: it only orders): the intervals of the most
// crowded instants must be packed without holes for the region to reach
// PeakLive.
func (p *packer) contention() []uint64 {
	// live[t]: bytes live at slot t, from a difference array.
	slots := p.leaves
	diff := make([]uint64, slots+1)
	for i := range p.ivs {
		diff[p.lo[i]] += p.sizes[i]
		diff[p.hi[i]] -= p.sizes[i]
	}
	// A max segment tree over the slots.
	tree := make([]uint64, 2*slots)
	var live uint64
	for t := 0; t < slots; t++ {
		live += diff[t]
		tree[slots+t] = live
	}
	for v := slots - 1; v >= 1; v-- {
		tree[v] = max(tree[2*v], tree[2*v+1])
	}
	out := make([]uint64, len(p.ivs))
	for i := range p.ivs {
		var m uint64
		for l, r := int(p.lo[i])+slots, int(p.hi[i])+slots; l < r; l, r = l/2, r/2 {
			if l&1 == 1 {
				m = max(m, tree[l])
				l++
			}
			if r&1 == 1 {
				r--
				m = max(m, tree[r])
			}
		}
		out[i] = m
	}
	return out
}

// search is the best packing found so far.
type search struct {
	p       *packer
	offsets []uint64 // nil until a pass completes
	size    uint64   // its region size; MaxUint64 before
	order   []int32  // the order that produced it
	bad     int32    // an interval the first overflowing pass failed on, or -1
	budget  int      // p.work at which no further pass starts
	stale   int      // packings kept since the size last decreased
}

// try packs in order and keeps the result if it is no larger than the
// best; it reports whether it kept it.
func (s *search) try(order []int32) bool {
	size, bad, ok := s.p.greedy(order, s.size)
	if !ok {
		if bad >= 0 && s.bad < 0 {
			s.bad = bad
		}
		return false
	}
	if s.offsets == nil {
		s.offsets = make([]uint64, len(order))
	}
	if size < s.size {
		s.stale = 0
	} else {
		s.stale++
	}
	copy(s.offsets, s.p.offsets)
	s.size, s.order = size, order
	return true
}

// improve is a local search over orders. A culprit is an interval of the
// best packing that ends above the lower bound; taking the culprits in the
// order they were placed, it moves one earlier in the order (halfway to
// the front, a quarter of the way, then to the front: placed before the
// intervals that crowded it out) and packs again, keeping the first packing no larger than the
// best, then starts over from it. It stops after passes packings, at the
// lower bound, when the work budget is spent, after maxStalePasses kept
// packings in a row that were no smaller, or when no move of any culprit
// is kept.
func (s *search) improve(passes int) {
	for passes > 0 && s.size > s.p.lower && s.p.work < s.budget && s.stale < maxStalePasses {
		kept := false
		// Culprits: the intervals that end above the lower bound, in the
		// order they were placed.
		for pos := 0; pos < len(s.order) && !kept && passes > 0; pos++ {
			i := s.order[pos]
			if s.offsets[i]+s.p.sizes[i] <= s.p.lower {
				continue
			}
			prev := pos
			for _, to := range [...]int{pos / 2, pos / 4, 0} {
				if to == prev || passes == 0 || kept || s.p.work >= s.budget {
					continue
				}
				prev = to
				passes--
				kept = s.try(moveEarlier(s.order, pos, to))
			}
		}
		if !kept {
			return
		}
	}
}

// moveEarlier returns a copy of order with the element at pos moved to to
// (to <= pos).
func moveEarlier(order []int32, pos, to int) []int32 {
	out := make([]int32, 0, len(order))
	out = append(out, order[:to]...)
	out = append(out, order[pos])
	out = append(out, order[to:pos]...)
	return append(out, order[pos+1:]...)
}

// run packs in each initial order, then improves the best packing; it
// stops as soon as a packing reaches the lower bound.
func (p *packer) run() ([]uint64, uint64, error) {
	s := search{p: p, size: math.MaxUint64, bad: -1, budget: math.MaxInt}
	for k := range numOrders {
		if s.try(p.order(k)) && s.size == p.lower {
			return s.offsets, s.size, nil
		}
		if s.budget == math.MaxInt {
			s.budget = p.work + workBudget
		}
		if p.work >= s.budget {
			break
		}
	}
	if s.offsets == nil {
		return nil, 0, &IntervalError{Index: int(s.bad), Interval: p.ivs[s.bad], Err: ErrOverflow}
	}
	s.improve(maxImprovePasses)
	return s.offsets, s.size, nil
}
