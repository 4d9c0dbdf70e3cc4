package host

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Check verifies the allocator's invariants against a slow recount and
// returns the first violation found, wrapping ErrCorrupt:
//   - the address index holds exactly the blocks and registrations, without
//     overlap, and the block map exactly the blocks;
//   - every block's size is its class size; the free lists hold exactly the
//     cached blocks, each once, in their class;
//   - free-pending blocks are exactly those with events and the
//     quarantined ones, which have none and are listed once in the
//     quarantine; each block's event count equals its entries in the
//     stream queues; no event is both idle and pending, or pending twice;
//   - the statistics' current values equal the recount.
//
// It then compares device addresses with the driver: for every block the
// allocator has registered and every mapped registration whose device
// address is known, HostGetDevicePointer must return the same address.
// It walks everything: use it in tests, not on a hot path. After Close it
// returns ErrClosed, as every method that can fail does.
func (a *Allocator) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if err := a.check(); err != nil {
		return err
	}
	return a.checkDriver()
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

func (a *Allocator) check() error {
	var want Stats
	var prevEnd uintptr
	first := true
	nBlocks := 0
	pendingBlocks := 0
	var err error
	a.spans.Ascend(func(s span) bool {
		switch {
		case s.end <= s.start:
			err = corrupt("span at %#x is empty or wraps (end %#x)", s.start, s.end)
		case boolInt(s.b != nil)+boolInt(s.r != nil)+boolInt(s.c != nil) != 1:
			err = corrupt("span at %#x must hold exactly one block, registration or chunk", s.start)
		case !first && s.start < prevEnd:
			err = corrupt("span at %#x overlaps the one before, which ends at %#x", s.start, prevEnd)
		}
		if err != nil {
			return false
		}
		first, prevEnd = false, s.end
		if r := s.r; r != nil {
			if r.ptr != s.start || s.end-s.start != uintptr(r.size) || r.ptr%pageSize != 0 {
				err = corrupt("registration %#x+%d indexed as [%#x,%#x)", r.ptr, r.size, s.start, s.end)
				return false
			}
			if r.flags != backend.HostRegisterMapped && (r.flags != backend.HostRegisterPinned || r.devPtr != 0) {
				err = corrupt("registration %#x has flags %#x and device address %#x", r.ptr, uint32(r.flags), r.devPtr)
				return false
			}
			want.Registered.Add(1)
			want.RegisteredBytes.Add(int64(r.size))
			return true
		}
		if c := s.c; c != nil {
			if err = a.checkChunk(c, s); err != nil {
				return false
			}
			want.Segment.Add(1)
			want.ReservedBytes.Add(int64(c.size))
			return true
		}
		b := s.b
		nBlocks++
		if b.pageable {
			if a.blocks[b.ptr] != b || b.ptr != s.start || s.end-s.start != uintptr(b.size) || b.state != stateAllocated || b.mem == nil || b.reg {
				err = corrupt("pageable block %#x+%d indexed as [%#x,%#x), %v", b.ptr, b.size, s.start, s.end, b.state)
				return false
			}
			want.Pageable.Add(1)
			want.PageableBytes.Add(int64(b.size))
			return true
		}
		if err = a.checkBlock(b, s); err != nil {
			return false
		}
		want.Segment.Add(1)
		want.ReservedBytes.Add(int64(b.size))
		if countBlock(&want, b) {
			pendingBlocks++
		}
		return true
	})
	if err != nil {
		return err
	}
	if a.exp != nil {
		if err := a.checkExp(&want, &pendingBlocks); err != nil {
			return err
		}
	}
	if nBlocks != len(a.blocks) {
		return corrupt("%d blocks indexed by address, %d in the block map", nBlocks, len(a.blocks))
	}
	if pendingBlocks != a.pending {
		return corrupt("%d free-pending blocks, counter says %d", pendingBlocks, a.pending)
	}
	listed := make(map[*block]bool)
	for _, b := range a.quarantine {
		if listed[b] || !b.quarantined || b.state != stateFreePending || a.lookup(b.ptr) != b {
			return corrupt("quarantined block %#x: listed twice, unflagged, unknown or %v", b.ptr, b.state)
		}
		listed[b] = true
	}
	for _, b := range a.sortedBlocks() {
		if b.quarantined && !listed[b] {
			return corrupt("block %#x flagged quarantined but not listed", b.ptr)
		}
	}
	if err := a.checkLists(); err != nil {
		return err
	}
	if err := a.checkEvents(); err != nil {
		return err
	}
	got := []stats.Stat{a.st.Allocation, a.st.AllocatedBytes, a.st.RequestedBytes, a.st.Active, a.st.ActiveBytes,
		a.st.Segment, a.st.ReservedBytes, a.st.Registered, a.st.RegisteredBytes, a.st.Quarantined, a.st.QuarantinedBytes,
		a.st.Pageable, a.st.PageableBytes}
	names := []string{"allocation", "allocated_bytes", "requested_bytes", "active", "active_bytes",
		"segment", "reserved_bytes", "registered", "registered_bytes", "quarantined", "quarantined_bytes",
		"pageable", "pageable_bytes"}
	for i, w := range want.stats() {
		g := got[i]
		if g.Current != w.Current {
			return corrupt("%s.current is %d, recount %d", names[i], g.Current, w.Current)
		}
		if g.Peak < g.Current || g.Current < 0 {
			return corrupt("%s: peak %d below current %d, or current negative", names[i], g.Peak, g.Current)
		}
	}
	return nil
}

// checkBlock checks one block against its index entry. mu held.
func (a *Allocator) checkBlock(b *block, s span) error {
	if a.blocks[b.ptr] != b {
		return corrupt("block %#x indexed by address but not in the block map", b.ptr)
	}
	if b.ptr != s.start || s.end-s.start != uintptr(b.size) || b.ptr%pageSize != 0 {
		return corrupt("block %#x+%d indexed as [%#x,%#x)", b.ptr, b.size, s.start, s.end)
	}
	if size, c := a.classes.round(b.size); size != b.size || c != b.class {
		return corrupt("block %#x: %d bytes in class %d, but that size is class %d of %d bytes", b.ptr, b.size, b.class, c, size)
	}
	if err := checkState(b); err != nil {
		return err
	}
	if a.cfg.UseHostRegister != (b.mem != nil) || (b.mem != nil && !b.reg) {
		return corrupt("block %#x: OS memory %v, registered %v, with UseHostRegister %v", b.ptr, b.mem != nil, b.reg, a.cfg.UseHostRegister)
	}
	if b.devPtr != 0 && !b.reg && !b.mallocHost() {
		return corrupt("block %#x of OS memory has device address %#x but no registration", b.ptr, b.devPtr)
	}
	return nil
}

// checkLists checks that the free lists hold exactly the cached blocks. mu
// held.
func (a *Allocator) checkLists() error {
	seen := make(map[*block]bool)
	for c, l := range a.free {
		for _, b := range l {
			switch {
			case b == nil:
				return corrupt("nil block in free list %d", c)
			case seen[b]:
				return corrupt("block %#x twice in the free lists", b.ptr)
			case b.class != c || b.state != stateCached || a.blocks[b.ptr] != b:
				return corrupt("block %#x (class %d, %v) in free list %d", b.ptr, b.class, b.state, c)
			}
			seen[b] = true
		}
	}
	for _, b := range a.blocks {
		if b.state == stateCached && !seen[b] {
			return corrupt("cached block %#x is in no free list", b.ptr)
		}
	}
	return nil
}

// checkEvents checks the stream queues and the idle events. mu held.
func (a *Allocator) checkEvents() error {
	events := make(map[backend.Event]bool)
	perBlock := make(map[*block]int)
	gone := 0
	for _, ss := range a.slist {
		if ss.gone {
			gone++
			if a.streams[ss.stream] == ss {
				return corrupt("gone stream %d still mapped", ss.stream)
			}
		} else if a.streams[ss.stream] != ss {
			return corrupt("stream %d listed but not mapped", ss.stream)
		}
		if ss.head < 0 || ss.head > len(ss.queue) || (ss.head > 0 && ss.head == len(ss.queue)) {
			return corrupt("stream %d: queue head %d of %d", ss.stream, ss.head, len(ss.queue))
		}
		for _, pe := range ss.queue[:ss.head] {
			if pe != (pendingEvent{}) {
				return corrupt("stream %d: retired queue entry still holds event %d", ss.stream, pe.ev)
			}
		}
		for _, pe := range ss.pending() {
			if events[pe.ev] {
				return corrupt("event %d pending twice", pe.ev)
			}
			events[pe.ev] = true
			if pe.b.state != stateFreePending || a.lookup(pe.b.ptr) != pe.b {
				return corrupt("event %d on stream %d holds block %#x in state %v", pe.ev, ss.stream, pe.b.ptr, pe.b.state)
			}
			perBlock[pe.b]++
		}
	}
	if gone != a.gone || len(a.slist)-gone != len(a.streams) {
		return corrupt("%d streams listed (%d gone, counter %d), %d mapped", len(a.slist), gone, a.gone, len(a.streams))
	}
	for b, n := range perBlock {
		if b.events != n {
			return corrupt("block %#x counts %d events, %d are queued", b.ptr, b.events, n)
		}
	}
	for dev, l := range a.idle {
		for _, ev := range l {
			if events[ev] {
				return corrupt("event %d of device %d both idle and pending", ev, dev)
			}
			events[ev] = true
		}
	}
	return nil
}

// checkDriver compares known device addresses with the driver's. mu held.
func (a *Allocator) checkDriver() error {
	var err error
	a.spans.Ascend(func(s span) bool {
		var p, want uintptr
		switch {
		case s.b != nil && s.b.devPtr != 0:
			p, want = s.b.ptr, s.b.devPtr
		case s.c != nil:
			p, want = s.c.base, s.c.devPtr
		case s.r != nil && s.r.devPtr != 0:
			p, want = s.r.ptr, s.r.devPtr
		default:
			return true
		}
		got, e := a.hm.HostGetDevicePointer(p)
		switch {
		case e != nil:
			err = fmt.Errorf("%w: driver: HostGetDevicePointer(%#x): %w", ErrCorrupt, p, e)
		case got != want:
			err = corrupt("driver maps %#x at device address %#x, allocator says %#x", p, got, want)
		}
		return err == nil
	})
	return err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkChunk checks one chunk against its index entry and the heap. mu
// held.
func (a *Allocator) checkChunk(c *chunk, s span) error {
	if a.exp == nil {
		return corrupt("chunk %#x without expandable segments", c.base)
	}
	if c.base != s.start || s.end-s.start != uintptr(c.size) || c.size == 0 || c.size%ChunkGranule != 0 || c.devPtr == 0 {
		return corrupt("chunk %#x+%d (device %#x) indexed as [%#x,%#x)", c.base, c.size, c.devPtr, s.start, s.end)
	}
	if rid := a.exp.heap.RegionAt(c.base); rid == 0 || a.exp.heap.RegionAt(c.end()-1) != rid {
		return corrupt("chunk %#x+%d does not lie in one reservation", c.base, c.size)
	}
	return nil
}

// checkChunks checks the reservations' blocks against the chunks: no
// chunk overlaps an Unmapped or Mapping block, every other block lies in
// chunks, and adjacent chunks of a reservation are device-contiguous. mu
// held.
func (a *Allocator) checkChunks() error {
	s := a.exp
	var cs []*chunk
	a.spans.Ascend(func(sp span) bool {
		if sp.c != nil {
			cs = append(cs, sp.c)
		}
		return true
	})
	for j := 1; j < len(cs); j++ {
		lo, hi := cs[j-1], cs[j]
		if lo.end() == hi.base && s.heap.RegionAt(lo.base) == s.heap.RegionAt(hi.base) && lo.devPtr+uintptr(lo.size) != hi.devPtr {
			return corrupt("adjacent chunks %#x and %#x are at device addresses %#x and %#x, not contiguous", lo.base, hi.base, lo.devPtr, hi.devPtr)
		}
	}
	mapping := 0
	for _, r := range s.resv {
		info, ok := s.heap.Region(r.rid)
		if !ok || info.Base != r.base || info.Size != r.size {
			return corrupt("reservation %#x+%d is region %d of the heap: %+v", r.base, r.size, r.rid, info)
		}
		for id := info.Head; id != arena.NoBlock; id = s.heap.Next(id) {
			p, _ := s.heap.Peek(id)
			end := p.Addr + uintptr(p.Size)
			j, _ := slices.BinarySearchFunc(cs, p.Addr, func(c *chunk, at uintptr) int { return cmp.Compare(c.end(), at+1) })
			switch p.State {
			case arena.Unmapped, arena.Mapping:
				if p.State == arena.Mapping {
					mapping++
				}
				if j < len(cs) && cs[j].base < end {
					return corrupt("%v block %#x+%d overlaps chunk %#x", p.State, p.Addr, p.Size, cs[j].base)
				}
			default:
				for at := p.Addr; at < end; j++ {
					if j >= len(cs) || cs[j].base > at {
						return corrupt("%v block %#x+%d: %#x lies in no chunk", p.State, p.Addr, p.Size, at)
					}
					at = cs[j].end()
				}
			}
		}
	}
	for _, k := range s.stuck {
		if p, ok := s.heap.Peek(k.m); !ok || p.State != arena.Mapping || p.Addr != k.c.base || p.Size != k.c.size {
			return corrupt("stuck chunk %#x+%d is heap block %d: %+v", k.c.base, k.c.size, k.m, p)
		}
	}
	if mapping < len(s.stuck) || mapping > len(s.stuck)+a.inflight {
		return corrupt("%d blocks being mapped, %d kept by the driver and %d driver calls in flight", mapping, len(s.stuck), a.inflight)
	}
	return nil
}

// countBlock adds block b to the statistics want that Check expects, and
// reports whether b is pending on events (freed, not quarantined).
func countBlock(want *Stats, b *block) (pending bool) {
	switch b.state {
	case stateAllocated:
		want.Allocation.Add(1)
		want.AllocatedBytes.Add(int64(b.size))
		want.RequestedBytes.Add(int64(b.req))
		fallthrough
	case stateFreePending:
		want.Active.Add(1)
		want.ActiveBytes.Add(int64(b.size))
	}
	if b.quarantined {
		want.Quarantined.Add(1)
		want.QuarantinedBytes.Add(int64(b.size))
	}
	return b.state == stateFreePending && !b.quarantined
}

// checkExp checks the expandable blocks against the heap, recounting them
// into want and the free-pending ones into pending. mu held.
func (a *Allocator) checkExp(want *Stats, pending *int) error {
	s := a.exp
	if err := s.heap.Check(); err != nil {
		return fmt.Errorf("%w: block heap: %w", ErrCorrupt, err)
	}
	if err := a.checkChunks(); err != nil {
		return err
	}
	for _, k := range s.stuck {
		want.Segment.Add(1)
		want.ReservedBytes.Add(int64(k.c.size))
	}
	n := 0
	for id, b := range s.byID {
		if b == nil {
			continue
		}
		n++
		p, ok := s.heap.Peek(arena.BlockID(id))
		switch {
		case b.id != arena.BlockID(id) || !ok || p.State != arena.Allocated || p.Addr != b.ptr || p.Size != b.size:
			return corrupt("block record %#x+%d (id %d) is heap block %d: %+v", b.ptr, b.size, b.id, id, p)
		case b.class != -1 || b.mem != nil || b.reg || b.devPtr != 0 || b.pageable || b.size%pageSize != 0:
			return corrupt("expandable block %#x: class %d, OS memory %v, registered %v, device %#x, pageable %v", b.ptr, b.class, b.mem != nil, b.reg, b.devPtr, b.pageable)
		}
		if err := checkState(b); err != nil {
			return err
		}
		if countBlock(want, b) {
			*pending++
		}
	}
	if n != s.heap.Allocated() {
		return corrupt("%d block records, the heap has %d allocated blocks", n, s.heap.Allocated())
	}
	var fastBytes uint64
	seen := make(map[*block]bool)
	lists := make(map[uint64][]*block, len(s.fast)+len(s.big))
	for i, l := range s.fast {
		if len(l) > 0 && s.fastSet[i/64]&(1<<(i%64)) == 0 {
			return corrupt("fast cache list of %d pages is not marked", i)
		}
		lists[uint64(i)<<pageShift] = l
	}
	for _, l := range s.big {
		if len(l.blocks) == 0 {
			continue
		}
		if l.size <= fastPages*pageSize || len(lists[l.size]) != 0 {
			return corrupt("fast cache keeps a list of %d-byte blocks twice, or among the big sizes", l.size)
		}
		lists[l.size] = l.blocks
	}
	for size, l := range lists {
		for _, b := range l {
			if b == nil || seen[b] || b.state != stateCached || b.size != size || s.byID[b.id] != b {
				return corrupt("fast cache list of %d-byte blocks holds a bad block", size)
			}
			seen[b] = true
			fastBytes += b.size
		}
	}
	if fastBytes != s.fastBytes {
		return corrupt("fast cache holds %d bytes, counter says %d", fastBytes, s.fastBytes)
	}
	for _, b := range s.byID {
		if b != nil && b.state == stateCached && !seen[b] {
			return corrupt("cached block %#x is in no fast cache list", b.ptr)
		}
	}
	return nil
}

// checkState checks the fields of b that its state fixes.
func checkState(b *block) error {
	switch b.state {
	case stateAllocated:
		if b.req == 0 || b.req > b.size || b.events != 0 {
			return corrupt("allocated block %#x: requested %d of %d bytes, %d events", b.ptr, b.req, b.size, b.events)
		}
	case stateFreePending:
		if (b.events <= 0) != b.quarantined || b.req != 0 || len(b.uses) != 0 {
			return corrupt("free-pending block %#x: %d events, requested %d, %d uses", b.ptr, b.events, b.req, len(b.uses))
		}
	case stateCached:
		if b.events != 0 || b.req != 0 || len(b.uses) != 0 {
			return corrupt("cached block %#x: %d events, requested %d, %d uses", b.ptr, b.events, b.req, len(b.uses))
		}
	default:
		return corrupt("block %#x in state %v", b.ptr, b.state)
	}
	return nil
}
