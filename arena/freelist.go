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

// FreeList is a TLSF index of free blocks ordered by (size, address)
// within each class. The zero value is an empty list.
type FreeList struct {
	flMap uint64           // bit f set: some class in first level f is non-empty
	slMap [flCount]uint16  // bit s of slMap[f] set: class f*16+s non-empty
	heads [numClass]*Block // class lists, ascending (size, address)
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

// Insert adds b, which must not be in a list.
func (l *FreeList) Insert(b *Block) {
	if b.list != nil {
		panic("arena: Insert of a listed block")
	}
	c := classOf(b.Size)
	b.class = int32(c)
	b.list = l
	var prev *Block
	cur := l.heads[c]
	for cur != nil && less(cur, b) {
		prev, cur = cur, cur.lnext
	}
	b.lprev, b.lnext = prev, cur
	if cur != nil {
		cur.lprev = b
	}
	if prev != nil {
		prev.lnext = b
	} else {
		l.heads[c] = b
		fl, sl := c/slCount, c%slCount
		l.slMap[fl] |= 1 << uint(sl)
		l.flMap |= 1 << uint(fl)
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
	if b.lprev != nil {
		b.lprev.lnext = b.lnext
	} else {
		l.heads[c] = b.lnext
		if b.lnext == nil {
			fl, sl := c/slCount, c%slCount
			l.slMap[fl] &^= 1 << uint(sl)
			if l.slMap[fl] == 0 {
				l.flMap &^= 1 << uint(fl)
			}
		}
	}
	if b.lnext != nil {
		b.lnext.lprev = b.lprev
	}
	b.lprev, b.lnext, b.list = nil, nil, nil
	l.n--
	l.bytes -= b.Size
}

// BestFit returns the smallest block of at least size bytes, the lowest
// address among equals, or nil. It does not remove it.
func (l *FreeList) BestFit(size uint64) *Block {
	c := classOf(size)
	for b := l.heads[c]; b != nil; b = b.lnext {
		if b.Size >= size {
			return b
		}
	}
	return l.firstAbove(c)
}

// firstAbove returns the head of the first non-empty class above c.
func (l *FreeList) firstAbove(c int) *Block {
	fl, sl := c/slCount, c%slCount
	if sl+1 < slCount {
		if m := l.slMap[fl] &^ (1<<uint(sl+1) - 1); m != 0 {
			return l.heads[fl*slCount+bits.TrailingZeros16(m)]
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
	return l.heads[f*slCount+bits.TrailingZeros16(l.slMap[f])]
}

// Largest returns the largest block, or nil.
func (l *FreeList) Largest() *Block {
	if l.flMap == 0 {
		return nil
	}
	f := 63 - bits.LeadingZeros64(l.flMap)
	s := 15 - bits.LeadingZeros16(l.slMap[f])
	b := l.heads[f*slCount+s]
	for b.lnext != nil {
		b = b.lnext
	}
	return b
}

// Each calls fn for every block in ascending (size, address) order until fn
// returns false.
func (l *FreeList) Each(fn func(*Block) bool) {
	m := l.flMap
	for m != 0 {
		f := bits.TrailingZeros64(m)
		m &^= 1 << uint(f)
		s := l.slMap[f]
		for s != 0 {
			k := bits.TrailingZeros16(s)
			s &^= 1 << uint(k)
			for b := l.heads[f*slCount+k]; b != nil; b = b.lnext {
				if !fn(b) {
					return
				}
			}
		}
	}
}

// Contains reports whether b is in l.
func (l *FreeList) Contains(b *Block) bool { return b.list == l }

// replaceSlot puts unlisted block r in listed block b's place in the class
// list (same class, and ordering kept: the caller checked), and takes b
// out of the list.
func (l *FreeList) replaceSlot(b, r *Block) {
	r.lprev, r.lnext, r.class, r.list = b.lprev, b.lnext, b.class, l
	if b.lprev != nil {
		b.lprev.lnext = r
	} else {
		l.heads[b.class] = r
	}
	if b.lnext != nil {
		b.lnext.lprev = r
	}
	b.lprev, b.lnext, b.list = nil, nil, nil
}

// fitsSlot reports whether a block of the given size and address could
// stand where b stands in its class list.
func fitsSlot(b *Block, size uint64, addr uintptr) bool {
	if int32(classOf(size)) != b.class {
		return false
	}
	k := Block{Addr: addr, Size: size}
	return (b.lprev == nil || less(b.lprev, &k)) && (b.lnext == nil || less(&k, b.lnext))
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
