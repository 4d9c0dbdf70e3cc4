package host

import "math/bits"

const (
	pageShift = 12             // log2 of the host page
	pageSize  = 1 << pageShift // 4 KiB: the least a pinned allocation occupies, and HostRegister's alignment (R19)

	// MaxSize is the largest request Malloc accepts (4 EiB), so that every
	// rounding stays inside uint64.
	MaxSize = 1 << 62
	maxLog  = 61 // a request above 2^maxLog rounds to at most 2^(maxLog+1) = MaxSize
)

// sizeClasses rounds requests to the block sizes the cache keeps. Blocks are
// never split, so a request is served only by a free block of exactly its
// class. A class is a whole number of pages; above one page the classes are
// the powers of two and, with div > 1, div steps between consecutive powers
// (2^k + j·2^k/div, j = 1..div), no step smaller than a page. div = 1 gives
// PyTorch's power-of-two classes.
type sizeClasses struct {
	shift uint // log2 of div: 0, 1, 2 or 3
}

// count is the number of class indices.
func (c sizeClasses) count() int { return (maxLog-pageShift+1)<<c.shift + 1 }

// round returns the class size and index of a request of n bytes,
// 0 < n ≤ MaxSize.
func (c sizeClasses) round(n uint64) (size uint64, class int) {
	if n <= pageSize {
		return pageSize, 0
	}
	k := uint(bits.Len64(n-1) - 1) // 2^k < n ≤ 2^(k+1), k ≥ pageShift
	step := max(uint64(1)<<(k-c.shift), pageSize)
	size = (n + step - 1) &^ (step - 1)
	// Index by position among the div steps above 2^k (j = 1..div); a step
	// clamped to a page is a multiple of the unclamped one, so some indices
	// stay unused.
	unit := uint64(1) << (k - c.shift)
	idx := int(k-pageShift)<<c.shift + int((size-1<<k)/unit)
	return size, idx
}
