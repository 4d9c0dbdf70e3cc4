package segment

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Kept handles: unmapping physical memory without giving it up, and
// mapping a given handle at a given offset. The allocator's sleep and
// wake (a pool's memory is unmapped and freed, its addresses kept, then
// mapped again with fresh handles at exactly the old places) are built on
// them: UnmapKeep hands the unmapped handles to the caller instead of the
// HandleCache or FreePhysical, so a failure half way can map them back
// with their contents (MapKept), and MapKept maps a handle of exactly the
// size and offset the caller recorded, whatever the cut policy.

// KeptHandle is a physical handle unmapped by UnmapKeep (or created by the
// caller) and the place it is mapped at: its first byte's offset from
// Base and its nbytes.
type KeptHandle struct {
	Off    uint64
	Size   uint64
	Handle backend.Handle
}

// UnmapKeep unmaps the whole handles of [off, off+n), in address order, as
// Unmap does, but neither caches nor frees them: it returns them, and they
// are the caller's (to free, or to map again with MapKept). It makes no
// stream synchronize. A bad range changes nothing (Unmap's errors). If the
// driver's Unmap fails at a handle it stops there: the handles before it
// are returned, unmapped, with the error, and the rest stays mapped.
func (s *Segment) UnmapKeep(off, n uint64) ([]KeptHandle, error) {
	first, end, err := s.checkUnmap(off, n)
	if err != nil {
		return nil, err
	}
	for _, r := range s.inflight {
		if r.Off < off+n && off < r.Off+r.Len {
			return nil, fmt.Errorf("segment: unmap [%#x, +%#x): %w: [%#x, +%#x) is in flight",
				off, n, ErrInvalidRange, r.Off, r.Len)
		}
	}
	var kept []KeptHandle
	for g := first; g < end; {
		if err := s.unmapHandle(g); err != nil {
			return kept, fmt.Errorf("segment: unmap [%#x, +%#x): %w", off, n, err)
		}
		h, size := s.takeHandle(g)
		kept = append(kept, KeptHandle{Off: uint64(g) * s.gran, Size: size, Handle: h})
		g += int(size / s.gran)
	}
	return kept, nil
}

// MapKept maps k.Handle (k.Size bytes, the handle's whole size) at offset
// k.Off, gives it the segment's access, and records it as mapped. The
// granules must be unmapped and in no map in flight (else
// ErrAlreadyMapped, or a range error, and nothing is done). If the
// driver's Map or SetAccess fails the handle is unmapped again and stays
// the caller's; should that unmap fail too, the handle is recorded as
// mapped (the segment stays truthful) and the error says so.
func (s *Segment) MapKept(k KeptHandle) error {
	first, count, err := s.granules("map", k.Off, k.Size)
	if err != nil {
		return err
	}
	if k.Handle == 0 {
		return fmt.Errorf("segment: map [%#x, +%#x): %w: no handle", k.Off, k.Size, ErrInvalidRange)
	}
	for g := first; g < first+count; g++ {
		if s.span[g] != 0 {
			return fmt.Errorf("segment: map [%#x, +%#x): %w: granule at offset %#x",
				k.Off, k.Size, ErrAlreadyMapped, uint64(g)*s.gran)
		}
	}
	for _, r := range s.inflight {
		if r.Off < k.Off+k.Size && k.Off < r.Off+r.Len {
			return fmt.Errorf("segment: map [%#x, +%#x): %w: [%#x, +%#x) is being mapped",
				k.Off, k.Size, ErrAlreadyMapped, r.Off, r.Len)
		}
	}
	va := s.va(k.Off)
	if err := s.drv.Map(va, k.Size, k.Handle); err != nil {
		return fmt.Errorf("segment: map handle [%#x, +%#x) at %#x: %w", k.Off, k.Size, va, err)
	}
	s.c.Maps++
	if err := s.drv.SetAccess(va, k.Size, s.access); err != nil {
		err = fmt.Errorf("segment: set access on handle [%#x, +%#x) at %#x: %w", k.Off, k.Size, va, err)
		if uerr := s.drv.Unmap(va, k.Size); uerr != nil {
			s.record(k.Off, k.Off+k.Size, k.Handle)
			return fmt.Errorf("%w; rollback incomplete, the handle stays mapped: %w", err, uerr)
		}
		s.c.Unmaps++
		return err
	}
	s.record(k.Off, k.Off+k.Size, k.Handle)
	s.maxHandle = max(s.maxHandle, k.Size)
	return nil
}
