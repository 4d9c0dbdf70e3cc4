package arena

// The cache-hit path. AllocFit and FreeAt each do in one call what
// BestFit+Alloc and Lookup+Peek+Free do in several: one validation of the
// arguments, then trusted access to records already checked. In the
// common split-then-merge-back cycle no class treap changes shape: the
// free block being split keeps its record (and its treap slot, when its
// new key still orders there) and the allocated piece gets a fresh record
// below it; freeing that piece merges it back into the same record. And
// the index remembers the block it split (fitMemo), so that the next
// request of the same size, with nothing else changed in between, takes
// it without a search. Both refuse, changing nothing, whatever they
// cannot do cheaply; the owner then takes its general path, which reports
// errors.

// AllocFit hands out n bytes (0 < requested ≤ n) of the best free block
// of stream sid in pool for n bytes: BestFit then Alloc in one step, for
// the owner's cache-hit path. The best block is taken only if its size is
// at most maxSize; the rest of it is split off as a Free block only if it
// is at least minSplit bytes (minSplit ≥ 1), else the whole block is
// handed out. It returns the Allocated block, its address and its size.
//
// The Free rest keeps the record (and BlockID) of the block that was
// split, and the Allocated block gets a new one: unlike Alloc, which
// hands out the block it is given.
//
// NoBlock, changing nothing, when no block fits or the best one is larger
// than maxSize, and on any bad argument or a full heap (BestFit and Alloc
// say which).
func (h *Heap) AllocFit(sid StreamID, pool uint8, n, requested, maxSize, minSplit uint64) (BlockID, uintptr, uint64) {
	if uint(sid) >= uint(len(h.streams)) || requested-1 >= n || minSplit == 0 {
		return NoBlock, 0, 0
	}
	st := &h.streams[uint(sid)] // uint: the test above serves as the bounds check
	if int(pool) >= len(st.free) {
		return NoBlock, 0, 0 // also stream slot 0, whose free is nil
	}
	l := &st.free[pool]
	id, b := h.memoFit(l, n)
	// With a recycled record the heap is not full: nrec stays below
	// maxRecords-1 (newRec's callers check room) and used below nrec-1.
	if id == NoBlock || b.size-n < minSplit || h.freeRec == NoBlock || h.live.room == 0 || h.splitHook != nil {
		return h.allocFit(st, l, n, requested, maxSize, minSplit)
	}
	if b.size > maxSize {
		return NoBlock, 0, 0
	}
	// The memo's block, split in place again with a recycled record and
	// room in the address table: no call (the general path, allocFit,
	// makes the calls, and the spills they cost, that this one does
	// without).
	aid, a := h.recycled()
	addr := b.addr
	a.setBelow(id, b, n, requested)
	h.splitBelow(st, b, aid, n)
	l.bytes -= n
	h.live.putRoom(aid, addr)
	return aid, addr, n
}

// allocFit is AllocFit past its memo's fast path, in index l of stream
// record st. Arguments are checked.
func (h *Heap) allocFit(st *streamRec, l *tlsfIndex, n, requested, maxSize, minSplit uint64) (BlockID, uintptr, uint64) {
	id, b := h.memoFit(l, n)
	memoHit := id != NoBlock
	if !memoHit {
		if id = h.bestFit(l, n); id == NoBlock {
			return NoBlock, 0, 0
		}
		b = h.rec(id)
	}
	size := b.size
	if size > maxSize {
		return NoBlock, 0, 0
	}
	if size-n < minSplit { // the whole block (size ≥ n)
		if h.splitHook != nil {
			h.leave(b)
		}
		h.remove(l, id, b)
		b.state = Allocated
		b.aux, b.up = requested, 0
		if h.live.room == 0 { // put, without the call
			h.live.grow(h)
		}
		h.live.putRoom(id, b.addr)
		return id, b.addr, size
	}
	if int64(h.used)+1 >= maxRecords-1 {
		return NoBlock, 0, 0
	}
	if h.splitHook != nil {
		h.leave(b)
	}
	addr := b.addr
	inPlace := memoHit // a memo is kept only for a split in place
	if !memoHit {
		if inPlace = h.fitsSlotSmaller(id, b, size-n, addr+uintptr(n)); inPlace {
			m := &l.memo // field by field: no zeroing
			m.ver, m.id, m.n, m.size, m.b = l.ver, id, n, size, b
		}
	}
	if !inPlace {
		h.remove(l, id, b)
	}
	aid, a := h.recycled()
	if aid == NoBlock {
		aid, a = h.newRec()
	}
	a.setBelow(id, b, n, requested)
	h.splitBelow(st, b, aid, n)
	if inPlace {
		l.bytes -= n
	} else {
		h.insert(l, id, b)
	}
	if h.splitHook != nil {
		h.enter(b)
	}
	if h.live.room == 0 { // put, without the call
		h.live.grow(h)
	}
	h.live.putRoom(aid, addr)
	return aid, addr, n
}

// splitBelow cuts the first n bytes (0 < n < size) off b, a Free block
// of stream record st, which keeps its record and its place in any index
// (the caller fixes the index for the new key), and links in their new
// block aid below it, which setBelow has set. room has been checked. It
// inlines.
func (h *Heap) splitBelow(st *streamRec, b *block, aid BlockID, n uint64) {
	if b.prev != NoBlock {
		h.rec(b.prev).next = aid
	} else {
		h.regions[b.region].head = aid
	}
	b.prev = aid
	b.addr += uintptr(n)
	b.size -= n
	st.blocks++
}

// setBelow makes a, a record that is zero but for its state and next
// (from recycled or newRec), the Allocated block of the first n bytes of
// b (id) for a request of requested bytes. Field by field: a composite
// literal would be built on the stack and copied.
func (a *block) setBelow(id BlockID, b *block, n, requested uint64) {
	a.addr = b.addr
	a.size = n
	a.aux = requested
	a.prev = b.prev
	a.next = id
	a.region = b.region
	a.stream = b.stream
	a.state = Allocated
	a.pool = b.pool
}

// Freed is what FreeAt says of the block it freed. It has four fields so
// that the compiler keeps it in registers (a larger struct, such as Peek,
// goes through memory: stored, copied and loaded again at every call).
type Freed struct {
	Size      uint64   // nbytes
	Requested uint64   // nbytes asked for
	Stream    StreamID // the stream that owned it
	Pool      uint8    // the region's pool
}

// FreeAt frees the Allocated block starting at addr if no event is
// counted on it: Lookup, Peek and Free in one step, for the owner's
// cache-hit path. It returns what Peek said of the block before it was
// freed (its address is addr and its state Allocated). ok is false, and
// nothing changes, when no Allocated block starts at addr or the block
// has events (the owner takes its general path: MarkPending).
//
// When the block merges with a Free upper neighbour only, that neighbour
// keeps its record and the freed block's record is recycled.
func (h *Heap) FreeAt(addr uintptr) (f Freed, ok bool) {
	t := &h.live
	i, id, b := t.find(h, addr)
	if id == NoBlock || b.up != 0 {
		return Freed{}, false
	}
	// t.removeAt(h, i), written out: the compiler does not inline it.
	t.slots[i] = NoBlock
	t.room++
	if t.slots[(i+1)&(len(t.slots)-1)] != NoBlock {
		t.shiftBack(h, i)
	}
	f = Freed{Size: b.size, Requested: b.aux, Stream: b.stream, Pool: b.pool}
	b.state = Free
	b.aux = 0
	// coalesceInsert, by cases, for a block that was in no index.
	var prev *block // b's lower neighbour, if any
	if b.prev != NoBlock {
		if prev = h.rec(b.prev); mergeable(prev, f.Stream) {
			h.coalesceInsert(id, b)
			return f, true
		}
	}
	st := &h.streams[f.Stream]
	l := &st.free[f.Pool] // b's index, and its upper neighbour's if they merge
	m := &l.memo
	nid := b.next
	nx := m.b // b's upper neighbour, if any: the memo's record is at hand
	if nid != m.id {
		nx = nil
		if nid != NoBlock {
			nx = h.rec(nid)
		}
	}
	if nx == nil || !mergeable(nx, f.Stream) { // no merge
		h.insert(l, id, b)
		if h.splitHook != nil {
			h.enter(b)
		}
		return f, true
	}
	// Only the upper neighbour merges. The split-then-merge-back cycle:
	// b was cut off the bottom of the memo's block, which absorbs it and,
	// back at the memo's key, keeps its slot (mergeAbove's first case,
	// without the call).
	if nid == m.id && m.ver == l.ver && nx.size+f.Size == m.size && h.splitHook == nil {
		l.bytes += f.Size
		nx.addr = addr
		nx.size += f.Size
		nx.prev = b.prev
		if prev != nil {
			prev.next = nid
		} else {
			h.regions[b.region].head = nid
		}
		st.blocks-- // freeRecord(id, b), with st at hand
		h.recycleRecord(id, b)
		return f, true
	}
	h.mergeAbove(l, id, b, prev, nid, nx)
	return f, true
}

// mergeAbove merges Free block b (in no index), whose lower neighbour
// prev (nil when none) does not merge, into its upper neighbour nx,
// listed in l: nx keeps its treap slot when its new key still orders
// there (the split-then-merge-back cycle of AllocFit undone).
func (h *Heap) mergeAbove(l *tlsfIndex, id BlockID, b, prev *block, nid BlockID, nx *block) {
	if h.splitHook != nil {
		h.leave(nx)
	}
	size := nx.size + b.size
	// Merging back to the memo's key restores the index it was kept for,
	// where that key stood in this slot.
	m := &l.memo
	fits := nid == m.id && m.ver == l.ver && size == m.size
	if !fits {
		if fits = h.fitsSlotLarger(nid, nx, size, b.addr); fits && nid != m.id {
			l.ver++ // another block's key changes in place
		}
	}
	if fits {
		l.bytes += b.size
		h.absorbBelow(nid, nx, id, b, prev)
	} else {
		h.remove(l, nid, nx)
		h.absorbBelow(nid, nx, id, b, prev)
		h.insert(l, nid, nx)
	}
	if h.splitHook != nil {
		h.enter(nx)
	}
}

// absorbBelow merges b, the lower neighbour of nx and in no index, into
// nx, and recycles b's record; prev is the record of b's lower neighbour
// (nil when none).
func (h *Heap) absorbBelow(nid BlockID, nx *block, id BlockID, b, prev *block) {
	nx.addr = b.addr
	nx.size += b.size
	nx.prev = b.prev
	if prev != nil {
		prev.next = nid
	} else {
		h.regions[b.region].head = nid
	}
	h.freeRecord(id, b)
}

// fitsSlotSmaller is fitsSlot for a key (size, addr) that orders before
// the key of listed block id (record b): only its predecessor can be out
// of order.
func (h *Heap) fitsSlotSmaller(id BlockID, b *block, size uint64, addr uintptr) bool {
	if !sameClass(size, b.size) {
		return false
	}
	if b.up == 0 && b.aux == 0 {
		return true // alone in its class
	}
	p := h.pred(id, b)
	return p == NoBlock || lessThanKey(h.rec(p), size, addr)
}

// fitsSlotLarger is fitsSlot for a key (size, addr) that orders after the
// key of listed block id (record b): only its successor can be out of
// order.
func (h *Heap) fitsSlotLarger(id BlockID, b *block, size uint64, addr uintptr) bool {
	if !sameClass(size, b.size) {
		return false
	}
	if b.up == 0 && b.aux == 0 {
		return true // alone in its class
	}
	n := h.succ(id, b)
	return n == NoBlock || lessKey(size, addr, h.rec(n))
}
