// Package arena holds the blocks that tile a segment's address range, the
// size-class free lists that find a free block for a request, and Heap,
// the block heap that owns both.
//
// Heap (below) is the mechanism the allocator is moving onto; Region,
// Block, BlockPool and FreeList are the earlier pointer-linked form, which
// the allocator still drives directly while it moves. Both use the same
// size classes and return the same best fit.
//
// # Blocks
//
// A Region is one segment's address range, tiled without gap or overlap by
// Blocks linked in address order (Prev/Next). A block is in one of four
// states:
//
//	           Split/Alloc                Free (no recorded streams)
//	Free  ───────────────────▶ Allocated ─────────────────────────────▶ Free
//	 ▲  │                          │ Free (recorded streams)            ▲
//	 │  │ unmap pages              ▼                                    │
//	 │  ▼                     PendingFree ── every event completed ─────┘
//	Unmapped
//	 (map pages: Unmapped → Free)
//
// Free blocks are mapped and sit in exactly one FreeList (their stream's, in
// their pool). Unmapped blocks are address space with no physical memory;
// they belong to no stream. Neighbours merge only when both are Free (or
// both Unmapped), on the same stream, with no pending events: with
// Region/Block, coalescing is done by the owner through Region.Merge; a
// Heap does it itself.
//
// # Free lists
//
// FreeList is a two-level segregated fit (TLSF) index: the first level is
// the power of two of the size, the second splits each power of two into
// 16 linear classes, and two bitmaps find the first non-empty class at
// least as large as a request in O(1). Each class holds its blocks in an
// intrusive treap ordered by (size, address) (links in the Block, so no
// allocation), so the smallest fitting block of the request's own class,
// or else the minimum of the next non-empty class, is the exact best fit
// with the lowest address among equals — the same answer as an ordered set
// keyed by (size, address) (see BTreeFreeList, kept for comparison) — in
// O(log k) for k blocks in the class, even when thousands of free blocks
// share one size. Class width is 1/16 of a power of two, so a class holds
// blocks within 6.25% of each other.
//
// Block headers are recycled through a BlockPool, so the steady-state
// Malloc/Free path allocates nothing on the Go heap.
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
// fits.
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
// Measured (BenchmarkHeapLiveBlocks, 10⁶ live blocks): 56 bytes of Go
// heap per block and a full runtime.GC() of about 2 ms, against 162 bytes
// and hundreds of milliseconds for Block headers.
//
// # Locking
//
// Nothing in this package locks: the owner serialises every call on a
// Heap, Region, Block or FreeList (the allocator's device mutex). A Heap
// never calls out except to its SplitHook, synchronously.
package arena

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// State is the state of a block.
type State uint8

const (
	Free        State = iota // mapped, in a free list, usable
	Allocated                // handed out to a caller
	PendingFree              // freed by the caller, waiting on stream events
	Unmapped                 // address space without physical memory
	Releasing                // Heap only: free memory being unmapped (lock may be dropped)
	Mapping                  // Heap only: unmapped memory being mapped (lock may be dropped)
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

// Block is a sub-range of a Region.
type Block struct {
	Addr      uintptr        // first byte
	Size      uint64         // nbytes, rounded
	Requested uint64         // nbytes the caller asked for; 0 unless Allocated/PendingFree
	Stream    backend.Stream // allocation stream; 0 for Unmapped
	State     State
	Events    int32            // pending events before a PendingFree block may be freed
	Uses      []backend.Stream // other streams recorded on an allocated block (RecordStream)

	Prev, Next *Block  // address-ordered neighbours in Region; nil at the ends
	Region     *Region // the region the block tiles

	list   *FreeList // free list holding the block, or nil
	left   *Block    // class treap links
	right  *Block
	parent *Block
	prio   uint32 // treap priority (a hash of Addr at insertion)
	class  int32
}

// End is the address one past the block.
func (b *Block) End() uintptr { return b.Addr + uintptr(b.Size) }

// InList reports whether the block is in a free list.
func (b *Block) InList() bool { return b.list != nil }

// IsSplit reports whether the block is not the whole of its region.
func (b *Block) IsSplit() bool { return b.Prev != nil || b.Next != nil }

// Region is one segment's address range and the blocks that tile it.
type Region struct {
	Base  uintptr // first byte
	Size  uint64  // nbytes
	Head  *Block  // lowest block
	Owner any     // the allocator's segment record

	// Pool is the index of the owner's pool, kept here so the hot path
	// reads it without a type assertion on Owner.
	Pool uint8
}

// End is the address one past the region.
func (r *Region) End() uintptr { return r.Base + uintptr(r.Size) }

// BlockPool recycles block headers.
type BlockPool struct {
	free []*Block
}

// Get returns a zeroed block.
func (p *BlockPool) Get() *Block {
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free = p.free[:n-1]
		return b
	}
	return &Block{}
}

// Put recycles b. b must not be referenced afterwards.
func (p *BlockPool) Put(b *Block) {
	uses := b.Uses[:0]
	*b = Block{Uses: uses}
	p.free = append(p.free, b)
}

// Len is the number of cached headers.
func (p *BlockPool) Len() int { return len(p.free) }

// NewRegion makes a region tiled by one block in state st.
func NewRegion(pool *BlockPool, base uintptr, size uint64, st State, stream backend.Stream, owner any) *Region {
	r := &Region{Base: base, Size: size, Owner: owner}
	b := pool.Get()
	b.Addr, b.Size, b.State, b.Stream, b.Region = base, size, st, stream, r
	r.Head = b
	return r
}

// Split cuts b at offset n (0 < n < b.Size) and returns the new block that
// holds the upper part, with the same state and stream as b. b must not be
// in a free list.
func Split(pool *BlockPool, b *Block, n uint64) *Block {
	if b.list != nil {
		panic("arena: Split of a listed block")
	}
	if n == 0 || n >= b.Size {
		panic("arena: Split offset out of range")
	}
	return split(pool, b, n)
}

func split(pool *BlockPool, b *Block, n uint64) *Block {
	r := pool.Get()
	r.Addr = b.Addr + uintptr(n)
	r.Size = b.Size - n
	r.State = b.State
	r.Stream = b.Stream
	r.Region = b.Region
	r.Prev = b
	r.Next = b.Next
	if b.Next != nil {
		b.Next.Prev = r
	}
	b.Next = r
	b.Size = n
	return r
}

// Merge absorbs b.Next into b and recycles b.Next's header. Neither may be
// in a free list.
func Merge(pool *BlockPool, b *Block) {
	n := b.Next
	if n == nil || n.list != nil || b.list != nil {
		panic("arena: bad Merge")
	}
	merge(pool, b)
}

func merge(pool *BlockPool, b *Block) {
	n := b.Next
	b.Size += n.Size
	b.Next = n.Next
	if n.Next != nil {
		n.Next.Prev = b
	}
	pool.Put(n)
}

// Blocks returns the region's blocks in address order (for checks and
// snapshots; it allocates).
func (r *Region) Blocks() []*Block {
	var out []*Block
	for b := r.Head; b != nil; b = b.Next {
		out = append(out, b)
	}
	return out
}

// Find returns the block containing addr, or nil. It walks the region.
func (r *Region) Find(addr uintptr) *Block {
	if addr < r.Base || addr >= r.End() {
		return nil
	}
	for b := r.Head; b != nil; b = b.Next {
		if addr >= b.Addr && addr < b.End() {
			return b
		}
	}
	return nil
}
