package plan

import "sort"

// span is an address range [off, end), off < end.
type span struct{ off, end uint64 }

// spanSet is a set of addresses kept as sorted, disjoint, non-adjacent
// spans (adjacent or overlapping spans are merged on insertion), so a
// densely packed region is a single span however many blocks fill it.
type spanSet []span

// add inserts [off, end) into s, merging it with the spans it overlaps or
// touches, and reports whether s changed (false when a span already held
// it). It costs O(log m) to find the place plus the move of the spans
// after it.
func (s *spanSet) add(off, end uint64) bool {
	ss := *s
	// First span that ends at or after off: the first one that may merge.
	i, hi := 0, len(ss)
	for i < hi {
		if m := int(uint(i+hi) >> 1); ss[m].end < off {
			i = m + 1
		} else {
			hi = m
		}
	}
	if i < len(ss) && ss[i].off <= off && ss[i].end >= end {
		return false
	}
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
	return true
}

// cursor walks a span set upwards for one query: the candidate offsets a
// query tries only increase, so it passes over each span at most once.
type cursor struct {
	set spanSet
	at  int // the current span; the ones before it lie below the candidate
}

// skip moves the cursor to the first span that ends above off (it stays
// where it is if its span does), galloping from the current one.
func (c *cursor) skip(off uint64) {
	s := c.set
	if c.at >= len(s) || s[c.at].end > off {
		return
	}
	lo, step := c.at, 1
	for lo+step < len(s) && s[lo+step].end <= off {
		lo += step
		step *= 2
	}
	// s[lo] ends at or below off; s[lo+step], if any, above it.
	hi := min(lo+step, len(s))
	c.at = lo + 1 + sort.Search(hi-lo-1, func(k int) bool { return s[lo+1+k].end > off })
}

// firstFree returns the lowest o >= off such that [o, o+size) holds no
// address of the set (o+size may exceed 64 bits: the caller checks). off
// must be no lower than in the cursor's previous call.
func (c *cursor) firstFree(off, size uint64) uint64 {
	c.skip(off)
	s := c.set
	for c.at < len(s) && (s[c.at].off <= off || s[c.at].off-off < size) {
		off = s[c.at].end
		c.at++
	}
	return off
}

// lowestFree returns the lowest o >= 0 such that [o, o+size) holds no
// address of any of the sets (o+size may exceed 64 bits: the caller
// checks), and the number of cursor steps it took. It leapfrogs: each set
// in turn pushes the candidate past its spans in the way, until a whole
// round of the sets leaves it where it is.
func lowestFree(sets []cursor, size uint64) (off uint64, steps int) {
	for k, still := 0, 0; still < len(sets); k++ {
		if k == len(sets) {
			k = 0
		}
		steps++
		if next := sets[k].firstFree(off, size); next != off {
			off, still = next, 1
		} else {
			still++
		}
	}
	return off, steps
}
