package arena

import "fmt"

// BestFit is the free block of stream sid in pool with the smallest size
// of at least size bytes, the lowest address among equals, or NoBlock. It
// leaves the block free; Alloc hands it out.
func (h *Heap) BestFit(sid StreamID, pool uint8, size uint64) BlockID {
	if sid <= 0 || int(sid) >= len(h.streams) || int(pool) >= h.npools {
		return NoBlock
	}
	st := &h.streams[sid]
	if st.stream == 0 {
		return NoBlock
	}
	return h.bestFit(&st.free[pool], size)
}

// Alloc hands out Free block id as an Allocated block of its first n
// bytes (0 < n ≤ its size) for a request of requested bytes (0 <
// requested ≤ n). The rest, if any, is split off as a Free block of the
// same stream, which takes id's place in the free index when its order
// allows (the cache-hit path).
func (h *Heap) Alloc(id BlockID, n, requested uint64) error {
	b, ok := h.valid(id)
	if !ok || b.state != Free {
		return h.badState(id, "Alloc", Free)
	}
	if n == 0 || n > b.size || requested == 0 || requested > n {
		return fmt.Errorf("%w: Alloc of %d bytes (requested %d) from a block of %d", ErrBadRange, n, requested, b.size)
	}
	if n < b.size {
		if err := h.room(1); err != nil {
			return err
		}
	}
	l := h.list(b)
	if h.splitHook != nil {
		h.leave(b)
	}
	if n < b.size {
		rsize, raddr := b.size-n, b.addr+uintptr(n)
		c := classOf(b.size)
		inPlace := h.fitsSlot(id, b, c, rsize, raddr)
		if !inPlace {
			h.remove(l, id, b)
		}
		rid, r := h.splitAt(id, b, n)
		if inPlace {
			h.replaceSlot(l, c, id, b, rid, r)
			l.bytes -= n
		} else {
			h.insert(l, rid, r)
		}
		if h.splitHook != nil {
			h.enter(r)
		}
	} else {
		h.remove(l, id, b)
	}
	b.state = Allocated
	b.aux = requested
	b.up = 0
	h.live.put(h, id, b.addr)
	return nil
}

// MarkPending turns Allocated block id into PendingFree: freed by its
// caller, waiting for the owner's events. Lookup no longer finds it.
func (h *Heap) MarkPending(id BlockID) error {
	b, ok := h.valid(id)
	if !ok || b.state != Allocated {
		return h.badState(id, "MarkPending", Allocated)
	}
	h.live.remove(h, id, b.addr)
	b.state = PendingFree
	return nil
}

// Free makes Allocated or PendingFree block id Free, merges it with the
// Free neighbours of its stream and returns the merged block.
func (h *Heap) Free(id BlockID) (BlockID, error) {
	b, ok := h.valid(id)
	if !ok || !b.inUse() {
		return NoBlock, h.badState(id, "Free", Allocated)
	}
	if b.state == Allocated {
		h.live.remove(h, id, b.addr)
	}
	b.state = Free
	b.aux, b.up = 0, 0
	return h.coalesceInsert(id, b), nil
}

// badState is the error for an operation op on id, which must be in state
// want.
func (h *Heap) badState(id BlockID, op string, want State) error {
	b, ok := h.valid(id)
	if !ok {
		return fmt.Errorf("%w: %s of block %d", ErrBadBlock, op, id)
	}
	if op == "Free" {
		return fmt.Errorf("%w: Free of %s block %#x (want allocated or pending_free)", ErrBadState, b.state, b.addr)
	}
	return fmt.Errorf("%w: %s of %s block %#x (want %s)", ErrBadState, op, b.state, b.addr, want)
}

// mergeable reports whether x is Free on stream sid.
func mergeable(x *block, sid StreamID) bool { return x.state == Free && x.stream == sid }

// coalesceInsert merges Free block id (in no index) with the Free
// neighbours of its stream and inserts the result into its free index.
func (h *Heap) coalesceInsert(id BlockID, b *block) BlockID {
	l := h.list(b)
	prevOK := b.prev != NoBlock && mergeable(h.rec(b.prev), b.stream)
	if nid := b.next; !prevOK && nid != NoBlock {
		if nx := h.rec(nid); mergeable(nx, b.stream) {
			// The common case: freeing the block just split off a free one.
			if h.splitHook != nil {
				h.leave(nx)
			}
			if c := classOf(nx.size); h.fitsSlot(nid, nx, c, b.size+nx.size, b.addr) {
				h.replaceSlot(l, c, nid, nx, id, b)
				l.bytes += b.size
				h.absorbNext(id, b)
			} else {
				h.remove(l, nid, nx)
				h.absorbNext(id, b)
				h.insert(l, id, b)
			}
			if h.splitHook != nil {
				h.enter(b)
			}
			return id
		}
	}
	if prevOK {
		pid := b.prev
		p := h.rec(pid)
		if h.splitHook != nil {
			h.leave(p)
		}
		h.remove(l, pid, p)
		h.absorbNext(pid, p)
		id, b = pid, p
	}
	if nid := b.next; nid != NoBlock {
		if nx := h.rec(nid); mergeable(nx, b.stream) {
			if h.splitHook != nil {
				h.leave(nx)
			}
			h.remove(l, nid, nx)
			h.absorbNext(id, b)
		}
	}
	h.insert(l, id, b)
	if h.splitHook != nil {
		h.enter(b)
	}
	return id
}

// coalesceUnmapped merges Unmapped block id (in no index) with its
// Unmapped neighbours and inserts the result into its pool's unmapped
// index.
func (h *Heap) coalesceUnmapped(id BlockID, b *block) BlockID {
	t := h.unmapped[h.pool(b)]
	if pid := b.prev; pid != NoBlock && h.rec(pid).state == Unmapped {
		// pid stays in the index: its address, the key, is unchanged.
		h.absorbNext(pid, h.rec(pid))
		return h.absorbUnmappedNext(pid)
	}
	if nid := b.next; nid != NoBlock && h.rec(nid).state == Unmapped {
		t.Delete(nid)
		h.absorbNext(id, b)
	}
	t.ReplaceOrInsert(id)
	return id
}

// absorbUnmappedNext merges indexed Unmapped block id with an Unmapped
// upper neighbour, if any.
func (h *Heap) absorbUnmappedNext(id BlockID) BlockID {
	b := h.rec(id)
	if nid := b.next; nid != NoBlock && h.rec(nid).state == Unmapped {
		h.unmapped[h.pool(b)].Delete(nid)
		h.absorbNext(id, b)
	}
	return id
}

// splitAt cuts b (in no index, or keeping its slot while its key stays
// valid) at offset k and returns the new upper block, with b's state and
// stream, in no index. room has been checked.
func (h *Heap) splitAt(id BlockID, b *block, k uint64) (BlockID, *block) {
	rid, r := h.newRec()
	r.addr = b.addr + uintptr(k)
	r.size = b.size - k
	r.state = b.state
	r.stream = b.stream
	r.region = b.region
	r.pool = b.pool
	r.prev = id
	r.next = b.next
	if b.next != NoBlock {
		h.rec(b.next).prev = rid
	}
	b.next = rid
	b.size = k
	if r.stream != 0 {
		h.streams[r.stream].blocks++
	}
	return rid, r
}

// absorbNext merges b's upper neighbour, which is in no index, into b and
// recycles its record.
func (h *Heap) absorbNext(id BlockID, b *block) {
	nid := b.next
	nx := h.rec(nid)
	b.size += nx.size
	b.next = nx.next
	if nx.next != NoBlock {
		h.rec(nx.next).prev = id
	}
	h.freeRecord(nid, nx)
}

// carve cuts [off, off+n) out of b (in no index) and returns the middle
// block and the pieces below and above it (NoBlock where none), all in no
// index with b's state.
func (h *Heap) carve(id BlockID, b *block, off, n uint64) (mid, lo, hi BlockID) {
	mid = id
	if off > 0 {
		lo = id
		mid, b = h.splitAt(id, b, off)
	}
	if n < b.size {
		hi, _ = h.splitAt(mid, b, n)
	}
	return mid, lo, hi
}

// checkRange validates [off, off+n) inside b for op.
func (h *Heap) checkRange(op string, b *block, off, n uint64) error {
	if n == 0 || off >= b.size || n > b.size-off {
		return fmt.Errorf("%w: %s of [%d, +%d) in a block of %d bytes", ErrBadRange, op, off, n, b.size)
	}
	pieces := 0
	if off > 0 {
		pieces++
	}
	if off+n < b.size {
		pieces++
	}
	return h.room(pieces)
}

// BeginMap marks the n bytes at offset off of Unmapped block u as Mapping
// and returns that block; the rest of u stays Unmapped. Growth searches
// skip a Mapping block, so the owner may drop its lock while it maps the
// range, then call CommitMap or AbortMap.
func (h *Heap) BeginMap(u BlockID, off, n uint64) (BlockID, error) {
	b, ok := h.valid(u)
	if !ok || b.state != Unmapped {
		return NoBlock, h.badState(u, "BeginMap", Unmapped)
	}
	if err := h.checkRange("BeginMap", b, off, n); err != nil {
		return NoBlock, err
	}
	t := h.unmapped[h.pool(b)]
	t.Delete(u)
	mid, lo, hi := h.carve(u, b, off, n)
	if lo != NoBlock {
		t.ReplaceOrInsert(lo)
	}
	if hi != NoBlock {
		t.ReplaceOrInsert(hi)
	}
	h.rec(mid).state = Mapping
	return mid, nil
}

// CommitMap makes Mapping block m Free on stream sid (its memory is now
// mapped), merges it with the Free neighbours of sid and returns the
// merged block.
func (h *Heap) CommitMap(m BlockID, sid StreamID) (BlockID, error) {
	b, ok := h.valid(m)
	if !ok || b.state != Mapping {
		return NoBlock, h.badState(m, "CommitMap", Mapping)
	}
	st, err := h.streamRec(sid)
	if err != nil {
		return NoBlock, err
	}
	b.state, b.stream = Free, sid
	st.blocks++
	return h.coalesceInsert(m, b), nil
}

// AbortMap returns Mapping block m to Unmapped (mapping failed), merged
// with its Unmapped neighbours, and returns the merged block.
func (h *Heap) AbortMap(m BlockID) (BlockID, error) {
	b, ok := h.valid(m)
	if !ok || b.state != Mapping {
		return NoBlock, h.badState(m, "AbortMap", Mapping)
	}
	b.state = Unmapped
	return h.coalesceUnmapped(m, b), nil
}

// BeginRelease marks the n bytes at offset off of Free block id as
// Releasing and returns that block; the rest of id stays Free and indexed.
// Best fit and coalescing skip a Releasing block, so the owner may drop
// its lock while it waits for the stream and unmaps the range, then call
// CommitRelease or AbortRelease.
func (h *Heap) BeginRelease(id BlockID, off, n uint64) (BlockID, error) {
	b, ok := h.valid(id)
	if !ok || b.state != Free {
		return NoBlock, h.badState(id, "BeginRelease", Free)
	}
	if err := h.checkRange("BeginRelease", b, off, n); err != nil {
		return NoBlock, err
	}
	l := h.list(b)
	if h.splitHook != nil {
		h.leave(b)
	}
	h.remove(l, id, b)
	mid, lo, hi := h.carve(id, b, off, n)
	for _, x := range [2]BlockID{lo, hi} {
		if x != NoBlock {
			xb := h.rec(x)
			h.insert(l, x, xb)
			if h.splitHook != nil {
				h.enter(xb)
			}
		}
	}
	h.rec(mid).state = Releasing
	return mid, nil
}

// CommitRelease ends the release of Releasing block r, of which the first
// done bytes were unmapped (0 ≤ done ≤ its size): they become Unmapped,
// merged with Unmapped neighbours, and the rest becomes Free again, merged
// with the Free neighbours of its stream. It returns the Unmapped block, or
// NoBlock when done is 0.
func (h *Heap) CommitRelease(r BlockID, done uint64) (BlockID, error) {
	b, ok := h.valid(r)
	if !ok || b.state != Releasing {
		return NoBlock, h.badState(r, "CommitRelease", Releasing)
	}
	if done > b.size {
		return NoBlock, fmt.Errorf("%w: CommitRelease of %d bytes of a block of %d", ErrBadRange, done, b.size)
	}
	if done == 0 {
		b.state = Free
		h.coalesceInsert(r, b)
		return NoBlock, nil
	}
	if done < b.size {
		if err := h.room(1); err != nil {
			return NoBlock, err
		}
		rid, rest := h.splitAt(r, b, done)
		rest.state = Free
		h.coalesceInsert(rid, rest)
	}
	h.streams[b.stream].blocks--
	b.stream = 0
	b.state = Unmapped
	return h.coalesceUnmapped(r, b), nil
}

// AbortRelease returns Releasing block r to Free (nothing was unmapped),
// merged with the Free neighbours of its stream, and returns the merged
// block.
func (h *Heap) AbortRelease(r BlockID) (BlockID, error) {
	b, ok := h.valid(r)
	if !ok || b.state != Releasing {
		return NoBlock, h.badState(r, "AbortRelease", Releasing)
	}
	b.state = Free
	return h.coalesceInsert(r, b), nil
}

// EachFree calls fn for every Free block of stream sid in pool, in
// ascending (size, address) order, until fn returns false. fn must not
// change the heap.
func (h *Heap) EachFree(sid StreamID, pool uint8, fn func(BlockID) bool) {
	if h.Stream(sid) == 0 || int(pool) >= h.npools {
		return
	}
	h.eachFree(&h.streams[sid].free[pool], fn)
}

// FreeLen is the number of Free blocks of stream sid in pool.
func (h *Heap) FreeLen(sid StreamID, pool uint8) int {
	if h.Stream(sid) == 0 || int(pool) >= h.npools {
		return 0
	}
	return int(h.streams[sid].free[pool].n)
}

// FreeBytes is the nbytes of the Free blocks of stream sid in pool.
func (h *Heap) FreeBytes(sid StreamID, pool uint8) uint64 {
	if h.Stream(sid) == 0 || int(pool) >= h.npools {
		return 0
	}
	return h.streams[sid].free[pool].bytes
}

// AscendUnmapped calls fn for every Unmapped block of pool in ascending
// address order until fn returns false. fn must not change the heap.
func (h *Heap) AscendUnmapped(pool uint8, fn func(BlockID) bool) {
	if int(pool) >= h.npools {
		return
	}
	h.unmapped[pool].Ascend(func(id BlockID) bool { return fn(id) })
}

// UnmappedLen is the number of Unmapped blocks of pool.
func (h *Heap) UnmappedLen(pool uint8) int {
	if int(pool) >= h.npools {
		return 0
	}
	return h.unmapped[pool].Len()
}

// MoveStream relabels every block of stream from (Free, Allocated,
// PendingFree or Releasing) as stream to's, merging the Free ones with
// to's Free neighbours: the memory of a stream that is going away passes
// to another owner. It walks every region.
func (h *Heap) MoveStream(from, to StreamID) error {
	if _, err := h.streamRec(from); err != nil {
		return err
	}
	if _, err := h.streamRec(to); err != nil {
		return err
	}
	if from == to || h.streams[from].blocks == 0 {
		return nil
	}
	for _, rid := range h.order {
		for id := h.regions[rid].head; id != NoBlock; {
			b := h.rec(id)
			if b.stream != from {
				id = b.next
				continue
			}
			if b.state == Free {
				if h.splitHook != nil {
					h.leave(b)
				}
				h.remove(h.list(b), id, b)
			}
			h.streams[from].blocks--
			h.streams[to].blocks++
			b.stream = to
			if b.state == Free {
				id = h.coalesceInsert(id, b)
				b = h.rec(id)
			}
			id = b.next
		}
	}
	return nil
}

// AdoptRange gives the n bytes at offset off of Free block start, and the
// Free blocks after it that the range runs into (of any streams), to
// stream sid: the parts inside the range leave their streams' free indexes
// and become one Free block of sid, merged with sid's Free neighbours,
// which it returns; the parts outside stay with their streams. Every block
// the range touches must be Free.
func (h *Heap) AdoptRange(start BlockID, off, n uint64, sid StreamID) (BlockID, error) {
	b, ok := h.valid(start)
	if !ok || b.state != Free {
		return NoBlock, h.badState(start, "AdoptRange", Free)
	}
	if _, err := h.streamRec(sid); err != nil {
		return NoBlock, err
	}
	if n == 0 || off >= b.size {
		return NoBlock, fmt.Errorf("%w: AdoptRange of [%d, +%d) from a block of %d bytes", ErrBadRange, off, n, b.size)
	}
	pos := b.addr + uintptr(off)
	end := pos + uintptr(n)
	if end < pos {
		return NoBlock, fmt.Errorf("%w: AdoptRange of %d bytes wraps", ErrBadRange, n)
	}
	for x := b; x.end() < end; {
		if x.next == NoBlock {
			return NoBlock, fmt.Errorf("%w: AdoptRange runs past the region's end at %#x", ErrBadRange, x.end())
		}
		x = h.rec(x.next)
		if x.state != Free {
			return NoBlock, fmt.Errorf("%w: AdoptRange runs into a %s block at %#x", ErrBadState, x.state, x.addr)
		}
	}
	if err := h.room(2); err != nil {
		return NoBlock, err
	}
	first := NoBlock
	for id := start; id != NoBlock && h.rec(id).addr < end; {
		x := h.rec(id)
		if h.splitHook != nil {
			h.leave(x)
		}
		h.remove(h.list(x), id, x)
		piece, p := id, x
		if x.addr < pos { // the part below the range stays
			piece, p = h.splitAt(id, x, uint64(pos-x.addr))
			h.insert(h.list(x), id, x)
			if h.splitHook != nil {
				h.enter(x)
			}
		}
		if p.end() > end { // the part above the range stays
			hid, hb := h.splitAt(piece, p, uint64(end-p.addr))
			h.insert(h.list(hb), hid, hb)
			if h.splitHook != nil {
				h.enter(hb)
			}
		}
		h.streams[p.stream].blocks--
		h.streams[sid].blocks++
		p.stream = sid
		if first == NoBlock {
			first = piece
		} else {
			h.absorbNext(first, h.rec(first)) // first ends where piece begins
		}
		id = h.rec(first).next
	}
	return h.coalesceInsert(first, h.rec(first)), nil
}
