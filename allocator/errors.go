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
//
// Besides the device's figures it says where the free memory is, so that
// a device that is full can be told from one that is fragmented: Largest
// is the largest free block the request could have used, Unusable the
// free bytes cached in the request's pool on its stream that no request
// of this size can use (blocks too small, or of the other size class),
// OtherStreamsFree and OtherPoolsFree the free bytes other streams and
// other pools cache (each stream's and pool's cache is its own), and
// Room the bytes the allocator could still map. Fragmented reports the
// first case, and Advice names what would help. The message is one line,
// PyTorch's OutOfMemoryError message with these figures added.
//
// Before it returns one the ladder takes a last look: it waits for the
// growths, releases and collections of other goroutines in flight, and
// climbs again while a block waits for stream events or free memory is
// cached that a release could return. So an immediate retry with nothing
// changed fails too (pytorch/pytorch#189504 is the opposite), unless
// other goroutines kept freeing and allocating through all of its
// bounded tries.
type OutOfMemoryError struct {
	Device    int
	Requested uint64 // nbytes asked for
	// Rounded is the request rounded to a block size (512 bytes, and
	// roundup_power2_divisions): the free block it needs is this large.
	// 0 for a Wake, which needs handles, not a block.
	Rounded   uint64
	Tried     uint64 // nbytes the allocator tried to map (granule-rounded)
	Total     uint64 // device capacity
	Free      uint64 // device free memory after the ladder
	Allowed   uint64 // cap from per_process_memory_fraction; 0 = none
	Allocated uint64 // bytes in allocated blocks
	Reserved  uint64 // bytes mapped by this allocator
	// Largest is the largest free block, in nbytes, of the request's pool
	// on its stream in its size class that the request may take (within
	// max_split_size_mb's bound in classic mode): smaller than Rounded,
	// or the request would have had it. 0 for a Wake.
	Largest uint64
	// Unusable is the free nbytes cached in the request's pool on its
	// stream (both size classes) after the ladder released what it
	// could: free memory no request of this size can use, in blocks
	// smaller than Rounded or of the other size class, stranded inside
	// physical handles or classic segments that still hold allocated
	// bytes. 0 for a Wake.
	Unusable uint64
	// OtherStreamsFree is the free nbytes cached in the request's pool by
	// other streams (and by streams released with memory still in use),
	// which this stream cannot take; OtherPoolsFree the free nbytes
	// cached in other pools that are awake. Neither counts Stranded.
	OtherStreamsFree uint64
	OtherPoolsFree   uint64
	// Advice names what would help, from the figures: the config key or
	// call for fragmentation, other streams' or pools' caches, or an
	// exhausted device, pool limit or address-space budget.
	Advice   string
	Stranded uint64 // of Reserved, bytes held for streams destroyed without ReleaseStream (see ReleaseStream)
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
	// Malloc; Allocated and Reserved are then the pool's. A Wake's error
	// sets Pool and PoolName to the pool woken.
	Pool      PoolID
	PoolName  string
	PoolLimit uint64 // nbytes; 0 when the device's memory ran out
}

// Room is the nbytes the allocator could still map for the request: the
// device's free memory, within what per_process_memory_fraction allows
// (or, when PoolLimit is set, the pool's limit) beyond Reserved.
func (e *OutOfMemoryError) Room() uint64 {
	switch {
	case e.PoolLimit != 0:
		return min(e.Free, e.PoolLimit-min(e.PoolLimit, e.Reserved))
	case e.Allowed != 0:
		return min(e.Free, e.Allowed-min(e.Allowed, e.Reserved))
	}
	return e.Free
}

// Fragmented reports whether the request failed for fragmentation rather
// than exhaustion: its pool and stream cache free bytes that no request
// of this size can use, and those bytes with the Room left would hold
// the request had they been one block.
func (e *OutOfMemoryError) Fragmented() bool {
	return e.Unusable > 0 && e.Unusable+e.Room() >= e.Rounded
}

func (e *OutOfMemoryError) Error() string {
	var s string
	if e.PoolLimit != 0 {
		s = fmt.Sprintf("vmmalloc: out of memory: tried to allocate %s in pool %q, whose memory limit of %s is reached (the device has %s free). "+
			"Of the pool's memory %s is allocated and %s is reserved but unallocated",
			humanize.IBytes(e.Tried), e.PoolName, humanize.IBytes(e.PoolLimit), humanize.IBytes(e.Free),
			humanize.IBytes(e.Allocated), humanize.IBytes(e.Reserved-min(e.Reserved, e.Allocated)))
	} else {
		s = fmt.Sprintf("vmmalloc: out of memory: tried to allocate %s. Device %d has a total capacity of %s of which %s is free. ",
			humanize.IBytes(e.Tried), e.Device, humanize.IBytes(e.Total), humanize.IBytes(e.Free))
		if e.Allowed != 0 {
			s += humanize.IBytes(e.Allowed) + " allowed by per_process_memory_fraction. "
		}
		s += fmt.Sprintf("Of the allocated memory %s is allocated by vmmalloc, and %s is reserved by vmmalloc but unallocated",
			humanize.IBytes(e.Allocated), humanize.IBytes(e.Reserved-min(e.Reserved, e.Allocated-min(e.Allocated, e.AsleepAllocated))))
	}
	if e.Rounded != 0 {
		// The request's own figures (none for a Wake, which needs
		// handles, not a block).
		s += fmt.Sprintf(": the largest free block this request (%s) could use is %s; %s is free but unusable for this size (fragmentation)",
			humanize.IBytes(e.Rounded), humanize.IBytes(e.Largest), humanize.IBytes(e.Unusable))
	}
	if e.OtherStreamsFree != 0 || e.OtherPoolsFree != 0 {
		s += fmt.Sprintf("; %s is free in other streams' caches and %s in other pools'",
			humanize.IBytes(e.OtherStreamsFree), humanize.IBytes(e.OtherPoolsFree))
	}
	s += "."
	if e.PoolLimit == 0 && e.AsleepAllocated != 0 {
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
	if e.Advice != "" {
		s += " " + e.Advice
	}
	return s
}

// Is matches ErrOutOfMemory and backend.ErrOutOfMemory.
func (e *OutOfMemoryError) Is(target error) bool {
	return target == ErrOutOfMemory || target == backend.ErrOutOfMemory
}

// Unwrap returns the driver error that ended the ladder, if any.
func (e *OutOfMemoryError) Unwrap() error { return e.Cause }
