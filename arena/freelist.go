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

// FreeList is a TLSF index of free blocks: per class, a treap ordered by
// (size, address). The zero value is an empty list.
type FreeList struct {
	flMap uint64           // bit f set: some class in first level f is non-empty
	slMap [flCount]uint16  // bit s of slMap[f] set: class f*16+s non-empty
	roots [numClass]*Block // class treap roots
	n     int              // blocks in the list
	bytes uint64           // nbytes in the list
}

// Len is the number of blocks in the list.
func (l *FreeList) Len() int { return l.n }

// Bytes is the total size of the blocks in the list.
func (l *FreeList) Bytes() uint64 { return l.bytes }

func less(a, b *Block) bool {
	return a.Size < b.Size || (a.Size == b.Size && a.Addr < b.Addr)
}

// priority is a block's treap priority: a hash of its address, so the
// shape of a treap depends only on its keys (deterministic).
func priority(addr uintptr) uint32 {
	x := uint64(addr>>9) * 0x9E3779B97F4A7C15
	x ^= x >> 29
	return uint32(x>>32) | 1
}

func (l *FreeList) markNonEmpty(c int) {
	fl, sl := c/slCount, c%slCount
	l.slMap[fl] |= 1 << uint(sl)
	l.flMap |= 1 << uint(fl)
}

func (l *FreeList) markEmpty(c int) {
	fl, sl := c/slCount, c%slCount
	l.slMap[fl] &^= 1 << uint(sl)
	if l.slMap[fl] == 0 {
		l.flMap &^= 1 << uint(fl)
	}
}

// setChild replaces child old of parent p (or the root of class c) by n.
func (l *FreeList) setChild(c int, p, old, n *Block) {
	switch {
	case p == nil:
		l.roots[c] = n
	case p.left == old:
		p.left = n
	default:
		p.right = n
	}
	if n != nil {
		n.parent = p
	}
}

// rotateUp rotates b above its parent.
func (l *FreeList) rotateUp(c int, b *Block) {
	p := b.parent
	g := p.parent
	if p.left == b {
		p.left = b.right
		if b.right != nil {
			b.right.parent = p
		}
		b.right = p
	} else {
		p.right = b.left
		if b.left != nil {
			b.left.parent = p
		}
		b.left = p
	}
	p.parent = b
	l.setChild(c, g, p, b)
}

// Insert adds b, which must not be in a list.
func (l *FreeList) Insert(b *Block) {
	if b.list != nil {
		panic("arena: Insert of a listed block")
	}
	c := classOf(b.Size)
	b.class = int32(c)
	b.list = l
	b.left, b.right, b.parent = nil, nil, nil
	b.prio = priority(b.Addr)
	if l.roots[c] == nil {
		l.roots[c] = b
		l.markNonEmpty(c)
	} else {
		cur := l.roots[c]
		for {
			if less(b, cur) {
				if cur.left == nil {
					cur.left = b
					break
				}
				cur = cur.left
			} else {
				if cur.right == nil {
					cur.right = b
					break
				}
				cur = cur.right
			}
		}
		b.parent = cur
		for b.parent != nil && b.prio < b.parent.prio {
			l.rotateUp(c, b)
		}
	}
	l.n++
	l.bytes += b.Size
}

// Remove takes b out of the list; b must be in l.
func (l *FreeList) Remove(b *Block) {
	if b.list != l {
		panic("arena: Remove of a block not in this list")
	}
	c := int(b.class)
	// Rotate b down until it has at most one child, then splice it out.
	for b.left != nil && b.right != nil {
		if b.left.prio < b.right.prio {
			l.rotateUp(c, b.left)
		} else {
			l.rotateUp(c, b.right)
		}
	}
	child := b.left
	if child == nil {
		child = b.right
	}
	l.setChild(c, b.parent, b, child)
	if l.roots[c] == nil {
		l.markEmpty(c)
	}
	b.left, b.right, b.parent, b.list = nil, nil, nil, nil
	l.n--
	l.bytes -= b.Size
}

// BestFit returns the smallest block of at least size bytes, the lowest
// address among equals, or nil. It does not remove it.
func (l *FreeList) BestFit(size uint64) *Block {
	c := classOf(size)
	var best *Block
	for cur := l.roots[c]; cur != nil; {
		if cur.Size >= size {
			best, cur = cur, cur.left
		} else {
			cur = cur.right
		}
	}
	if best != nil {
		return best
	}
	return l.firstAbove(c)
}

func minNode(b *Block) *Block {
	for b.left != nil {
		b = b.left
	}
	return b
}

func maxNode(b *Block) *Block {
	for b.right != nil {
		b = b.right
	}
	return b
}

// firstAbove returns the smallest block of the first non-empty class
// above c.
func (l *FreeList) firstAbove(c int) *Block {
	fl, sl := c/slCount, c%slCount
	if sl+1 < slCount {
		if m := l.slMap[fl] &^ (1<<uint(sl+1) - 1); m != 0 {
			return minNode(l.roots[fl*slCount+bits.TrailingZeros16(m)])
		}
	}
	if fl+1 >= flCount {
		return nil
	}
	m := l.flMap &^ (1<<uint(fl+1) - 1)
	if m == 0 {
		return nil
	}
	f := bits.TrailingZeros64(m)
	return minNode(l.roots[f*slCount+bits.TrailingZeros16(l.slMap[f])])
}

// next is b's in-order successor within its class, or nil.
func next(b *Block) *Block {
	if b.right != nil {
		return minNode(b.right)
	}
	for b.parent != nil && b.parent.right == b {
		b = b.parent
	}
	return b.parent
}

// prev is b's in-order predecessor within its class, or nil.
func prev(b *Block) *Block {
	if b.left != nil {
		return maxNode(b.left)
	}
	for b.parent != nil && b.parent.left == b {
		b = b.parent
	}
	return b.parent
}

// Each calls fn for every block in ascending (size, address) order until fn
// returns false. fn must not change the list.
func (l *FreeList) Each(fn func(*Block) bool) {
	m := l.flMap
	for m != 0 {
		f := bits.TrailingZeros64(m)
		m &^= 1 << uint(f)
		s := l.slMap[f]
		for s != 0 {
			k := bits.TrailingZeros16(s)
			s &^= 1 << uint(k)
			for b := minNode(l.roots[f*slCount+k]); b != nil; b = next(b) {
				if !fn(b) {
					return
				}
			}
		}
	}
}

// Contains reports whether b is in l.
func (l *FreeList) Contains(b *Block) bool { return b.list == l }

// replaceSlot puts unlisted block r in listed block b's place in its
// class treap (same class, and ordering kept: the caller checked), and
// takes b out of the list.
func (l *FreeList) replaceSlot(b, r *Block) {
	r.left, r.right, r.prio, r.class, r.list = b.left, b.right, b.prio, b.class, l
	if r.left != nil {
		r.left.parent = r
	}
	if r.right != nil {
		r.right.parent = r
	}
	l.setChild(int(b.class), b.parent, b, r)
	b.left, b.right, b.parent, b.list = nil, nil, nil, nil
}

// fitsSlot reports whether a block of the given size and address could
// stand where b stands in its class treap.
func fitsSlot(b *Block, size uint64, addr uintptr) bool {
	if int32(classOf(size)) != b.class {
		return false
	}
	k := Block{Addr: addr, Size: size}
	p, n := prev(b), next(b)
	return (p == nil || less(p, &k)) && (n == nil || less(&k, n))
}

// SplitFront cuts listed block b at offset n (0 < n < b.Size): b leaves
// the list holding the low n bytes, and the returned remainder, a new block
// with b's state and stream, takes b's place in the list. It is Remove,
// Split and Insert, but reuses b's list slot when the remainder stays in
// b's class (the cache-hit Malloc path).
func (l *FreeList) SplitFront(pool *BlockPool, b *Block, n uint64) *Block {
	if b.list != l || n == 0 || n >= b.Size {
		panic("arena: bad SplitFront")
	}
	if !fitsSlot(b, b.Size-n, b.Addr+uintptr(n)) {
		l.Remove(b)
		r := split(pool, b, n)
		l.Insert(r)
		return r
	}
	r := split(pool, b, n)
	l.replaceSlot(b, r)
	l.bytes -= n
	return r
}

// MergeNext merges unlisted block b with b.Next, which is in l, and leaves
// the merged block b in l. It is Remove, Merge and Insert, but b takes
// b.Next's list slot when the merged size stays in its class (the cache-hit
// Free path).
func (l *FreeList) MergeNext(pool *BlockPool, b *Block) {
	n := b.Next
	if b.list != nil || n == nil || n.list != l {
		panic("arena: bad MergeNext")
	}
	if !fitsSlot(n, b.Size+n.Size, b.Addr) {
		l.Remove(n)
		merge(pool, b)
		l.Insert(b)
		return
	}
	l.replaceSlot(n, b)
	l.bytes += b.Size
	merge(pool, b)
}
