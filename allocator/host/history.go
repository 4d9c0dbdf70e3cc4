package host

import (
	"time"

	"github.com/vmmalloc/vmmalloc/stats"
)

// RecordHistory starts, restarts or (maxEntries 0) stops recording the
// memory history, the host side of the device allocator's RecordHistory:
// Malloc (alloc), Free (free_requested), a block's return to the cache
// (free_completed), chunks mapped and unmapped (segment_map,
// segment_unmap) or size-class blocks obtained and given back
// (segment_alloc, segment_free), and failed Mallocs (oom, Size the
// request). The newest maxEntries entries are kept (at most
// stats.MaxHistoryEntries); a recording ring allocates nothing per entry.
func (a *Allocator) RecordHistory(maxEntries int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if maxEntries <= 0 {
		a.hist = nil
		return nil
	}
	a.hist = stats.NewHistory(maxEntries)
	return nil
}

// History returns the recorded entries, oldest first, and whether
// recording is on.
func (a *Allocator) History() ([]stats.TraceEntry, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hist == nil {
		return nil, false
	}
	return a.hist.Entries(), true
}

// histRecord appends an entry. mu held, a.hist not nil.
func (a *Allocator) histRecord(act stats.TraceAction, addr uintptr, size uint64) {
	a.hist.Record(stats.TraceEntry{Action: act, Addr: addr, Size: size, TimeNs: time.Now().UnixNano()})
}

// histSegment records a chunk mapped or unmapped. mu held.
func (a *Allocator) histSegment(mapped bool, c *chunk) {
	if a.hist == nil {
		return
	}
	act := stats.TraceSegmentUnmap
	if mapped {
		act = stats.TraceSegmentMap
	}
	a.histRecord(act, c.base, c.size)
}
