package arena

import "math/bits"

const (
	slBits    = 4
	slCount   = 1 << slBits // second-level classes per power of two
	flCount   = 61          // first levels: sizes up to 2^64
	numClass  = flCount * slCount
	linearMax = slCount // sizes below this are classed exactly
)

// classOf maps a size to its TLSF class index. Sizes below 16 have a class
// each; above, each power of two [2^k, 2^(k+1)) is split into 16 classes of
// width 2^(k-4), so a class spans at most 1/16 (6.25%) of its lower bound.
func classOf(size uint64) int {
	if size < linearMax {
		return int(size)
	}
	fl := bits.Len64(size) - slBits // >= 1
	sl := int(size>>(uint(fl)-1)) & (slCount - 1)
	return fl*slCount + sl
}

// ClassLowerBound is the smallest size in class c.
func ClassLowerBound(c int) uint64 {
	fl, sl := c/slCount, c%slCount
	if fl == 0 {
		return uint64(sl)
	}
	return uint64(slCount+sl) << uint(fl-1)
}

// sameClass reports whether sizes x and y have one class (classOf(x) ==
// classOf(y)) without computing either: a class is the sizes that agree
// on their top five bits and bit length (every bit below 32).
func sameClass(x, y uint64) bool {
	s := max(bits.Len64(x), 5) - 5
	return x>>uint(s) == y>>uint(s)
}
