package arena

import "github.com/google/btree"

// BTreeFreeList is the ordered-set alternative to FreeList: a B-tree of free
// blocks keyed by (size, address). BestFit is a lower-bound search. It
// returns the same blocks as FreeList for the same operations; it is kept
// for the comparison benchmarks (FreeList is faster and allocation-free, so
// the allocator uses FreeList).
type BTreeFreeList struct {
	t     *btree.BTreeG[*Block]
	bytes uint64
}

// NewBTreeFreeList returns an empty list.
func NewBTreeFreeList() *BTreeFreeList {
	return &BTreeFreeList{t: btree.NewG(32, less)}
}

// Len is the number of blocks in the list.
func (l *BTreeFreeList) Len() int { return l.t.Len() }

// Bytes is the total size of the blocks in the list.
func (l *BTreeFreeList) Bytes() uint64 { return l.bytes }

// Insert adds b.
func (l *BTreeFreeList) Insert(b *Block) {
	l.t.ReplaceOrInsert(b)
	l.bytes += b.Size
}

// Remove takes b out of the list.
func (l *BTreeFreeList) Remove(b *Block) {
	if _, ok := l.t.Delete(b); ok {
		l.bytes -= b.Size
	}
}

// BestFit returns the smallest block of at least size bytes, the lowest
// address among equals, or nil.
func (l *BTreeFreeList) BestFit(size uint64) *Block {
	var found *Block
	l.t.AscendGreaterOrEqual(&Block{Size: size}, func(b *Block) bool {
		found = b
		return false
	})
	return found
}
