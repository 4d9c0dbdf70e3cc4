package allocator

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
)

// HandleSpan is one physical handle mapped under a live allocation: the
// handle, the device address of its first byte and its size in bytes.
type HandleSpan struct {
	Handle backend.Handle // the allocator's handle (RetainHandle of VA returns it too)
	VA     uintptr        // first byte of the handle's mapping
	Size   uint64         // nbytes of the handle
}

// Spans tells which physical handles back the live allocation at ptr, in
// address order, for sharing it with another process (allocator/ipc). size
// is the allocation's block size in bytes (the request rounded); the
// allocation occupies [ptr, ptr+size), which starts ptr-spans[0].VA bytes
// into the first handle and ends inside the last.
//
// The handles stay mapped while the allocation is live; a caller that
// needs them longer takes its own references (backend.Driver.RetainHandle)
// before it frees ptr. A ptr that is not the start of a live allocation is
// an error as for Free (ErrUnknownPointer, ErrInteriorPointer,
// ErrDoubleFree); nothing changes.
func (a *Allocator) Spans(ptr uintptr) (size uint64, spans []HandleSpan, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spans(ptr)
}

// spans is Spans with mu held.
func (a *Allocator) spans(ptr uintptr) (size uint64, spans []HandleSpan, err error) {
	if a.closed {
		return 0, nil, ErrClosed
	}
	if ptr == 0 || ptr%minBlockSize != 0 {
		return 0, nil, a.badPointer(ptr)
	}
	var id arena.BlockID
	var b arena.BlockInfo
	if r := a.plannedRegion(ptr); r != nil { // a planned block: its part of the region
		j := r.liveBlock(ptr)
		if j < 0 {
			return 0, nil, r.badPointer(ptr)
		}
		id, b = r.id, arena.BlockInfo{Addr: ptr, Size: r.blocks[j].size}
	} else {
		if id = a.heap.Lookup(ptr); id == arena.NoBlock {
			return 0, nil, a.badPointer(ptr)
		}
		b, _ = a.heap.Block(id)
	}
	if p := a.ownerOf(id).pool; p.asleep {
		return 0, nil, p.notAwake() // its handles are given back
	}
	sg := a.segOfBlock(id)
	if sg == nil {
		return 0, nil, fmt.Errorf("%w: %#x has no segment", ErrUnknownPointer, ptr)
	}
	base := sg.s.Base()
	end := uint64(b.Addr-base) + b.Size
	for off := uint64(b.Addr - base); off < end; {
		h, start, n, ok := sg.s.HandleAt(off)
		if !ok {
			return 0, nil, fmt.Errorf("%w: %#x: byte %d of the allocation is not mapped", ErrUnknownPointer, ptr, off-uint64(b.Addr-base))
		}
		spans = append(spans, HandleSpan{Handle: h, VA: base + uintptr(start), Size: n})
		off = start + n
	}
	return b.Size, spans, nil
}
