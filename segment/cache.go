package segment

import (
	"fmt"
	"slices"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Counters are the driver-call figures a segment reports. The allocator
// owns one per device and shares it among that device's segments and handle
// caches; the caller's device lock guards it like everything else here.
// Every field counts calls or handles since creation.
type Counters struct {
	// Maps and Unmaps count handles mapped and unmapped: driver Map and
	// Unmap calls that succeeded, including those a rollback made.
	Maps, Unmaps int64
	// HandlesCreated counts CreatePhysical calls that succeeded.
	HandlesCreated int64
	// HandlesFreed counts FreePhysical calls that succeeded.
	HandlesFreed int64
	// HandlesReused counts handles mapped that were taken from a
	// HandleCache instead of created. A handle taken by a Map that then
	// rolled back went back to the cache and is not counted.
	HandlesReused int64
	// StreamSyncs counts StreamSynchronize calls that succeeded before an
	// unmap.
	StreamSyncs int64
}

// HandleCache holds unmapped physical handles of one property so that a
// later Map reuses them instead of creating new ones, as torch_npu's
// allocator does. Segments whose PageSize and Prop match may share one
// cache. It holds handles of its size (the segments' PageSize) and of the
// other sizes Hold adds (the allocator's large growth handles, granule
// handles), never the odd-size ones cut for the tail of a mapped range;
// a map takes only handles of exactly the size of the piece they back.
// Its budget is in bytes, whatever the handle sizes: Max handles of Size
// bytes.
//
// A HandleCache is not safe for concurrent use: the caller serialises calls
// to it and to every segment using it (the allocator's device lock).
type HandleCache struct {
	drv  backend.Driver
	size uint64               // nbytes of each page-size handle
	prop backend.PhysicalProp // property of each handle
	// also are the other handle sizes it keeps, in bytes (Hold).
	also []uint64
	// maxBytes is the most bytes kept by put (Max × size).
	maxBytes uint64
	// handles are the cached handles, used as a stack (last in, first
	// out), and sizes[i] is the nbytes of handles[i]. bytes is their sum,
	// which may exceed maxBytes only by handles whose FreePhysical failed:
	// they are kept rather than leaked, and Trim retries them.
	handles []backend.Handle
	sizes   []uint64
	bytes   uint64
	c       *Counters // HandlesFreed; never nil
}

// NewHandleCache returns an empty cache for handles of size bytes and
// property prop created through drv. maxHandles is the most handles of
// size bytes kept (the budget, maxHandles × size bytes, holds handles of
// any size it keeps); a handle put beyond it is freed at once. 0 (or less)
// keeps none. c may be nil; otherwise the cache adds the handles it frees
// to c.HandlesFreed.
func NewHandleCache(drv backend.Driver, size uint64, prop backend.PhysicalProp, maxHandles int, c *Counters) *HandleCache {
	if c == nil {
		c = new(Counters)
	}
	return &HandleCache{drv: drv, size: size, prop: prop, maxBytes: uint64(max(maxHandles, 0)) * size, c: c}
}

// Hold makes the cache keep handles of size bytes as well as page-size
// ones (0 and sizes it keeps already change nothing).
func (hc *HandleCache) Hold(size uint64) {
	if !hc.holds(size) && size != 0 {
		hc.also = append(hc.also, size)
	}
}

// holds reports whether handles of size bytes enter the cache.
func (hc *HandleCache) holds(size uint64) bool {
	return size == hc.size || slices.Contains(hc.also, size)
}

// Len is the number of handles cached, of every size.
func (hc *HandleCache) Len() int { return len(hc.handles) }

// Bytes is the physical memory held by the cached handles, in bytes.
func (hc *HandleCache) Bytes() uint64 { return hc.bytes }

// Size is the size of each page-size handle, in bytes.
func (hc *HandleCache) Size() uint64 { return hc.size }

// Prop is the physical property of each handle.
func (hc *HandleCache) Prop() backend.PhysicalProp { return hc.prop }

// Max is the budget in handles of Size bytes: the cache keeps at most
// Max × Size bytes of handles.
func (hc *HandleCache) Max() int { return int(hc.maxBytes / hc.size) }

// SetMax changes the budget to maxHandles handles of Size bytes (0 or less
// keeps none). It frees nothing itself: handles already cached beyond the
// new limit stay until Trim(maxHandles) is called, so that a FreePhysical
// error has a caller to report to.
func (hc *HandleCache) SetMax(maxHandles int) { hc.maxBytes = uint64(max(maxHandles, 0)) * hc.size }

// MaxBytes is the budget in bytes.
func (hc *HandleCache) MaxBytes() uint64 { return hc.maxBytes }

// SetMaxBytes changes the budget to n bytes; like SetMax it frees nothing
// (TrimBytes does).
func (hc *HandleCache) SetMaxBytes(n uint64) { hc.maxBytes = n }

// Trim frees cached handles to the driver, most recently cached first,
// until they hold at most keep × Size bytes (keep < 0 counts as 0). If
// FreePhysical fails the handle stays cached and Trim returns the error
// (wrapping ErrHandleNotFreed and the driver's error) with the handles
// freed so far gone.
func (hc *HandleCache) Trim(keep int) error {
	return hc.TrimBytes(uint64(max(keep, 0)) * hc.size)
}

// TrimBytes is Trim down to at most limit bytes cached.
func (hc *HandleCache) TrimBytes(limit uint64) error {
	for hc.bytes > limit {
		top := len(hc.handles) - 1
		h := hc.handles[top]
		if err := hc.drv.FreePhysical(h); err != nil {
			return fmt.Errorf("segment: trim handle cache: %w: handle %#x: %w", ErrHandleNotFreed, uint64(h), err)
		}
		hc.c.HandlesFreed++
		hc.bytes -= hc.sizes[top]
		hc.handles, hc.sizes = hc.handles[:top], hc.sizes[:top]
	}
	return nil
}

// TrimLarger frees every cached handle of more than size bytes to the
// driver and keeps the others. If
// FreePhysical fails that handle stays cached and TrimLarger returns the
// error (as Trim does) with the handles freed so far gone.
func (hc *HandleCache) TrimLarger(size uint64) error {
	var err error
	kept := 0
	for i, h := range hc.handles {
		if hc.sizes[i] > size && err == nil {
			ferr := hc.drv.FreePhysical(h)
			if ferr == nil {
				hc.c.HandlesFreed++
				hc.bytes -= hc.sizes[i]
				continue
			}
			err = fmt.Errorf("segment: trim handle cache: %w: handle %#x: %w", ErrHandleNotFreed, uint64(h), ferr)
		}
		hc.handles[kept], hc.sizes[kept] = h, hc.sizes[i]
		kept++
	}
	clear(hc.handles[kept:])
	hc.handles, hc.sizes = hc.handles[:kept], hc.sizes[:kept]
	return err
}

// take pops up to len(dst) handles of size bytes into dst (most recently
// cached first) and returns how many it took.
func (hc *HandleCache) take(dst []backend.Handle, size uint64) int {
	n := 0
	for i := len(hc.handles) - 1; i >= 0 && n < len(dst); i-- {
		if hc.sizes[i] == size {
			dst[n] = hc.handles[i]
			n++
			hc.sizes[i] = 0 // taken; compacted below
		}
	}
	if n == 0 {
		return 0
	}
	kept := 0
	for i, h := range hc.handles {
		if hc.sizes[i] != 0 {
			hc.handles[kept], hc.sizes[kept] = h, hc.sizes[i]
			kept++
		}
	}
	hc.handles, hc.sizes = hc.handles[:kept], hc.sizes[:kept]
	hc.bytes -= uint64(n) * size
	return n
}

// restore pushes back a handle of size bytes taken by take without
// counting anything; undoing take(dst) means restoring dst[n-1] first and
// dst[0] last.
func (hc *HandleCache) restore(h backend.Handle, size uint64) {
	hc.handles = append(hc.handles, h)
	hc.sizes = append(hc.sizes, size)
	hc.bytes += size
}

// put caches an unmapped handle of size bytes (a size it holds), or frees
// it when the budget is spent. If that FreePhysical fails the handle is
// cached anyway (beyond the budget, so Trim retries it) and the error is
// returned.
func (hc *HandleCache) put(h backend.Handle, size uint64) error {
	if hc.bytes+size <= hc.maxBytes {
		hc.restore(h, size)
		return nil
	}
	if err := hc.drv.FreePhysical(h); err != nil {
		hc.restore(h, size)
		return fmt.Errorf("%w: handle %#x kept in the handle cache: %w", ErrHandleNotFreed, uint64(h), err)
	}
	hc.c.HandlesFreed++
	return nil
}

// Add caches h, an unmapped handle of size bytes created by the caller
// (the allocator's background reserve), as an Unmap would: kept if the
// cache holds its size and the budget has room, freed to the driver
// otherwise. If that FreePhysical fails the handle is cached anyway
// (Trim retries it) and the error is returned.
func (hc *HandleCache) Add(h backend.Handle, size uint64) error {
	if !hc.holds(size) {
		if err := hc.drv.FreePhysical(h); err != nil {
			hc.restore(h, size)
			return fmt.Errorf("%w: handle %#x kept in the handle cache: %w", ErrHandleNotFreed, uint64(h), err)
		}
		hc.c.HandlesFreed++
		return nil
	}
	return hc.put(h, size)
}
