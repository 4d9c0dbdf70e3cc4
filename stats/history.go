package stats

// TraceAction names what a TraceEntry records, as PyTorch's memory
// history (torch.cuda.memory._record_memory_history) names its actions.
type TraceAction string

const (
	TraceAlloc         TraceAction = "alloc"          // a block was handed to a caller
	TraceFreeRequested TraceAction = "free_requested" // a caller freed a block; stream uses may delay it
	TraceFreeCompleted TraceAction = "free_completed" // the block went back to the pool
	TraceSegmentAlloc  TraceAction = "segment_alloc"  // a segment was created (classic mapping or reservation)
	TraceSegmentFree   TraceAction = "segment_free"   // a segment was released to the driver
	TraceSegmentMap    TraceAction = "segment_map"    // pages of an expandable segment were mapped
	TraceSegmentUnmap  TraceAction = "segment_unmap"  // pages of an expandable segment were unmapped
	TraceSnapshot      TraceAction = "snapshot"       // a snapshot was taken
	TraceOOM           TraceAction = "oom"            // a malloc failed; Addr holds the device's free bytes
	// TraceEmptyCache is vmmalloc's own: EmptyCache was called. PyTorch's
	// history has no such action, so PyTorch-format writers leave it out.
	TraceEmptyCache TraceAction = "empty_cache"
)

// Valid reports whether a is one of the TraceAction constants.
func (a TraceAction) Valid() bool {
	switch a {
	case TraceAlloc, TraceFreeRequested, TraceFreeCompleted, TraceSegmentAlloc,
		TraceSegmentFree, TraceSegmentMap, TraceSegmentUnmap, TraceSnapshot, TraceOOM, TraceEmptyCache:
		return true
	}
	return false
}

// TraceEntry is one record of the memory history. For TraceOOM, as in
// PyTorch, Addr carries the device's free bytes at the time and Size the
// bytes that were asked for.
type TraceEntry struct {
	Action TraceAction `json:"action"`
	Addr   uintptr     `json:"addr"`   // device virtual address of the block or range
	Size   uint64      `json:"size"`   // bytes
	Stream uint64      `json:"stream"` // stream the block or segment belongs to
	TimeNs int64       `json:"time_ns"`
	// Stack names the Go call stack of the caller that caused the entry in
	// its recorder's stack table (1-based); 0 when none was recorded.
	Stack uint32 `json:"stack,omitempty"`
	// Pool is the memory pool of the block or segment, as PyTorch's
	// MempoolId_t; (0, 0) for the default pool.
	Pool [2]uint64 `json:"pool,omitzero"`
}

// MaxHistoryEntries caps the capacity NewHistory preallocates (4Mi
// entries, about 160 MiB), so that a mistyped size cannot exhaust host
// memory.
const MaxHistoryEntries = 1 << 22

// History is a fixed-capacity ring buffer of TraceEntry records, the
// store behind PyTorch's _record_memory_history(max_entries=N): once full,
// each Record overwrites the oldest entry and counts it as dropped.
//
// The ring is allocated once by NewHistory, so Record never allocates.
// A nil *History is a valid, disabled history: Record does nothing and
// Len is 0.
//
// History is not safe for concurrent use. Its owner (the allocator, under
// its device mutex) must serialise every call, including Entries.
type History struct {
	buf     []TraceEntry // ring storage; len(buf) is the capacity
	start   int          // index in buf of the oldest entry; 0 while n < len(buf)
	n       int          // number of entries held, <= len(buf)
	dropped int64        // entries overwritten or refused since creation or Clear
}

// NewHistory returns an empty History that keeps the newest maxEntries
// entries. maxEntries above MaxHistoryEntries is clamped to it. With
// maxEntries <= 0 the history keeps nothing: every Record is counted as
// dropped.
func NewHistory(maxEntries int) *History {
	return &History{buf: make([]TraceEntry, historyCap(maxEntries))}
}

// historyCap is the capacity NewHistory gives for maxEntries.
func historyCap(maxEntries int) int {
	return max(0, min(maxEntries, MaxHistoryEntries))
}

// Record appends e, overwriting the oldest entry when the ring is full.
// It does not allocate and does not check e.Action.
func (h *History) Record(e TraceEntry) {
	if h == nil {
		return
	}
	c := len(h.buf)
	if c == 0 {
		h.dropped++
		return
	}
	if h.n < c {
		// Until the ring first fills, start is 0 (it moves only when the
		// ring is full, and Clear resets both), so the next slot is n.
		h.buf[h.n] = e
		h.n++
		return
	}
	h.buf[h.start] = e
	h.start++
	if h.start == c {
		h.start = 0
	}
	h.dropped++
}

// Entries returns a copy of the entries held, oldest first. The slice is
// never nil and never aliases the ring.
func (h *History) Entries() []TraceEntry {
	if h == nil {
		return []TraceEntry{}
	}
	out := make([]TraceEntry, h.n)
	k := copy(out, h.buf[h.start:min(h.start+h.n, len(h.buf))])
	copy(out[k:], h.buf[:h.n-k])
	return out
}

// Len returns the number of entries held.
func (h *History) Len() int {
	if h == nil {
		return 0
	}
	return h.n
}

// Cap returns the number of entries the history can hold.
func (h *History) Cap() int {
	if h == nil {
		return 0
	}
	return len(h.buf)
}

// Dropped returns how many entries were lost since creation or the last
// Clear: overwritten by newer ones, or refused by a zero-capacity history.
func (h *History) Dropped() int64 {
	if h == nil {
		return 0
	}
	return h.dropped
}

// Clear empties the history and zeroes Dropped, keeping the capacity
// (clear_history=True).
func (h *History) Clear() {
	if h == nil {
		return
	}
	clear(h.buf) // drop old entries' Action strings
	h.start, h.n, h.dropped = 0, 0, 0
}
