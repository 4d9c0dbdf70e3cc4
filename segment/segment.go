// Package segment implements one expandable segment: a reserved range of
// virtual addresses (VA) cut into fixed-size pages, each of which is either
// unmapped or mapped to a physical handle of exactly one page. It is the
// Go counterpart of PyTorch's ExpandableSegment (CUDACachingAllocator.cpp)
// built on the backend.Driver VMM primitives; the allocator above it grows
// a segment by mapping pages and shrinks it by unmapping them.
//
// # Page state machine
//
// Every page of a live segment is in one of two states:
//
//	           Map: handle from HandleCache, else CreatePhysical;
//	                driver Map; driver SetAccess
//	unmapped ─────────────────────────────────────────▶ mapped(handle)
//	    ▲                                                     │
//	    └─────────────────────────────────────────────────────┘
//	           Unmap: StreamSynchronize the given streams; driver Unmap;
//	                  handle → HandleCache (if it has room) or FreePhysical
//
// A handle that leaves a page goes to the segment's HandleCache when it has
// one and the cache has room, and back to the driver (FreePhysical)
// otherwise. A handle whose FreePhysical fails is never dropped: it stays in
// the cache (beyond its limit; HandleCache.Trim retries it) or, without a
// cache, in the segment's leftover list (FreeLeftovers, Release and Destroy
// retry it).
//
// Map is all or nothing: if any step fails for any page (creating a
// handle, mapping it, setting its access), every page this call mapped is
// unmapped again, handles taken from the cache go back to it in their old
// order, and handles created are freed; the error wraps the driver's error
// so errors.Is(err, backend.ErrOutOfMemory) works. If a rollback step itself
// fails the state stays truthful: a page the driver still maps is recorded
// as mapped with its handle, and a handle that could not be freed is kept as
// above. Unmap works page by page in address order and stops at the first
// driver Unmap error, reporting how long the unmapped prefix is.
//
// The segment itself is alive from New until Release (or Destroy)
// succeeds; afterwards every mutating call returns ErrReleased. A failed
// Release or Destroy leaves the segment alive and truthful, so it can be
// retried.
//
// # Classic segments
//
// NewClassic makes the baseline "cudaMalloc" segment: one reservation, one
// handle of the whole (granularity-rounded) size, mapped at creation. It has
// one page, is never grown or partly unmapped (Map and Unmap return
// ErrClassic), and is torn down with Destroy.
//
// # Concurrency
//
// A Segment and a HandleCache are not safe for concurrent use. The caller
// (the allocator) serialises every call to one segment and to the caches
// and Counters it shares, under its device lock. The Driver itself is safe
// for concurrent use.
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
	// ErrInvalidRange: an offset or length is not a multiple of the page
	// size, or the length is zero.
	ErrInvalidRange = errors.New("invalid range")
	// ErrOutOfRange: a range reaches past the end of the segment.
	ErrOutOfRange = errors.New("range out of segment")
	// ErrAlreadyMapped: Map was asked to map a page that is mapped.
	ErrAlreadyMapped = errors.New("page already mapped")
	// ErrNotMapped: Unmap was asked to unmap a page that is not mapped.
	ErrNotMapped = errors.New("page not mapped")
	// ErrNotEmpty: Release was called while pages are still mapped.
	ErrNotEmpty = errors.New("segment still has mapped pages")
	// ErrReleased: the segment's address range has been released.
	ErrReleased = errors.New("segment released")
	// ErrClassic: Map or Unmap was called on a classic segment.
	ErrClassic = errors.New("operation not supported on a classic segment")
	// ErrHandleNotFreed: a page was unmapped (or a rollback finished) but
	// FreePhysical of its handle failed; the handle is kept, in the handle
	// cache or the segment's leftover list, for a later retry.
	ErrHandleNotFreed = errors.New("physical handle not freed, kept for retry")
)

// MaxPages is the most pages one segment may have (its per-page table is
// 8 bytes a page).
const MaxPages = 1 << 24

// Config describes an expandable segment.
type Config struct {
	// Device is the device the segment belongs to. When Prop names a
	// device it must be this one.
	Device int
	// Prop is the physical memory property of the pages.
	Prop backend.PhysicalProp
	// PageSize is the nbytes of each page, i.e. of each physical handle;
	// a nonzero multiple of the driver's MINIMUM granularity for Prop.
	PageSize uint64
	// VASize is the nbytes of address space to reserve; a nonzero multiple
	// of PageSize, at most MaxPages pages.
	VASize uint64
	// Access is set on every page mapped. Empty means read-write for
	// Prop.Location. The slice is copied.
	Access []backend.AccessDesc
	// Cache, optional, supplies handles before CreatePhysical and takes
	// them back on Unmap. Its size must equal PageSize and its property
	// Prop, and it must use the same driver.
	Cache *HandleCache
	// Counters, optional, receives the segment's driver-call figures.
	Counters *Counters
}

// Run is a range of a segment, as byte offsets from Base.
type Run struct {
	Off uint64 // offset from Base, in bytes
	Len uint64 // length, in bytes
}

// Segment is one reserved VA range and the mapping state of its pages. See
// the package documentation for the state machine. It is not safe for
// concurrent use; the caller's device lock guards every field.
type Segment struct {
	drv      backend.Driver
	dev      int
	prop     backend.PhysicalProp
	access   []backend.AccessDesc // set on every mapped page
	base     uintptr              // start of the reservation
	size     uint64               // nbytes reserved
	pageSize uint64               // nbytes per page and per handle
	classic  bool                 // one whole-size page mapped at creation

	handles  []backend.Handle // per page: its handle, 0 if unmapped; nil once released
	mapped   int              // npages mapped (nonzero entries of handles)
	cache    *HandleCache     // optional
	c        *Counters        // never nil
	leftover []backend.Handle // handles whose FreePhysical failed (no cache)
	scratch  []backend.Handle // reused by Map: the handles of the pages being mapped
	released bool
}

// New validates cfg (querying the driver's MINIMUM granularity for
// cfg.Prop) and reserves cfg.VASize bytes of address space with every page
// unmapped. On failure nothing is left reserved; the error wraps
// ErrInvalidConfig for a bad config, or the driver's error.
func New(drv backend.Driver, cfg Config) (*Segment, error) {
	if drv == nil {
		return nil, fmt.Errorf("segment.New: %w: nil driver", ErrInvalidConfig)
	}
	if err := checkProp(cfg); err != nil {
		return nil, err
	}
	gran, err := granularity(drv, cfg.Prop)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.PageSize == 0 || cfg.PageSize%gran != 0:
		return nil, fmt.Errorf("segment.New: %w: page size %d is not a nonzero multiple of the granularity %d",
			ErrInvalidConfig, cfg.PageSize, gran)
	case cfg.VASize == 0 || cfg.VASize%cfg.PageSize != 0:
		return nil, fmt.Errorf("segment.New: %w: VA size %d is not a nonzero multiple of the page size %d",
			ErrInvalidConfig, cfg.VASize, cfg.PageSize)
	case cfg.VASize/cfg.PageSize > MaxPages:
		return nil, fmt.Errorf("segment.New: %w: %d pages exceed the limit of %d",
			ErrInvalidConfig, cfg.VASize/cfg.PageSize, MaxPages)
	}
	if hc := cfg.Cache; hc != nil && (hc.size != cfg.PageSize || hc.prop != cfg.Prop) {
		return nil, fmt.Errorf("segment.New: %w: handle cache holds %d-byte %v handles, segment needs %d-byte %v",
			ErrInvalidConfig, hc.size, hc.prop, cfg.PageSize, cfg.Prop)
	}
	base, err := drv.ReserveAddress(cfg.VASize)
	if err != nil {
		return nil, fmt.Errorf("segment.New: reserve %d bytes: %w", cfg.VASize, err)
	}
	s := newSegment(drv, cfg, base, cfg.VASize, cfg.PageSize)
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

// NewClassicConfig is NewClassic with a full Config: cfg.Access and
// cfg.Counters are used; cfg.PageSize and cfg.VASize must be 0 or equal to
// the rounded size, and cfg.Cache must be nil.
//
// On failure every completed step is undone. If undoing itself fails,
// NewClassicConfig returns the error together with a non-nil Segment that
// truthfully holds what could not be undone (the reservation, a page still
// mapped, or a leftover handle); the caller must Destroy it. Otherwise the
// Segment is nil whenever the error is not.
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
	gran, err := granularity(drv, cfg.Prop)
	if err != nil {
		return nil, err
	}
	if size > math.MaxUint64-(gran-1) {
		return nil, fmt.Errorf("segment.NewClassic: %w: size %d too large", ErrInvalidConfig, size)
	}
	size = (size + gran - 1) / gran * gran
	if (cfg.PageSize != 0 && cfg.PageSize != size) || (cfg.VASize != 0 && cfg.VASize != size) {
		return nil, fmt.Errorf("segment.NewClassic: %w: page size %d / VA size %d differ from the rounded size %d",
			ErrInvalidConfig, cfg.PageSize, cfg.VASize, size)
	}
	base, err := drv.ReserveAddress(size)
	if err != nil {
		return nil, fmt.Errorf("segment.NewClassic: reserve %d bytes: %w", size, err)
	}
	s := newSegment(drv, cfg, base, size, size)
	s.classic = true
	if err := s.mapPages(0, 1); err != nil {
		err = fmt.Errorf("segment.NewClassic: %w", err)
		if s.mapped > 0 || len(s.leftover) > 0 {
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

func newSegment(drv backend.Driver, cfg Config, base uintptr, size, pageSize uint64) *Segment {
	s := &Segment{
		drv:      drv,
		dev:      cfg.Device,
		prop:     cfg.Prop,
		base:     base,
		size:     size,
		pageSize: pageSize,
		handles:  make([]backend.Handle, size/pageSize),
		c:        cfg.Counters,
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

// PageSize is the nbytes of each page (and each physical handle).
func (s *Segment) PageSize() uint64 { return s.pageSize }

// NumPages is the number of pages, Size / PageSize.
func (s *Segment) NumPages() int { return int(s.size / s.pageSize) }

// Device is the device the segment belongs to.
func (s *Segment) Device() int { return s.dev }

// Prop is the physical property of the segment's pages.
func (s *Segment) Prop() backend.PhysicalProp { return s.prop }

// Classic reports whether this is a classic (NewClassic) segment.
func (s *Segment) Classic() bool { return s.classic }

// Released reports whether the address range has been released.
func (s *Segment) Released() bool { return s.released }

// MappedPages is the number of pages mapped.
func (s *Segment) MappedPages() int { return s.mapped }

// MappedBytes is the nbytes of pages mapped.
func (s *Segment) MappedBytes() uint64 { return uint64(s.mapped) * s.pageSize }

// IsMapped reports whether page (an index, 0 ≤ page < NumPages) is mapped;
// false for an index out of range.
func (s *Segment) IsMapped(page int) bool { return s.Handle(page) != 0 }

// Handle is the handle mapped at page, or 0 if the page is unmapped or the
// index is out of range.
func (s *Segment) Handle(page int) backend.Handle {
	if page < 0 || page >= len(s.handles) {
		return 0
	}
	return s.handles[page]
}

// Leftovers is the number of handles whose FreePhysical failed and that the
// segment keeps for a retry (handles of a segment with a cache are kept in
// the cache instead).
func (s *Segment) Leftovers() int { return len(s.leftover) }

// MappedRuns lists the maximal runs of mapped pages in address order, as
// byte offsets from Base.
func (s *Segment) MappedRuns() []Run {
	var runs []Run
	start := -1
	for p, h := range s.handles {
		switch {
		case h != 0 && start < 0:
			start = p
		case h == 0 && start >= 0:
			runs = append(runs, s.run(start, p))
			start = -1
		}
	}
	if start >= 0 {
		runs = append(runs, s.run(start, len(s.handles)))
	}
	return runs
}

func (s *Segment) run(from, to int) Run {
	return Run{Off: uint64(from) * s.pageSize, Len: uint64(to-from) * s.pageSize}
}

// va is the address of page p.
func (s *Segment) va(p int) uintptr { return s.base + uintptr(uint64(p)*s.pageSize) }

// pages validates a byte range and returns its first page and page count.
func (s *Segment) pages(what string, off, n uint64) (first, count int, err error) {
	if s.released {
		return 0, 0, fmt.Errorf("segment: %s: %w", what, ErrReleased)
	}
	if s.classic {
		return 0, 0, fmt.Errorf("segment: %s: %w", what, ErrClassic)
	}
	if n == 0 || off%s.pageSize != 0 || n%s.pageSize != 0 {
		return 0, 0, fmt.Errorf("segment: %s [%#x, +%#x): %w: page size is %#x",
			what, off, n, ErrInvalidRange, s.pageSize)
	}
	if off >= s.size || n > s.size-off {
		return 0, 0, fmt.Errorf("segment: %s [%#x, +%#x): %w of size %#x", what, off, n, ErrOutOfRange, s.size)
	}
	return int(off / s.pageSize), int(n / s.pageSize), nil
}

// Map maps the n bytes at offset off (both multiples of PageSize, n > 0,
// within the segment), every page of which must be unmapped: otherwise it
// returns ErrAlreadyMapped (or ErrInvalidRange, ErrOutOfRange,
// ErrReleased, ErrClassic) and does nothing.
//
// For each page it takes a handle from the cache, or creates one when the
// cache is empty (all handles are obtained before any is mapped), maps it
// and sets the segment's access on it. A failure at any step rolls the
// whole call back (see the package documentation) and returns an error
// wrapping the driver's; if the rollback itself fails, that error is
// wrapped too and the segment's state says what stayed.
func (s *Segment) Map(off, n uint64) error {
	first, count, err := s.pages("map", off, n)
	if err != nil {
		return err
	}
	for p := first; p < first+count; p++ {
		if s.handles[p] != 0 {
			return fmt.Errorf("segment: map [%#x, +%#x): %w: page %d at %#x",
				off, n, ErrAlreadyMapped, p, s.va(p))
		}
	}
	if err := s.mapPages(first, count); err != nil {
		return fmt.Errorf("segment: map [%#x, +%#x): %w", off, n, err)
	}
	return nil
}

// mapPages maps the unmapped pages [first, first+count), all or nothing.
func (s *Segment) mapPages(first, count int) error {
	if cap(s.scratch) < count {
		s.scratch = make([]backend.Handle, count)
	}
	hs := s.scratch[:count]
	defer clear(hs)

	fromCache := 0
	if s.cache != nil {
		fromCache = s.cache.take(hs)
	}
	for i := fromCache; i < count; i++ {
		h, err := s.drv.CreatePhysical(s.pageSize, s.prop)
		if err != nil {
			err = fmt.Errorf("create handle for page %d: %w", first+i, err)
			return s.rollbackMap(first, 0, hs[:i], fromCache, err)
		}
		s.c.HandlesCreated++
		hs[i] = h
	}
	for i := range count {
		p := first + i
		va := s.va(p)
		if err := s.drv.Map(va, s.pageSize, hs[i]); err != nil {
			err = fmt.Errorf("map page %d at %#x: %w", p, va, err)
			return s.rollbackMap(first, i, hs, fromCache, err)
		}
		s.c.Maps++
		s.handles[p] = hs[i]
		s.mapped++
		if err := s.drv.SetAccess(va, s.pageSize, s.access); err != nil {
			err = fmt.Errorf("set access on page %d at %#x: %w", p, va, err)
			return s.rollbackMap(first, i+1, hs, fromCache, err)
		}
	}
	s.c.HandlesReused += int64(fromCache)
	return nil
}

// rollbackMap undoes a failed mapPages: it unmaps pages [first,
// first+nMapped) and gives back the handles in hs (hs[:fromCache] came from
// the cache, the rest were created). It returns cause, with any rollback
// failure added.
func (s *Segment) rollbackMap(first, nMapped int, hs []backend.Handle, fromCache int, cause error) error {
	var rbErrs []error
	for i := nMapped - 1; i >= 0; i-- {
		p := first + i
		if err := s.drv.Unmap(s.va(p), s.pageSize); err != nil {
			// The page stays mapped and keeps its handle.
			rbErrs = append(rbErrs, fmt.Errorf("unmap page %d at %#x: %w", p, s.va(p), err))
			if i < fromCache {
				s.c.HandlesReused++
			}
			hs[i] = 0
			continue
		}
		s.c.Unmaps++
		s.handles[p] = 0
		s.mapped--
	}
	for i := min(fromCache, len(hs)) - 1; i >= 0; i-- {
		if hs[i] != 0 {
			s.cache.restore(hs[i])
		}
	}
	for i := fromCache; i < len(hs); i++ {
		if hs[i] != 0 {
			if err := s.freeHandle(hs[i]); err != nil {
				rbErrs = append(rbErrs, err)
			}
		}
	}
	if len(rbErrs) > 0 {
		return fmt.Errorf("%w; rollback incomplete: %w", cause, errors.Join(rbErrs...))
	}
	return cause
}

// freeHandle frees h; if that fails it keeps h (in the cache, beyond its
// limit, or in the leftover list) and returns an error wrapping
// ErrHandleNotFreed.
func (s *Segment) freeHandle(h backend.Handle) error {
	if err := s.drv.FreePhysical(h); err != nil {
		if s.cache != nil {
			s.cache.restore(h)
			return fmt.Errorf("%w: handle %#x kept in the handle cache: %w", ErrHandleNotFreed, uint64(h), err)
		}
		s.leftover = append(s.leftover, h)
		return fmt.Errorf("%w: handle %#x kept as a leftover: %w", ErrHandleNotFreed, uint64(h), err)
	}
	s.c.HandlesFreed++
	return nil
}

// discard disposes of the handle of a page just unmapped: into the cache if
// there is one (which frees it when full), else back to the driver.
func (s *Segment) discard(h backend.Handle) error {
	if s.cache != nil {
		return s.cache.put(h)
	}
	return s.freeHandle(h)
}

// Unmap unmaps the n bytes at offset off (multiples of PageSize, n > 0,
// within the segment), every page of which must be mapped: otherwise it
// returns ErrNotMapped (or ErrInvalidRange, ErrOutOfRange, ErrReleased,
// ErrClassic) and does nothing.
//
// It first synchronizes every stream in sync (the streams whose queued
// work may still touch the range; duplicates are synchronized once); if one
// fails it returns the error with nothing unmapped. Then, page by page in
// address order, it unmaps the page and passes its handle to the cache (or
// frees it when there is no cache or the cache is full).
//
// done is the nbytes of the prefix [off, off+done) now unmapped. If the
// driver's Unmap fails at a page, Unmap stops there: the rest stays mapped
// and the error is returned. If only a FreePhysical fails, every page is
// unmapped (done == n) and the error, wrapping ErrHandleNotFreed, says the
// handle was kept for a retry.
func (s *Segment) Unmap(off, n uint64, sync ...backend.Stream) (done uint64, err error) {
	first, count, err := s.pages("unmap", off, n)
	if err != nil {
		return 0, err
	}
	for p := first; p < first+count; p++ {
		if s.handles[p] == 0 {
			return 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w: page %d at %#x",
				off, n, ErrNotMapped, p, s.va(p))
		}
	}
	if err := s.syncStreams(sync); err != nil {
		return 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w", off, n, err)
	}
	var freeErr error
	for i := range count {
		p := first + i
		if err := s.unmapPage(p); err != nil {
			err = fmt.Errorf("segment: unmap [%#x, +%#x): %w", off, n, err)
			if freeErr != nil {
				err = errors.Join(err, freeErr)
			}
			return uint64(i) * s.pageSize, err
		}
		if err := s.discard(s.takeHandle(p)); err != nil && freeErr == nil {
			freeErr = fmt.Errorf("segment: unmap [%#x, +%#x): page %d: %w", off, n, p, err)
		}
	}
	return n, freeErr
}

// unmapPage calls the driver's Unmap on page p and counts it.
func (s *Segment) unmapPage(p int) error {
	if err := s.drv.Unmap(s.va(p), s.pageSize); err != nil {
		return fmt.Errorf("unmap page %d at %#x: %w", p, s.va(p), err)
	}
	s.c.Unmaps++
	return nil
}

// takeHandle records page p as unmapped and returns its handle.
func (s *Segment) takeHandle(p int) backend.Handle {
	h := s.handles[p]
	s.handles[p] = 0
	s.mapped--
	return h
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

// Release releases the segment's address range. Every page must be
// unmapped (else ErrNotEmpty, nothing done). Leftover handles are freed
// first; if that or ReleaseAddress fails the segment stays alive and the
// error is returned, so Release can be retried. Afterwards the segment is
// dead: Map, Unmap, Release and Destroy return ErrReleased.
func (s *Segment) Release() error {
	if s.released {
		return fmt.Errorf("segment: release: %w", ErrReleased)
	}
	if s.mapped > 0 {
		return fmt.Errorf("segment: release: %w: %d pages mapped", ErrNotEmpty, s.mapped)
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
	s.handles = nil
	s.scratch = nil
	s.mapped = 0
}

// Destroy tears the segment down: it synchronizes the streams in sync
// (when any page is mapped; a failure returns at once with nothing
// unmapped, since queued work may still use the memory), unmaps every
// mapped page, disposing of its handle as Unmap does, frees leftover
// handles, and releases the address range. It carries on past a failed
// page unmap or handle free, returns the first error, and releases the
// address only if everything before succeeded, so the segment's state stays
// truthful and Destroy can be retried. It is how a classic segment is
// freed.
func (s *Segment) Destroy(sync ...backend.Stream) error {
	if s.released {
		return fmt.Errorf("segment: destroy: %w", ErrReleased)
	}
	if s.mapped > 0 {
		if err := s.syncStreams(sync); err != nil {
			return fmt.Errorf("segment: destroy: %w", err)
		}
	}
	var first error
	for p, h := range s.handles {
		if h == 0 {
			continue
		}
		if err := s.unmapPage(p); err != nil {
			if first == nil {
				first = fmt.Errorf("segment: destroy: %w", err)
			}
			continue
		}
		if err := s.discard(s.takeHandle(p)); err != nil && first == nil {
			first = fmt.Errorf("segment: destroy: page %d: %w", p, err)
		}
	}
	if s.mapped > 0 {
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
