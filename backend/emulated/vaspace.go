package emulated

import (
	"sort"

	"github.com/google/btree"
)

// vaSpace hands out aligned ranges of the window [base, limit) first-fit,
// so the same sequence of calls always yields the same addresses. Released
// ranges are coalesced and reused. The owner's lock guards it.
type vaSpace struct {
	free []vaSpan // free ranges, sorted by start, disjoint and not adjacent
}

// vaSpan is the address range [start, end).
type vaSpan struct{ start, end uint64 }

func newVASpace(base, limit uint64) *vaSpace {
	return &vaSpace{free: []vaSpan{{base, limit}}}
}

// alignUp rounds a up to a multiple of the power of two align; ok is false
// on overflow.
func alignUp(a, align uint64) (uint64, bool) {
	r := (a + align - 1) &^ (align - 1)
	return r, r >= a
}

// alloc takes size bytes at the lowest free address that is a multiple of
// align (a power of two).
func (s *vaSpace) alloc(size, align uint64) (uint64, bool) {
	for i, f := range s.free {
		start, ok := alignUp(f.start, align)
		if !ok || start >= f.end || f.end-start < size {
			continue
		}
		s.take(i, start, start+size)
		return start, true
	}
	return 0, false
}

// allocAt takes [start, start+size) if it is wholly free.
func (s *vaSpace) allocAt(start, size uint64) bool {
	end := start + size
	if end < start {
		return false
	}
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].end > start })
	if i == len(s.free) || s.free[i].start > start || s.free[i].end < end {
		return false
	}
	s.take(i, start, end)
	return true
}

// take removes [start, end) from free span i, which contains it.
func (s *vaSpace) take(i int, start, end uint64) {
	f := s.free[i]
	switch {
	case f.start == start && f.end == end:
		s.free = append(s.free[:i], s.free[i+1:]...)
	case f.start == start:
		s.free[i].start = end
	case f.end == end:
		s.free[i].end = start
	default:
		s.free[i].end = start
		s.free = append(s.free, vaSpan{})
		copy(s.free[i+2:], s.free[i+1:])
		s.free[i+1] = vaSpan{end, f.end}
	}
}

// release returns [start, start+size), which alloc or allocAt handed out.
func (s *vaSpace) release(start, size uint64) {
	end := start + size
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].start >= end })
	mergePrev := i > 0 && s.free[i-1].end == start
	mergeNext := i < len(s.free) && s.free[i].start == end
	switch {
	case mergePrev && mergeNext:
		s.free[i-1].end = s.free[i].end
		s.free = append(s.free[:i], s.free[i+1:]...)
	case mergePrev:
		s.free[i-1].end = end
	case mergeNext:
		s.free[i].start = start
	default:
		s.free = append(s.free, vaSpan{})
		copy(s.free[i+1:], s.free[i:])
		s.free[i] = vaSpan{start, end}
	}
}

// entry is one range [start, end) of an index and its value.
type entry[T any] struct {
	start, end uint64
	v          T
}

// index keeps disjoint ranges ordered by start address. Lookups take value
// pivots, so they do not allocate. The owner's lock guards it.
type index[T any] struct{ t *btree.BTreeG[entry[T]] }

func newIndex[T any]() index[T] {
	return index[T]{btree.NewG(16, func(a, b entry[T]) bool { return a.start < b.start })}
}

func (x index[T]) put(start, end uint64, v T) { x.t.ReplaceOrInsert(entry[T]{start, end, v}) }

func (x index[T]) del(start uint64) { x.t.Delete(entry[T]{start: start}) }

func (x index[T]) len() int { return x.t.Len() }

// at returns the range that starts at a.
func (x index[T]) at(a uint64) (entry[T], bool) { return x.t.Get(entry[T]{start: a}) }

// containing returns the range that holds address a.
func (x index[T]) containing(a uint64) (entry[T], bool) {
	var found entry[T]
	ok := false
	x.t.DescendLessOrEqual(entry[T]{start: a}, func(e entry[T]) bool {
		found, ok = e, true
		return false
	})
	if ok && a < found.end {
		return found, true
	}
	return entry[T]{}, false
}

// overlaps reports whether some range intersects [start, end), end > start.
func (x index[T]) overlaps(start, end uint64) bool {
	hit := false
	x.t.DescendLessOrEqual(entry[T]{start: end - 1}, func(e entry[T]) bool {
		hit = e.end > start
		return false
	})
	return hit
}

// each calls fn for every range in address order.
func (x index[T]) each(fn func(entry[T]) bool) { x.t.Ascend(fn) }
