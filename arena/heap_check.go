package arena

import (
	"fmt"
	"math/bits"
)

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// Check verifies the heap's invariants and returns the first violation,
// wrapping ErrCorrupt:
//   - regions are ordered and disjoint, and their blocks tile them without
//     gap or overlap, with consistent address links;
//   - no two neighbours are both Free on one stream, nor both Unmapped;
//   - each free index holds exactly the Free blocks of its stream and pool,
//     as well-formed treaps (order, priorities, parent links, classes,
//     bitmaps, counts and bytes);
//   - each unmapped index holds exactly the Unmapped blocks of its pool;
//   - the address table holds exactly the Allocated blocks;
//   - streams carry the blocks they count, and Unmapped and Mapping blocks
//     none; recycled records are all accounted for.
//
// It walks everything: for tests and the owner's own Check.
func (h *Heap) Check() error {
	var (
		blocks    int
		allocated int
		nFree     = make(map[[2]int]int)
		nUnmapped = make([]int, h.npools)
		perStream = make([]int, len(h.streams))
	)
	for i, rid := range h.order {
		r := &h.regions[rid]
		if r.head == NoBlock {
			return corrupt("region slot %d in the order is unused", rid)
		}
		if i > 0 {
			if p := &h.regions[h.order[i-1]]; p.base+uintptr(p.size) > r.base {
				return corrupt("regions %#x and %#x overlap or are unordered", p.base, r.base)
			}
		}
		addr := r.base
		var prevID BlockID
		var prev *block
		for id := r.head; id != NoBlock; {
			b, ok := h.valid(id)
			if !ok {
				return corrupt("region %#x links to dead block %d", r.base, id)
			}
			blocks++
			if blocks > h.used {
				return corrupt("more blocks in regions than records in use (%d): a cycle?", h.used)
			}
			if b.region != rid || b.pool != r.pool || b.prev != prevID {
				return corrupt("block %#x: bad region, pool or prev link", b.addr)
			}
			if b.addr != addr || b.size == 0 {
				return corrupt("block %#x+%d: expected to start at %#x", b.addr, b.size, addr)
			}
			addr = b.end()
			if b.hasStream() != (b.state != Unmapped && b.state != Mapping) {
				return corrupt("%s block %#x has stream %d", b.state, b.addr, b.stream)
			}
			if b.hasStream() {
				if h.Stream(b.stream) == 0 {
					return corrupt("block %#x on unregistered stream %d", b.addr, b.stream)
				}
				perStream[b.stream]++
			}
			switch b.state {
			case Free:
				if prev != nil && prev.state == Free && prev.stream == b.stream {
					return corrupt("free blocks %#x and %#x of stream %d not coalesced", prev.addr, b.addr, b.stream)
				}
				nFree[[2]int{int(b.stream), int(r.pool)}]++
			case Unmapped:
				if prev != nil && prev.state == Unmapped {
					return corrupt("unmapped blocks %#x and %#x not coalesced", prev.addr, b.addr)
				}
				if got, ok := h.unmapped[r.pool].Get(id); !ok || got != id {
					return corrupt("unmapped block %#x not in pool %d's unmapped index", b.addr, r.pool)
				}
				nUnmapped[r.pool]++
			case Allocated:
				if b.aux == 0 || b.aux > b.size || b.up < 0 {
					return corrupt("allocated block %#x: requested %d of %d, events %d", b.addr, b.aux, b.size, b.up)
				}
				if h.live.get(h, b.addr) != id {
					return corrupt("allocated block %#x missing from the address table", b.addr)
				}
				allocated++
			case PendingFree:
				if b.aux == 0 || b.aux > b.size || b.up < 0 {
					return corrupt("pending block %#x: requested %d of %d, events %d", b.addr, b.aux, b.size, b.up)
				}
			case Releasing, Mapping:
			default:
				return corrupt("block %#x in state %s", b.addr, b.state)
			}
			prevID, prev = id, b
			id = b.next
		}
		if addr != r.base+uintptr(r.size) {
			return corrupt("blocks of region %#x end at %#x, not %#x", r.base, addr, r.base+uintptr(r.size))
		}
	}
	if blocks != h.used {
		return corrupt("%d records in use, regions hold %d blocks", h.used, blocks)
	}
	recycled := 0
	for id := h.freeRec; id != NoBlock; id = h.rec(id).next {
		if id <= 0 || int32(id) >= h.nrec || h.rec(id).state != dead {
			return corrupt("recycled record %d is live or out of range", id)
		}
		if recycled++; recycled > int(h.nrec) {
			return corrupt("recycled records form a cycle")
		}
	}
	if recycled+h.used+1 != int(h.nrec) {
		return corrupt("%d records: %d in use, %d recycled", h.nrec-1, h.used, recycled)
	}
	if allocated != h.live.len() {
		return corrupt("address table holds %d blocks, regions %d allocated", h.live.len(), allocated)
	}
	for p := range h.unmapped {
		if h.unmapped[p].Len() != nUnmapped[p] {
			return corrupt("pool %d unmapped index holds %d blocks, regions %d", p, h.unmapped[p].Len(), nUnmapped[p])
		}
	}
	for sid := 1; sid < len(h.streams); sid++ {
		st := &h.streams[sid]
		if st.stream == 0 {
			continue
		}
		if st.blocks != perStream[sid] {
			return corrupt("stream %d counts %d blocks, regions %d", st.stream, st.blocks, perStream[sid])
		}
		for p := range st.free {
			if err := h.checkIndex(&st.free[p], StreamID(sid), uint8(p)); err != nil {
				return err
			}
			if want := nFree[[2]int{sid, p}]; int(st.free[p].n) != want {
				return corrupt("stream %d pool %d free index holds %d blocks, regions %d", st.stream, p, st.free[p].n, want)
			}
		}
	}
	return nil
}

// checkIndex verifies one free index's treaps, bitmaps and counts, and that
// it holds only Free blocks of sid in pool.
func (h *Heap) checkIndex(l *tlsfIndex, sid StreamID, pool uint8) error {
	n := 0
	var sum uint64
	var walk func(id, parent BlockID, c int, lo, hi *block) error
	walk = func(id, parent BlockID, c int, lo, hi *block) error {
		if id == NoBlock {
			return nil
		}
		b, ok := h.valid(id)
		if !ok {
			return corrupt("free index links to dead block %d", id)
		}
		if n++; n > h.used {
			return corrupt("free index of stream %d pool %d has a cycle", sid, pool)
		}
		sum += b.size
		switch {
		case b.state != Free || b.stream != sid || h.pool(b) != pool:
			return corrupt("%s block %#x of stream %d in the free index of stream %d pool %d", b.state, b.addr, b.stream, sid, pool)
		case BlockID(b.up) != parent:
			return corrupt("free block %#x: parent link %d, want %d", b.addr, b.up, parent)
		case classOf(b.size) != c:
			return corrupt("free block %#x of %d bytes in class %d", b.addr, b.size, c)
		case parent != NoBlock && h.rec(parent).prio > b.prio:
			return corrupt("free block %#x breaks the treap's heap order", b.addr)
		case lo != nil && !lessRec(lo, b), hi != nil && !lessRec(b, hi):
			return corrupt("free block %#x out of (size, address) order", b.addr)
		}
		if err := walk(b.left(), id, c, lo, b); err != nil {
			return err
		}
		return walk(b.right(), id, c, b, hi)
	}
	if len(l.groups) != bits.OnesCount64(l.flMap) || l.flMap>>flCount != 0 {
		return corrupt("stream %d pool %d: first-level bitmap %#x disagrees with %d groups", sid, pool, l.flMap, len(l.groups))
	}
	empty := 0
	for fl, p := range l.pos {
		if l.flMap&(1<<uint(fl)) == 0 {
			if p != 0 {
				return corrupt("stream %d pool %d: first level %d without a group maps to group %d", sid, pool, fl, p)
			}
			continue
		}
		if want := 1 + bits.OnesCount64(l.flMap&(1<<uint(fl)-1)); int(p) != want {
			return corrupt("stream %d pool %d: first level %d maps to group %d, not %d", sid, pool, fl, p, want)
		}
		g := &l.groups[p-1]
		if g.slMap == 0 {
			empty++
		}
		for sl, root := range g.roots {
			c := fl*slCount + sl
			if (root != NoBlock) != (g.slMap&(1<<uint(sl)) != 0) {
				return corrupt("stream %d pool %d: bitmaps disagree with class %d", sid, pool, c)
			}
			if err := walk(root, NoBlock, c, nil, nil); err != nil {
				return err
			}
		}
	}
	if empty > max(maxEmptyGroups, len(l.groups)-empty) || empty != int(l.empty) {
		return corrupt("stream %d pool %d: %d empty groups of %d (counted %d), at most %d or as many as the others", sid, pool, empty, len(l.groups), l.empty, maxEmptyGroups)
	}
	if n != int(l.n) || sum != l.bytes {
		return corrupt("stream %d pool %d: index counts %d blocks of %d bytes, holds %d of %d", sid, pool, l.n, l.bytes, n, sum)
	}
	if m := l.memo; (m.id == NoBlock) != (m.b == nil) || m.id != NoBlock && (int32(m.id) >= h.nrec || m.b != h.rec(m.id)) {
		return corrupt("stream %d pool %d: the best-fit memo's record is not block %d's", sid, pool, m.id)
	}
	// A memo that AllocFit would use must say what a search says.
	if m := l.memo; m.n > 0 {
		if id, b := h.memoFit(l, m.n); id != NoBlock {
			if got := h.bestFit(l, m.n); got != id {
				return corrupt("stream %d pool %d: the best-fit memo for %d bytes names block %d, the search %d", sid, pool, m.n, id, got)
			}
			if b.state != Free || b.stream != sid {
				return corrupt("stream %d pool %d: the best-fit memo names a %s block of stream %d", sid, pool, b.state, b.stream)
			}
			if m.size <= m.n || !h.fitsSlotSmaller(id, b, m.size-m.n, b.addr+uintptr(m.n)) {
				return corrupt("stream %d pool %d: the best-fit memo of %d bytes names a block of %d whose split does not fit its slot", sid, pool, m.n, m.size)
			}
		}
	}
	return nil
}
