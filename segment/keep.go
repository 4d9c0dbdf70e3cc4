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
// mapped (the segment stays truthful) and the error says so. It is
// BeginMapKept, KeptMap.Run and EndMapKept in one call.
func (s *Segment) MapKept(k KeptHandle) error {
	if k.Handle == 0 {
		return fmt.Errorf("segment: map [%#x, +%#x): %w: no handle", k.Off, k.Size, ErrInvalidRange)
	}
	m, err := s.BeginMapKept(k.Off, k.Size)
	if err != nil {
		return err
	}
	err = m.Run(k.Handle)
	if eerr := s.EndMapKept(m); eerr != nil {
		return eerr
	}
	return err
}

// KeptMap is one MapKept in flight, in three steps like MapOp, so that
// the caller can make the driver calls without the lock that guards the
// segment: BeginMapKept (lock held) validates the range and marks it in
// flight; KeptMap.Run (no lock) maps a handle there and sets its access,
// and KeptMap.Undo (no lock) unmaps it again, touching no segment state;
// EndMapKept (lock held) records the handle as mapped if Run mapped it
// and Undo did not take it back, counts the driver calls and ends the
// mark. Until EndMapKept the range reads as unmapped, a map or unmap
// overlapping it is refused, and Release and Destroy return ErrBusy.
type KeptMap struct {
	s             *Segment
	k             KeptHandle // the range, and the handle Run mapped
	maps, unmaps  int        // driver Map and Unmap calls that succeeded
	mapped        bool       // the handle is mapped now
	ran, finished bool
}

// BeginMapKept starts the map of a kept handle of size bytes at offset
// off (see KeptMap). The granules must be unmapped and in no map or unmap
// in flight (else ErrAlreadyMapped, or a range error).
func (s *Segment) BeginMapKept(off, size uint64) (*KeptMap, error) {
	first, count, err := s.granules("map", off, size)
	if err != nil {
		return nil, err
	}
	for g := first; g < first+count; g++ {
		if s.span[g] != 0 {
			return nil, fmt.Errorf("segment: map [%#x, +%#x): %w: granule at offset %#x",
				off, size, ErrAlreadyMapped, uint64(g)*s.gran)
		}
	}
	for _, r := range s.inflight {
		if r.Off < off+size && off < r.Off+r.Len {
			return nil, fmt.Errorf("segment: map [%#x, +%#x): %w: [%#x, +%#x) is being mapped",
				off, size, ErrAlreadyMapped, r.Off, r.Len)
		}
	}
	s.inflight = append(s.inflight, Run{Off: off, Len: size})
	return &KeptMap{s: s, k: KeptHandle{Off: off, Size: size}}, nil
}

// Run maps h (of the range's size) and sets the segment's access on it.
// If SetAccess fails the handle is unmapped again; should that unmap fail
// too, it stays mapped (EndMapKept records it) and the error says so. A
// KeptMap is run once; a second Run returns ErrBusy.
func (m *KeptMap) Run(h backend.Handle) error {
	if m.ran {
		return fmt.Errorf("segment: map [%#x, +%#x): %w: run twice", m.k.Off, m.k.Size, ErrBusy)
	}
	m.ran = true
	s, k := m.s, m.k
	if h == 0 {
		return fmt.Errorf("segment: map [%#x, +%#x): %w: no handle", k.Off, k.Size, ErrInvalidRange)
	}
	m.k.Handle = h
	va := s.va(k.Off)
	if err := s.drv.Map(va, k.Size, h); err != nil {
		return fmt.Errorf("segment: map handle [%#x, +%#x) at %#x: %w", k.Off, k.Size, va, err)
	}
	m.maps++
	m.mapped = true
	if err := s.drv.SetAccess(va, k.Size, s.access); err != nil {
		err = fmt.Errorf("segment: set access on handle [%#x, +%#x) at %#x: %w", k.Off, k.Size, va, err)
		if uerr := m.Undo(); uerr != nil {
			return fmt.Errorf("%w; rollback incomplete, the handle stays mapped: %w", err, uerr)
		}
		return err
	}
	return nil
}

// Mapped reports whether the handle Run mapped is mapped now (Undo not
// called, or failed).
func (m *KeptMap) Mapped() bool { return m.mapped }

// Undo unmaps the handle Run mapped (a rollback); the handle is the
// caller's again. With nothing mapped it does nothing. If the driver's
// Unmap fails the handle stays mapped, and EndMapKept records it.
func (m *KeptMap) Undo() error {
	if !m.mapped {
		return nil
	}
	va := m.s.va(m.k.Off)
	if err := m.s.drv.Unmap(va, m.k.Size); err != nil {
		return fmt.Errorf("segment: unmap handle [%#x, +%#x) at %#x: %w", m.k.Off, m.k.Size, va, err)
	}
	m.unmaps++
	m.mapped = false
	return nil
}

// EndMapKept ends a map begun by BeginMapKept: it counts the driver calls
// Run and Undo made, and records the handle as mapped if it is (Mapped).
// Ending a KeptMap twice, or one of another segment, returns
// ErrInvalidRange and does nothing.
func (s *Segment) EndMapKept(m *KeptMap) error {
	if m == nil || m.s != s || m.finished {
		return fmt.Errorf("segment: end map: %w: not a kept map in flight on this segment", ErrInvalidRange)
	}
	m.finished = true
	for i, r := range s.inflight {
		if r.Off == m.k.Off {
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			break
		}
	}
	s.c.Maps += int64(m.maps)
	s.c.Unmaps += int64(m.unmaps)
	if m.mapped {
		s.record(m.k.Off, m.k.Off+m.k.Size, m.k.Handle)
		s.maxHandle = max(s.maxHandle, m.k.Size)
	}
	return nil
}

// KeptHandles lists the handles an UnmapOp will unmap, with their
// offsets and sizes (BeginUnmap found them), for a caller that ends it
// with EndUnmapKeep. Lock held.
func (op *UnmapOp) KeptHandles() []KeptHandle {
	out := make([]KeptHandle, len(op.handles))
	for i, r := range op.handles {
		out[i] = KeptHandle{Off: r.Off, Size: r.Len, Handle: op.s.hnd[r.Off/op.s.gran]}
	}
	return out
}

// EndUnmapKeep ends an unmap begun by BeginUnmap as UnmapKeep does: the
// handles Run unmapped (a prefix, in address order) are neither cached
// nor freed but returned, the caller's; err is Run's driver failure, the
// rest of the range staying mapped. Ending an op twice, or one of another
// segment, returns ErrInvalidRange.
func (s *Segment) EndUnmapKeep(op *UnmapOp) ([]KeptHandle, error) {
	if op == nil || op.s != s || op.finished {
		return nil, fmt.Errorf("segment: end unmap: %w: not an unmap in flight on this segment", ErrInvalidRange)
	}
	op.finished = true
	for i, r := range s.inflight {
		if r.Off == op.off {
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			break
		}
	}
	s.c.Unmaps += int64(op.unmaps)
	var kept []KeptHandle
	for g := op.first; g < op.first+op.done; {
		h, size := s.takeHandle(g)
		kept = append(kept, KeptHandle{Off: uint64(g) * s.gran, Size: size, Handle: h})
		g += int(size / s.gran)
	}
	if op.err != nil {
		return kept, fmt.Errorf("segment: unmap [%#x, +%#x): %w", op.off, op.n, op.err)
	}
	return kept, nil
}
