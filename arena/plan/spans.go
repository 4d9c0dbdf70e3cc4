package plan

import "sort"

// span is an address range [off, end), off < end.
type span struct{ off, end uint64 }

// spanSet is a set of addresses kept as sorted, disjoint, non-adjacent
// spans (adjacent or overlapping spans are merged on insertion), so a
// densely packed region is a single span however many blocks fill it.
type spanSet []span

// add inserts [off, end) into s, merging it with the spans it overlaps or
// touches. It costs O(log m) to find the place plus the move of the spans
// after it.
func (s *spanSet) add(off, end uint64) {
	ss := *s
	// First span that ends at or after off: the first one that may merge.
	i := sort.Search(len(ss), func(k int) bool { return ss[k].end >= off })
	j := i
	for j < len(ss) && ss[j].off <= end {
		off = min(off, ss[j].off)
		end = max(end, ss[j].end)
		j++
	}
	switch {
	case j == i: // no merge: insert
		ss = append(ss, span{})
		copy(ss[i+1:], ss[i:])
		ss[i] = span{off, end}
	default: // spans i..j-1 merged into one
		ss[i] = span{off, end}
		ss = append(ss[:i+1], ss[j:]...)
	}
	*s = ss
}

// firstFree returns the lowest o >= off such that [o, o+size) holds no
// address of s (o+size may exceed 64 bits: the caller checks).
func (s spanSet) firstFree(off, size uint64) uint64 {
	i := sort.Search(len(s), func(k int) bool { return s[k].end > off })
	for i < len(s) && (s[i].off <= off || s[i].off-off < size) {
		off = s[i].end
		i++
	}
	return off
}
