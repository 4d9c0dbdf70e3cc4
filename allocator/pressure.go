package allocator

import (
	"fmt"
	"math"

	"github.com/vmmalloc/vmmalloc/arena"
)

// Pressure: the handle size a growth maps.
//
// A physical handle is unmapped only whole, so free memory inside a handle
// that still holds one allocated byte is stranded: no other request can
// use it unless it fits there, and no defragmentation or out-of-memory
// release can return it. The larger the handles, the more each partly free
// one strands (up to a handle); the smaller, the more driver calls each
// growth and release makes (three per handle mapped, two per handle
// released). Which handles will end up partly free is unknown when they
// are mapped, so the choice follows the room left:
//
//   - while the process may still map as much again as it has reserved
//     (reserved bytes after the growth at most pressureNum/pressureDen of
//     the memory it may use: the device, per_process_memory_fraction, and
//     for a private pool its MemoryLimit), growths map large handles
//     (expandable_handle_mb) and pages (large_segment_size_mb): even if
//     every one of them ended up stranded, what is left would hold them
//     again, and a workload that stays there makes today's driver calls;
//   - above it every growth maps granule handles (2 MiB), so every free
//     granule there can be unmapped by defragmentation before the next
//     growth and by the ladder's release, and remapped where the heap
//     grows.
//
// Above the line, growth handles (handles larger than a page, mapped while
// there was room) are not kept once wholly free, because a wholly free one
// is exactly what a later cut would strand:
//
//   - a growth first unmaps the growing stream's wholly free growth
//     handles (releaseFreeGrowthHandles), so that it remaps their memory
//     in granules where the heap grows;
//   - a Malloc whose best fit would cut a wholly free growth handle, leaving
//     part of it free, unmaps that handle first and fits again
//     (fitPressed), so the request is served by the rest of the block or by
//     a growth in granules. The cache hit (Malloc's fast path) takes, under
//     pressure, only blocks that leave less than a granule (hitBound),
//     which can strand no more than a granule handle would; larger cuts
//     take the slow path.
//
// Both unmap only free memory of the requesting stream, after waiting for
// its queued work (as defragmentation does), and free the unmapped growth
// handles rather than cache them: under pressure no growth maps that size
// again. A handle that holds an allocated byte cannot be split, so what a
// partly free growth handle mapped below the line costs is what it
// strands when a growth fails: on cs336_ctx512_fullstep the minimum
// capacity is 0.8 % above peak allocated, 189 MiB of it free in such
// handles (docs/results.md, "Under memory pressure"), against 0.3 %
// with granule handles everywhere at 17× the driver calls of a device
// with room.
const (
	pressureNum = 1
	pressureDen = 2
)

// underPressure reports whether mapping n more bytes for pool p would
// take the reserved memory past pressureNum/pressureDen of the memory the
// process may use (a.pressureAt, the line of allowed), or p's reserved memory past that share of
// p's memory limit. Growths in flight count. mu held.
func (a *Allocator) underPressure(p *Pool, n uint64) bool {
	after := uint64(a.st.ReservedBytes[0].Current) + a.mappingBytes + n
	if after > uint64(a.pressureAt) {
		return true
	}
	if p.limit == math.MaxUint64 {
		return false
	}
	return uint64(a.poolRec(p).ReservedBytes[0].Current)+p.mapping+n > p.limit/pressureDen*pressureNum
}

// pressureLine is the reserved bytes above which a device that lets the
// process use allowed bytes is under pressure (pressureNum/pressureDen of
// them): Allocator.pressureAt, the cache hit's test.
func pressureLine(allowed uint64) int64 {
	return int64(min(allowed/pressureDen*pressureNum, math.MaxInt64))
}

// hitBound is the largest free block the default pool's cache hit may
// take for rounded bytes, given fitLimits' maxSize: under pressure
// (reserved past the line), only a block that leaves less than a granule
// when cut; a larger one goes to mallocSlow, whose fitPressed looks at the
// handles the cut would strand. It inlines into the cache hit. mu held.
func (a *Allocator) hitBound(rounded, maxSize uint64) uint64 {
	if a.st.ReservedBytes[0].Current > a.pressureAt {
		return a.poolHitBound(&a.def, rounded, maxSize)
	}
	return maxSize
}

// poolHitBound is hitBound for pool p, whose memory limit may put it
// under pressure too. mu held.
//
//go:noinline
func (a *Allocator) poolHitBound(p *Pool, rounded, maxSize uint64) uint64 {
	if !a.classFor(rounded).growthHandles() || !a.guardsCuts(p) {
		return maxSize
	}
	return min(maxSize, rounded+a.gran-1)
}

// growthHandles reports whether growths of cl map handles larger than a
// page (expandable_handle_mb, the large pool only).
func (cl *sizeClass) growthHandles() bool { return cl.handleSize > cl.pageSize }

// guardsCuts reports whether a Malloc in pool p is under pressure and may
// unmap a wholly free growth handle rather than cut it: an expandable,
// unaligned, shared pool (an aligned or isolated pool maps handles of its
// own) with defragmentation on. mu held.
func (a *Allocator) guardsCuts(p *Pool) bool {
	return p.expandable && p.align == 0 && !p.isolated && !p.asleep && a.cfg.DefragThreshold >= 0 && a.underPressure(p, 0)
}

// fitPressed is bestFit for rounded bytes of ss under pressure, given
// bestFit's block b (at addr, of size bytes): while the block would be
// cut inside a wholly free growth handle (leaving part of that handle
// free), that handle is unmapped, after ss's queued work completes, and
// the fit searched again. It returns the block to serve the request from
// (NoBlock: grow), or ErrInvalidStream if ss was released while it
// waited. A release that fails leaves the block as it was, and the
// request takes it. mu held (dropped while it waits).
func (a *Allocator) fitPressed(ss *streamState, cl *sizeClass, rounded uint64, b arena.BlockID, addr uintptr, size uint64) (arena.BlockID, uintptr, uint64, error) {
	stream := ss.stream
	for b != arena.NoBlock && a.guardsCuts(ss.pool) {
		rel, ok := a.markCut(ss, cl, b, rounded)
		if !ok {
			break
		}
		before := a.st.ReservedBytes[0].Current
		_ = a.releaseRels(ss, []arena.BlockID{rel}) // best effort: what stays mapped stays usable
		if !a.owns(ss) || ss.stream != stream {
			return arena.NoBlock, 0, 0, fmt.Errorf("%w: stream %d was released while a Malloc on it waited", ErrInvalidStream, stream)
		}
		_ = cl.cache.TrimLarger(cl.pageSize) // a failed free stays cached; the ladder retries
		released := a.st.ReservedBytes[0].Current < before
		b, addr, size = a.bestFit(ss, cl, rounded)
		if !released {
			break
		}
	}
	return b, addr, size, nil
}

// markCut marks Releasing the wholly free growth handle of free block b
// (of ss, in cl) that serving rounded bytes from b's start would cut: the
// handle over the request's last byte, if it lies inside b, is larger than
// a page, and extends past the request. ok is false when there is none.
// mu held.
func (a *Allocator) markCut(ss *streamState, cl *sizeClass, b arena.BlockID, rounded uint64) (rel arena.BlockID, ok bool) {
	info, found := a.heap.Block(b)
	if !found || info.State != arena.Free || info.Size <= rounded || !a.shouldSplit(true, cl, info.Size, rounded) {
		return arena.NoBlock, false
	}
	sg := a.segOf[info.Region]
	if !sg.expandable {
		return arena.NoBlock, false
	}
	off := uint64(info.Addr - sg.base)
	lo, n, mapped := sg.s.HandleRange(off + rounded - 1)
	if !mapped || n <= cl.pageSize || lo < off || lo+n > off+info.Size || lo+n <= off+rounded {
		return arena.NoBlock, false
	}
	rel, err := a.heap.BeginRelease(b, lo-off, n)
	if err != nil {
		return arena.NoBlock, false // Check reports the disagreement
	}
	return rel, true
}

// releaseFreeGrowthHandles unmaps, before a growth of ss in cl under
// pressure, every run of ss's free memory that holds a wholly free growth
// handle (from the first such handle of a free block to the end of its
// last, smaller handles between them included), after ss's queued work
// completes, and frees the growth handles. The growth that follows maps
// granules, taking the freed memory where the heap grows. mu held
// (dropped while it waits).
func (a *Allocator) releaseFreeGrowthHandles(ss *streamState, cl *sizeClass) {
	var blocks []arena.BlockID
	a.heap.EachFree(ss.sid, uint8(cl.idx), func(b arena.BlockID) bool {
		if info, _ := a.heap.Block(b); info.Size > cl.pageSize {
			blocks = append(blocks, b)
		}
		return true
	})
	var rels []arena.BlockID
	for _, b := range blocks {
		info, _ := a.heap.Block(b)
		sg := a.segOf[info.Region]
		if !sg.expandable {
			continue
		}
		off := uint64(info.Addr - sg.base)
		lo, hi := sg.s.LargeHandles(off, info.Size, cl.pageSize)
		if lo >= hi {
			continue
		}
		if rel, err := a.heap.BeginRelease(b, lo-off, hi-lo); err == nil {
			rels = append(rels, rel)
		}
	}
	if len(rels) == 0 {
		return
	}
	_ = a.releaseRels(ss, rels) // best effort: the growth reports real failures
	_ = cl.cache.TrimLarger(cl.pageSize)
}
