package plan

import (
	"math"
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
	n := len(ivs)
	sizes := make([]uint64, n)
	for i, iv := range ivs {
		sizes[i] = roundUp(iv.Size, align)
	}
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	sort.Slice(order, func(a, b int) bool {
		x, y := order[a], order[b]
		if sizes[x] != sizes[y] {
			return sizes[x] > sizes[y]
		}
		lx, ly := ivs[x].Death-ivs[x].Birth, ivs[y].Death-ivs[y].Birth
		if lx != ly {
			return lx > ly
		}
		return x < y
	})
	offsets = make([]uint64, n)
	placed := make([]int32, 0, n) // sorted by offset
	for _, i := range order {
		iv, s := ivs[i], sizes[i]
		top := uint64(0)
		best, bestGap := uint64(0), uint64(math.MaxUint64)
		found := false
		for _, j := range placed {
			jv := ivs[j]
			if jv.Birth >= iv.Death || iv.Birth >= jv.Death {
				continue
			}
			if o := offsets[j]; o > top {
				if g := o - top; g >= s && g < bestGap {
					best, bestGap, found = top, g, true
				}
			}
			if e := offsets[j] + sizes[j]; e > top {
				top = e
			}
		}
		if !found {
			if top > math.MaxUint64-s {
				return nil, 0, &IntervalError{Index: int(i), Interval: iv, Offset: top, Err: ErrOverflow}
			}
			best = top
		}
		offsets[i] = best
		if end := best + s; end > size {
			size = end
		}
		k := sort.Search(len(placed), func(k int) bool { return offsets[placed[k]] > best })
		placed = append(placed, 0)
		copy(placed[k+1:], placed[k:])
		placed[k] = i
	}
	return offsets, size, nil
}
