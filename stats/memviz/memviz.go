// Package memviz writes vmmalloc memory snapshots in the format of
// PyTorch's torch.cuda.memory._dump_snapshot, so that PyTorch's memory
// viewer (https://pytorch.org/memory_viz, torch/utils/viz/MemoryViz.js)
// and torch.cuda._memory_viz open them.
//
// # Format
//
// A snapshot is a pickle (protocol 4; the viewer rejects protocol 5) of
//
//	{"segments": [segment...], "device_traces": [[entry...] per device],
//	 "allocator_settings": {...}}
//
// following what the viewer reads:
//
//   - Segments tile the mapped memory. An expandable vmmalloc segment is
//     one address reservation with unmapped holes; it is written as one
//     segment per maximal run of mapped blocks of one stream (PyTorch's
//     expandable segments are per stream too), so vmmalloc's "unmapped"
//     block state never appears.
//   - Each segment's blocks tile it from its address, in address order,
//     every one with a frames list (possibly empty): the viewer computes
//     block addresses by adding up sizes and falls back to legacy handling
//     without frames.
//   - Trace entries use PyTorch's action names and keys (addr, size,
//     stream, time_us, frames, and pool_id, the (int, int) MempoolId_t of
//     the entry's pool, as newer PyTorch writes it; device_free instead of
//     addr on oom) and never a category key. vmmalloc's empty_cache entries have no PyTorch
//     counterpart and are left out; the segment_unmap/segment_free entries
//     they cause are written.
//   - The viewer replays the trace backwards from the segments, so a
//     snapshot must pair the state with the history that led to it: take
//     both under one lock (allocator.WriteSnapshot does).
//
// Frames are written once and referenced through the pickle memo after
// that, so a stack repeated on many entries costs a few bytes each.
package memviz

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/vmmalloc/vmmalloc/stats"
)

// Errors Write returns, wrapped with detail; test them with errors.Is.
var (
	// ErrInvalidSnapshot: the snapshot is inconsistent (a negative or
	// repeated device index, blocks that do not tile their segment, a
	// stack id out of range, an unknown block state or action).
	ErrInvalidSnapshot = errors.New("memviz: invalid snapshot")
	// ErrUnsupportedValue: a setting's value is not nil, bool, int, int64,
	// uint64, float64 or string.
	ErrUnsupportedValue = errors.New("memviz: unsupported setting value")
	// ErrNilWriter: Write, WriteHTML or EmbedHTML was given a nil writer.
	ErrNilWriter = errors.New("memviz: nil writer")
)

// MaxDevices bounds device indices: the trace list has one entry per index
// up to the largest, so an index is at most MaxDevices-1.
const MaxDevices = 1 << 16

// Frame is one frame of a call stack, as PyTorch records it.
type Frame struct {
	Filename string
	Line     int
	Name     string // function name
}

// Device is the state and history of one device.
type Device struct {
	Index    int                 // device ordinal
	Segments []stats.SegmentInfo // the state at snapshot time
	Trace    []stats.TraceEntry  // the history before it, oldest first
	// Stacks[id-1] are the frames of stack id, innermost first, for the
	// Stack fields of Trace entries and blocks.
	Stacks [][]Frame
}

// Snapshot is what Write writes.
type Snapshot struct {
	Devices []Device
	// Settings become allocator_settings; values must be nil, bool, int,
	// int64, uint64, float64 or string.
	Settings map[string]any
}

// Write validates s and writes it to w as a PyTorch memory snapshot
// pickle. On a validation error nothing is written.
func Write(w io.Writer, s Snapshot) error {
	if w == nil {
		return ErrNilWriter
	}
	devs := slices.Clone(s.Devices)
	slices.SortFunc(devs, func(a, b Device) int { return a.Index - b.Index })
	for i, d := range devs {
		if d.Index < 0 || d.Index >= MaxDevices || (i > 0 && devs[i-1].Index == d.Index) {
			return fmt.Errorf("%w: device index %d negative, repeated or not below %d", ErrInvalidSnapshot, d.Index, MaxDevices)
		}
		if err := validate(d); err != nil {
			return err
		}
	}
	for k, v := range s.Settings {
		switch v.(type) {
		case nil, bool, int, int64, uint64, float64, string:
		default:
			return fmt.Errorf("%w: %s is %T", ErrUnsupportedValue, k, v)
		}
	}

	bw := bufio.NewWriterSize(w, 64<<10)
	p := &pickler{w: bw}
	fw := &frameWriter{p: p}
	p.begin()
	p.dict()

	p.string("segments")
	p.list()
	for _, d := range devs {
		fw.reset(d.Stacks)
		for _, sg := range d.Segments {
			writeSegment(p, fw, d.Index, sg)
		}
	}
	p.closeList()

	p.string("device_traces")
	p.list()
	next := 0
	for _, d := range devs {
		for ; next < d.Index; next++ {
			p.list()
			p.closeList()
		}
		next++
		fw.reset(d.Stacks)
		p.list()
		for _, e := range d.Trace {
			writeEntry(p, fw, e)
		}
		p.closeList()
	}
	p.closeList()

	p.string("allocator_settings")
	p.dict()
	keys := make([]string, 0, len(s.Settings))
	for k := range s.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p.string(k)
		if err := p.value(s.Settings[k]); err != nil {
			return err
		}
	}
	p.closeDict()

	p.closeDict()
	p.end()
	if p.err != nil {
		return fmt.Errorf("memviz: write: %w", p.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("memviz: write: %w", err)
	}
	return nil
}

// validate checks what the viewer relies on.
func validate(d Device) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: device %d: %s", ErrInvalidSnapshot, d.Index, fmt.Sprintf(format, args...))
	}
	stack := func(id uint32) bool { return int(id) <= len(d.Stacks) }
	for _, sg := range d.Segments {
		addr := sg.Address
		var total uint64
		for _, b := range sg.Blocks {
			if b.Address != addr || b.Size == 0 {
				return bad("segment %#x: block %#x+%d does not start at %#x", sg.Address, b.Address, b.Size, addr)
			}
			if b.Size > sg.TotalSize-total || uint64(b.Address)+b.Size < uint64(b.Address) {
				return bad("segment %#x: block %#x+%d runs past the segment's %d bytes or the address space", sg.Address, b.Address, b.Size, sg.TotalSize)
			}
			switch b.State {
			case stats.BlockActiveAllocated, stats.BlockActivePendingFree, stats.BlockInactive, stats.BlockUnmapped:
			default:
				return bad("block %#x: unknown state %q", b.Address, b.State)
			}
			if !stack(b.Stack) {
				return bad("block %#x: stack %d of %d", b.Address, b.Stack, len(d.Stacks))
			}
			addr += uintptr(b.Size)
			total += b.Size
		}
		if total != sg.TotalSize {
			return bad("segment %#x: blocks cover %d of %d bytes", sg.Address, total, sg.TotalSize)
		}
	}
	for i, e := range d.Trace {
		if !e.Action.Valid() {
			return bad("trace entry %d: unknown action %q", i, e.Action)
		}
		if !stack(e.Stack) {
			return bad("trace entry %d: stack %d of %d", i, e.Stack, len(d.Stacks))
		}
	}
	return nil
}

// writeSegment writes sg as one PyTorch segment per maximal run of mapped
// blocks of one stream and memory pool (segment_pool_id).
func writeSegment(p *pickler, fw *frameWriter, dev int, sg stats.SegmentInfo) {
	blocks := sg.Blocks
	for len(blocks) > 0 {
		if blocks[0].State == stats.BlockUnmapped {
			blocks = blocks[1:]
			continue
		}
		n := 1
		for n < len(blocks) && blocks[n].State != stats.BlockUnmapped && blocks[n].Stream == blocks[0].Stream && blocks[n].Pool == blocks[0].Pool {
			n++
		}
		writeRun(p, fw, dev, sg, blocks[:n])
		blocks = blocks[n:]
	}
}

func writeRun(p *pickler, fw *frameWriter, dev int, sg stats.SegmentInfo, run []stats.BlockInfo) {
	var total, allocated, active, requested uint64
	for _, b := range run {
		total += b.Size
		switch b.State {
		case stats.BlockActiveAllocated:
			allocated += b.Size
			active += b.Size
			requested += b.RequestedSize
		case stats.BlockActivePendingFree:
			active += b.Size
		}
	}
	segType := "large"
	if sg.Pool == stats.SmallPool {
		segType = "small"
	}
	p.dict()
	p.string("device")
	p.int(int64(dev))
	p.string("address")
	p.uint(uint64(run[0].Address))
	p.string("total_size")
	p.uint(total)
	p.string("stream")
	p.uint(run[0].Stream)
	p.string("segment_type")
	p.string(segType)
	p.string("segment_pool_id")
	p.uint(run[0].Pool[0]) // (0, 0): the default pool; read by Python tools only
	p.uint(run[0].Pool[1])
	p.bytes(opTuple2)
	p.string("is_expandable")
	p.boolean(sg.IsExpandable)
	p.string("allocated_size")
	p.uint(allocated)
	p.string("active_size")
	p.uint(active)
	p.string("requested_size")
	p.uint(requested)
	p.string("frames")
	p.list()
	p.closeList()
	p.string("blocks")
	p.list()
	for _, b := range run {
		p.dict()
		p.string("address")
		p.uint(uint64(b.Address))
		p.string("size")
		p.uint(b.Size)
		p.string("requested_size")
		if b.State == stats.BlockActiveAllocated || b.State == stats.BlockActivePendingFree {
			p.uint(b.RequestedSize)
		} else {
			p.uint(b.Size)
		}
		p.string("state")
		p.string(string(b.State))
		p.string("frames")
		fw.frames(b.Stack)
		p.closeDict()
	}
	p.closeList()
	p.closeDict()
}

// writeEntry writes one trace entry; empty_cache entries are skipped.
func writeEntry(p *pickler, fw *frameWriter, e stats.TraceEntry) {
	if e.Action == stats.TraceEmptyCache {
		return
	}
	p.dict()
	p.string("action")
	p.string(string(e.Action))
	if e.Action == stats.TraceOOM {
		p.string("device_free")
	} else {
		p.string("addr")
	}
	p.uint(uint64(e.Addr))
	p.string("size")
	p.uint(e.Size)
	p.string("stream")
	p.uint(e.Stream)
	p.string("time_us")
	p.int(e.TimeNs / 1000)
	p.string("pool_id")
	p.uint(e.Pool[0]) // (0, 0): the default pool; read by Python tools and replay, not the viewer
	p.uint(e.Pool[1])
	p.bytes(opTuple2)
	p.string("frames")
	fw.frames(e.Stack)
	p.closeDict()
}

// frameWriter writes the frames list of a stack id, the first time in
// full and memoized, later as a memo reference.
type frameWriter struct {
	p      *pickler
	stacks [][]Frame
	memo   map[uint32]uint32 // stack id → memo index of its frames list
}

func (fw *frameWriter) reset(stacks [][]Frame) {
	fw.stacks = stacks
	fw.memo = make(map[uint32]uint32)
}

func (fw *frameWriter) frames(id uint32) {
	p := fw.p
	if id == 0 {
		p.list()
		p.closeList()
		return
	}
	if i, ok := fw.memo[id]; ok {
		p.get(i)
		return
	}
	p.bytes(opEmptyList)
	fw.memo[id] = p.put()
	p.bytes(opMark)
	for _, f := range fw.stacks[id-1] {
		p.dict()
		p.string("filename")
		p.string(f.Filename)
		p.string("line")
		p.int(int64(f.Line))
		p.string("name")
		p.string(f.Name)
		p.closeDict()
	}
	p.closeList()
}
