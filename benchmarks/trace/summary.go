package trace

import (
	"fmt"
	"io"
	"math"
)

// Summary describes a trace: event counts and the live-memory curve that
// every fragmentation ratio is measured against (reserved / PeakLiveBytes).
// Byte counts are in bytes as requested by the trace, before any rounding
// an allocator applies.
type Summary struct {
	Events        int64 // all events
	Allocs        int64 // Alloc events
	Frees         int64 // Free events
	RecordStreams int64 // RecordStream events
	StreamSyncs   int64 // StreamSync events
	EmptyCaches   int64 // EmptyCache events
	Marks         int64 // Mark events

	TotalAllocBytes uint64 // sum of Alloc sizes (saturates at MaxUint64)
	PeakLiveBytes   uint64 // maximum over time of the bytes allocated and not yet freed
	PeakLiveEvent   int64  // 0-based index of the event that first reached PeakLiveBytes; -1 if no Alloc
	PeakLiveAllocs  int64  // maximum number of allocations live at once
	LiveAllocs      int64  // allocations still live after the last event
	LiveBytes       uint64 // bytes still live after the last event
	MinAllocSize    uint64 // smallest Alloc size; 0 if no Alloc
	MaxAllocSize    uint64 // largest Alloc size
	Streams         int    // distinct Stream values on Alloc, RecordStream and StreamSync events
	FirstTimeNs     int64  // TimeNs of the first event
	LastTimeNs      int64  // TimeNs of the last event
	// PoolPeakLive is each pool's PeakLiveBytes (the default pool's
	// included), when an Alloc names a pool other than the default one;
	// nil otherwise.
	PoolPeakLive map[PoolID]uint64
}

// ValidationError locates the first inconsistency Summarize found.
type ValidationError struct {
	Index  int64  // 0-based index of the offending event
	Event  Event  // the offending event
	Reason string // what is wrong
}

// Error implements error.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("%v: event %d (%v): %s", ErrInvalidTrace, e.Index, e.Event, e.Reason)
}

// Unwrap returns ErrInvalidTrace.
func (e *ValidationError) Unwrap() error { return ErrInvalidTrace }

// Summarize reads r to the end and summarizes it, validating as it goes:
// a Free or RecordStream must name a live id, and an Alloc must not reuse
// an id that is still live (an id may be reused after its Free). The first
// violation stops the scan with a *ValidationError (errors.Is
// ErrInvalidTrace); a read error stops it with that error. In both cases
// the Summary of the events before the failure is returned too.
func Summarize(r EventReader) (Summary, error) {
	s := Summary{PeakLiveEvent: -1}
	type liveAlloc struct {
		size uint64
		pool PoolID
	}
	live := make(map[uint64]liveAlloc)  // id -> allocation
	poolLive := make(map[PoolID]uint64) // pool -> live bytes
	var defaultPeak uint64              // the default pool's peak, kept before PoolPeakLive exists
	streams := make(map[uint64]struct{})
	fail := func(e Event, format string, args ...any) error {
		return &ValidationError{Index: s.Events, Event: e, Reason: fmt.Sprintf(format, args...)}
	}
	for {
		e, err := r.Next()
		if err == io.EOF {
			return s, nil
		}
		if err != nil {
			return s, err
		}
		if s.Events == 0 {
			s.FirstTimeNs = e.TimeNs
		}
		switch e.Kind {
		case Alloc:
			if _, dup := live[e.ID]; dup {
				return s, fail(e, "id %d is already live", e.ID)
			}
			if s.LiveBytes+e.Size < s.LiveBytes {
				return s, fail(e, "live bytes overflow 64 bits")
			}
			live[e.ID] = liveAlloc{e.Size, e.Pool}
			poolLive[e.Pool] += e.Size
			if e.Pool.IsDefault() {
				defaultPeak = max(defaultPeak, poolLive[e.Pool])
			} else if s.PoolPeakLive == nil {
				s.PoolPeakLive = make(map[PoolID]uint64)
			}
			if s.PoolPeakLive != nil {
				s.PoolPeakLive[PoolID{}] = defaultPeak
				s.PoolPeakLive[e.Pool] = max(s.PoolPeakLive[e.Pool], poolLive[e.Pool])
			}
			streams[e.Stream] = struct{}{}
			s.Allocs++
			s.LiveAllocs++
			s.LiveBytes += e.Size
			if s.TotalAllocBytes+e.Size < s.TotalAllocBytes {
				s.TotalAllocBytes = math.MaxUint64
			} else {
				s.TotalAllocBytes += e.Size
			}
			if s.Allocs == 1 || e.Size < s.MinAllocSize {
				s.MinAllocSize = e.Size
			}
			s.MaxAllocSize = max(s.MaxAllocSize, e.Size)
			if s.LiveBytes > s.PeakLiveBytes || s.PeakLiveEvent < 0 {
				s.PeakLiveBytes, s.PeakLiveEvent = s.LiveBytes, s.Events
			}
			s.PeakLiveAllocs = max(s.PeakLiveAllocs, s.LiveAllocs)
		case Free:
			a, ok := live[e.ID]
			if !ok {
				return s, fail(e, "id %d is not live", e.ID)
			}
			delete(live, e.ID)
			poolLive[a.pool] -= a.size
			s.Frees++
			s.LiveAllocs--
			s.LiveBytes -= a.size
		case RecordStream:
			if _, ok := live[e.ID]; !ok {
				return s, fail(e, "id %d is not live", e.ID)
			}
			streams[e.Stream] = struct{}{}
			s.RecordStreams++
		case StreamSync:
			streams[e.Stream] = struct{}{}
			s.StreamSyncs++
		case EmptyCache:
			s.EmptyCaches++
		case Mark:
			s.Marks++
		default:
			return s, fail(e, "invalid kind")
		}
		s.Streams = len(streams)
		s.LastTimeNs = e.TimeNs
		s.Events++
	}
}
