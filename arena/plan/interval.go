package plan

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// Interval is one block of a step: Size bytes, live from call index Birth
// (its Malloc) to Death (its Free), Birth < Death. Call indices are
// positions in the step's call sequence; the lifetime is the half-open
// [Birth, Death), so an interval whose Death is t and one whose Birth is t
// may share memory.
type Interval struct {
	Size, Birth, Death uint64
}

// Sentinel errors; the errors returned by Pack, Verify and Validate wrap
// one of them (test with errors.Is) and are an *IntervalError or an
// *OverlapError where they concern intervals.
var (
	// ErrZeroSize: an interval of 0 bytes.
	ErrZeroSize = errors.New("plan: interval of zero size")
	// ErrLifetime: an interval with Birth >= Death.
	ErrLifetime = errors.New("plan: interval's birth is not before its death")
	// ErrAlign: align is 0 or not a power of two.
	ErrAlign = errors.New("plan: alignment is not a power of two")
	// ErrOverflow: a size rounded up to align, or an offset plus a size,
	// does not fit in 64 bits.
	ErrOverflow = errors.New("plan: offset or size overflows 64 bits")
	// ErrLength: offsets and intervals differ in length (Verify).
	ErrLength = errors.New("plan: offsets and intervals differ in length")
	// ErrMisaligned: an offset or the region size is not a multiple of
	// align (Verify).
	ErrMisaligned = errors.New("plan: offset or size is not aligned")
	// ErrOutside: an interval ends beyond the region (Verify).
	ErrOutside = errors.New("plan: interval ends beyond the region")
	// ErrOverlap: two intervals live at the same time share an address
	// (Verify).
	ErrOverlap = errors.New("plan: two live intervals overlap in address")
	// ErrTooMany: more intervals than Pack indexes (maxIntervals, 2^31-1).
	ErrTooMany = errors.New("plan: too many intervals")
)

// maxIntervals is the most intervals Pack takes: it numbers them in int32.
// A variable so that tests can lower it.
var maxIntervals = math.MaxInt32

// IntervalError says which interval a check failed on.
type IntervalError struct {
	Index    int      // position in the slice given
	Interval Interval // its value
	Offset   uint64   // its offset, for ErrMisaligned and ErrOutside (0 otherwise)
	Err      error    // one of the sentinel errors
}

func (e *IntervalError) Error() string {
	msg := fmt.Sprintf("%v: interval %d {size %d, birth %d, death %d}",
		e.Err, e.Index, e.Interval.Size, e.Interval.Birth, e.Interval.Death)
	if e.Err == ErrMisaligned || e.Err == ErrOutside {
		msg += fmt.Sprintf(" at offset %d", e.Offset)
	}
	return msg
}

func (e *IntervalError) Unwrap() error { return e.Err }

// OverlapError names two intervals, live at the same time, whose address
// ranges overlap.
type OverlapError struct {
	I, J int // indices into the slice given, I < J
}

func (e *OverlapError) Error() string {
	return fmt.Sprintf("%v: intervals %d and %d", ErrOverlap, e.I, e.J)
}

func (e *OverlapError) Unwrap() error { return ErrOverlap }

// Validate reports whether Pack accepts ivs and align: align a power of
// two, at most 2^31-1 intervals, every one of nonzero size with
// Birth < Death and a size that rounds up to align within 64 bits.
func Validate(ivs []Interval, align uint64) error {
	if align == 0 || align&(align-1) != 0 {
		return fmt.Errorf("%w: %d", ErrAlign, align)
	}
	if len(ivs) > maxIntervals {
		return fmt.Errorf("%w: %d", ErrTooMany, len(ivs))
	}
	for i, iv := range ivs {
		var err error
		switch {
		case iv.Size == 0:
			err = ErrZeroSize
		case iv.Birth >= iv.Death:
			err = ErrLifetime
		case iv.Size > math.MaxUint64-(align-1):
			err = ErrOverflow
		}
		if err != nil {
			return &IntervalError{Index: i, Interval: iv, Err: err}
		}
	}
	return nil
}

// roundUp rounds n up to align (a power of two); the caller has checked
// that it fits.
func roundUp(n, align uint64) uint64 { return (n + align - 1) &^ (align - 1) }

// PeakLive returns the lower bound on any packing's size: the largest sum,
// over any instant, of the sizes (each rounded up to align) of the
// intervals live then. It saturates at math.MaxUint64, and returns 0 for
// input that Validate rejects.
func PeakLive(ivs []Interval, align uint64) uint64 {
	if Validate(ivs, align) != nil {
		return 0
	}
	type event struct {
		t    uint64
		size uint64
		born bool
	}
	evs := make([]event, 0, 2*len(ivs))
	for _, iv := range ivs {
		s := roundUp(iv.Size, align)
		evs = append(evs, event{iv.Birth, s, true}, event{iv.Death, s, false})
	}
	// Deaths before births at the same instant: lifetimes are half-open.
	sort.Slice(evs, func(a, b int) bool {
		if evs[a].t != evs[b].t {
			return evs[a].t < evs[b].t
		}
		return !evs[a].born && evs[b].born
	})
	// The running sum is kept as a 128-bit value so that it stays exact
	// even when it exceeds 64 bits.
	var hi, lo, peakHi, peakLo uint64
	for _, e := range evs {
		if e.born {
			var c uint64
			lo, c = bits.Add64(lo, e.size, 0)
			hi += c
			if hi > peakHi || (hi == peakHi && lo > peakLo) {
				peakHi, peakLo = hi, lo
			}
		} else {
			var b uint64
			lo, b = bits.Sub64(lo, e.size, 0)
			hi -= b
		}
	}
	if peakHi != 0 {
		return math.MaxUint64
	}
	return peakLo
}

func trailingZeros(w uint64) int { return bits.TrailingZeros64(w) }
