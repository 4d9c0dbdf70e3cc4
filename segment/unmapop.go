package segment

import (
	"errors"
	"fmt"
)

// UnmapOp is one Unmap in flight, in three steps like MapOp: BeginUnmap
// (lock held) validates the range as Unmap does and marks it busy;
// UnmapOp.Run (lock not needed) makes the driver's Unmap calls, handle
// by handle in address order, stopping at the first failure, and touches
// no segment, cache or Counters state; EndUnmap (lock held) marks the
// handles Run unmapped as unmapped, passes each to the cache or frees it
// as Unmap does, and counts the calls. Until EndUnmap the range's
// handles still read as mapped (the caller keeps everything else off
// them), another Unmap or BeginUnmap overlapping it is refused
// (ErrInvalidRange), and Release and Destroy return ErrBusy. It does not
// synchronize streams: the caller waits for queued work first.
type UnmapOp struct {
	s             *Segment
	off, n        uint64 // the byte range [off, off+n)
	first         int    // its first granule
	handles       []Run  // its handles, in address order, as BeginUnmap found them
	done          int    // granules [first, first+done) Run unmapped, whole handles
	unmaps        int    // handles Run unmapped
	err           error  // the driver's Unmap failure, if any
	ran, finished bool
}

// BeginUnmap starts Unmap(off, n) without its streams (see UnmapOp). It
// returns the errors Unmap returns for a bad range, and ErrInvalidRange
// for a range overlapping a map or unmap in flight.
func (s *Segment) BeginUnmap(off, n uint64) (*UnmapOp, error) {
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
	op := &UnmapOp{s: s, off: off, n: n, first: first}
	for g := first; g < end; g += int(s.span[g]) {
		op.handles = append(op.handles, s.run(g, g+int(s.span[g])))
	}
	s.inflight = append(s.inflight, Run{Off: off, Len: n})
	return op, nil
}

// Run unmaps the range's handles with the driver, in address order, and
// stops at the first failure. It reads only the handle list BeginUnmap
// made and what does not change after New, so it needs no lock; an
// UnmapOp is run once.
func (op *UnmapOp) Run() {
	if op.ran {
		return
	}
	op.ran = true
	s := op.s
	for _, h := range op.handles {
		if err := s.drv.Unmap(s.va(h.Off), h.Len); err != nil {
			op.err = fmt.Errorf("unmap handle [%#x, +%#x) at %#x: %w", h.Off, h.Len, s.va(h.Off), err)
			return
		}
		op.unmaps++
		op.done += int(h.Len / s.gran)
	}
}

// EndUnmap finishes an unmap begun by BeginUnmap, with Unmap's results:
// done is the nbytes of the prefix now unmapped (a handle boundary; 0 if
// Run was never called), err the driver's Unmap failure and/or, wrapping
// ErrHandleNotFreed, a handle whose free failed and was kept. Ending an op
// twice, or one of another segment, returns ErrInvalidRange.
func (s *Segment) EndUnmap(op *UnmapOp) (done uint64, err error) {
	if op == nil || op.s != s || op.finished {
		return 0, fmt.Errorf("segment: end unmap: %w: not an unmap in flight on this segment", ErrInvalidRange)
	}
	op.finished = true
	for i, r := range s.inflight {
		if r.Off == op.off {
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			break
		}
	}
	s.c.Unmaps += int64(op.unmaps)
	var freeErr error
	for g := op.first; g < op.first+op.done; {
		h, size := s.takeHandle(g)
		if err := s.discard(h, size); err != nil && freeErr == nil {
			freeErr = fmt.Errorf("segment: unmap [%#x, +%#x): handle at offset %#x: %w", op.off, op.n, uint64(g)*s.gran, err)
		}
		g += int(size / s.gran)
	}
	if op.err != nil {
		err = fmt.Errorf("segment: unmap [%#x, +%#x): %w", op.off, op.n, op.err)
	}
	return uint64(op.done) * s.gran, errors.Join(err, freeErr)
}

// checkUnmap validates an Unmap range: granule-aligned, within the
// segment, every granule mapped, starting and ending at handle
// boundaries. It returns the range's granules.
func (s *Segment) checkUnmap(off, n uint64) (first, end int, err error) {
	first, count, err := s.granules("unmap", off, n)
	if err != nil {
		return 0, 0, err
	}
	end = first + count
	for g := first; g < end; {
		sp := int(s.span[g])
		switch {
		case sp == 0:
			return 0, 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w: granule at offset %#x",
				off, n, ErrNotMapped, uint64(g)*s.gran)
		case sp < 0:
			st, size, _ := s.HandleRange(off)
			return 0, 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w: start is inside the handle [%#x, +%#x)",
				off, n, ErrInvalidRange, st, size)
		}
		if g+sp > end {
			return 0, 0, fmt.Errorf("segment: unmap [%#x, +%#x): %w: end is inside the handle [%#x, +%#x)",
				off, n, ErrInvalidRange, uint64(g)*s.gran, uint64(sp)*s.gran)
		}
		g += sp
	}
	return first, end, nil
}
