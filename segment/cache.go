package segment

import (
	"fmt"

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

// HandleCache holds unmapped physical handles of one size and property so
// that a later Map reuses them instead of creating new ones, as torch_npu's
// allocator does. Segments whose PageSize and Prop match may share one
// cache; it holds only their full-size (PageSize) handles, never the
// odd-size ones cut for the head or tail of a mapped range.
//
// A HandleCache is not safe for concurrent use: the caller serialises calls
// to it and to every segment using it (the allocator's device lock).
type HandleCache struct {
	drv  backend.Driver
	size uint64               // nbytes of each handle
	prop backend.PhysicalProp // property of each handle
	max  int                  // most handles kept by put; >= 0
	// handles are the cached handles, used as a stack (last in, first
	// out). len(handles) may exceed max only by handles whose
	// FreePhysical failed: they are kept rather than leaked, and Trim
	// retries them.
	handles []backend.Handle
	c       *Counters // HandlesFreed; never nil
}

// NewHandleCache returns an empty cache for handles of size bytes and
// property prop created through drv. maxHandles is the most handles kept;
// a handle put beyond it is freed at once. 0 (or less) keeps none. c may be
// nil; otherwise the cache adds the handles it frees to c.HandlesFreed.
func NewHandleCache(drv backend.Driver, size uint64, prop backend.PhysicalProp, maxHandles int, c *Counters) *HandleCache {
	if c == nil {
		c = new(Counters)
	}
	return &HandleCache{drv: drv, size: size, prop: prop, max: max(maxHandles, 0), c: c}
}

// Len is the number of handles cached.
func (hc *HandleCache) Len() int { return len(hc.handles) }

// Bytes is the physical memory held by the cached handles, in bytes.
func (hc *HandleCache) Bytes() uint64 { return uint64(len(hc.handles)) * hc.size }

// Size is the size of each handle, in bytes.
func (hc *HandleCache) Size() uint64 { return hc.size }

// Prop is the physical property of each handle.
func (hc *HandleCache) Prop() backend.PhysicalProp { return hc.prop }

// Max is the most handles the cache keeps.
func (hc *HandleCache) Max() int { return hc.max }

// SetMax changes the most handles kept (0 or less keeps none). It frees
// nothing itself: handles already cached beyond the new limit stay until
// Trim(maxHandles) is called, so that a FreePhysical error has a caller to
// report to.
func (hc *HandleCache) SetMax(maxHandles int) { hc.max = max(maxHandles, 0) }

// Trim frees cached handles to the driver, most recently cached first,
// until at most keep remain (keep < 0 counts as 0). If FreePhysical fails
// the handle stays cached and Trim returns the error (wrapping
// ErrHandleNotFreed and the driver's error) with the handles freed so far
// gone.
func (hc *HandleCache) Trim(keep int) error {
	keep = max(keep, 0)
	for len(hc.handles) > keep {
		h := hc.handles[len(hc.handles)-1]
		if err := hc.drv.FreePhysical(h); err != nil {
			return fmt.Errorf("segment: trim handle cache: %w: handle %#x: %w", ErrHandleNotFreed, uint64(h), err)
		}
		hc.c.HandlesFreed++
		hc.handles = hc.handles[:len(hc.handles)-1]
	}
	return nil
}

// take pops up to len(dst) handles into dst (most recently cached first)
// and returns how many it took.
func (hc *HandleCache) take(dst []backend.Handle) int {
	n := min(len(dst), len(hc.handles))
	top := len(hc.handles)
	for i := 0; i < n; i++ {
		dst[i] = hc.handles[top-1-i]
	}
	hc.handles = hc.handles[:top-n]
	return n
}

// restore pushes back a handle taken by take without counting anything;
// undoing take(dst) means restoring dst[n-1] first and dst[0] last.
func (hc *HandleCache) restore(h backend.Handle) { hc.handles = append(hc.handles, h) }

// put caches an unmapped handle, or frees it when the cache is full. If
// that FreePhysical fails the handle is cached anyway (beyond max, so Trim
// retries it) and the error is returned.
func (hc *HandleCache) put(h backend.Handle) error {
	if len(hc.handles) < hc.max {
		hc.handles = append(hc.handles, h)
		return nil
	}
	if err := hc.drv.FreePhysical(h); err != nil {
		hc.handles = append(hc.handles, h)
		return fmt.Errorf("%w: handle %#x kept in the handle cache: %w", ErrHandleNotFreed, uint64(h), err)
	}
	hc.c.HandlesFreed++
	return nil
}
