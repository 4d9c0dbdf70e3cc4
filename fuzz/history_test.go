package fuzz

import (
	"bytes"
	"testing"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
	"github.com/vmmalloc/vmmalloc/stats"
)

// FuzzHistory runs FuzzAllocator's operation sequences, faults included,
// with the memory history recording (with call stacks for inputs of even
// length), and checks after the run that the history accounts for the
// allocator exactly:
//   - segment entries (map/alloc minus unmap/free) add up to reserved
//     bytes;
//   - the addresses allocated and not yet freed in the trace are the
//     harness's live blocks;
//   - the profile's in-use bytes are the allocated bytes;
//   - the PyTorch snapshot writes and decodes.
func FuzzHistory(f *testing.F) {
	for _, seed := range seedProgs() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newHarness(t, harnessConfig{
			conf: "handle_cache_mb:64", capacity: 512 * mib, streams: 3, manual: true,
		})
		if err := h.a.RecordHistory(allocator.HistoryOptions{MaxEntries: 1 << 16, Stacks: len(data)%2 == 0}); err != nil {
			t.Fatal(err)
		}
		h.run(data)
		h.checkHistory()
		h.finish()
	})
}

// checkHistory compares the recorded history with the allocator and the
// harness's model.
func (h *harness) checkHistory() {
	h.t.Helper()
	rec, ok := h.a.History()
	if !ok {
		h.fatalf("history: not recording")
	}
	if rec.Dropped != 0 {
		return // a partial history accounts for nothing
	}
	var reserved int64
	live := map[uintptr]bool{}
	for _, e := range rec.Entries {
		switch e.Action {
		case stats.TraceSegmentMap, stats.TraceSegmentAlloc:
			reserved += int64(e.Size)
		case stats.TraceSegmentUnmap, stats.TraceSegmentFree:
			reserved -= int64(e.Size)
		case stats.TraceAlloc:
			if live[e.Addr] {
				h.fatalf("history: alloc of %#x, already allocated", e.Addr)
			}
			live[e.Addr] = true
		case stats.TraceFreeRequested:
			if !live[e.Addr] {
				h.fatalf("history: free_requested of %#x, not allocated", e.Addr)
			}
			delete(live, e.Addr)
		}
	}
	if got := int64(h.a.MemoryReserved()); reserved != got {
		h.fatalf("history: segment entries add up to %d bytes, reserved is %d", reserved, got)
	}
	// A pool's Sleep records its blocks freed and its Wake allocated
	// again (the snapshot shows an asleep pool's memory unmapped), so
	// the trace's live blocks are the model's blocks of awake pools.
	awake := 0
	for p, b := range h.byPtr {
		if h.asleep[b.pool] {
			if live[p] {
				h.fatalf("history: block %#x of an asleep pool is live in the trace", p)
			}
			continue
		}
		awake++
		if !live[p] {
			h.fatalf("history: live block %#x has no alloc entry", p)
		}
	}
	if len(live) != awake {
		h.fatalf("history: %d blocks live in the trace, %d in the model's awake pools", len(live), awake)
	}
	recs, _ := h.a.MemProfile()
	var inuse int64
	for _, r := range recs {
		inuse += r.InUseBytes()
	}
	if got := int64(h.a.MemoryAllocated()); inuse != got {
		h.fatalf("profile: %d bytes in use, allocated is %d", inuse, got)
	}
	var buf bytes.Buffer
	if err := h.a.WriteSnapshot(&buf); err != nil {
		h.fatalf("WriteSnapshot: %v", err)
	}
	if _, err := pickle.Decode(buf.Bytes()); err != nil {
		h.fatalf("snapshot does not decode: %v", err)
	}
}
