// Package arena is the block heap of vmmalloc: Heap tiles segments'
// address ranges with blocks, splits and coalesces them, finds the exact
// best fit among the free blocks of a stream and pool in size-class free
// lists, and tracks the transitions between mapped and unmapped memory.
//
// # Free lists
//
// Each (stream, pool) has a two-level segregated fit (TLSF) index: the
// first level is the power of two of the size, the second splits each
// power of two into 16 linear classes, and two bitmaps find the first
// non-empty class at least as large as a request in O(1). Each class holds
// its blocks in an intrusive treap ordered by (size, address) (links in
// the block records, so no allocation), so the smallest fitting block of
// the request's own class, or else the minimum of the next non-empty
// class, is the exact best fit with the lowest address among equals — the
// same answer as an ordered set keyed by (size, address) — in O(log k) for
// k blocks in the class, even when thousands of free blocks share one
// size. Class width is 1/16 of a power of two, so a class holds blocks
// within 6.25% of each other.
//
// The index is sparse (heap_index.go): the classes of a power of two exist
// only while it holds free blocks (or held them lately), so a stream with
// one free block costs the heap a few hundred bytes, not the 4 KB per pool
// of a full table.
//
// # Heap
//
// Heap is the block heap the allocator runs on: it owns the block records
// of every region, splits and coalesces them, keeps the free blocks of each
// (stream, pool) in a TLSF index for exact best fit, keeps the unmapped
// blocks of each pool in address order, and maps the address of every
// allocated block to its record. The allocator decides when: which pool
// and stream a request uses, when to grow and what to map, when to release
// and what to unmap, events, driver calls and statistics. The heap decides
// how: where a block is split, which neighbours merge, which free block
// fits. AllocFit and FreeAt are the cache hit in one call each: the free
// block that is split keeps its record and, when its new key still
// orders there, its treap slot (the allocated piece gets a new record
// below it), and freeing that piece merges it back the same way, so the
// common split-then-merge cycle changes no treap.
//
// Block life in a Heap (Releasing and Mapping are the two transition
// states in which the owner may drop its lock around a driver call):
//
//	           Alloc                 Free
//	Free ───────────────▶ Allocated ─────────────▶ Free
//	 ▲ │                     │ MarkPending             ▲
//	 │ │ BeginRelease        ▼                         │
//	 │ ▼                PendingFree ───── Free ────────┘
//	 │ Releasing ── CommitRelease(done) ──▶ Unmapped (the first done bytes)
//	 │   └───── AbortRelease / the rest ──▶ Free
//	 │                                        │ BeginMap
//	 └──────────── CommitMap ──── Mapping ◀───┘
//	                                └── AbortMap ──▶ Unmapped
//
// Coalescing rule, kept by every operation and verified by Check: two
// address neighbours are never both Free on the same stream, nor both
// Unmapped. Releasing and Mapping blocks are in no index: best fit, growth
// searches and coalescing skip them, so the owner can mark a range, drop
// its lock, wait for a stream and call the driver, retake the lock and
// commit or abort (gVisor pgalloc's "releasing" state). Operations on other
// blocks stay valid meanwhile; RemoveRegion refuses a region with a block
// in transition.
//
// # Representation
//
// A block record is 48 bytes and holds no Go pointer: address links,
// treap links and region and stream references are int32 indices
// (BlockID, RegionID, StreamID). Records live in fixed-size chunks (slabs)
// that are never moved or copied, recycled records are chained through
// their next link, and the address table holds BlockIDs, so the garbage
// collector scans no memory per block and a live block costs its record
// plus one or two table slots. Fields that only some states use share
// storage: a free block's treap children and an allocated block's
// requested size; a free block's treap parent and an allocated block's
// event count.
//
// Why chunks and not one flat slice grown by doubling: a flat slice saves
// a load and a bounds check per record access (45 of 956 instructions of
// a cache-hit Malloc+Free, measured with a slice reserved large enough
// never to grow), but growing it at 10⁶ records copies 48 MiB, 20 to
// 38 ms under the owner's lock on one unlucky Malloc, and every *block a
// function holds across a record creation would point into the old copy.
//
// Measured (BenchmarkHeapLiveBlocks, 10⁶ live blocks): 56 bytes of Go
// heap per block and a full runtime.GC() of 1 to 5 ms on a loaded 2-core
// machine, where the pointer-linked 128-byte block headers the allocator
// used before took 162 bytes and 90 to 380 ms.
//
// # Locking
//
// Nothing in this package locks: the owner serialises every call on a
// Heap (the allocator's device mutex). A Heap never calls out except to
// its SplitHook, synchronously.
package arena

import "fmt"

// State is the state of a block.
type State uint8

const (
	Free        State = iota // mapped, in its stream's free list, usable
	Allocated                // handed out to a caller
	PendingFree              // freed by the caller, waiting on stream events
	Unmapped                 // address space without physical memory
	Releasing                // free memory being unmapped (the owner may drop its lock)
	Mapping                  // unmapped memory being mapped (the owner may drop its lock)
)

func (s State) String() string {
	switch s {
	case Free:
		return "free"
	case Allocated:
		return "allocated"
	case PendingFree:
		return "pending_free"
	case Unmapped:
		return "unmapped"
	case Releasing:
		return "releasing"
	case Mapping:
		return "mapping"
	}
	return fmt.Sprintf("State(%d)", int(s))
}
