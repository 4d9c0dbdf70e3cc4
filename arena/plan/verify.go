package plan

import (
	"fmt"
	"sort"
)

// Verify checks a packing of ivs: as many offsets as intervals, align a
// power of two, every offset and size a multiple of align, every interval
// inside [0, size), and no two intervals whose lifetimes overlap sharing an
// address. It returns nil or the first violation found (an *IntervalError
// or *OverlapError wrapping a sentinel error). It runs in
// O(n log n + n·L) time, L the most intervals live at once (a sweep over
// time keeping the live intervals sorted by offset; each birth is checked
// against its neighbours only, since the live set is disjoint by
// induction).
func Verify(ivs []Interval, offsets []uint64, align uint64, size uint64) error {
	if len(offsets) != len(ivs) {
		return fmt.Errorf("%w: %d offsets, %d intervals", ErrLength, len(offsets), len(ivs))
	}
	if err := Validate(ivs, align); err != nil {
		return err
	}
	if size%align != 0 {
		return fmt.Errorf("%w: region size %d, align %d", ErrMisaligned, size, align)
	}
	for i, iv := range ivs {
		off := offsets[i]
		if off%align != 0 {
			return &IntervalError{Index: i, Interval: iv, Offset: off, Err: ErrMisaligned}
		}
		if off > size || iv.Size > size-off {
			return &IntervalError{Index: i, Interval: iv, Offset: off, Err: ErrOutside}
		}
	}
	// Sweep: order indices by birth; deaths are taken from a list ordered
	// by death. Both are processed with deaths first at equal instants.
	births := make([]int32, len(ivs))
	deaths := make([]int32, len(ivs))
	for i := range ivs {
		births[i] = int32(i)
		deaths[i] = int32(i)
	}
	sort.Slice(births, func(a, b int) bool { return ivs[births[a]].Birth < ivs[births[b]].Birth })
	sort.Slice(deaths, func(a, b int) bool { return ivs[deaths[a]].Death < ivs[deaths[b]].Death })
	// live holds the live intervals' indices sorted by offset; they are
	// pairwise disjoint in address.
	var live []int32
	find := func(i int32) int {
		off := offsets[i]
		return sort.Search(len(live), func(k int) bool {
			o := offsets[live[k]]
			return o > off || (o == off && live[k] >= i)
		})
	}
	d := 0
	for _, i := range births {
		b := ivs[i].Birth
		for d < len(deaths) && ivs[deaths[d]].Death <= b {
			j := deaths[d]
			k := find(j)
			live = append(live[:k], live[k+1:]...)
			d++
		}
		k := find(i)
		off, end := offsets[i], offsets[i]+ivs[i].Size
		if k > 0 {
			p := live[k-1]
			if offsets[p]+ivs[p].Size > off {
				return overlap(p, i)
			}
		}
		if k < len(live) {
			n := live[k]
			if offsets[n] < end {
				return overlap(n, i)
			}
		}
		live = append(live, 0)
		copy(live[k+1:], live[k:])
		live[k] = i
	}
	return nil
}

func overlap(a, b int32) error {
	if a > b {
		a, b = b, a
	}
	return &OverlapError{I: int(a), J: int(b)}
}
