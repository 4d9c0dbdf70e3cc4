package arena

import "math/bits"

// tlsfIndex is a TLSF index of the free blocks of one (stream, pool) of a
// Heap: the classes of classOf and two bitmaps, with class treaps ordered
// by (size, address) and linked through the records' aux (children) and
// up (parent) fields. Its methods live on Heap, which owns the records.
type tlsfIndex struct {
	flMap uint64            // bit f set: some class in first level f is non-empty
	slMap [flCount]uint16   // bit s of slMap[f] set: class f*16+s non-empty
	roots [numClass]BlockID // class treap roots
	n     int               // blocks in the index
	bytes uint64            // nbytes in the index
}

func (l *tlsfIndex) markNonEmpty(c int) {
	fl, sl := c/slCount, c%slCount
	l.slMap[fl] |= 1 << uint(sl)
	l.flMap |= 1 << uint(fl)
}

func (l *tlsfIndex) markEmpty(c int) {
	fl, sl := c/slCount, c%slCount
	l.slMap[fl] &^= 1 << uint(sl)
	if l.slMap[fl] == 0 {
		l.flMap &^= 1 << uint(fl)
	}
}

// lessRec orders free blocks by (size, address).
func lessRec(a, b *block) bool {
	return a.size < b.size || (a.size == b.size && a.addr < b.addr)
}

// lessKey orders a (size, address) key before block b.
func lessKey(size uint64, addr uintptr, b *block) bool {
	return size < b.size || (size == b.size && addr < b.addr)
}

// lessThanKey orders block b before a (size, address) key.
func lessThanKey(b *block, size uint64, addr uintptr) bool {
	return b.size < size || (b.size == size && b.addr < addr)
}

// prio16 is a block's treap priority: a hash of its address, so a treap's
// shape depends only on its keys (deterministic).
func prio16(addr uintptr) uint16 {
	return uint16((uint64(addr) * 0x9E3779B97F4A7C15) >> 48)
}

// setChild replaces child old of parent pid (or the root of class c) by
// n, whose record is nb (nil when n is NoBlock).
func (h *Heap) setChild(l *tlsfIndex, c int, pid, old, n BlockID, nb *block) {
	if pid == NoBlock {
		l.roots[c] = n
	} else if p := h.rec(pid); p.left() == old {
		p.setLeft(n)
	} else {
		p.setRight(n)
	}
	if nb != nil {
		nb.up = int32(pid)
	}
}

// rotateUp rotates id above its parent.
func (h *Heap) rotateUp(l *tlsfIndex, c int, id BlockID) {
	b := h.rec(id)
	pid := BlockID(b.up)
	p := h.rec(pid)
	gid := BlockID(p.up)
	if p.left() == id {
		x := b.right()
		p.setLeft(x)
		if x != NoBlock {
			h.rec(x).up = int32(pid)
		}
		b.setRight(pid)
	} else {
		x := b.left()
		p.setRight(x)
		if x != NoBlock {
			h.rec(x).up = int32(pid)
		}
		b.setLeft(pid)
	}
	p.up = int32(id)
	h.setChild(l, c, gid, pid, id, b)
}

// insert adds free block id (in no index) to l.
func (h *Heap) insert(l *tlsfIndex, id BlockID, b *block) {
	c := classOf(b.size)
	b.aux, b.up = 0, 0
	b.prio = prio16(b.addr)
	if l.roots[c] == NoBlock {
		l.roots[c] = id
		l.markNonEmpty(c)
	} else {
		cur := l.roots[c]
		for {
			cb := h.rec(cur)
			if lessRec(b, cb) {
				if cb.left() == NoBlock {
					cb.setLeft(id)
					break
				}
				cur = cb.left()
			} else {
				if cb.right() == NoBlock {
					cb.setRight(id)
					break
				}
				cur = cb.right()
			}
		}
		b.up = int32(cur)
		for b.up != 0 && b.prio < h.rec(BlockID(b.up)).prio {
			h.rotateUp(l, c, id)
		}
	}
	l.n++
	l.bytes += b.size
}

// remove takes block id, whose size is that it was inserted with, out of l.
func (h *Heap) remove(l *tlsfIndex, id BlockID, b *block) {
	c := classOf(b.size)
	for b.left() != NoBlock && b.right() != NoBlock {
		if h.rec(b.left()).prio < h.rec(b.right()).prio {
			h.rotateUp(l, c, b.left())
		} else {
			h.rotateUp(l, c, b.right())
		}
	}
	child := b.left()
	if child == NoBlock {
		child = b.right()
	}
	var cb *block
	if child != NoBlock {
		cb = h.rec(child)
	}
	h.setChild(l, c, BlockID(b.up), id, child, cb)
	if l.roots[c] == NoBlock {
		l.markEmpty(c)
	}
	b.aux, b.up = 0, 0
	l.n--
	l.bytes -= b.size
}

// bestFit is the smallest block of l of at least size bytes, the lowest
// address among equals, or NoBlock.
func (h *Heap) bestFit(l *tlsfIndex, size uint64) BlockID {
	c := classOf(size)
	best := NoBlock
	for cur := l.roots[c]; cur != NoBlock; {
		b := h.rec(cur)
		if b.size >= size {
			best, cur = cur, b.left()
		} else {
			cur = b.right()
		}
	}
	if best != NoBlock {
		return best
	}
	return h.firstAbove(l, c)
}

func (h *Heap) minNode(id BlockID) BlockID {
	for {
		x := h.rec(id).left()
		if x == NoBlock {
			return id
		}
		id = x
	}
}

func (h *Heap) maxNode(id BlockID) BlockID {
	for {
		x := h.rec(id).right()
		if x == NoBlock {
			return id
		}
		id = x
	}
}

// firstAbove is the smallest block of the first non-empty class above c.
func (h *Heap) firstAbove(l *tlsfIndex, c int) BlockID {
	fl, sl := uint(c)/slCount, uint(c)%slCount // c ≥ 0: shifts and masks
	if fl >= flCount {
		return NoBlock
	}
	if m := l.slMap[fl] &^ (1<<(sl+1) - 1); m != 0 { // a 16-bit map: empty when sl is the last class
		return h.minNode(l.roots[fl*slCount+uint(bits.TrailingZeros16(m))])
	}
	m := l.flMap &^ (1<<(fl+1) - 1)
	if m == 0 {
		return NoBlock
	}
	f := uint(bits.TrailingZeros64(m))
	if f >= flCount { // never: flMap has no bit at or above flCount
		return NoBlock
	}
	return h.minNode(l.roots[f*slCount+uint(bits.TrailingZeros16(l.slMap[f]))])
}

// succ is the in-order successor of id (record b) within its class
// treap, or NoBlock.
func (h *Heap) succ(id BlockID, b *block) BlockID {
	if r := b.right(); r != NoBlock {
		return h.minNode(r)
	}
	for b.up != 0 {
		pid := BlockID(b.up)
		p := h.rec(pid)
		if p.right() != id {
			return pid
		}
		id, b = pid, p
	}
	return NoBlock
}

// pred is the in-order predecessor of id (record b) within its class
// treap, or NoBlock.
func (h *Heap) pred(id BlockID, b *block) BlockID {
	if l := b.left(); l != NoBlock {
		return h.maxNode(l)
	}
	for b.up != 0 {
		pid := BlockID(b.up)
		p := h.rec(pid)
		if p.left() != id {
			return pid
		}
		id, b = pid, p
	}
	return NoBlock
}

// fitsSlot reports whether a free block keyed (size, addr) could stand
// where listed block id (record b, class c) stands in its class treap.
func (h *Heap) fitsSlot(id BlockID, b *block, c int, size uint64, addr uintptr) bool {
	if classOf(size) != c {
		return false
	}
	if b.up == 0 && b.aux == 0 {
		return true // alone in its class
	}
	if p := h.pred(id, b); p != NoBlock && !lessThanKey(h.rec(p), size, addr) {
		return false
	}
	if n := h.succ(id, b); n != NoBlock && !lessKey(size, addr, h.rec(n)) {
		return false
	}
	return true
}

// replaceSlot puts unlisted block rid (record r) in listed block bid's
// (record b) place in its class treap c (the caller checked fitsSlot) and
// takes bid out, without changing l's counts.
func (h *Heap) replaceSlot(l *tlsfIndex, c int, bid BlockID, b *block, rid BlockID, r *block) {
	r.aux, r.prio = b.aux, b.prio
	if x := r.left(); x != NoBlock {
		h.rec(x).up = int32(rid)
	}
	if x := r.right(); x != NoBlock {
		h.rec(x).up = int32(rid)
	}
	h.setChild(l, c, BlockID(b.up), bid, rid, r)
	b.aux, b.up = 0, 0
}

// eachFree calls fn for every block of l in ascending (size, address)
// order until fn returns false.
func (h *Heap) eachFree(l *tlsfIndex, fn func(BlockID) bool) {
	m := l.flMap
	for m != 0 {
		f := bits.TrailingZeros64(m)
		m &^= 1 << uint(f)
		s := l.slMap[f]
		for s != 0 {
			k := bits.TrailingZeros16(s)
			s &^= 1 << uint(k)
			for id := h.minNode(l.roots[f*slCount+k]); id != NoBlock; id = h.succ(id, h.rec(id)) {
				if !fn(id) {
					return
				}
			}
		}
	}
}

// addrTable maps the address of every Allocated block of a Heap to its
// record: open addressing over BlockIDs with linear probing and
// backward-shift deletion; the key of a slot is its record's address, so a
// slot is 4 bytes. It doubles when more than half full and never shrinks.
type addrTable struct {
	slots []BlockID // NoBlock = empty
	n     int       // occupied slots
	shift uint      // 64 − log2(len(slots))
}

const addrTableMinSize = 1024

func (t *addrTable) home(addr uintptr) int {
	return int((uint64(addr) * 0x9E3779B97F4A7C15) >> t.shift)
}

func (t *addrTable) init(size int) {
	t.slots = make([]BlockID, size)
	t.n = 0
	t.shift = 64 - uint(bits.Len(uint(size))-1)
}

func (t *addrTable) get(h *Heap, addr uintptr) BlockID {
	if t.n == 0 {
		return NoBlock
	}
	mask := len(t.slots) - 1
	for i := t.home(addr); ; i = (i + 1) & mask {
		id := t.slots[i]
		if id == NoBlock || h.rec(id).addr == addr {
			return id
		}
	}
}

// find is get that also returns the slot and the record of the block
// found (NoBlock, nil when none).
func (t *addrTable) find(h *Heap, addr uintptr) (int, BlockID, *block) {
	if t.n == 0 {
		return 0, NoBlock, nil
	}
	mask := len(t.slots) - 1
	for i := t.home(addr); ; i = (i + 1) & mask {
		id := t.slots[i]
		if id == NoBlock {
			return i, NoBlock, nil
		}
		if b := h.rec(id); b.addr == addr {
			return i, id, b
		}
	}
}

// put inserts id, whose address addr is not in the table.
func (t *addrTable) put(h *Heap, id BlockID, addr uintptr) {
	if t.slots == nil {
		t.init(addrTableMinSize)
	}
	if 2*(t.n+1) > len(t.slots) {
		old := t.slots
		t.init(2 * len(old))
		for _, x := range old {
			if x != NoBlock {
				t.put(h, x, h.rec(x).addr)
			}
		}
	}
	mask := len(t.slots) - 1
	i := t.home(addr)
	for t.slots[i] != NoBlock {
		i = (i + 1) & mask
	}
	t.slots[i] = id
	t.n++
}

// remove takes id, whose address is addr, out; it reports whether id was
// there.
func (t *addrTable) remove(h *Heap, id BlockID, addr uintptr) bool {
	if t.n == 0 {
		return false
	}
	mask := len(t.slots) - 1
	i := t.home(addr)
	for t.slots[i] != id {
		if t.slots[i] == NoBlock {
			return false
		}
		i = (i + 1) & mask
	}
	t.removeAt(h, i)
	return true
}

// removeAt empties occupied slot i, shifting back the entries after it
// that probed past it.
func (t *addrTable) removeAt(h *Heap, i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j] != NoBlock; j = (j + 1) & mask {
		home := t.home(h.rec(t.slots[j]).addr)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = NoBlock
	t.n--
}
