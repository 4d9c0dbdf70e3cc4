// Package segment implements one expandable segment: a reserved range of
// virtual addresses (VA) whose memory is mapped and unmapped in physical
// handles of variable size on a granule grid. It is the Go counterpart of
// PyTorch's ExpandableSegment (CUDACachingAllocator.cpp) built on the
// backend.Driver VMM primitives; the allocator above it grows a segment by
// mapping ranges and shrinks it by unmapping them.
//
// # Granules, pages and handles
//
// Three sizes describe a segment:
//
//   - the granule (Config.Granule, by default the driver's MINIMUM
//     granularity) is the unit of mapping: every offset and length given to
//     Map and Unmap is a multiple of it, and the segment records the state
//     of each granule;
//   - the page (Config.PageSize, a multiple of the granule) is the largest
//     handle;
//   - a handle covers one or more granules, at most a page (or, mapped
//     by MapLarge on a CutFromStart segment, at most the piece it asked
//     for).
//
// Map(off, n) cuts [off, off+n) into pieces of at most a page and backs
// each piece with one handle of exactly its size. By default
// (CutAtPageGrid) it cuts at the multiples of PageSize (offsets from Base),
// so no handle crosses a page boundary; with CutFromStart it cuts every
// PageSize bytes from off, so only the tail piece is partial. Pieces that are whole pages get
// full-size handles (PageSize bytes), taken from the HandleCache first and
// created only when it is empty; a partial piece at the head or tail of
// the range gets an odd-size handle, always created fresh. For example,
// with 20 MiB pages and 2 MiB granules, Map(6 MiB, 50 MiB) maps the handles
// [6, 20), [20, 40) and [40, 56) MiB: two odd ones of 14 and 16 MiB and one
// full one of 20 MiB; with CutFromStart it maps [6, 26), [26, 46) and
// [46, 56). So no memory is stranded in partly used pages, while the bulk
// of a large range still uses full, reusable handles. MapLarge(off, n,
// piece) cuts every piece bytes instead (CutFromStart only), into fresh
// handles: fewer driver calls for a large range, unmapped only whole.
//
// # State machine
//
// Every granule of a live segment is in one of two states:
//
//	            Map: cut at page boundaries; per piece a handle
//	                 (full size: HandleCache, else CreatePhysical;
//	                 odd size: CreatePhysical); driver Map; SetAccess
//	unmapped ─────────────────────────────────────────────────▶ mapped, as part
//	    ▲                                                        of one handle
//	    └────────────────────────────────────────────────────────────┘
//	            Unmap (whole handles only): StreamSynchronize the given
//	            streams; driver Unmap; full-size handle → HandleCache (if it
//	            has room) or FreePhysical; odd-size handle, or one
//	            Config.Unmapped says is shared → FreePhysical
//
// A mapped granule belongs to exactly one handle, and a handle is mapped
// and unmapped whole: Unmap's range must start and end on handle
// boundaries. A handle whose FreePhysical fails is never dropped: a
// full-size one stays in the cache (beyond its limit; HandleCache.Trim
// retries it) when the segment has a cache, and any other goes to the
// segment's leftover list (FreeLeftovers, Release and Destroy retry it).
// Only handles of a size the HandleCache holds (PageSize, and the sizes
// HandleCache.Hold adds) ever enter it, and never one shared with another
// process (Config.Unmapped).
//
// Map is all or nothing: if any step fails for any handle (creating it,
// mapping it, setting its access), every handle this call mapped is
// unmapped again, handles taken from the cache go back to it in their old
// order, and handles created are freed; the error wraps the driver's error
// so errors.Is(err, backend.ErrOutOfMemory) works. If a rollback step itself
// fails the state stays truthful: a handle the driver still maps is
// recorded as mapped, and a handle that could not be freed is kept as
// above. Unmap works handle by handle in address order and stops at the
// first driver Unmap error, reporting how long the unmapped prefix is.
//
// The segment itself is alive from New until Release (or Destroy)
// succeeds; afterwards every mutating call returns ErrReleased. A failed
// Release or Destroy leaves the segment alive and truthful, so it can be
// retried.
//
// # Classic segments
//
// NewClassic makes the baseline "cudaMalloc" segment: one reservation, one
// handle of the whole (granule-rounded) size, mapped at creation; its
// PageSize is that size. It is never grown or partly unmapped (Map and
// Unmap return ErrClassic), and is torn down with Destroy.
//
// # Concurrency
//
// A Segment and a HandleCache are not safe for concurrent use. The caller
// (the allocator) serialises every call to one segment and to the caches
// and Counters it shares, under its device lock. The Driver itself is safe
// for concurrent use, so a map's driver calls can be made without that
// lock: BeginMap (lock held) validates the range and takes cached
// handles, MapOp.Run (lock dropped) creates, maps and sets access and
// touches no segment, cache or Counters state, and EndMap (lock held)
// records the handles, counts the calls, or rolls back as Map does. While
// a map is in flight its granules read as unmapped, a map overlapping it
// is refused, and Release and Destroy return ErrBusy. Map and MapLarge are
// the three steps in one call. BeginUnmap, UnmapOp.Run and EndUnmap do
// the same for an unmap (without its stream synchronizes, which the
// caller makes first): its handles read as mapped until EndUnmap.
package segment

import (
	"errors"
	"fmt"
	"math"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Sentinel errors. Errors returned by this package wrap one of them (and,
// for a failed driver call, the driver's *backend.Error too), so callers
// test them with errors.Is.
var (
	// ErrInvalidConfig: New or NewClassic was given an unusable Config.
	ErrInvalidConfig = errors.New("invalid segment config")
	// ErrInvalidRange: an offset or length is not a multiple of the
	// granule, the length is zero, or an Unmap range starts or ends inside
	// a handle.
	ErrInvalidRange = errors.New("invalid range")
	// ErrOutOfRange: a range reaches past the end of the segment.
	ErrOutOfRange = errors.New("range out of segment")
	// ErrAlreadyMapped: Map was asked to map a granule that is mapped.
	ErrAlreadyMapped = errors.New("granule already mapped")
	// ErrNotMapped: Unmap was asked to unmap a granule that is not mapped.
	ErrNotMapped = errors.New("granule not mapped")
	// ErrNotEmpty: Release was called while handles are still mapped.
	ErrNotEmpty = errors.New("segment still has mapped handles")
	// ErrReleased: the segment's address range has been released.
	ErrReleased = errors.New("segment released")
	// ErrClassic: Map or Unmap was called on a classic segment.
	ErrClassic = errors.New("operation not supported on a classic segment")
	// ErrBusy: Release or Destroy was called while a map begun by
	// BeginMap has not ended, or EndMap was given an op never run.
	ErrBusy = errors.New("segment has a map in flight")
	// ErrHandleNotFreed: a handle was unmapped (or a rollback finished) but
	// its FreePhysical failed; the handle is kept, in the handle cache or
	// the segment's leftover list, for a later retry.
	ErrHandleNotFreed = errors.New("physical handle not freed, kept for retry")
)

// MaxGranules is the most granules one segment may have (its per-granule
// table is 12 bytes a granule).
const MaxGranules = 1 << 24

// Config describes an expandable segment.
type Config struct {
	// Device is the device the segment belongs to. When Prop names a
	// device it must be this one.
	Device int
	// Prop is the physical memory property of the handles.
	Prop backend.PhysicalProp
	// Granule is the nbytes of the mapping grid: every Map and Unmap
	// offset and length is a multiple of it. 0 means the driver's MINIMUM
	// granularity for Prop; otherwise it must be a multiple of that.
	Granule uint64
	// PageSize is the nbytes of the largest (full-size) handle; a nonzero
	// multiple of Granule. Under CutAtPageGrid, handles never cross a
	// multiple of PageSize.
	PageSize uint64
	// Cut says where Map cuts a range into handles (CutAtPageGrid if zero).
	Cut CutPolicy
	// VASize is the nbytes of address space to reserve; a nonzero multiple
	// of PageSize, at most MaxGranules granules.
	VASize uint64
	// Access is set on every handle mapped. Empty means read-write for
	// Prop.Location. The slice is copied.
	Access []backend.AccessDesc
	// Cache, optional, supplies full-size handles before CreatePhysical and
	// takes them back on Unmap. Its size must equal PageSize and its
	// property Prop, and it must use the same driver.
	Cache *HandleCache
	// Counters, optional, receives the segment's driver-call figures.
	Counters *Counters
	// Unmapped, optional, is told of every handle the segment unmaps
	// (Unmap, EndUnmap, Destroy), with its nbytes, after the driver's Unmap
	// and before the segment disposes of the handle. If it returns true the
	// handle is shared with another process: it never enters the
	// HandleCache (a peer may still map its memory, which another
	// allocation must not get) and is freed at once, kept as a leftover if
	// that free fails. It runs under the caller's lock, like every
	// segment call.
	Unmapped func(h backend.Handle, size uint64) (shared bool)
}

// CutPolicy says where Map cuts the range it maps into handles.
type CutPolicy uint8

const (
	// CutAtPageGrid cuts at the multiples of PageSize (offsets from Base):
	// full-size handles sit on a fixed grid, with an odd-size handle for a
	// partial page at the head and at the tail of the range.
	CutAtPageGrid CutPolicy = iota
	// CutFromStart cuts every PageSize bytes from the start of the range:
	// full-size handles from the start, one odd-size handle for the rest.
	// A range maps with at most one handle more than a whole number of
	// pages needs, and handle boundaries follow the start of the
	// allocation that caused the growth, so freeing that allocation frees
	// whole handles.
	CutFromStart
)

// Run is a range of a segment, as byte offsets from Base.
type Run struct {
	Off uint64 // offset from Base, in bytes
	Len uint64 // length, in bytes
}

// Segment is one reserved VA range and the mapping state of its granules.
// See the package documentation for the state machine. It is not safe for
// concurrent use; the caller's device lock guards every field.
type Segment struct {
	drv       backend.Driver
	dev       int
	prop      backend.PhysicalProp
	access    []backend.AccessDesc // set on every mapped handle
	base      uintptr              // start of the reservation
	size      uint64               // nbytes reserved
	gran      uint64               // nbytes per granule
	pageSize  uint64               // nbytes of a full-size handle; a multiple of gran
	maxHandle uint64               // most nbytes of any handle mapped: pageSize, or the largest MapLarge piece
	cut       CutPolicy            // where Map cuts ranges into handles
	classic   bool                 // one whole-size handle mapped at creation

	// span has one entry per granule (nil once released): 0 if the granule
	// is unmapped; k > 0 if it is the first granule of a mapped handle k
	// granules long; -d < 0 if it lies d granules after the first granule
	// of its handle. Walking a segment by handles jumps span[i] granules.
	span []int32
	// hnd has one entry per granule (nil once released): the handle at
	// the first granule of each mapped handle, 0 everywhere else.
	hnd      []backend.Handle
	nHandles int                               // handles mapped (positive entries of span)
	nGran    int                               // granules mapped (nonzero entries of span)
	cache    *HandleCache                      // optional; holds full-size handles only
	unmapped func(backend.Handle, uint64) bool // Config.Unmapped; may be nil
	c        *Counters                         // never nil
	leftover []backend.Handle                  // handles whose FreePhysical failed and that no cache holds
	// inflight are the ranges of maps begun (BeginMap) and not yet ended
	// (EndMap): their granules read as unmapped, no other map may take
	// them, and Release and Destroy wait for them (ErrBusy).
	inflight []Run
	syncOp   MapOp // the op of Map and MapLarge, which end before they return
	released bool
}

// New validates cfg (querying the driver's MINIMUM granularity for
// cfg.Prop) and reserves cfg.VASize bytes of address space with every
// granule unmapped. On failure nothing is left reserved; the error wraps
// ErrInvalidConfig for a bad config, or the driver's error.
func New(drv backend.Driver, cfg Config) (*Segment, error) {
	if drv == nil {
		return nil, fmt.Errorf("segment.New: %w: nil driver", ErrInvalidConfig)
	}
	if err := checkProp(cfg); err != nil {
		return nil, err
	}
	gran, err := granule(drv, cfg)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.PageSize == 0 || cfg.PageSize%gran != 0:
		return nil, fmt.Errorf("segment.New: %w: page size %d is not a nonzero multiple of the granule %d",
			ErrInvalidConfig, cfg.PageSize, gran)
	case cfg.VASize == 0 || cfg.VASize%cfg.PageSize != 0:
		return nil, fmt.Errorf("segment.New: %w: VA size %d is not a nonzero multiple of the page size %d",
			ErrInvalidConfig, cfg.VASize, cfg.PageSize)
	case cfg.VASize/gran > MaxGranules:
		return nil, fmt.Errorf("segment.New: %w: %d granules exceed the limit of %d",
			ErrInvalidConfig, cfg.VASize/gran, MaxGranules)
	}
	if hc := cfg.Cache; hc != nil && (hc.size != cfg.PageSize || hc.prop != cfg.Prop) {
		return nil, fmt.Errorf("segment.New: %w: handle cache holds %d-byte %v handles, segment needs %d-byte %v",
			ErrInvalidConfig, hc.size, hc.prop, cfg.PageSize, cfg.Prop)
	}
	base, err := drv.ReserveAddress(cfg.VASize)
	if err != nil {
		return nil, fmt.Errorf("segment.New: reserve %d bytes: %w", cfg.VASize, err)
	}
	s := newSegment(drv, cfg, base, cfg.VASize, gran, cfg.PageSize)
	s.cache = cfg.Cache
	return s, nil
}

// NewClassic makes a classic ("cudaMalloc") segment on device dev: size
// bytes rounded up to the MINIMUM granularity of prop are reserved, backed
// by one handle of that size, mapped, and made read-write for
// prop.Location. A failure at any step is rolled back fully. It is
// NewClassicConfig with only Device and Prop set.
func NewClassic(drv backend.Driver, dev int, size uint64, prop backend.PhysicalProp) (*Segment, error) {
	return NewClassicConfig(drv, size, Config{Device: dev, Prop: prop})
}

// NewClassicConfig is NewClassic with a full Config: cfg.Access,
// cfg.Counters and cfg.Granule (the rounding unit; 0 means the driver's
// MINIMUM granularity) are used; cfg.PageSize and cfg.VASize must be 0 or
// equal to the rounded size, and cfg.Cache must be nil.
//
// On failure every completed step is undone. If undoing itself fails,
// NewClassicConfig returns the error together with a non-nil Segment that
// truthfully holds what could not be undone (the reservation, a handle
// still mapped, or a leftover handle); the caller must Destroy it.
// Otherwise the Segment is nil whenever the error is not.
func NewClassicConfig(drv backend.Driver, size uint64, cfg Config) (*Segment, error) {
	if drv == nil {
		return nil, fmt.Errorf("segment.NewClassic: %w: nil driver", ErrInvalidConfig)
	}
	if err := checkProp(cfg); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, fmt.Errorf("segment.NewClassic: %w: zero size", ErrInvalidConfig)
	}
	if cfg.Cache != nil {
		return nil, fmt.Errorf("segment.NewClassic: %w: a classic segment takes no handle cache", ErrInvalidConfig)
	}
	gran, err := granule(drv, cfg)
	if err != nil {
		return nil, err
	}
	if size > math.MaxUint64-(gran-1) {
		return nil, fmt.Errorf("segment.NewClassic: %w: size %d too large", ErrInvalidConfig, size)
	}
	size = (size + gran - 1) / gran * gran
	if size/gran > MaxGranules {
		return nil, fmt.Errorf("segment.NewClassic: %w: %d granules exceed the limit of %d",
			ErrInvalidConfig, size/gran, MaxGranules)
	}
	if (cfg.PageSize != 0 && cfg.PageSize != size) || (cfg.VASize != 0 && cfg.VASize != size) {
		return nil, fmt.Errorf("segment.NewClassic: %w: page size %d / VA size %d differ from the rounded size %d",
			ErrInvalidConfig, cfg.PageSize, cfg.VASize, size)
	}
	base, err := drv.ReserveAddress(size)
	if err != nil {
		return nil, fmt.Errorf("segment.NewClassic: reserve %d bytes: %w", size, err)
	}
	s := newSegment(drv, cfg, base, size, gran, size)
	s.classic = true
	if err := s.mapRange(0, size, s.pageSize); err != nil {
		err = fmt.Errorf("segment.NewClassic: %w", err)
		if s.nHandles > 0 || len(s.leftover) > 0 {
			return s, err // rollback incomplete: the caller must Destroy s
		}
		if rerr := drv.ReleaseAddress(base, size); rerr != nil {
			return s, fmt.Errorf("%w; rollback incomplete: release address: %w", err, rerr)
		}
		s.markReleased()
		return nil, err
	}
	return s, nil
}

// checkProp checks that cfg.Prop agrees with cfg.Device.
func checkProp(cfg Config) error {
	if cfg.Device < 0 {
		return fmt.Errorf("segment: %w: negative device %d", ErrInvalidConfig, cfg.Device)
	}
	if loc := cfg.Prop.Location; loc.Type == backend.LocationDevice && loc.ID != cfg.Device {
		return fmt.Errorf("segment: %w: property is on device %d, segment on device %d",
			ErrInvalidConfig, loc.ID, cfg.Device)
	}
	return nil
}

// granularity queries the MINIMUM granularity of prop.
func granularity(drv backend.Driver, prop backend.PhysicalProp) (uint64, error) {
	gran, err := drv.Granularity(prop, backend.GranularityMinimum)
	if err != nil {
		return 0, fmt.Errorf("segment: %w: granularity of %v: %w", ErrInvalidConfig, prop, err)
	}
	if gran == 0 {
		return 0, fmt.Errorf("segment: %w: driver reports zero granularity for %v", ErrInvalidConfig, prop)
	}
	return gran, nil
}

// granule returns cfg.Granule, or the driver's MINIMUM granularity for
// cfg.Prop when it is 0, after checking it against that granularity.
func granule(drv backend.Driver, cfg Config) (uint64, error) {
	minGran, err := granularity(drv, cfg.Prop)
	if err != nil {
		return 0, err
	}
	if cfg.Granule == 0 {
		return minGran, nil
	}
	if cfg.Granule%minGran != 0 {
		return 0, fmt.Errorf("segment: %w: granule %d is not a multiple of the driver's granularity %d",
			ErrInvalidConfig, cfg.Granule, minGran)
	}
	return cfg.Granule, nil
}

func newSegment(drv backend.Driver, cfg Config, base uintptr, size, gran, pageSize uint64) *Segment {
	n := size / gran
	s := &Segment{
		drv:       drv,
		dev:       cfg.Device,
		prop:      cfg.Prop,
		base:      base,
		size:      size,
		gran:      gran,
		pageSize:  pageSize,
		maxHandle: pageSize,
		cut:       cfg.Cut,
		span:      make([]int32, n),
		hnd:       make([]backend.Handle, n),
		unmapped:  cfg.Unmapped,
		c:         cfg.Counters,
	}
	if len(cfg.Access) > 0 {
		s.access = append([]backend.AccessDesc(nil), cfg.Access...)
	} else {
		s.access = []backend.AccessDesc{{Location: cfg.Prop.Location, Flags: backend.AccessReadWrite}}
	}
	if s.c == nil {
		s.c = new(Counters)
	}
	return s
}

// Base is the first address of the segment.
func (s *Segment) Base() uintptr { return s.base }

// Size is the nbytes of address space the segment reserves.
func (s *Segment) Size() uint64 { return s.size }

// Granule is the nbytes of the mapping grid: Map and Unmap offsets and
// lengths are multiples of it.
func (s *Segment) Granule() uint64 { return s.gran }

// PageSize is the nbytes of the largest (full-size) handle; handles never
// cross a multiple of it.
func (s *Segment) PageSize() uint64 { return s.pageSize }

// Device is the device the segment belongs to.
func (s *Segment) Device() int { return s.dev }

// Prop is the physical property of the segment's handles.
func (s *Segment) Prop() backend.PhysicalProp { return s.prop }

// Classic reports whether this is a classic (NewClassic) segment.
func (s *Segment) Classic() bool { return s.classic }

// Released reports whether the address range has been released.
func (s *Segment) Released() bool { return s.released }

// HandleCount is the number of handles mapped.
func (s *Segment) HandleCount() int { return s.nHandles }

// MappedBytes is the nbytes mapped (the sum of the mapped handles' sizes).
func (s *Segment) MappedBytes() uint64 { return uint64(s.nGran) * s.gran }

// Leftovers is the number of handles whose FreePhysical failed and that the
// segment keeps for a retry (a full-size handle of a segment with a cache
// is kept in the cache instead).
func (s *Segment) Leftovers() int { return len(s.leftover) }

// IsMappedAt reports whether byte offset off (from Base) is mapped; false
// for an offset out of range or a released segment.
func (s *Segment) IsMappedAt(off uint64) bool {
	return !s.released && off < s.size && s.span[off/s.gran] != 0
}

// HandleRange returns the handle mapped over byte offset off (from Base):
// its first byte's offset and its nbytes. ok is false if off is unmapped,
// out of range, or the segment is released.
func (s *Segment) HandleRange(off uint64) (start, size uint64, ok bool) {
	if s.released || off >= s.size {
		return 0, 0, false
	}
	g := int(off / s.gran)
	if s.span[g] == 0 {
		return 0, 0, false
	}
	first := s.first(g)
	return uint64(first) * s.gran, uint64(s.span[first]) * s.gran, true
}

// HandleAt is HandleRange with the handle itself: the handle mapped over
// byte offset off, its first byte's offset and its nbytes.
func (s *Segment) HandleAt(off uint64) (h backend.Handle, start, size uint64, ok bool) {
	start, size, ok = s.HandleRange(off)
	if !ok {
		return 0, 0, 0, false
	}
	return s.hnd[start/s.gran], start, size, true
}

// first returns the first granule of the handle mapped over granule g,
// which must be mapped.
func (s *Segment) first(g int) int {
	if sp := s.span[g]; sp < 0 {
		return g + int(sp)
	}
	return g
}

// Handles lists the mapped handles in address order, one Run per handle,
// as byte offsets from Base; nil if none. It walks handles, not granules,
// where it can and allocates the result; it is meant for checks and
// reports, not for the hot path.
func (s *Segment) Handles() []Run {
	if s.nHandles == 0 {
		return nil
	}
	runs := make([]Run, 0, s.nHandles)
	for g := 0; g < len(s.span); {
		sp := int(s.span[g])
		if sp <= 0 {
			g++
			continue
		}
		runs = append(runs, s.run(g, g+sp))
		g += sp
	}
	return runs
}

// MappedRuns lists the maximal runs of mapped granules in address order,
// as byte offsets from Base; nil if none. A run may span many handles.
func (s *Segment) MappedRuns() []Run {
	var runs []Run
	start := -1
	for g := 0; g < len(s.span); {
		if sp := int(s.span[g]); sp > 0 {
			if start < 0 {
				start = g
			}
			g += sp
			continue
		}
		if start >= 0 {
			runs = append(runs, s.run(start, g))
			start = -1
		}
		g++
	}
	if start >= 0 {
		runs = append(runs, s.run(start, len(s.span)))
	}
	return runs
}

// WholeHandles returns the whole handles inside [off, off+n), a range the
// caller knows to be mapped: lo is the first handle boundary ≥ off and hi
// the last handle boundary ≤ off+n (offsets need not be granule-aligned).
// If limit < hi−lo, lo is raised to the handle boundary that leaves the
// smallest suffix [lo, hi) of whole handles with hi−lo ≥ limit; so limit 0
// leaves nothing and ^uint64(0) trims nothing. When no whole handle fits
// (or the segment is released, or the range is empty or out of range) it
// returns lo == hi == off.
//
// Should [off, off+n) not be entirely mapped, [lo, hi) is the first run of
// whole mapped handles in it, ending at the first unmapped granule; a
// nonempty result is therefore always a valid Unmap range. It walks the
// handles, not the granules, of a mapped range: O(handles in the range).
func (s *Segment) WholeHandles(off, n, limit uint64) (lo, hi uint64) {
	if s.released || n == 0 || off >= s.size {
		return off, off
	}
	end := off + min(n, s.size-off)
	endG := int(end / s.gran) // granules [.., endG) lie wholly before end
	g := int(off / s.gran)
	switch sp := s.span[g]; {
	case sp < 0 || (sp > 0 && off%s.gran != 0): // off inside a handle: skip it
		f := s.first(g)
		g = f + int(s.span[f])
	case sp == 0 && off%s.gran != 0: // inside an unmapped granule
		g++
	}
	for g < endG && s.span[g] == 0 { // unmapped granules (not the caller's contract)
		g++
	}
	first := g
	for g < endG && s.span[g] > 0 && g+int(s.span[g]) <= endG {
		g += int(s.span[g])
	}
	loG, hiG := first, g
	if limit < uint64(hiG-loG)*s.gran {
		// Step down from hiG one handle at a time until the suffix holds
		// limit bytes; it stops before loG since [loG, hiG) holds more.
		loG = hiG
		for uint64(hiG-loG)*s.gran < limit {
			loG = s.first(loG - 1)
		}
	}
	if loG >= hiG {
		return off, off
	}
	return uint64(loG) * s.gran, uint64(hiG) * s.gran
}

// LargeHandles returns the range [lo, hi) from the first to the end of the
// last whole handle of more than size bytes inside [off, off+n), a range the
// caller knows to be mapped (offsets need not be granule-aligned); the
// handles between them, whatever their size, are inside it too, so a
// nonempty result is a valid Unmap range. With no such handle it returns
// lo == hi == off. It walks the handles of the range: O(handles in it).
func (s *Segment) LargeHandles(off, n, size uint64) (lo, hi uint64) {
	wlo, whi := s.WholeHandles(off, n, ^uint64(0))
	lo, hi = off, off
	for at := wlo; at < whi; {
		g := int(at / s.gran)
		sp := uint64(s.span[g])
		if sp*s.gran > size {
			if lo == hi {
				lo = at
			}
			hi = at + sp*s.gran
		}
		at += sp * s.gran
	}
	return lo, hi
}

// run is the Run of granules [from, to).
func (s *Segment) run(from, to int) Run {
	return Run{Off: uint64(from) * s.gran, Len: uint64(to-from) * s.gran}
}

// va is the address of byte offset off.
func (s *Segment) va(off uint64) uintptr { return s.base + uintptr(off) }

// granules validates a byte range and returns its first granule and
// granule count.
func (s *Segment) granules(what string, off, n uint64) (first, count int, err error) {
	if s.released {
		return 0, 0, fmt.Errorf("segment: %s: %w", what, ErrReleased)
	}
	if s.classic {
		return 0, 0, fmt.Errorf("segment: %s: %w", what, ErrClassic)
	}
	if n == 0 || off%s.gran != 0 || n%s.gran != 0 {
		return 0, 0, fmt.Errorf("segment: %s [%#x, +%#x): %w: granule is %#x",
			what, off, n, ErrInvalidRange, s.gran)
	}
	if off >= s.size || n > s.size-off {
		return 0, 0, fmt.Errorf("segment: %s [%#x, +%#x): %w of size %#x", what, off, n, ErrOutOfRange, s.size)
	}
	return int(off / s.gran), int(n / s.gran), nil
}

// numPieces is the number of pieces [off, end) is cut into by the cut
// policy.
func (s *Segment) numPieces(off, end, size uint64) int {
	if s.cut == CutFromStart {
		return int((end - off + size - 1) / size)
	}
	span := end - (off - off%size)
	np := span / size
	if span%size != 0 {
		np++
	}
	return int(np)
}

// piece returns piece i of [off, end) cut by the cut policy into pieces
// of at most size bytes, as byte offsets [lo, hi).
func (s *Segment) piece(off, end, size uint64, i int) (lo, hi uint64) {
	if s.cut == CutFromStart {
		lo = off + uint64(i)*size
		return lo, min(end, lo+size)
	}
	page := off - off%size + uint64(i)*size
	return max(off, page), min(end, page+size)
}

// Map maps the n bytes at offset off (both multiples of Granule, n > 0,
// within the segment), every granule of which must be unmapped: otherwise
// it returns ErrAlreadyMapped (or ErrInvalidRange, ErrOutOfRange,
// ErrReleased, ErrClassic) and does nothing.
//
// It cuts the range into pieces by the cut policy (Config.Cut) and maps one
// handle per piece: a whole page gets a full-size handle, taken from the cache or
// created when the cache is empty; a partial page at the head or tail gets
// a handle of exactly its size, created fresh. All handles are obtained
// before any is mapped; then each is mapped and given the segment's
// access, in address order. A failure at any step rolls the whole call
// back (see the package documentation) and returns an error wrapping the
// driver's; if the rollback itself fails, that error is wrapped too and
// the segment's state says what stayed.
func (s *Segment) Map(off, n uint64) error {
	op, err := s.beginMap(off, n, s.pageSize, &s.syncOp)
	if err != nil {
		return err
	}
	op.Run()
	return s.EndMap(op)
}

// MapLarge is Map with handles of up to piece bytes (a multiple of
// Granule) instead of PageSize, cut every piece bytes from off: larger
// pieces make fewer driver calls for a large range, at the cost of coarser
// unmapping (a handle is unmapped whole); smaller ones (down to a granule)
// let every free granule be unmapped. Whole pieces come from the
// HandleCache when it holds their size (HandleCache.Hold), and Unmap
// caches them again; other handles are created fresh and freed. With
// piece == PageSize it is Map. Pieces other than a page need a
// CutFromStart segment (under CutAtPageGrid handles follow the page
// grid); otherwise, and for a bad piece, it returns ErrInvalidRange and
// does nothing.
func (s *Segment) MapLarge(off, n, piece uint64) error {
	if err := s.checkPiece(off, n, piece); err != nil {
		return err
	}
	op, err := s.beginMap(off, n, piece, &s.syncOp)
	if err != nil {
		return err
	}
	op.Run()
	return s.EndMap(op)
}

// BeginMap starts Map(off, n) in three steps, so that the caller can make
// the driver calls without the lock that guards the segment: BeginMap
// (lock held) validates the range as Map does, refuses one that overlaps
// a map in flight (ErrAlreadyMapped), and takes the full-size handles
// from the cache; MapOp.Run (lock not needed) creates the other handles
// and maps them and sets their access, touching no segment state; EndMap
// (lock held) records the handles, or rolls the whole call back as Map
// does, and returns Map's error. Every MapOp BeginMap returns must be
// ended with EndMap, after Run; until then the range counts as busy:
// Release and Destroy return ErrBusy, and its granules read as unmapped.
func (s *Segment) BeginMap(off, n uint64) (*MapOp, error) {
	return s.beginMap(off, n, s.pageSize, new(MapOp))
}

// BeginMapLarge is BeginMap for MapLarge(off, n, piece).
func (s *Segment) BeginMapLarge(off, n, piece uint64) (*MapOp, error) {
	if err := s.checkPiece(off, n, piece); err != nil {
		return nil, err
	}
	return s.beginMap(off, n, piece, new(MapOp))
}

// checkPiece validates MapLarge's piece size.
func (s *Segment) checkPiece(off, n, piece uint64) error {
	if piece == 0 || piece%s.gran != 0 || (piece != s.pageSize && s.cut != CutFromStart) {
		return fmt.Errorf("segment: map [%#x, +%#x) in %d-byte pieces: %w: want a multiple of the granule of at least a page, larger only when cutting from the start", off, n, piece, ErrInvalidRange)
	}
	return nil
}

// beginMap is BeginMap into op, whose handle slice it reuses.
func (s *Segment) beginMap(off, n, piece uint64, op *MapOp) (*MapOp, error) {
	first, count, err := s.granules("map", off, n)
	if err != nil {
		return nil, err
	}
	for g := first; g < first+count; g++ {
		if s.span[g] != 0 {
			return nil, fmt.Errorf("segment: map [%#x, +%#x): %w: granule at offset %#x",
				off, n, ErrAlreadyMapped, uint64(g)*s.gran)
		}
	}
	for _, r := range s.inflight {
		if r.Off < off+n && off < r.Off+r.Len {
			return nil, fmt.Errorf("segment: map [%#x, +%#x): %w: [%#x, +%#x) is being mapped",
				off, n, ErrAlreadyMapped, r.Off, r.Len)
		}
	}
	op.reset(s, off, off+n, piece)
	op.takeCached()
	s.inflight = append(s.inflight, Run{Off: off, Len: n})
	return op, nil
}

// MapOp is one Map in flight (BeginMap, Run, EndMap). Its fields are
// written by BeginMap and Run and read by EndMap; the caller orders the
// three (Run happens after BeginMap returns and before EndMap is called).
type MapOp struct {
	s             *Segment
	off, end      uint64           // the byte range [off, end) being mapped
	size          uint64           // most bytes per handle (the page, or MapLarge's piece)
	hs            []backend.Handle // one handle per piece; 0 where none is held
	cache0        int              // hs[cache0:cache1] came from the cache
	cache1        int
	created       int   // handles Run created
	mapped        int   // pieces Run mapped (the driver's Map succeeded), in address order
	accessOK      bool  // SetAccess succeeded on every mapped piece
	err           error // Run's failure, nil if every piece is mapped with its access set
	ran, finished bool
}

// reset makes op a fresh map of [off, end) of s in handles of at most
// size bytes, reusing its handle slice.
func (op *MapOp) reset(s *Segment, off, end, size uint64) {
	np := s.numPieces(off, end, size)
	hs := op.hs
	if cap(hs) < np {
		hs = make([]backend.Handle, np)
	}
	*op = MapOp{s: s, off: off, end: end, size: size, hs: hs[:np]}
}

// takeCached takes the full-size pieces' handles (op.size bytes each)
// from the cache, if it holds handles of that size.
func (op *MapOp) takeCached() {
	s, np := op.s, len(op.hs)
	full0, full1 := 0, np
	if s.cache == nil || !s.cache.holds(op.size) {
		full1 = 0
	}
	if lo, hi := s.piece(op.off, op.end, op.size, 0); full1 > full0 && hi-lo != op.size {
		full0 = 1
	}
	if lo, hi := s.piece(op.off, op.end, op.size, np-1); full1 > full0 && hi-lo != op.size {
		full1--
	}
	op.cache0, op.cache1 = full0, full0
	if full1 > full0 {
		op.cache1 += s.cache.take(op.hs[full0:full1], op.size)
	}
}

// Run makes the driver calls of the map: it creates the handles BeginMap
// did not take from the cache, then maps each piece and sets its access,
// in address order, and stops at the first failure (EndMap rolls back).
// It reads only what does not change after New (the driver, addresses,
// property, access), so it needs no lock; a MapOp is run once.
func (op *MapOp) Run() {
	if op.ran {
		return
	}
	op.ran = true
	s := op.s
	for i := range op.hs {
		if op.hs[i] != 0 {
			continue
		}
		lo, hi := s.piece(op.off, op.end, op.size, i)
		h, err := s.drv.CreatePhysical(hi-lo, s.prop)
		if err != nil {
			op.err = fmt.Errorf("create %d-byte handle for [%#x, %#x): %w", hi-lo, lo, hi, err)
			return
		}
		op.created++
		op.hs[i] = h
	}
	for i := range op.hs {
		lo, hi := s.piece(op.off, op.end, op.size, i)
		va := s.va(lo)
		if err := s.drv.Map(va, hi-lo, op.hs[i]); err != nil {
			op.err = fmt.Errorf("map handle [%#x, %#x) at %#x: %w", lo, hi, va, err)
			return
		}
		op.mapped++
		if err := s.drv.SetAccess(va, hi-lo, s.access); err != nil {
			op.err = fmt.Errorf("set access on handle [%#x, %#x) at %#x: %w", lo, hi, va, err)
			return
		}
	}
}

// EndMap finishes a map begun by BeginMap: after a successful Run it
// records the handles as mapped and returns nil; otherwise (Run failed,
// or was never called) it undoes the call as Map does and returns Map's
// error. Ending an op twice, or an op of another segment, returns
// ErrInvalidRange and does nothing.
func (s *Segment) EndMap(op *MapOp) error {
	if op == nil || op.s != s || op.finished {
		return fmt.Errorf("segment: end map: %w: not a map in flight on this segment", ErrInvalidRange)
	}
	op.finished = true
	for i, r := range s.inflight {
		if r.Off == op.off {
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			break
		}
	}
	off, n := op.off, op.end-op.off
	err := op.err
	if !op.ran {
		err = fmt.Errorf("%w: ended before it ran", ErrBusy)
	}
	s.c.HandlesCreated += int64(op.created)
	s.c.Maps += int64(op.mapped)
	for i := range op.mapped {
		lo, hi := s.piece(op.off, op.end, op.size, i)
		s.record(lo, hi, op.hs[i])
	}
	if err == nil {
		s.c.HandlesReused += int64(op.cache1 - op.cache0)
		s.maxHandle = max(s.maxHandle, op.size)
		clear(op.hs)
		return nil
	}
	err = s.rollbackMap(op.off, op.end, op.size, op.mapped, op.hs, op.cache0, op.cache1, err)
	clear(op.hs)
	return fmt.Errorf("segment: map [%#x, +%#x): %w", off, n, err)
}

// mapRange maps the unmapped, granule-aligned range [off, end), all or
// nothing, in handles of at most size bytes.
func (s *Segment) mapRange(off, end, size uint64) error {
	s.inflight = append(s.inflight, Run{Off: off, Len: end - off})
	op := &s.syncOp
	op.reset(s, off, end, size)
	op.takeCached()
	op.Run()
	return s.EndMap(op)
}

// rollbackMap undoes a failed map of [off, end): it unmaps its first
// nMapped pieces and gives back the handles in hs (hs[cache0:cache1] came
// from the cache, the others were created). It returns cause, with any
// rollback failure added.
func (s *Segment) rollbackMap(off, end, size uint64, nMapped int, hs []backend.Handle, cache0, cache1 int, cause error) error {
	var rbErrs []error
	for i := nMapped - 1; i >= 0; i-- {
		lo, hi := s.piece(off, end, size, i)
		if err := s.drv.Unmap(s.va(lo), hi-lo); err != nil {
			// The handle stays mapped, and recorded as such.
			rbErrs = append(rbErrs, fmt.Errorf("unmap handle [%#x, %#x) at %#x: %w", lo, hi, s.va(lo), err))
			if i >= cache0 && i < cache1 {
				s.c.HandlesReused++
			}
			hs[i] = 0
			continue
		}
		s.c.Unmaps++
		s.takeHandle(int(lo / s.gran))
	}
	for i := cache1 - 1; i >= cache0; i-- {
		if hs[i] != 0 {
			s.cache.restore(hs[i], size)
		}
	}
	for i, h := range hs {
		if h == 0 || (i >= cache0 && i < cache1) {
			continue
		}
		lo, hi := s.piece(off, end, size, i)
		if err := s.freeHandle(h, hi-lo, true); err != nil {
			rbErrs = append(rbErrs, err)
		}
	}
	if len(rbErrs) > 0 {
		return fmt.Errorf("%w; rollback incomplete: %w", cause, errors.Join(rbErrs...))
	}
	return cause
}

// record marks the granules of [lo, hi) as mapped to handle h.
func (s *Segment) record(lo, hi uint64, h backend.Handle) {
	g, k := int(lo/s.gran), int((hi-lo)/s.gran)
	s.span[g] = int32(k)
	for d := 1; d < k; d++ {
		s.span[g+d] = int32(-d)
	}
	s.hnd[g] = h
	s.nHandles++
	s.nGran += k
}

// takeHandle marks the handle whose first granule is g as unmapped and
// returns it and its nbytes.
func (s *Segment) takeHandle(g int) (backend.Handle, uint64) {
	k := int(s.span[g])
	h := s.hnd[g]
	clear(s.span[g : g+k])
	s.hnd[g] = 0
	s.nHandles--
	s.nGran -= k
	return h, uint64(k) * s.gran
}

// freeHandle frees h, of size bytes; if that fails it keeps h (in the
// cache, beyond its limit, when cacheable and the cache holds its size;
// else in the leftover list) and returns an error wrapping
// ErrHandleNotFreed.
func (s *Segment) freeHandle(h backend.Handle, size uint64, cacheable bool) error {
	if err := s.drv.FreePhysical(h); err != nil {
		if cacheable && s.cache != nil && s.cache.holds(size) {
			s.cache.restore(h, size)
			return fmt.Errorf("%w: handle %#x kept in the handle cache: %w", ErrHandleNotFreed, uint64(h), err)
		}
		s.leftover = append(s.leftover, h)
		return fmt.Errorf("%w: handle %#x kept as a leftover: %w", ErrHandleNotFreed, uint64(h), err)
	}
	s.c.HandlesFreed++
	return nil
}

// discard disposes of a handle of size nbytes just unmapped: one of a size
// the cache holds into the cache if there is one (which frees it when its
// budget is spent), any other back to the driver.
func (s *Segment) discard(h backend.Handle, size uint64) error {
	if s.unmapped != nil && s.unmapped(h, size) {
		return s.freeHandle(h, size, false) // shared: never cached
	}
	if s.cache != nil && s.cache.holds(size) {
		return s.cache.put(h, size)
	}
	return s.freeHandle(h, size, true)
}

// Unmap unmaps the n bytes at offset off (multiples of Granule, n > 0,
// within the segment). off and off+n must be handle boundaries and every
// granule in between mapped: otherwise it returns ErrInvalidRange (a
// boundary falls inside a handle, or the range overlaps an unmap begun by
// BeginUnmap and not ended) or ErrNotMapped (or ErrOutOfRange,
// ErrReleased, ErrClassic) and does nothing.
//
// It first synchronizes every stream in sync (the streams whose queued
// work may still touch the range; duplicates are synchronized once); if one
// fails it returns the error with nothing unmapped. Then, handle by handle
// in address order, it unmaps the handle and passes it to the cache if it
// is full-size (the cache frees it when full; without a cache it is freed)
// or frees it if it is odd-size.
//
// done is the nbytes of the prefix [off, off+done) now unmapped, always a
// handle boundary. If the driver's Unmap fails at a handle, Unmap stops
// there: the rest stays mapped and the error is returned. If only a
// FreePhysical fails, every handle is unmapped (done == n) and the error,
// wrapping ErrHandleNotFreed, says the handle was kept for a retry.
func (s *Segment) Unmap(off, n uint64, sync ...backend.Stream) (done uint64, err error) {
	first, end, err := s.checkUnmap(off, n)
	if err != nil {
		return 0, err
	}
	for _, r := range s.inflight {
		if r.Off < off+n && off < r.Off+r.Len {
			return 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w: [%#x, +%#x) is in flight",
				off, n, ErrInvalidRange, r.Off, r.Len)
		}
	}
	if err := s.syncStreams(sync); err != nil {
		return 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w", off, n, err)
	}
	var freeErr error
	for g := first; g < end; {
		if err := s.unmapHandle(g); err != nil {
			err = fmt.Errorf("segment: unmap [%#x, +%#x): %w", off, n, err)
			if freeErr != nil {
				err = errors.Join(err, freeErr)
			}
			return uint64(g-first) * s.gran, err
		}
		h, size := s.takeHandle(g)
		if err := s.discard(h, size); err != nil && freeErr == nil {
			freeErr = fmt.Errorf("segment: unmap [%#x, +%#x): handle at offset %#x: %w", off, n, uint64(g)*s.gran, err)
		}
		g += int(size / s.gran)
	}
	return n, freeErr
}

// unmapHandle calls the driver's Unmap on the handle whose first granule
// is g and counts it.
func (s *Segment) unmapHandle(g int) error {
	off, size := uint64(g)*s.gran, uint64(s.span[g])*s.gran
	if err := s.drv.Unmap(s.va(off), size); err != nil {
		return fmt.Errorf("unmap handle [%#x, +%#x) at %#x: %w", off, size, s.va(off), err)
	}
	s.c.Unmaps++
	return nil
}

// syncStreams synchronizes each distinct stream of sync, in order.
func (s *Segment) syncStreams(sync []backend.Stream) error {
next:
	for i, st := range sync {
		for _, prev := range sync[:i] {
			if prev == st {
				continue next
			}
		}
		if err := s.drv.StreamSynchronize(st); err != nil {
			return fmt.Errorf("synchronize stream %d: %w", st, err)
		}
		s.c.StreamSyncs++
	}
	return nil
}

// FreeLeftovers retries FreePhysical on the segment's leftover handles,
// keeping those that fail again; it returns the first error (wrapping
// ErrHandleNotFreed). It is allowed on a released segment too.
func (s *Segment) FreeLeftovers() error {
	var first error
	kept := s.leftover[:0]
	for _, h := range s.leftover {
		if err := s.drv.FreePhysical(h); err != nil {
			kept = append(kept, h)
			if first == nil {
				first = fmt.Errorf("segment: free leftover: %w: handle %#x: %w", ErrHandleNotFreed, uint64(h), err)
			}
			continue
		}
		s.c.HandlesFreed++
	}
	clear(s.leftover[len(kept):])
	s.leftover = kept
	return first
}

// Release releases the segment's address range. Every handle must be
// unmapped (else ErrNotEmpty, nothing done). Leftover handles are freed
// first; if that or ReleaseAddress fails the segment stays alive and the
// error is returned, so Release can be retried. Afterwards the segment is
// dead: Map, Unmap, Release and Destroy return ErrReleased.
func (s *Segment) Release() error {
	if s.released {
		return fmt.Errorf("segment: release: %w", ErrReleased)
	}
	if s.nHandles > 0 {
		return fmt.Errorf("segment: release: %w: %d handles mapped", ErrNotEmpty, s.nHandles)
	}
	if len(s.inflight) > 0 {
		return fmt.Errorf("segment: release: %w: [%#x, +%#x)", ErrBusy, s.inflight[0].Off, s.inflight[0].Len)
	}
	return s.release()
}

func (s *Segment) release() error {
	if err := s.FreeLeftovers(); err != nil {
		return err
	}
	if err := s.drv.ReleaseAddress(s.base, s.size); err != nil {
		return fmt.Errorf("segment: release address %#x (%d bytes): %w", s.base, s.size, err)
	}
	s.markReleased()
	return nil
}

func (s *Segment) markReleased() {
	s.released = true
	s.span = nil
	s.hnd = nil
	s.nHandles = 0
	s.nGran = 0
}

// Destroy tears the segment down: it synchronizes the streams in sync
// (when any handle is mapped; a failure returns at once with nothing
// unmapped, since queued work may still use the memory), unmaps every
// mapped handle, disposing of it as Unmap does, frees leftover handles, and
// releases the address range. It carries on past a failed unmap or handle
// free, returns the first error, and releases the address only if
// everything before succeeded, so the segment's state stays truthful and
// Destroy can be retried. It is how a classic segment is freed.
func (s *Segment) Destroy(sync ...backend.Stream) error {
	if s.released {
		return fmt.Errorf("segment: destroy: %w", ErrReleased)
	}
	if len(s.inflight) > 0 {
		return fmt.Errorf("segment: destroy: %w: [%#x, +%#x)", ErrBusy, s.inflight[0].Off, s.inflight[0].Len)
	}
	if s.nHandles > 0 {
		if err := s.syncStreams(sync); err != nil {
			return fmt.Errorf("segment: destroy: %w", err)
		}
	}
	var first error
	for g := 0; g < len(s.span); {
		sp := int(s.span[g])
		if sp <= 0 {
			g++
			continue
		}
		if err := s.unmapHandle(g); err != nil {
			if first == nil {
				first = fmt.Errorf("segment: destroy: %w", err)
			}
			g += sp
			continue
		}
		if err := s.discard(s.takeHandle(g)); err != nil && first == nil {
			first = fmt.Errorf("segment: destroy: handle at offset %#x: %w", uint64(g)*s.gran, err)
		}
		g += sp
	}
	if s.nHandles > 0 {
		return first
	}
	if err := s.release(); err != nil {
		if first == nil {
			first = fmt.Errorf("segment: destroy: %w", err)
		}
		return first
	}
	return first
}
