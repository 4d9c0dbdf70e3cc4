package arena

import "math/bits"

// tlsfIndex is a TLSF index of the free blocks of one (stream, pool) of a
// Heap: the classes of classOf and two levels of bitmaps, with class
// treaps ordered by (size, address) and linked through the records' aux
// (children) and up (parent) fields. Its methods live on Heap, which owns
// the records.
//
// The index is sparse. The second-level bitmap and the 16 class roots of a
// first level (a tlsfGroup, 68 bytes) exist only while that first level
// holds a free block, or held one lately: an index costs 160 bytes empty
// and a group per first level in use, not the 4 KB of a full table of 976
// class roots. A heap may register a stream per request, and a hostile
// trace a hundred thousand streams that each hold one block or none, so
// what a stream costs follows what it holds.
//
// The groups are kept in first-level order, and pos maps a first level to
// its group, so that finding a class root costs two loads, as with a full
// table. A first level gets a group when its first block enters (the
// groups above it shift up one). A group whose last block leaves stays,
// empty, so that a block moving back and forth between two first levels
// (the split-then-merge cycle of the cache-hit path across a power of
// two) costs bit flips, not a shift each way; when that leaves more than
// maxEmptyGroups empty groups and more empty groups than others, the empty
// ones are dropped. The slice keeps its capacity, so the cache-hit path
// allocates nothing once a stream's first levels have been seen. Searches
// skip empty groups.
type tlsfIndex struct {
	flMap  uint64      // bit f set: first level f has a group (perhaps empty)
	groups []tlsfGroup // the groups of the first levels in flMap, in ascending order
	bytes  uint64      // nbytes in the index
	n      int32       // blocks in the index
	empty  uint8       // groups without a block (slMap 0)
	pos    [64]uint8   // pos[f]: 1 + the index in groups of first level f's group; 0 when it has none
	// ver counts the changes of the index's content (its blocks' keys),
	// but for the in-place splits and merges of memo's block; 64 bits, so
	// that it never wraps back to a stale memo's.
	ver  uint64
	memo fitMemo
}

// fitMemo is the last best fit that AllocFit split in place in an index,
// kept so that the split-then-merge-back cycle of the cache hit does not
// search again: while the index's ver is memo's and the block's size is
// back to size, the index holds what it held then, so bestFit(n) is id
// again, and splitting n off it fits its treap slot again. Only id's own
// in-place splits (AllocFit) and merges (FreeAt, mergeAbove) leave ver
// alone, and both keep the block's end address, so its size alone tells
// its key.
// Every other change (insert, remove, replaceSlot, another block's
// in-place merge) moves ver. Heap.Check verifies a memo that claims to be
// valid.
type fitMemo struct {
	ver  uint64
	id   BlockID // bestFit(l, n); NoBlock: none kept
	n    uint64  // the request, nbytes
	size uint64  // id's size then
	// b is id's record (nil when id is NoBlock), whatever ver says:
	// records never move, so the memo's users need not look it up.
	b *block
}

// memoFit returns the kept best fit of l for n bytes if the memo is
// valid; else NoBlock.
func (h *Heap) memoFit(l *tlsfIndex, n uint64) (BlockID, *block) {
	m := &l.memo
	if m.ver != l.ver || m.n != n || m.id == NoBlock {
		return NoBlock, nil
	}
	if m.b.size == m.size {
		return m.id, m.b
	}
	return NoBlock, nil
}

// maxEmptyGroups is the most empty groups an index keeps beyond as many
// as it has non-empty ones: a workload whose blocks move among many first
// levels (a training step's split and merged blocks, which merge back into
// a few large ones at the end of the step) keeps its groups, and dropping
// them, when empty ones outnumber the others, halves the groups at least,
// so that the shifts of adding them again are paid for. At 2, the warm
// replay of a training trace added and dropped groups every step.
const maxEmptyGroups = 8

// tlsfGroup is the second level of one first level of a tlsfIndex.
type tlsfGroup struct {
	slMap uint16           // bit s set: class f*16+s non-empty
	roots [slCount]BlockID // class treap roots
}

// group is the group of first level fl, which has one.
func (l *tlsfIndex) group(fl uint) *tlsfGroup { return &l.groups[int(l.pos[fl&63])-1] }

// root is the slot of class c's treap root; c's first level has a group.
func (l *tlsfIndex) root(c int) *BlockID {
	return &l.group(uint(c) / slCount).roots[uint(c)%slCount]
}

// addGroup gives first level fl, which has no group, an empty one, and
// returns it.
func (l *tlsfIndex) addGroup(fl uint) *tlsfGroup {
	fl &= 63
	bit := uint64(1) << fl
	r := bits.OnesCount64(l.flMap & (bit - 1))
	l.groups = append(l.groups, tlsfGroup{})
	copy(l.groups[r+1:], l.groups[r:])
	l.groups[r] = tlsfGroup{}
	for m := l.flMap &^ (bit - 1); m != 0; m &= m - 1 {
		l.pos[bits.TrailingZeros64(m)]++
	}
	l.pos[fl] = uint8(r + 1)
	l.flMap |= bit
	l.empty++
	return &l.groups[r]
}

// dropEmptyGroups drops the groups without a block. No pointer into
// groups survives it.
func (l *tlsfIndex) dropEmptyGroups() {
	kept := l.groups[:0]
	for m := l.flMap; m != 0; m &= m - 1 {
		fl := bits.TrailingZeros64(m)
		if g := l.groups[l.pos[fl]-1]; g.slMap != 0 {
			kept = append(kept, g)
			l.pos[fl] = uint8(len(kept))
		} else {
			l.pos[fl] = 0
			l.flMap &^= 1 << uint(fl)
		}
	}
	l.groups = kept
	l.empty = 0
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

// setChild replaces child old of parent pid (or the treap root in slot
// root) by n, whose record is nb (nil when n is NoBlock).
func (h *Heap) setChild(root *BlockID, pid, old, n BlockID, nb *block) {
	if pid == NoBlock {
		*root = n
	} else if p := h.rec(pid); p.left() == old {
		p.setLeft(n)
	} else {
		p.setRight(n)
	}
	if nb != nil {
		nb.up = int32(pid)
	}
}

// rotateUp rotates id above its parent, in the treap whose root is in
// slot root.
func (h *Heap) rotateUp(root *BlockID, id BlockID) {
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
	h.setChild(root, gid, pid, id, b)
}

// insert adds free block id (in no index) to l.
func (h *Heap) insert(l *tlsfIndex, id BlockID, b *block) {
	l.ver++
	c := classOf(b.size)
	fl, sl := uint(c)/slCount&63, uint(c)%slCount
	p := l.pos[fl]
	if p == 0 {
		// The call ends insert, so that no register is saved across it
		// on the common path.
		h.insertNewGroup(l, id, b, fl)
		return
	}
	b.aux, b.up = 0, 0
	b.prio = prio16(b.addr)
	g := &l.groups[int(p)-1]
	if root := &g.roots[sl]; *root == NoBlock {
		*root = id
		if g.slMap == 0 {
			l.empty--
		}
		g.slMap |= 1 << sl
	} else {
		cur := *root
		var cb *block
		for {
			cb = h.rec(cur)
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
		if b.prio < cb.prio { // the parent's record is at hand: seldom a rotation
			h.rotateUp(root, id)
			for b.up != 0 && b.prio < h.rec(BlockID(b.up)).prio {
				h.rotateUp(root, id)
			}
		}
	}
	l.n++
	l.bytes += b.size
}

// insertNewGroup is insert for a block whose first level fl has no group.
func (h *Heap) insertNewGroup(l *tlsfIndex, id BlockID, b *block, fl uint) {
	l.addGroup(fl)
	h.insert(l, id, b)
}

// remove takes block id, whose size is that it was inserted with, out of l.
func (h *Heap) remove(l *tlsfIndex, id BlockID, b *block) {
	l.ver++
	c := classOf(b.size)
	fl, sl := uint(c)/slCount, uint(c)%slCount
	g := l.group(fl)
	root := &g.roots[sl]
	for b.left() != NoBlock && b.right() != NoBlock {
		if h.rec(b.left()).prio < h.rec(b.right()).prio {
			h.rotateUp(root, b.left())
		} else {
			h.rotateUp(root, b.right())
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
	h.setChild(root, BlockID(b.up), id, child, cb)
	l.n--
	l.bytes -= b.size
	b.aux, b.up = 0, 0
	if *root == NoBlock {
		if g.slMap &^= 1 << sl; g.slMap == 0 {
			if l.empty++; l.empty > maxEmptyGroups && 2*int(l.empty) > len(l.groups) {
				l.dropEmptyGroups() // last: after the last use of g, and nothing is live across the call
			}
		}
	}
}

// bestFit is the smallest block of l of at least size bytes, the lowest
// address among equals, or NoBlock.
func (h *Heap) bestFit(l *tlsfIndex, size uint64) BlockID {
	c := classOf(size)
	fl, sl := uint(c)/slCount&63, uint(c)%slCount // c ≥ 0: shifts and masks
	p := l.pos[fl]
	if p == 0 {
		return h.firstAbove(l, fl)
	}
	g := &l.groups[int(p)-1] // perhaps empty: its roots are NoBlock, its slMap 0
	best := NoBlock
	for cur := g.roots[sl]; cur != NoBlock; {
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
	if m := g.slMap &^ (1<<(sl+1) - 1); m != 0 { // a 16-bit map: empty when sl is the last class
		return h.minNode(g.roots[bits.TrailingZeros16(m)])
	}
	return h.firstAbove(l, fl)
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

// firstAbove is the smallest block of the first non-empty first level
// above fl.
func (h *Heap) firstAbove(l *tlsfIndex, fl uint) BlockID {
	if fl >= flCount-1 {
		return NoBlock
	}
	for m := l.flMap &^ (1<<(fl+1) - 1); m != 0; m &= m - 1 {
		if g := l.group(uint(bits.TrailingZeros64(m))); g.slMap != 0 {
			return h.minNode(g.roots[bits.TrailingZeros16(g.slMap)])
		}
	}
	return NoBlock
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
	l.ver++
	root := l.root(c)
	r.aux, r.prio = b.aux, b.prio
	if x := r.left(); x != NoBlock {
		h.rec(x).up = int32(rid)
	}
	if x := r.right(); x != NoBlock {
		h.rec(x).up = int32(rid)
	}
	h.setChild(root, BlockID(b.up), bid, rid, r)
	b.aux, b.up = 0, 0
}

// eachFree calls fn for every block of l in ascending (size, address)
// order until fn returns false. fn must not change l.
func (h *Heap) eachFree(l *tlsfIndex, fn func(BlockID) bool) {
	for gi := range l.groups {
		g := &l.groups[gi]
		for s := g.slMap; s != 0; s &= s - 1 {
			k := bits.TrailingZeros16(s)
			for id := h.minNode(g.roots[k]); id != NoBlock; id = h.succ(id, h.rec(id)) {
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
// NewHeap sizes it (addrTableMinSize), so it always has an empty slot: a
// probe ends without a count check.
type addrTable struct {
	slots []BlockID // NoBlock = empty; a power of two long
	room  int       // puts left before the table doubles: len(slots)/2 − the occupied slots
	shift uint      // 64 − log2(len(slots))
}

const addrTableMinSize = 1024

func (t *addrTable) home(addr uintptr) int {
	return int((uint64(addr) * 0x9E3779B97F4A7C15) >> (t.shift & 63)) // & 63: no test for shifts ≥ 64
}

func (t *addrTable) init(size int) {
	t.slots = make([]BlockID, size)
	t.room = size / 2
	t.shift = 64 - uint(bits.Len(uint(size))-1)
}

// len is the number of occupied slots.
func (t *addrTable) len() int { return len(t.slots)/2 - t.room }

func (t *addrTable) get(h *Heap, addr uintptr) BlockID {
	_, id, _ := t.find(h, addr)
	return id
}

// find returns the slot, the BlockID and the record of the block at addr
// (the empty slot that ends the probe, NoBlock and nil when none). It
// inlines into FreeAt.
func (t *addrTable) find(h *Heap, addr uintptr) (i int, id BlockID, b *block) {
	for i = t.home(addr); ; i = (i + 1) & (len(t.slots) - 1) {
		if id = t.slots[i]; id == NoBlock {
			return i, NoBlock, nil
		}
		if b = h.rec(id); b.addr == addr {
			return i, id, b
		}
	}
}

// put inserts id, whose address addr is not in the table.
func (t *addrTable) put(h *Heap, id BlockID, addr uintptr) {
	if t.room == 0 {
		t.grow(h)
	}
	t.putRoom(id, addr)
}

// putRoom is put for a caller that has seen room (room > 0). It inlines.
func (t *addrTable) putRoom(id BlockID, addr uintptr) {
	i := t.home(addr)
	for t.slots[i] != NoBlock {
		i = (i + 1) & (len(t.slots) - 1)
	}
	t.slots[i] = id
	t.room--
}

// grow doubles the table.
func (t *addrTable) grow(h *Heap) {
	old := t.slots
	t.init(2 * len(old))
	for _, x := range old {
		if x != NoBlock {
			t.put(h, x, h.rec(x).addr)
		}
	}
}

// remove takes id, whose address is addr, out; it reports whether id was
// there.
func (t *addrTable) remove(h *Heap, id BlockID, addr uintptr) bool {
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

// removeAt empties occupied slot i. Where the next slot is empty (the
// common case in a table at most half full) nothing else moves, and
// removeAt inlines into the caller; else shiftBack moves back the entries
// after i that probed past it.
func (t *addrTable) removeAt(h *Heap, i int) {
	t.slots[i] = NoBlock
	t.room++
	if t.slots[(i+1)&(len(t.slots)-1)] != NoBlock {
		t.shiftBack(h, i)
	}
}

// shiftBack fills hole i, just emptied, with the entries after it that
// probed past it, and so on to the next empty slot.
func (t *addrTable) shiftBack(h *Heap, i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j] != NoBlock; j = (j + 1) & mask {
		home := t.home(h.rec(t.slots[j]).addr)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			t.slots[j] = NoBlock
			i = j
		}
	}
}
