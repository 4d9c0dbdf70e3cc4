package allocator

import (
	"io"
	"runtime"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/stats"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// MemorySnapshot returns the allocator's state and recorded history in the
// form package memviz writes (torch.cuda.memory._snapshot()): the segments
// and the trace are taken under one lock, so the trace leads exactly to
// the state, as PyTorch's memory viewer requires. Without RecordHistory the
// trace is empty. Stacks are resolved to file, line and function. The
// default stream is written as stream 0, as PyTorch names it.
//
// To put several devices in one file, append the Devices of each
// allocator's snapshot and call memviz.Write.
func (a *Allocator) MemorySnapshot() memviz.Snapshot {
	a.mu.Lock()
	a.quiesceWaits()
	st := a.snapshotLocked()
	a.unmapAsleep(st)
	var h HistoryRecord
	if a.hist != nil {
		h = HistoryRecord{Entries: a.hist.ring.Entries(), Stacks: a.hist.stackTable()}
	}
	cfg := a.cfg
	ds := uint64(a.defaultS)
	a.mu.Unlock()

	for i := range h.Entries {
		if h.Entries[i].Stream == ds {
			h.Entries[i].Stream = 0
		}
	}
	for _, sg := range st.Segments {
		for i := range sg.Blocks {
			if sg.Blocks[i].Stream == ds {
				sg.Blocks[i].Stream = 0
			}
		}
	}

	d := memviz.Device{Index: a.dev, Segments: st.Segments, Trace: h.Entries}
	d.Stacks = make([][]memviz.Frame, len(h.Stacks))
	for i, pcs := range h.Stacks {
		d.Stacks[i] = resolveFrames(pcs)
	}
	return memviz.Snapshot{
		Devices: []memviz.Device{d},
		Settings: map[string]any{
			"PYTORCH_CUDA_ALLOC_CONF": cfg.String(),
			"expandable_segments":     cfg.ExpandableSegments,
			"max_split_size":          int64(cfg.MaxSplitSize),
			"backend":                 "vmmalloc",
		},
	}
}

// WriteSnapshot writes MemorySnapshot to w as a PyTorch memory snapshot
// pickle that https://pytorch.org/memory_viz opens
// (torch.cuda.memory._dump_snapshot).
func (a *Allocator) WriteSnapshot(w io.Writer) error {
	return memviz.Write(w, a.MemorySnapshot())
}

// resolveFrames turns program counters from runtime.Callers into frames,
// innermost first.
func resolveFrames(pcs []uintptr) []memviz.Frame {
	out := make([]memviz.Frame, 0, len(pcs))
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		out = append(out, memviz.Frame{Filename: f.File, Line: f.Line, Name: f.Function})
		if !more {
			return out
		}
	}
}

// unmapAsleep shows the blocks of pools not awake as unmapped: their
// memory is given back, and the trace says so (histSleep), so that the
// viewer's replay of the trace reaches the snapshot. mu held.
func (a *Allocator) unmapAsleep(st stats.Snapshot) {
	for i, sg := range a.segs { // snapshotLocked's order: st.Segments[i] is sg
		r, _ := a.heap.Region(sg.rid)
		j := 0
		for id := r.Head; id != arena.NoBlock; id = a.heap.Next(id) {
			b := &st.Segments[i].Blocks[j]
			j++
			if b.State != stats.BlockUnmapped && a.ownerOf(id).pool.asleep {
				*b = stats.BlockInfo{Address: b.Address, Size: b.Size, State: stats.BlockUnmapped}
			}
		}
	}
}
