package host

import (
	"errors"
	"fmt"
	"math"
	mathbits "math/bits"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
)

const (
	// ChunkGranule is the unit in which expandable segments pin: a chunk
	// is a whole number of granules (2 MiB, the huge-page size).
	ChunkGranule = 2 << 20
	// reserveSize is the address space the first reservation takes (4
	// GiB, no access and no commit charge); each further one doubles, up
	// to maxReserve, and a chunk larger than that gets a reservation of
	// its own size. Small first, so that the many short-lived allocators
	// of a test or fuzz run take little of the 128 TiB of user address
	// space.
	reserveSize = 4 << 30
	maxReserve  = 1 << 40
	// fastPages is the largest request, in pages, the per-size fast cache
	// in front of the block heap indexes by size (1 MiB); bigSizes is how
	// many larger sizes it keeps at once.
	fastPages = 256
	bigSizes  = 8
	// fastMinCap is the least the fast cache may hold, nbytes; it may also
	// hold fastShift-th of the bytes pinned (ReservedBytes >> fastShift).
	fastMinCap = 4 << 20
	fastShift  = 6
)

// errStillPinned marks a failed mapping the driver could not undo.
var errStillPinned = errors.New("vmmalloc/host: the driver kept the registration of a chunk that failed to map; its address space is not reused")

// segments is the state of the expandable policy (Config.ExpandableSegments):
// every field is guarded by Allocator.mu.
type segments struct {
	// heap holds the blocks of every reservation, one region per
	// reservation, pool 0: Unmapped where no chunk is mapped, Mapping
	// while one is being mapped, Free, Allocated or PendingFree inside the
	// chunks. Adjacent chunks of a region are device-contiguous, so the
	// heap may merge free blocks across them.
	heap *arena.Heap
	sid  arena.StreamID          // the one stream of heap: host blocks are ordered by events, not by stream ownership
	resv []vaRange               // every reservation, for Close to unmap
	byID []*block                // the record of each Allocated heap block, by BlockID (nil: none)
	fast [fastPages + 1][]*block // cached blocks of i pages kept out of the heap, LIFO
	// fastSet has bit i set when fast[i] may be non-empty, so a flush
	// visits only those lists.
	fastSet [(fastPages + 64) / 64]uint64
	// big are the cached blocks larger than fastPages pages kept out of
	// the heap, LIFO, a list per size: the exact-size reuse of large
	// staging buffers, as cheap as a small block's.
	big [bigSizes]bigList
	// fastBytes is the nbytes in fast.
	fastBytes uint64
	spare     []*block // recycled block records (so a cache hit allocates nothing)
	// stuck are the chunks whose registration the driver kept when a
	// mapping was undone (HostUnregister failed): Mapping blocks of the
	// heap, in no index, counted as segments and pinned bytes until
	// releaseChunks undoes them.
	stuck []stuckChunk
}

// stuckChunk is a chunk that failed to map, still registered, and its
// Mapping heap block.
type stuckChunk struct {
	c *chunk
	m arena.BlockID
}

// bigList is the cached blocks of one size larger than fastPages pages.
type bigList struct {
	size   uint64 // nbytes of each block; any when blocks is empty
	blocks []*block
}

// fastList is the fast cache list for blocks of n bytes (a whole number
// of pages), or nil when there is none; with add, an empty list of the
// big sizes is taken for n if no list has n. mu held.
func (s *segments) fastList(n uint64, add bool) *[]*block {
	if n <= fastPages*pageSize {
		if add {
			s.fastSet[n>>pageShift/64] |= 1 << (n >> pageShift % 64)
		}
		return &s.fast[n>>pageShift]
	}
	free := -1
	for i := range s.big {
		if s.big[i].size == n {
			return &s.big[i].blocks
		}
		if free < 0 && len(s.big[i].blocks) == 0 {
			free = i
		}
	}
	if add && free >= 0 {
		s.big[free].size = n
		return &s.big[free].blocks
	}
	return nil
}

// vaRange is a reservation: a region of segments.heap.
type vaRange struct {
	base uintptr
	size uint64 // nbytes
	rid  arena.RegionID
}

// chunk is a granule-aligned piece of a reservation that is mapped
// (readable, writable) and registered with the driver (HostRegister,
// MAPPED): one registration, mapped and unmapped whole. A heap block may
// span adjacent chunks of a reservation, whose device addresses are
// contiguous (checked when a chunk is mapped).
type chunk struct {
	base   uintptr
	size   uint64  // nbytes, a multiple of ChunkGranule
	devPtr uintptr // HostGetDevicePointer(base): the device address of base, valid while the chunk is registered
}

func (c *chunk) end() uintptr { return c.base + uintptr(c.size) }

func newSegments() (*segments, error) {
	h, err := arena.NewHeap(1)
	if err != nil {
		return nil, err
	}
	s := &segments{heap: h}
	// The heap needs a stream to own Free blocks; host blocks have none
	// (events order their reuse), so one placeholder value serves.
	if s.sid, err = h.AddStream(1); err != nil {
		return nil, err
	}
	return s, nil
}

func roundPage(n uint64) uint64 { return (n + pageSize - 1) &^ (pageSize - 1) }

func roundGranule(n uint64) uint64 { return (n + ChunkGranule - 1) &^ (ChunkGranule - 1) }

// lookup is the block starting at ptr that Malloc handed out (allocated,
// or free-pending or cached with its record kept), or nil. mu held.
func (a *Allocator) lookup(ptr uintptr) *block {
	if s := a.exp; s != nil {
		if id := s.heap.Lookup(ptr); id != arena.NoBlock && int(id) < len(s.byID) {
			if b := s.byID[id]; b != nil {
				return b
			}
		}
		if len(a.blocks) == 0 {
			return nil
		}
	}
	return a.blocks[ptr]
}

// mallocExp serves a request of size bytes from the fast cache, the heap,
// or a new chunk. mu held.
func (a *Allocator) mallocExp(size uint64) (*block, error) {
	s := a.exp
	n := roundPage(size)
	if l := s.fastList(n, false); l != nil && len(*l) > 0 {
		k := len(*l) - 1
		b := (*l)[k]
		(*l)[k] = nil
		*l = (*l)[:k]
		s.fastBytes -= n
		a.st.CacheHits++
		return b, nil
	}
	// Not in the fast cache. Its blocks, kept out of the heap, may be
	// what keeps free ranges apart: give them back first, so that best
	// fit sees every free byte (each block is flushed at most once per
	// Free, so this costs O(1) per call, amortised). Then unmap the
	// chunks that are wholly free (none can serve the request, and
	// pinned memory that serves nothing is what the policy exists to
	// avoid) before a new one is mapped.
	if s.fastBytes > 0 {
		a.flushFast()
	}
	if id, addr, got := s.heap.AllocFit(s.sid, 0, n, size, math.MaxUint64, pageSize); id != arena.NoBlock {
		a.st.CacheHits++
		return a.record(id, addr, got), nil
	}
	if a.cfg.ReleaseOnGrow {
		_ = a.releaseChunks() // a chunk the driver refuses to unmap stays
	}
	return a.grow(size)
}

// record makes the block record of heap block id. mu held.
func (a *Allocator) record(id arena.BlockID, addr uintptr, size uint64) *block {
	s := a.exp
	var b *block
	if k := len(s.spare); k > 0 {
		b = s.spare[k-1]
		s.spare[k-1] = nil
		s.spare = s.spare[:k-1]
	} else {
		b = &block{class: -1}
	}
	b.ptr, b.size, b.id = addr, size, id
	for int(id) >= len(s.byID) {
		s.byID = append(s.byID, nil)
	}
	s.byID[id] = b
	return b
}

// cacheExp caches a block that is no longer active: in the fast cache if
// it is small and the cache has room, else back into the heap, merged
// with its free neighbours. mu held.
func (a *Allocator) cacheExp(b *block) {
	s := a.exp
	if s.fastBytes+b.size <= max(fastMinCap, uint64(a.st.ReservedBytes.Current)>>fastShift) {
		if l := s.fastList(b.size, true); l != nil {
			b.state = stateCached
			*l = append(*l, b)
			s.fastBytes += b.size
			return
		}
	}
	a.toHeap(b)
}

// toHeap frees b's heap block and recycles its record. mu held.
func (a *Allocator) toHeap(b *block) {
	s := a.exp
	if _, ok := s.heap.FreeAt(b.ptr); !ok {
		// Not an allocated heap block: an invariant is broken. Keep the
		// record, cached in no list, for Check to report.
		b.state = stateCached
		return
	}
	s.byID[b.id] = nil
	uses := b.uses[:0]
	*b = block{class: -1, uses: uses}
	s.spare = append(s.spare, b)
}

// flushFast moves every block of the fast cache back into the heap. mu
// held.
func (a *Allocator) flushFast() {
	s := a.exp
	for w, bits := range s.fastSet {
		for ; bits != 0; bits &= bits - 1 {
			i := w*64 + mathbits.TrailingZeros64(bits)
			for _, b := range s.fast[i] {
				a.toHeap(b)
			}
			clear(s.fast[i])
			s.fast[i] = s.fast[i][:0]
		}
		s.fastSet[w] = 0
	}
	for i := range s.big {
		for _, b := range s.big[i].blocks {
			a.toHeap(b)
		}
		clear(s.big[i].blocks)
		s.big[i].blocks = s.big[i].blocks[:0]
	}
	s.fastBytes = 0
}

// placement is where a chunk would be mapped: csize bytes at offset off of
// Unmapped block u.
type placement struct {
	u      arena.BlockID
	addr   uintptr // of u
	off    uint64
	csize  uint64
	joined bool // next to a free block that the request needs too
}

// better reports whether p pins less than q, or as much but joins free
// memory, or as much at a lower address.
func (p placement) better(q placement) bool {
	if q.u == arena.NoBlock || p.csize != q.csize {
		return q.u == arena.NoBlock || p.csize < q.csize
	}
	if p.joined != q.joined {
		return p.joined
	}
	return p.addr+uintptr(p.off) < q.addr+uintptr(q.off)
}

// place chooses where to map a chunk for a request of n bytes (a whole
// number of pages): where the fewest bytes serve it, counting the free
// block before or after the Unmapped range the chunk would join (a free
// tail of one chunk and the free head of the next serve one request),
// then at the lowest address. With isolate, the chunk joins nothing: it
// is placed a granule away from any mapped memory. NoBlock when no
// reservation has room. mu held.
func (a *Allocator) place(n uint64, isolate bool) placement {
	s := a.exp
	var best placement
	whole := roundGranule(n)
	s.heap.AscendUnmapped(0, func(u arena.BlockID) bool {
		p, _ := s.heap.Peek(u)
		prev, next := s.heap.Prev(u), s.heap.Next(u)
		var low, high uint64 // free bytes just below and above u
		if q, ok := s.heap.Peek(prev); ok && q.State == arena.Free {
			low = q.Size
		}
		if q, ok := s.heap.Peek(next); ok && q.State == arena.Free {
			high = q.Size
		}
		try := func(off, csize uint64, joined bool) {
			if c := (placement{u: u, addr: p.Addr, off: off, csize: csize, joined: joined}); csize > 0 && off+csize <= p.Size && c.better(best) {
				best = c
			}
		}
		if isolate {
			var lo, hi uint64
			if prev != arena.NoBlock {
				lo = ChunkGranule
			}
			if next != arena.NoBlock {
				hi = ChunkGranule
			}
			if lo+whole+hi <= p.Size {
				try(lo, whole, false)
			}
			return true
		}
		try(0, whole, false)
		if low > 0 {
			try(0, roundGranule(n-min(n-pageSize, low)), true)
		}
		if high > 0 {
			c := roundGranule(n - min(n-pageSize, high))
			if c <= p.Size {
				try(p.Size-c, c, true)
			}
		}
		if low+high > 0 && low+p.Size+high >= n {
			try(0, p.Size, true)
		}
		return true
	})
	return best
}

// reserve takes a new reservation large enough for a chunk of csize bytes
// and returns its Unmapped block. mu held.
func (a *Allocator) reserve(csize uint64) (placement, error) {
	s := a.exp
	r := max(uint64(reserveSize)<<min(len(s.resv), 8), csize)
	r = max(min(r, maxReserve), csize)
	base, err := reserveVA(r)
	if err != nil {
		return placement{}, fmt.Errorf("reserving %d bytes of address space: %w: %w", r, backend.ErrOutOfMemory, err)
	}
	rid, u, err := s.heap.AddRegion(base, r, 0, arena.Unmapped, 0)
	if err != nil {
		_ = unreserveVA(base, r)
		return placement{}, err
	}
	s.resv = append(s.resv, vaRange{base: base, size: r, rid: rid})
	return placement{u: u, addr: base, csize: csize}, nil
}

// obtainExp maps a new chunk for a request of size bytes and hands out
// a block of it: a chunk that joins the free memory next to it where that
// pins fewer bytes (place), else a chunk of the request rounded up to the
// granule. The budget is asked first; the mapping and registration
// (mprotect, HostRegister, HostGetDevicePointer) run with mu dropped,
// the range marked Mapping in the heap meanwhile, and the chunk joins its
// neighbours (CommitMap) only once it is registered and its device
// addresses continue theirs; a chunk the driver placed elsewhere on the
// device is unmapped and mapped again a granule away from any chunk. On
// failure nothing is held. mu held.
func (a *Allocator) obtainExp(size uint64) (*block, error) {
	s := a.exp
	n := roundPage(size)
	if n < size || roundGranule(n) < n {
		return nil, fmt.Errorf("%w: %d bytes", ErrInvalidSize, size)
	}
	isolate, join := false, true
	for try := 0; ; try++ {
		if try > 0 {
			// Memory freed or taken while mu was dropped: look again.
			if id, addr, got := s.heap.AllocFit(s.sid, 0, n, size, math.MaxUint64, pageSize); id != arena.NoBlock {
				return a.record(id, addr, got), nil
			}
		}
		if try == 4 {
			return nil, fmt.Errorf("%w: no chunk for %d bytes after %d mappings", backend.ErrOutOfMemory, size, try)
		}
		pl := placement{}
		if join || isolate {
			pl = a.place(n, isolate)
		}
		if pl.u == arena.NoBlock && !isolate {
			pl = a.place(n, true) // the fresh chunk of a request no free memory helps
			pl.joined = false
		}
		if pl.u == arena.NoBlock {
			var err error
			if pl, err = a.reserve(roundGranule(n)); err != nil {
				return nil, err
			}
		}
		c, err := a.mapAt(pl)
		if err != nil {
			return nil, err
		}
		if c == nil { // device addresses not contiguous with a neighbour's: unmapped again
			isolate = true
			continue
		}
		if a.closed { // Close waits for this call and releases the chunk
			return nil, ErrClosed
		}
		if id, addr, got := s.heap.AllocFit(s.sid, 0, n, size, math.MaxUint64, pageSize); id != arena.NoBlock {
			return a.record(id, addr, got), nil
		}
		// The free memory the chunk was to join was taken meanwhile: the
		// next chunk is a whole one.
		join = false
	}
}

// mapAt maps and registers the chunk of placement pl and makes it free
// heap memory, merged with its free neighbours. It returns nil, having
// unmapped the chunk again, when the chunk's device addresses do not
// continue those of an adjacent chunk. mu held (dropped while the driver
// works).
func (a *Allocator) mapAt(pl placement) (*chunk, error) {
	s := a.exp
	if err := a.budget.Reserve(pl.csize); err != nil {
		a.st.NumBudgetDenials++
		return nil, err
	}
	m, err := s.heap.BeginMap(pl.u, pl.off, pl.csize)
	if err != nil { // the placement came from the heap under mu: a bug
		a.budget.Release(pl.csize)
		return nil, corrupt("mapping %d bytes at offset %d of unmapped block %d: %v", pl.csize, pl.off, pl.u, err)
	}
	c := &chunk{base: pl.addr + uintptr(pl.off), size: pl.csize}
	if err := a.callUnlocked(func() error { return a.mapChunk(c) }); err != nil {
		if errors.Is(err, errStillPinned) { // the driver still holds the range
			a.keepStuck(c, m)
		} else {
			_, _ = s.heap.AbortMap(m)
			a.budget.Release(pl.csize)
		}
		return nil, err
	}
	if !a.contiguous(m, c) {
		if err := a.unmapChunk(c); err != nil {
			a.keepStuck(c, m)
			return nil, errors.Join(err, errStillPinned)
		}
		_, _ = s.heap.AbortMap(m)
		a.budget.Release(pl.csize)
		a.st.NumHostAlloc++
		a.st.NumHostFree++
		return nil, nil
	}
	if _, err := s.heap.CommitMap(m, s.sid); err != nil { // m is ours since BeginMap: a bug
		return nil, errors.Join(corrupt("committing the mapping of chunk %#x: %v", c.base, err), a.unmapChunk(c))
	}
	a.spans.ReplaceOrInsert(span{start: c.base, end: c.end(), c: c})
	a.st.Segment.Add(1)
	a.st.ReservedBytes.Add(int64(c.size))
	a.st.NumHostAlloc++
	a.histSegment(true, c)
	return c, nil
}

// keepStuck keeps chunk c, Mapping block m, that the driver still holds
// registered after a failed mapping, for releaseChunks to undo. Its budget
// stays taken. mu held.
func (a *Allocator) keepStuck(c *chunk, m arena.BlockID) {
	a.exp.stuck = append(a.exp.stuck, stuckChunk{c: c, m: m})
	a.st.Segment.Add(1)
	a.st.ReservedBytes.Add(int64(c.size))
	a.st.NumHostAlloc++
}

// releaseStuck undoes the registrations of the stuck chunks; those the
// driver refuses again stay. mu held.
func (a *Allocator) releaseStuck() error {
	s := a.exp
	var errs []error
	kept := s.stuck[:0]
	for _, k := range s.stuck {
		if err := a.hm.HostUnregister(k.c.base); err != nil {
			errs = append(errs, err)
			kept = append(kept, k)
			continue
		}
		errs = append(errs, decommitVA(k.c.base, k.c.size))
		_, _ = s.heap.AbortMap(k.m)
		a.st.Segment.Add(-1)
		a.st.ReservedBytes.Add(-int64(k.c.size))
		a.st.NumHostFree++
		a.budget.Release(k.c.size)
	}
	clear(s.stuck[len(kept):])
	s.stuck = kept
	return errors.Join(errs...)
}

// contiguous reports whether the device addresses of chunk c, being
// mapped as heap block m, continue those of the chunks adjacent to it in
// its reservation. mu held.
func (a *Allocator) contiguous(m arena.BlockID, c *chunk) bool {
	s := a.exp
	if q, ok := s.heap.Peek(s.heap.Prev(m)); ok && q.State != arena.Unmapped && q.State != arena.Mapping {
		lo, ok := a.chunkAt(c.base - 1)
		if !ok || lo.end() != c.base || lo.devPtr+uintptr(lo.size) != c.devPtr {
			return false
		}
	}
	if q, ok := s.heap.Peek(s.heap.Next(m)); ok && q.State != arena.Unmapped && q.State != arena.Mapping {
		hi, ok := a.chunkAt(c.end())
		if !ok || hi.base != c.end() || c.devPtr+uintptr(c.size) != hi.devPtr {
			return false
		}
	}
	return true
}

// chunkAt is the chunk holding p. mu held.
func (a *Allocator) chunkAt(p uintptr) (c *chunk, ok bool) {
	a.spans.DescendLessOrEqual(span{start: p}, func(sp span) bool {
		if sp.c != nil && p < sp.end {
			c, ok = sp.c, true
		}
		return false
	})
	return c, ok
}

// mapChunk makes c's range accessible and registers it with the driver.
// On failure nothing is left mapped or registered. It reads only c and
// what never changes, so it runs without mu.
func (a *Allocator) mapChunk(c *chunk) error {
	if err := commitVA(c.base, c.size); err != nil {
		return fmt.Errorf("mprotect of %d bytes: %w: %w", c.size, backend.ErrOutOfMemory, err)
	}
	if err := a.hm.HostRegister(c.base, c.size, backend.HostRegisterMapped); err != nil {
		return errors.Join(err, decommitVA(c.base, c.size))
	}
	d, err := a.hm.HostGetDevicePointer(c.base)
	if err != nil {
		if e2 := a.hm.HostUnregister(c.base); e2 != nil {
			// The driver still holds the range: its address space and
			// budget stay taken (errStillPinned), never reused.
			return errors.Join(err, e2, errStillPinned)
		}
		return errors.Join(err, decommitVA(c.base, c.size))
	}
	c.devPtr = d
	return nil
}

// unmapChunk undoes mapChunk for a chunk in no index. mu held or not.
func (a *Allocator) unmapChunk(c *chunk) error {
	if err := a.hm.HostUnregister(c.base); err != nil {
		return err
	}
	return decommitVA(c.base, c.size)
}

// releaseChunk gives chunk c back, which lies wholly in Free heap block
// id: HostUnregister, the pages back to the operating system, its range
// Unmapped in the heap (the rest of id stays free), the bytes back to the
// budget. It returns the heap block that follows c's range. If the driver
// refuses to unregister, nothing changes and it returns the free block
// that holds c. mu held.
func (a *Allocator) releaseChunk(c *chunk, id arena.BlockID) (arena.BlockID, error) {
	s := a.exp
	r, err := s.heap.BeginRelease(id, uint64(c.base-s.heap.Addr(id)), c.size)
	if err != nil {
		return arena.NoBlock, corrupt("releasing chunk %#x: %v", c.base, err)
	}
	if err := a.hm.HostUnregister(c.base); err != nil {
		back, _ := s.heap.AbortRelease(r)
		return back, err
	}
	derr := decommitVA(c.base, c.size) // unpinned already: the chunk goes, whatever the OS says
	u, err := s.heap.CommitRelease(r, c.size)
	if err != nil {
		return arena.NoBlock, errors.Join(derr, corrupt("releasing chunk %#x: %v", c.base, err))
	}
	a.spans.Delete(span{start: c.base})
	a.st.Segment.Add(-1)
	a.st.ReservedBytes.Add(-int64(c.size))
	a.st.NumHostFree++
	a.budget.Release(c.size)
	a.histSegment(false, c)
	return s.heap.Next(u), derr
}

// releaseChunks flushes the fast cache and releases every chunk that lies
// wholly in free memory, interior chunks of a free block too; those the
// driver refuses stay. mu held.
func (a *Allocator) releaseChunks() error {
	s := a.exp
	a.flushFast()
	errs := []error{a.releaseStuck()}
	type run struct {
		id     arena.BlockID
		chunks []*chunk
	}
	var runs []run
	s.heap.EachFree(s.sid, 0, func(id arena.BlockID) bool {
		start := s.heap.Addr(id)
		end := start + uintptr(s.heap.Size(id))
		var cs []*chunk
		a.spans.AscendGreaterOrEqual(span{start: start}, func(sp span) bool {
			if sp.start >= end {
				return false
			}
			if sp.c != nil && sp.end <= end {
				cs = append(cs, sp.c)
			}
			return true
		})
		if len(cs) > 0 {
			runs = append(runs, run{id: id, chunks: cs})
		}
		return true
	})
	for _, r := range runs {
		id := r.id
		for _, c := range r.chunks {
			if id == arena.NoBlock || s.heap.State(id) != arena.Free || s.heap.Addr(id) > c.base {
				break // a bug reported above
			}
			next, err := a.releaseChunk(c, id)
			if err != nil {
				errs = append(errs, err)
			}
			id = next
		}
	}
	return errors.Join(errs...)
}

// unreserveAll gives the reservations back once no chunk is left (Close).
// mu held.
func (a *Allocator) unreserveAll() error {
	s := a.exp
	if s == nil || len(s.resv) == 0 {
		return nil
	}
	chunks := len(s.stuck) > 0
	a.spans.Ascend(func(sp span) bool {
		chunks = chunks || sp.c != nil
		return !chunks
	})
	if chunks {
		return nil
	}
	var errs []error
	kept := s.resv[:0]
	for _, r := range s.resv {
		if err := s.heap.RemoveRegion(r.rid); err != nil { // a stuck chunk's Mapping block
			kept = append(kept, r)
			continue
		}
		if err := unreserveVA(r.base, r.size); err != nil {
			errs = append(errs, err)
		}
	}
	s.resv = kept
	return errors.Join(errs...)
}

// blocksExp lists the block records of every chunk in address order. mu
// held.
func (a *Allocator) blocksExp(out []*block) []*block {
	s := a.exp
	for id, b := range s.byID {
		if b != nil && arena.BlockID(id) == b.id {
			out = append(out, b)
		}
	}
	return out
}

// blockIn is the record of the block of a chunk that holds p, or nil when
// p lies in free memory of the chunk. It walks the chunk's blocks: for
// DevicePointer and error paths. mu held.
func (a *Allocator) blockIn(p uintptr) *block {
	s := a.exp
	id := s.heap.Find(p)
	if id == arena.NoBlock || int(id) >= len(s.byID) {
		return nil
	}
	return s.byID[id]
}

// badPointerExp classifies a pointer into chunk c that is not the start of
// an allocated block. mu held.
func (a *Allocator) badPointerExp(ptr uintptr, c *chunk) error {
	b := a.blockIn(ptr)
	switch {
	case b == nil:
		return fmt.Errorf("%w: %#x lies in free pinned memory of the chunk at %#x (freed already, or never allocated)", ErrDoubleFree, ptr, c.base)
	case b.ptr != ptr && b.state == stateAllocated:
		return fmt.Errorf("%w: %#x is %d bytes into the block at %#x", ErrInteriorPointer, ptr, ptr-b.ptr, b.ptr)
	case b.state == stateFreePending && b.ptr == ptr && b.quarantined:
		return fmt.Errorf("%w: %#x (quarantined: a stream recorded on it was destroyed)", ErrDoubleFree, ptr)
	case b.state == stateFreePending && b.ptr == ptr:
		return fmt.Errorf("%w: %#x (free pending on stream events)", ErrDoubleFree, ptr)
	default:
		return fmt.Errorf("%w: %#x is not the start of an allocation", ErrDoubleFree, ptr)
	}
}
