package trace

import (
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
)

// Point is one step of a memory curve: Bytes holds from TimeNs until the
// next Point.
type Point struct {
	TimeNs int64  // relative to the trace start, like Event.TimeNs
	Bytes  uint64 // value from TimeNs on
}

// PyTorchTrace is a PyTorch CUDA memory snapshot converted to events, with
// PyTorch's own reserved-memory curve for comparison.
type PyTorchTrace struct {
	Events []Event // Alloc, Free and EmptyCache events, in trace order
	Info   Info    // Source and Device filled in
	Device int     // index into the snapshot's device_traces

	Entries         int // trace entries for Device, all actions
	Allocs          int // "alloc" entries (each became an Alloc event)
	Frees           int // "free_completed" entries that became Free events
	FreeRequests    int // "free_requested" entries (not replayed; see ImportPyTorchSnapshot)
	UnmatchedFrees  int // "free_completed" entries for an address with no live alloc (skipped)
	DuplicateAllocs int // "alloc" of an address already live (the older allocation was freed first)
	OOMs            int // "oom" entries (failed requests; not replayed)
	Snapshots       int // "snapshot" entries (ignored)
	SegmentAllocs   int // "segment_alloc" entries
	SegmentFrees    int // "segment_free" entries
	SegmentMaps     int // "segment_map" entries (expandable segments)
	SegmentUnmaps   int // "segment_unmap" entries
	// Releases is the EmptyCache events inferred from segment_free /
	// segment_unmap entries: one per run of consecutive such entries (see
	// ImportPyTorchSnapshot).
	Releases int
	// UnmatchedSegmentFrees counts segment_free entries of an address no
	// recorded segment_alloc created (the segment predates the trace).
	UnmatchedSegmentFrees int
	UnknownActions        map[string]int // entries with any other action, by action (its first maxActionName bytes); nil if none

	PeakLive       uint64 // peak of allocated-and-not-yet-freed bytes over the trace
	LiveAllocsEnd  int    // allocations still live after the last entry
	LiveBytesEnd   uint64 // their bytes
	TotalAllocated uint64 // sum of all alloc sizes (saturates at MaxUint64)

	// PyTorch's reserved memory, from the segment entries: +size on
	// segment_alloc/segment_map, -size on segment_free/segment_unmap.
	// PeakReserved is meaningful only when PeakReservedKnown is true.
	PeakReserved     uint64
	ReservedCurve    []Point // one point per segment entry
	ReservedBaseline uint64  // bytes added to the whole curve so it never goes below 0 (segments freed that the trace never saw created)
	// PeakReservedKnown reports whether the file lets PyTorch's reserved
	// peak be known: it records segment entries, every segment it frees or
	// unmaps it saw created, and every block it frees it saw allocated (so
	// recording did not begin mid-run with memory already reserved). When
	// false, PeakReserved is only a lower bound of what PyTorch reserved
	// and must be reported as unknown.
	PeakReservedKnown bool

	StartTimeUs int64   // time_us of the first entry; Event.TimeNs is (time_us - StartTimeUs) * 1000
	Streams     []int64 // Streams[i] is PyTorch's stream handle for Event.Stream i; Streams[0] == 0 (the default stream)

	Settings map[string]any // the snapshot's allocator_settings, as decoded; nil if absent

	// State at dump time from the snapshot's "segments" list for Device.
	// When it exceeds what the trace accounts for, recording began after
	// memory had already been reserved.
	SnapshotSegments  int    // segments
	SnapshotReserved  uint64 // sum of total_size (saturates at MaxUint64)
	SnapshotAllocated uint64 // sum of allocated_size (saturates at MaxUint64)

	// Pools. PrivateSegments counts the snapshot's segments on Device in a
	// pool other than the default one (segment_pool_id ≠ (0, 0): a CUDA
	// graph's pool or a torch.cuda.MemPool). AllocPoolIDs counts the alloc
	// entries that carried their own pool_id (newer PyTorch); the pools of
	// the others are inferred from the segments (see ImportPyTorchSnapshot).
	// PoolAllocs counts the Alloc events of each private pool; nil when
	// every alloc is in the default pool.
	PrivateSegments int
	AllocPoolIDs    int
	PoolAllocs      map[PoolID]int

	private []privateSegment // the private-pool segments, by address (pytorchpools.go)
}

// Reader returns an EventReader over t.Events.
func (t *PyTorchTrace) Reader() EventReader { return NewSliceReader(t.Events) }

// maxSnapshotBytes bounds the snapshot size ImportPyTorchSnapshot reads.
const maxSnapshotBytes = 4 << 30

// maxActionName is how much of an unknown action UnknownActions keeps.
const maxActionName = 64

// ImportPyTorchSnapshot decodes a PyTorch memory snapshot (the pickle
// written by torch.cuda.memory._dump_snapshot after
// _record_memory_history) and converts device_traces[device] to events.
//
// The pickle is decoded with package pickle, which refuses any opcode that
// could load code (errors.Is pickle.ErrForbidden). Entries map as follows:
//
//   - alloc: an Alloc with a fresh id (1, 2, 3, …) keyed by address, Size
//     the entry's size (PyTorch records the requested size, before its own
//     rounding), Stream the stream's index (see Streams), Pool the
//     entry's pool_id when it has one (newer PyTorch), else the
//     segment_pool_id of the snapshot segment holding the address, if that
//     segment held it then (no segment_free or segment_unmap of an
//     overlapping range came after the alloc), else the default pool. So
//     CUDA-graph and MemPool allocations replay in pools of their own; an
//     older snapshot loses the pool of a private segment released before
//     the dump (its allocs fall back to the default pool).
//   - free_completed: a Free of the live allocation at that address. This,
//     not free_requested, is the free point: PyTorch logs free_requested
//     when the program drops the tensor and free_completed when the block
//     is back in the pool and reusable (later, when record_stream events
//     were pending), so replaying at free_completed releases memory when
//     PyTorch itself could reuse it. A free_completed with no live alloc
//     (the trace began mid-run, or its ring buffer wrapped) is skipped and
//     counted in UnmatchedFrees.
//   - free_requested: counted only.
//   - segment_alloc, segment_map: no event; they build ReservedCurve and
//     PeakReserved.
//   - segment_free, segment_unmap: they build ReservedCurve too, and the
//     first of each run of consecutive such entries becomes an EmptyCache
//     event (counted in Releases). The replayed allocator never frees a
//     segment on its own while memory is plentiful, so such an entry is
//     PyTorch releasing cached memory, because the program called
//     empty_cache or because cudaMalloc failed and PyTorch released its
//     cache and retried (release_cached_blocks). Both free every free
//     segment of every stream at once, hence one EmptyCache per run.
//     Replays may ignore them (replay.Options.IgnoreReleases). A snapshot
//     vmmalloc wrote (allocator_settings backend "vmmalloc") yields none:
//     there segment unmaps are the allocator's own decisions, which a
//     replay makes again.
//   - oom: counted (the failed request is not replayed); snapshot: ignored;
//     anything else: counted in UnknownActions, by its first 64 bytes
//     (so that a long action shared by many entries is not hashed whole
//     for each).
//
// Allocations still live at the end are left live (no Free is invented).
// A structurally unexpected snapshot yields ErrSnapshot.
func ImportPyTorchSnapshot(r io.Reader, device int) (*PyTorchTrace, error) {
	v, err := pickle.Read(r, maxSnapshotBytes)
	if err != nil {
		return nil, fmt.Errorf("trace: decoding PyTorch snapshot: %w", err)
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: top level is %s, want a dict", ErrSnapshot, typeOf(v))
	}
	dtRaw, ok := top["device_traces"]
	if !ok {
		return nil, fmt.Errorf("%w: no device_traces (was _record_memory_history enabled?)", ErrSnapshot)
	}
	dts, ok := dtRaw.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: device_traces is %s, want a list", ErrSnapshot, typeOf(dtRaw))
	}
	if device < 0 || device >= len(dts) {
		return nil, fmt.Errorf("%w: device %d not in snapshot (%d device traces)", ErrSnapshot, device, len(dts))
	}
	entries, ok := dts[device].([]any)
	if !ok {
		return nil, fmt.Errorf("%w: device_traces[%d] is %s, want a list", ErrSnapshot, device, typeOf(dts[device]))
	}

	t := &PyTorchTrace{
		Device:  device,
		Entries: len(entries),
		Info:    Info{Source: "pytorch memory snapshot", Device: "cuda:" + strconv.Itoa(device)},
		Streams: []int64{0},
	}
	if s, ok := top["allocator_settings"].(map[string]any); ok {
		t.Settings = s
	}
	if err := t.readSegments(top["segments"]); err != nil {
		return nil, err
	}
	if err := t.preparePools(entries); err != nil {
		return nil, err
	}
	if err := t.convert(entries); err != nil {
		return nil, err
	}
	return t, nil
}

func typeOf(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case map[string]any:
		return "a dict"
	case *pickle.Dict:
		return "a dict with non-str keys"
	case []any:
		return "a list"
	case string:
		return "a str"
	case int64:
		return "an int"
	}
	return fmt.Sprintf("%T", v)
}

// intOf converts a decoded int to int64.
func intOf(v any) (int64, bool) {
	i, ok := v.(int64)
	return i, ok
}

func (t *PyTorchTrace) readSegments(raw any) error {
	if raw == nil {
		return nil
	}
	segs, ok := raw.([]any)
	if !ok {
		return fmt.Errorf("%w: segments is %s, want a list", ErrSnapshot, typeOf(raw))
	}
	for i, s := range segs {
		m, ok := s.(map[string]any)
		if !ok {
			return fmt.Errorf("%w: segments[%d] is %s, want a dict", ErrSnapshot, i, typeOf(s))
		}
		if d, ok := intOf(m["device"]); ok && d != int64(t.Device) {
			continue
		}
		total, ok1 := intOf(m["total_size"])
		alloc, ok2 := intOf(m["allocated_size"])
		if !ok1 || !ok2 || total < 0 || alloc < 0 {
			return fmt.Errorf("%w: segments[%d] lacks non-negative total_size/allocated_size", ErrSnapshot, i)
		}
		t.SnapshotSegments++
		t.SnapshotReserved = addSaturating(t.SnapshotReserved, uint64(total))
		t.SnapshotAllocated = addSaturating(t.SnapshotAllocated, uint64(alloc))
		if err := t.addPrivateSegment(i, m, total); err != nil {
			return err
		}
	}
	return nil
}

// addSaturating returns a+b, or MaxUint64 when that overflows (a snapshot
// may list one huge segment many times through the pickle memo).
func addSaturating(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

type liveAlloc struct {
	id   uint64
	size uint64
}

func (t *PyTorchTrace) convert(entries []any) error {
	live := make(map[int64]liveAlloc) // address -> allocation
	streamIdx := map[int64]uint64{0: 0}
	var nextID uint64 = 1
	var liveBytes uint64
	var reserved, minReserved, maxReserved int64
	var lastTimeNs int64
	haveStart := false
	segs := make(map[int64]uint64) // address -> size of segments seen created, not freed
	inRelease := false             // the previous entry was a segment_free/segment_unmap

	for i, raw := range entries {
		m, ok := raw.(map[string]any)
		if !ok {
			return fmt.Errorf("%w: device_traces[%d][%d] is %s, want a dict", ErrSnapshot, t.Device, i, typeOf(raw))
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: device_traces[%d][%d]: %s", ErrSnapshot, t.Device, i, fmt.Sprintf(format, args...))
		}
		action, ok := m["action"].(string)
		if !ok {
			return bad("no action")
		}
		releasing := action == "segment_free" || action == "segment_unmap"
		startsRelease := releasing && !inRelease && !t.WrittenByVMMalloc()
		inRelease = releasing
		// Time: relative to the first entry; an entry without time_us keeps
		// the previous time.
		timeNs := lastTimeNs
		if us, ok := intOf(m["time_us"]); ok {
			if !haveStart {
				t.StartTimeUs, haveStart = us, true
			}
			d := us - t.StartTimeUs
			if (d > 0) != (us > t.StartTimeUs) || d > math.MaxInt64/1000 || d < math.MinInt64/1000 {
				return bad("time_us %d out of range", us)
			}
			timeNs = d * 1000
		}
		lastTimeNs = timeNs
		addrSize := func() (int64, uint64, error) {
			addr, ok1 := intOf(m["addr"])
			size, ok2 := intOf(m["size"])
			if !ok1 || !ok2 || size < 0 {
				return 0, 0, bad("%s entry lacks integer addr or non-negative size", action)
			}
			return addr, uint64(size), nil
		}
		stream := func() (uint64, error) {
			s, ok := intOf(m["stream"])
			if !ok {
				if m["stream"] == nil {
					return 0, nil
				}
				return 0, bad("stream is %s, want an int", typeOf(m["stream"]))
			}
			idx, seen := streamIdx[s]
			if !seen {
				idx = uint64(len(t.Streams))
				streamIdx[s] = idx
				t.Streams = append(t.Streams, s)
			}
			return idx, nil
		}

		switch action {
		case "alloc":
			addr, size, err := addrSize()
			if err != nil {
				return err
			}
			s, err := stream()
			if err != nil {
				return err
			}
			if old, dup := live[addr]; dup {
				t.DuplicateAllocs++
				t.Events = append(t.Events, Event{Kind: Free, ID: old.id, Stream: s, TimeNs: timeNs})
				liveBytes -= old.size
			}
			if liveBytes+size < liveBytes {
				return bad("live bytes overflow 64 bits")
			}
			pool, err := t.allocPool(m, addr, i)
			if err != nil {
				return err
			}
			id := nextID
			nextID++
			live[addr] = liveAlloc{id: id, size: size}
			t.Events = append(t.Events, Event{Kind: Alloc, ID: id, Size: size, Stream: s, TimeNs: timeNs, Pool: pool})
			if !pool.IsDefault() {
				if t.PoolAllocs == nil {
					t.PoolAllocs = make(map[PoolID]int)
				}
				t.PoolAllocs[pool]++
			}
			t.Allocs++
			if t.TotalAllocated+size < t.TotalAllocated {
				t.TotalAllocated = math.MaxUint64
			} else {
				t.TotalAllocated += size
			}
			liveBytes += size
			t.PeakLive = max(t.PeakLive, liveBytes)
		case "free_completed":
			addr, _, err := addrSize()
			if err != nil {
				return err
			}
			s, err := stream()
			if err != nil {
				return err
			}
			a, ok := live[addr]
			if !ok {
				t.UnmatchedFrees++
				continue
			}
			delete(live, addr)
			t.Events = append(t.Events, Event{Kind: Free, ID: a.id, Stream: s, TimeNs: timeNs})
			t.Frees++
			liveBytes -= a.size
		case "free_requested":
			t.FreeRequests++
		case "segment_alloc", "segment_map", "segment_free", "segment_unmap":
			addr, size, err := addrSize()
			if err != nil {
				return err
			}
			if size > math.MaxInt64/2 {
				return bad("segment size %d out of range", size)
			}
			if startsRelease {
				t.Events = append(t.Events, Event{Kind: EmptyCache, TimeNs: timeNs})
				t.Releases++
			}
			switch action {
			case "segment_alloc":
				t.SegmentAllocs++
				reserved += int64(size)
				segs[addr] = size
			case "segment_map":
				t.SegmentMaps++
				reserved += int64(size)
			case "segment_free":
				t.SegmentFrees++
				reserved -= int64(size)
				if _, ok := segs[addr]; ok {
					delete(segs, addr)
				} else {
					t.UnmatchedSegmentFrees++
				}
			default:
				t.SegmentUnmaps++
				reserved -= int64(size)
			}
			if reserved > math.MaxInt64/2 || reserved < math.MinInt64/2 {
				return bad("reserved bytes out of range")
			}
			minReserved = min(minReserved, reserved)
			maxReserved = max(maxReserved, reserved)
			// Stored relative for now; lifted by the baseline below.
			t.ReservedCurve = append(t.ReservedCurve, Point{TimeNs: timeNs, Bytes: uint64(reserved)})
		case "oom":
			t.OOMs++
		case "snapshot":
			t.Snapshots++
		default:
			if t.UnknownActions == nil {
				t.UnknownActions = make(map[string]int)
			}
			if len(action) > maxActionName {
				action = action[:maxActionName]
			}
			t.UnknownActions[action]++
		}
	}
	baseline := -minReserved // >= 0
	t.ReservedBaseline = uint64(baseline)
	for i := range t.ReservedCurve {
		t.ReservedCurve[i].Bytes = uint64(int64(t.ReservedCurve[i].Bytes) + baseline)
	}
	t.PeakReserved = uint64(maxReserved + baseline)
	t.PeakReservedKnown = t.SegmentAllocs+t.SegmentMaps > 0 && baseline == 0 &&
		t.UnmatchedSegmentFrees == 0 && t.UnmatchedFrees == 0
	t.LiveAllocsEnd = len(live)
	t.LiveBytesEnd = liveBytes
	return nil
}

// WrittenByVMMalloc reports whether the snapshot was written by vmmalloc
// (allocator.WriteSnapshot): its allocator_settings name backend "vmmalloc".
func (t *PyTorchTrace) WrittenByVMMalloc() bool {
	b, _ := t.Settings["backend"].(string)
	return b == "vmmalloc"
}
