package host

import (
	"errors"
	"fmt"
	"math"

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
	// in front of the block heap keeps (1 MiB).
	fastPages = 256
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
	heap *arena.Heap    // the blocks of every chunk, one region per chunk, pool 0
	sid  arena.StreamID // the one stream of heap: host blocks are ordered by events, not by stream ownership
	va   *arena.Heap    // the reservations: Free = address space no chunk uses, Allocated = a chunk
	vsid arena.StreamID
	resv []vaRange               // every reservation, for Close to unmap
	byID []*block                // the record of each Allocated heap block, by BlockID (nil: none)
	fast [fastPages + 1][]*block // cached blocks of i pages kept out of the heap, LIFO
	// fastBytes is the nbytes in fast.
	fastBytes uint64
	spare     []*block // recycled block records (so a cache hit allocates nothing)
}

type vaRange struct {
	base uintptr
	size uint64 // nbytes
}

// chunk is a granule-aligned piece of a reservation that is mapped
// (readable, writable) and registered with the driver (HostRegister,
// MAPPED): a region of segments.heap.
type chunk struct {
	base   uintptr
	size   uint64 // nbytes, a multiple of ChunkGranule
	rid    arena.RegionID
	devPtr uintptr // HostGetDevicePointer(base): the device address of base, valid while the chunk is registered
}

func newSegments() (*segments, error) {
	h, err := arena.NewHeap(1)
	if err != nil {
		return nil, err
	}
	va, err := arena.NewHeap(1)
	if err != nil {
		return nil, err
	}
	s := &segments{heap: h, va: va}
	// The heaps need a stream to own Free blocks; host blocks have none
	// (events order their reuse), so one placeholder value serves.
	if s.sid, err = h.AddStream(1); err != nil {
		return nil, err
	}
	if s.vsid, err = va.AddStream(1); err != nil {
		return nil, err
	}
	return s, nil
}

func roundPage(n uint64) uint64 { return (n + pageSize - 1) &^ (pageSize - 1) }

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
	if n <= fastPages*pageSize {
		if l := s.fast[n>>pageShift]; len(l) > 0 {
			b := l[len(l)-1]
			l[len(l)-1] = nil
			s.fast[n>>pageShift] = l[:len(l)-1]
			s.fastBytes -= n
			a.st.CacheHits++
			return b, nil
		}
	}
	if id, addr, got := s.heap.AllocFit(s.sid, 0, n, size, math.MaxUint64, pageSize); id != arena.NoBlock {
		a.st.CacheHits++
		return a.record(id, addr, got), nil
	}
	// A miss. Blocks of the fast cache may be what keeps a free range too
	// small: give them back to the heap and look again. Then unmap the
	// chunks that are wholly free (none can serve the request, and
	// pinned memory that serves nothing is what the policy exists to
	// avoid) before a new one is mapped.
	if s.fastBytes > 0 {
		a.flushFast()
		if id, addr, got := s.heap.AllocFit(s.sid, 0, n, size, math.MaxUint64, pageSize); id != arena.NoBlock {
			a.st.CacheHits++
			return a.record(id, addr, got), nil
		}
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
	if b.size <= fastPages*pageSize && s.fastBytes+b.size <= max(fastMinCap, uint64(a.st.ReservedBytes.Current)>>fastShift) {
		b.state = stateCached
		s.fast[b.size>>pageShift] = append(s.fast[b.size>>pageShift], b)
		s.fastBytes += b.size
		return
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
	for i := range s.fast {
		for _, b := range s.fast[i] {
			a.toHeap(b)
		}
		clear(s.fast[i])
		s.fast[i] = s.fast[i][:0]
	}
	s.fastBytes = 0
}

// obtainExp maps a new chunk large enough for a request of size bytes and
// hands out its first block. The budget is asked first; the address space
// is taken from a reservation (a new one when none has room); the mapping
// and registration (mprotect, HostRegister, HostGetDevicePointer) run with
// mu dropped. On failure nothing is held. mu held.
func (a *Allocator) obtainExp(size uint64) (*block, error) {
	s := a.exp
	n := roundPage(size)
	csize := (n + ChunkGranule - 1) &^ (ChunkGranule - 1)
	if csize < n {
		return nil, fmt.Errorf("%w: %d bytes", ErrInvalidSize, size)
	}
	if err := a.budget.Reserve(csize); err != nil {
		a.st.NumBudgetDenials++
		return nil, err
	}
	base, err := a.takeVA(csize)
	if err != nil {
		a.budget.Release(csize)
		return nil, err
	}
	c := &chunk{base: base, size: csize}
	if err := a.callUnlocked(func() error { return a.mapChunk(c) }); err != nil {
		if !errors.Is(err, errStillPinned) { // else the driver still holds the range: never reuse its address space
			_, _ = s.va.FreeAt(base)
			a.budget.Release(csize)
		}
		return nil, err
	}
	rid, _, err := s.heap.AddRegion(base, csize, 0, arena.Free, s.sid)
	if err != nil { // the address space came from our own reservation: a bug
		return nil, errors.Join(err, a.unmapChunk(c))
	}
	c.rid = rid
	a.spans.ReplaceOrInsert(span{start: base, end: base + uintptr(csize), c: c})
	a.st.Segment.Add(1)
	a.st.ReservedBytes.Add(int64(csize))
	a.st.NumHostAlloc++
	a.histSegment(true, c)
	if a.closed { // Close waits for this call and releases the chunk
		return nil, ErrClosed
	}
	id, addr, got := s.heap.AllocFit(s.sid, 0, n, size, math.MaxUint64, pageSize)
	if id == arena.NoBlock {
		return nil, corrupt("a fresh %d-byte chunk cannot serve %d bytes", csize, n)
	}
	return a.record(id, addr, got), nil
}

// takeVA takes n bytes of reserved address space. mu held.
func (a *Allocator) takeVA(n uint64) (uintptr, error) {
	s := a.exp
	if id, addr, _ := s.va.AllocFit(s.vsid, 0, n, n, math.MaxUint64, pageSize); id != arena.NoBlock {
		return addr, nil
	}
	r := max(uint64(reserveSize)<<min(len(s.resv), 8), n)
	r = max(min(r, maxReserve), n)
	base, err := reserveVA(r)
	if err != nil {
		return 0, fmt.Errorf("reserving %d bytes of address space: %w: %w", r, backend.ErrOutOfMemory, err)
	}
	if _, _, err := s.va.AddRegion(base, r, 0, arena.Free, s.vsid); err != nil {
		_ = unreserveVA(base, r)
		return 0, err
	}
	s.resv = append(s.resv, vaRange{base: base, size: r})
	id, addr, _ := s.va.AllocFit(s.vsid, 0, n, n, math.MaxUint64, pageSize)
	if id == arena.NoBlock {
		return 0, corrupt("a fresh %d-byte reservation cannot serve %d bytes", r, n)
	}
	return addr, nil
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

// chunkFree reports whether every byte of c is one Free heap block. mu
// held.
func (a *Allocator) chunkFree(c *chunk) bool {
	s := a.exp
	info, ok := s.heap.Region(c.rid)
	if !ok {
		return false
	}
	p, ok := s.heap.Peek(info.Head)
	return ok && p.State == arena.Free && p.Size == c.size
}

// releaseChunk gives chunk c, wholly free, back: HostUnregister, the pages
// back to the operating system, the address space back to its
// reservation, the bytes back to the budget. If the driver refuses to
// unregister, nothing changes. mu held.
func (a *Allocator) releaseChunk(c *chunk) error {
	s := a.exp
	if err := a.hm.HostUnregister(c.base); err != nil {
		return err
	}
	derr := decommitVA(c.base, c.size) // unpinned already: the chunk goes, whatever the OS says
	if err := s.heap.RemoveRegion(c.rid); err != nil {
		return errors.Join(derr, err)
	}
	_, _ = s.va.FreeAt(c.base)
	a.spans.Delete(span{start: c.base})
	a.st.Segment.Add(-1)
	a.st.ReservedBytes.Add(-int64(c.size))
	a.st.NumHostFree++
	a.budget.Release(c.size)
	a.histSegment(false, c)
	return derr
}

// releaseChunks flushes the fast cache and releases every wholly free
// chunk; those the driver refuses stay. mu held.
func (a *Allocator) releaseChunks() error {
	a.flushFast()
	var free []*chunk
	a.spans.Ascend(func(sp span) bool {
		if sp.c != nil && a.chunkFree(sp.c) {
			free = append(free, sp.c)
		}
		return true
	})
	var errs []error
	for _, c := range free {
		if err := a.releaseChunk(c); err != nil {
			errs = append(errs, err)
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
	chunks := false
	a.spans.Ascend(func(sp span) bool {
		chunks = sp.c != nil
		return !chunks
	})
	if chunks {
		return nil
	}
	var errs []error
	kept := s.resv[:0]
	for _, r := range s.resv {
		rid := s.va.RegionAt(r.base)
		if err := unreserveVA(r.base, r.size); err != nil {
			errs = append(errs, err)
			kept = append(kept, r)
			continue
		}
		_ = s.va.RemoveRegion(rid)
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
