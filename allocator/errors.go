package allocator

import (
	"errors"
	"fmt"

	"github.com/dustin/go-humanize"
	"github.com/vmmalloc/vmmalloc/backend"
)

// Sentinel errors. Every error the allocator returns wraps one of these or
// a backend error kind, so callers test with errors.Is.
var (
	ErrInvalidSize     = errors.New("vmmalloc: invalid size")
	ErrUnknownPointer  = errors.New("vmmalloc: pointer was not allocated by this allocator")
	ErrInteriorPointer = errors.New("vmmalloc: pointer is inside an allocation, not at its start")
	ErrDoubleFree      = errors.New("vmmalloc: pointer already freed")
	ErrInvalidStream   = errors.New("vmmalloc: invalid stream")
	ErrClosed          = errors.New("vmmalloc: allocator is closed")
	ErrInvalidConfig   = errors.New("vmmalloc: invalid config")
	ErrOutOfMemory     = errors.New("vmmalloc: out of memory")
)

// OutOfMemoryError is returned when a request cannot be met after the whole
// out-of-memory ladder. errors.Is matches ErrOutOfMemory and
// backend.ErrOutOfMemory.
type OutOfMemoryError struct {
	Device    int
	Requested uint64 // nbytes asked for
	Tried     uint64 // nbytes the allocator tried to map (granule-rounded)
	Total     uint64 // device capacity
	Free      uint64 // device free memory after the ladder
	Allowed   uint64 // cap from per_process_memory_fraction; 0 = none
	Allocated uint64 // bytes in allocated blocks
	Reserved  uint64 // bytes mapped by this allocator
	Stranded  uint64 // of Reserved, bytes held for streams destroyed without ReleaseStream (see ReleaseStream)
	// AsleepAllocated is the bytes of Allocated in pools asleep
	// (Pool.Sleep): allocated, but not mapped, so not in Reserved.
	AsleepAllocated uint64
	// ExporterHeld is the bytes of ExporterHeldHandles physical handles the
	// allocator has unmapped (not in Reserved) that exporters
	// (allocator/ipc) still hold for open exports: device memory this
	// process uses that only closing those exports gives back.
	ExporterHeld        uint64
	ExporterHeldHandles int
	Owned               uint64 // nbytes requested by owned Buffers not yet freed (NewBuffer)
	OwnedGC             bool   // the ladder collected unreachable Buffers first (owned_buffer_gc)
	Cause               error  // the driver error or address-space exhaustion, if any
	AddrSpaceVA         bool   // true when the address-space budget, not memory, ran out
	// Pool, PoolName and PoolLimit are set when the pool's own memory
	// limit (PoolOptions.MemoryLimit), not the device, stopped the
	// Malloc; Allocated and Reserved are then the pool's.
	Pool      PoolID
	PoolName  string
	PoolLimit uint64 // nbytes; 0 when the device's memory ran out
}

func (e *OutOfMemoryError) Error() string {
	if e.PoolLimit != 0 {
		return fmt.Sprintf("vmmalloc: out of memory: tried to allocate %s in pool %q, whose memory limit of %s is reached (the device has %s free). "+
			"Of the pool's memory %s is allocated and %s is reserved but unallocated.",
			humanize.IBytes(e.Tried), e.PoolName, humanize.IBytes(e.PoolLimit), humanize.IBytes(e.Free),
			humanize.IBytes(e.Allocated), humanize.IBytes(e.Reserved-e.Allocated))
	}
	s := fmt.Sprintf("vmmalloc: out of memory: tried to allocate %s. Device %d has a total capacity of %s of which %s is free. ",
		humanize.IBytes(e.Tried), e.Device, humanize.IBytes(e.Total), humanize.IBytes(e.Free))
	if e.Allowed != 0 {
		s += humanize.IBytes(e.Allowed) + " allowed; "
	}
	s += fmt.Sprintf("Of the allocated memory %s is allocated by vmmalloc, and %s is reserved by vmmalloc but unallocated.",
		humanize.IBytes(e.Allocated), humanize.IBytes(e.Reserved-min(e.Reserved, e.Allocated-min(e.Allocated, e.AsleepAllocated))))
	if e.AsleepAllocated != 0 {
		s += fmt.Sprintf(" %s of the allocated memory is in pools asleep, not mapped until they wake.", humanize.IBytes(e.AsleepAllocated))
	}
	if e.Stranded != 0 {
		s += fmt.Sprintf(" %s is stranded on streams destroyed without ReleaseStream.", humanize.IBytes(e.Stranded))
	}
	if e.ExporterHeld != 0 {
		s += fmt.Sprintf(" A further %s in %d physical handles is held by IPC exporters for open exports (close them to free it).",
			humanize.IBytes(e.ExporterHeld), e.ExporterHeldHandles)
	}
	switch {
	case e.Owned != 0 && e.OwnedGC:
		s += fmt.Sprintf(" %s is still held by owned buffers after a garbage collection (reachable, or dropped since).", humanize.IBytes(e.Owned))
	case e.Owned != 0:
		s += fmt.Sprintf(" %s is held by owned buffers not yet freed, collectable by the garbage collector once unreachable (owned_buffer_gc is off).", humanize.IBytes(e.Owned))
	}
	if e.AddrSpaceVA {
		s += " The virtual address budget (max_segments_per_pool) is exhausted."
	}
	return s
}

// Is matches ErrOutOfMemory and backend.ErrOutOfMemory.
func (e *OutOfMemoryError) Is(target error) bool {
	return target == ErrOutOfMemory || target == backend.ErrOutOfMemory
}

// Unwrap returns the driver error that ended the ladder, if any.
func (e *OutOfMemoryError) Unwrap() error { return e.Cause }
