package arena

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/google/btree"
	"github.com/vmmalloc/vmmalloc/backend"
)

// BlockID names a block of a Heap. NoBlock names none.
type BlockID int32

// RegionID names a region of a Heap. Zero names none.
type RegionID int32

// StreamID names a stream registered with a Heap. Zero names none (the
// stream of Unmapped and Mapping blocks).
type StreamID int32

// NoBlock is the zero BlockID.
const NoBlock BlockID = 0

// Errors returned by Heap operations, wrapped with detail. An operation
// that returns one of them changed nothing.
var (
	ErrBadBlock  = errors.New("arena: no such block")
	ErrBadState  = errors.New("arena: block in the wrong state")
	ErrBadRange  = errors.New("arena: bad offset or length")
	ErrBadRegion = errors.New("arena: bad region")
	ErrBadStream = errors.New("arena: bad stream")
	ErrBadPool   = errors.New("arena: bad pool")
	ErrBusy      = errors.New("arena: still in use")
	ErrFull      = errors.New("arena: too many blocks")
	ErrCorrupt   = errors.New("arena: heap invariant violated")
)

// dead marks a recycled record.
const dead State = 0xff

const (
	chunkShift = 10
	chunkLen   = 1 << chunkShift // records per slab chunk (48 KiB)
	maxRecords = math.MaxInt32
)

// block is one block record. It holds no Go pointer.
type block struct {
	addr uintptr // first byte
	size uint64  // nbytes
	// aux is, for a Free block, its treap children (left in the low 32
	// bits, right in the high 32); for an Allocated or PendingFree block,
	// the nbytes the caller requested; otherwise 0.
	aux uint64
	// up is, for a Free block, its treap parent (a BlockID); for an
	// Allocated or PendingFree block, its event count; otherwise 0.
	up         int32
	prev, next BlockID // address neighbours in the region (NoBlock at the ends); next chains recycled records
	region     RegionID
	stream     StreamID // zero for Unmapped and Mapping blocks
	prio       uint16   // treap priority while Free
	state      State
	pool       uint8 // the region's pool
}

func (b *block) left() BlockID  { return BlockID(uint32(b.aux)) }
func (b *block) right() BlockID { return BlockID(uint32(b.aux >> 32)) }
func (b *block) setLeft(x BlockID) {
	b.aux = b.aux&^0xffff_ffff | uint64(uint32(x))
}
func (b *block) setRight(x BlockID) {
	b.aux = b.aux&0xffff_ffff | uint64(uint32(x))<<32
}
func (b *block) end() uintptr    { return b.addr + uintptr(b.size) }
func (b *block) isSplit() bool   { return b.prev != NoBlock || b.next != NoBlock }
func (b *block) inUse() bool     { return b.state == Allocated || b.state == PendingFree }
func (b *block) hasStream() bool { return b.stream != 0 }

// regionRec is one region: an address range tiled by blocks.
type regionRec struct {
	base uintptr // first byte
	size uint64  // nbytes
	head BlockID // lowest block; NoBlock when the slot is unused
	pool uint8
}

// streamRec is one registered stream and its free indexes.
type streamRec struct {
	stream backend.Stream // zero when the slot is unused
	blocks int            // blocks carrying this stream (Free, Allocated, PendingFree, Releasing)
	free   []tlsfIndex    // free blocks of the stream, by pool
}

// SplitHook, when set, is called whenever a free block that is not the
// whole of its region enters (blocks=+1) or leaves (blocks=-1) the free
// indexes, with its pool, its stream and signed size: the allocator's
// classic-mode inactive_split statistic.
type SplitHook func(pool uint8, sid StreamID, blocks, bytes int64)

// Heap is a block heap: see the package documentation. Create one with
// NewHeap.
//
// What the allocator asks of a Heap:
//
//	cache-hit Malloc                       AllocFit(sid, pool, n, requested, maxSize, minSplit)
//	cache-hit Free                         FreeAt(addr)
//	other Mallocs                          BestFitAt(sid, pool, size), Alloc(id, n, requested)
//	other Frees                            Lookup(addr), Peek(id), Free(id) or MarkPending(id)
//	events of a RecordStream'd block       AddEvents, Events; Free when they complete
//	bad pointers                           Find(addr), RegionAt(addr)
//	growth: where to map                   AscendUnmapped(pool, fn), Coalescable(id, sid)
//	growth: mapping                        BeginMap(u, off, n) … CommitMap(m, sid) / AbortMap(m)
//	release: unmapping                     BeginRelease(id, off, n) … CommitRelease(r, done) / AbortRelease(r)
//	release walks                          EachFree(sid, pool, fn), FreeLen, FreeBytes
//	segments                               AddRegion; walk Head…Next, then RemoveRegion
//	released streams, adoption             MoveStream(from, to), AdoptRange(start, off, n, sid)
//	classic inactive_split                 SetSplitHook
//	Check and snapshots                    Regions, Region, Block, Next; Check
//
// The owner keeps what is policy: its segments by RegionID, its stream
// states by StreamID, and the streams recorded on allocated blocks
// (RecordStream) by BlockID.
type Heap struct {
	chunks  []*[chunkLen]block // record slabs; BlockID i is chunks[i>>chunkShift][i&(chunkLen-1)]; id 0 unused
	nrec    int32              // records ever handed out, counting id 0
	freeRec BlockID            // recycled records, chained through next
	used    int                // records in use (blocks)

	regions     []regionRec // by RegionID; [0] unused
	freeRegions []RegionID  // unused region slots
	order       []RegionID  // live regions by ascending base

	streams     []streamRec // by StreamID; [0] unused
	freeStreams []StreamID  // unused stream slots

	npools   int
	unmapped []*btree.BTreeG[BlockID] // Unmapped blocks of each pool by address
	live     addrTable                // Allocated blocks by address

	splitHook SplitHook
}

// NewHeap returns an empty heap whose regions belong to one of pools pools
// (1 to 255).
func NewHeap(pools int) (*Heap, error) {
	if pools < 1 || pools > math.MaxUint8 {
		return nil, fmt.Errorf("%w: %d pools (1 to 255)", ErrBadPool, pools)
	}
	h := &Heap{
		nrec:     1,
		regions:  make([]regionRec, 1),
		streams:  make([]streamRec, 1),
		npools:   pools,
		unmapped: make([]*btree.BTreeG[BlockID], pools),
	}
	h.chunks = append(h.chunks, new([chunkLen]block))
	h.live.init(addrTableMinSize)
	for i := range h.unmapped {
		h.unmapped[i] = btree.NewG(16, h.lessAddr)
	}
	return h, nil
}

// SetSplitHook installs fn (nil: none). See SplitHook.
func (h *Heap) SetSplitHook(fn SplitHook) { h.splitHook = fn }

func (h *Heap) lessAddr(x, y BlockID) bool { return h.rec(x).addr < h.rec(y).addr }

// rec returns the record of id, which must be below h.nrec.
func (h *Heap) rec(id BlockID) *block {
	return &h.chunks[uint32(id)>>chunkShift][uint32(id)&(chunkLen-1)]
}

// valid returns the record of id if id names a block.
func (h *Heap) valid(id BlockID) (*block, bool) {
	if id <= 0 || int32(id) >= h.nrec {
		return nil, false
	}
	b := h.rec(id)
	return b, b.state != dead
}

// get is valid with an error.
func (h *Heap) get(id BlockID) (*block, error) {
	b, ok := h.valid(id)
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrBadBlock, id)
	}
	return b, nil
}

// room reports whether n more records can be created.
func (h *Heap) room(n int) error {
	if int64(h.used)+int64(n) >= maxRecords-1 {
		return fmt.Errorf("%w: %d blocks", ErrFull, h.used)
	}
	return nil
}

// newRec returns a zeroed record; room must have been checked.
func (h *Heap) newRec() (BlockID, *block) {
	h.used++
	if id := h.freeRec; id != NoBlock {
		b := h.rec(id)
		h.freeRec = b.next
		*b = block{}
		return id, b
	}
	if int(h.nrec) == len(h.chunks)*chunkLen {
		h.chunks = append(h.chunks, new([chunkLen]block))
	}
	id := BlockID(h.nrec)
	h.nrec++
	return id, h.rec(id)
}

// recycled takes a recycled record as freeRecord left it (zero but for
// its state and next, which the caller sets), or NoBlock when none. It
// inlines.
func (h *Heap) recycled() (BlockID, *block) {
	id := h.freeRec
	if id == NoBlock {
		return NoBlock, nil
	}
	b := h.rec(id)
	h.freeRec = b.next
	h.used++
	return id, b
}

// freeRecord recycles the record of id, which is in no index: zeroed but
// for its state (dead) and next (the chain), which recycled's callers
// rely on.
func (h *Heap) freeRecord(id BlockID, b *block) {
	if b.stream != 0 {
		h.streams[b.stream].blocks--
	}
	h.recycleRecord(id, b)
}

// recycleRecord is freeRecord once b's stream no longer counts it. It
// inlines.
func (h *Heap) recycleRecord(id BlockID, b *block) {
	*b = block{state: dead, next: h.freeRec}
	h.freeRec = id
	h.used--
}

// pool is the pool of b's region.
func (h *Heap) pool(b *block) uint8 { return b.pool }

// list is the free index b belongs in (b has a stream).
func (h *Heap) list(b *block) *tlsfIndex {
	return &h.streams[b.stream].free[b.pool]
}

// leave and enter report a free block leaving or entering the free
// indexes to the split hook; callers test h.splitHook first, so that the
// hot path pays one predictable branch when no hook is set.
func (h *Heap) leave(b *block) {
	if b.isSplit() {
		h.splitHook(b.pool, b.stream, -1, -int64(b.size))
	}
}

func (h *Heap) enter(b *block) {
	if b.isSplit() {
		h.splitHook(b.pool, b.stream, 1, int64(b.size))
	}
}

// ---- streams ----

// AddStream registers stream s (nonzero) and returns its StreamID. One
// stream value may be registered more than once (a driver may hand out the
// number of a destroyed stream again while the heap still holds memory of
// the first): each registration is its own owner.
func (h *Heap) AddStream(s backend.Stream) (StreamID, error) {
	if s == 0 {
		return 0, fmt.Errorf("%w: stream 0", ErrBadStream)
	}
	var sid StreamID
	if n := len(h.freeStreams); n > 0 {
		sid = h.freeStreams[n-1]
		h.freeStreams = h.freeStreams[:n-1]
	} else {
		if len(h.streams) >= math.MaxInt32 {
			return 0, fmt.Errorf("%w: too many streams", ErrBadStream)
		}
		h.streams = append(h.streams, streamRec{})
		sid = StreamID(len(h.streams) - 1)
	}
	st := &h.streams[sid]
	st.stream = s
	if st.free == nil {
		st.free = make([]tlsfIndex, h.npools)
	}
	return sid, nil
}

// RemoveStream unregisters sid, which must carry no block.
func (h *Heap) RemoveStream(sid StreamID) error {
	st, err := h.streamRec(sid)
	if err != nil {
		return err
	}
	if st.blocks != 0 {
		return fmt.Errorf("%w: stream %d carries %d blocks", ErrBusy, st.stream, st.blocks)
	}
	st.stream = 0
	for i := range st.free {
		st.free[i] = tlsfIndex{}
	}
	h.freeStreams = append(h.freeStreams, sid)
	return nil
}

func (h *Heap) streamRec(sid StreamID) (*streamRec, error) {
	if sid <= 0 || int(sid) >= len(h.streams) || h.streams[sid].stream == 0 {
		return nil, fmt.Errorf("%w: id %d", ErrBadStream, sid)
	}
	return &h.streams[sid], nil
}

// Stream is the stream registered as sid, or 0.
func (h *Heap) Stream(sid StreamID) backend.Stream {
	if sid <= 0 || int(sid) >= len(h.streams) {
		return 0
	}
	return h.streams[sid].stream
}

// RenameStream changes the stream id registered for sid (an owner whose
// id its driver handed to another stream). Blocks are owned by sid, so
// they follow. Unknown sid or stream 0: no change.
func (h *Heap) RenameStream(sid StreamID, s backend.Stream) {
	if s == 0 || h.Stream(sid) == 0 {
		return
	}
	h.streams[sid].stream = s
}

// StreamBlocks is the number of blocks carrying stream sid (Free,
// Allocated, PendingFree or Releasing).
func (h *Heap) StreamBlocks(sid StreamID) int {
	if h.Stream(sid) == 0 {
		return 0
	}
	return h.streams[sid].blocks
}

// ---- regions ----

// RegionInfo describes a region.
type RegionInfo struct {
	Base uintptr // first byte
	Size uint64  // nbytes
	Pool uint8
	Head BlockID // lowest block
}

// End is the address one past the region.
func (r RegionInfo) End() uintptr { return r.Base + uintptr(r.Size) }

// AddRegion adds the range [base, base+size), which must overlap no other
// region, to pool, tiled by one block in state st: Free on stream sid, or
// Unmapped (sid 0). It returns the region and its block.
func (h *Heap) AddRegion(base uintptr, size uint64, pool uint8, st State, sid StreamID) (RegionID, BlockID, error) {
	switch {
	case size == 0 || base == 0 || uint64(base)+size < uint64(base) || uint64(base)+size > uint64(^uintptr(0)):
		return 0, 0, fmt.Errorf("%w: region %#x+%d", ErrBadRange, base, size)
	case int(pool) >= h.npools:
		return 0, 0, fmt.Errorf("%w: pool %d of %d", ErrBadPool, pool, h.npools)
	case st == Free:
		if _, err := h.streamRec(sid); err != nil {
			return 0, 0, err
		}
	case st == Unmapped:
		if sid != 0 {
			return 0, 0, fmt.Errorf("%w: an unmapped region has no stream (got %d)", ErrBadStream, sid)
		}
	default:
		return 0, 0, fmt.Errorf("%w: a new region is free or unmapped, not %s", ErrBadState, st)
	}
	i := sort.Search(len(h.order), func(i int) bool { return h.regions[h.order[i]].base >= base })
	if i > 0 {
		if p := &h.regions[h.order[i-1]]; p.base+uintptr(p.size) > base {
			return 0, 0, fmt.Errorf("%w: %#x+%d overlaps region %#x+%d", ErrBadRegion, base, size, p.base, p.size)
		}
	}
	if i < len(h.order) {
		if n := &h.regions[h.order[i]]; base+uintptr(size) > n.base {
			return 0, 0, fmt.Errorf("%w: %#x+%d overlaps region %#x+%d", ErrBadRegion, base, size, n.base, n.size)
		}
	}
	if err := h.room(1); err != nil {
		return 0, 0, err
	}
	var rid RegionID
	if n := len(h.freeRegions); n > 0 {
		rid = h.freeRegions[n-1]
		h.freeRegions = h.freeRegions[:n-1]
	} else {
		if len(h.regions) >= math.MaxInt32 {
			return 0, 0, fmt.Errorf("%w: too many regions", ErrBadRegion)
		}
		h.regions = append(h.regions, regionRec{})
		rid = RegionID(len(h.regions) - 1)
	}
	id, b := h.newRec()
	b.addr, b.size, b.region, b.state, b.pool = base, size, rid, st, pool
	h.regions[rid] = regionRec{base: base, size: size, head: id, pool: pool}
	h.order = append(h.order, 0)
	copy(h.order[i+1:], h.order[i:])
	h.order[i] = rid
	if st == Free {
		b.stream = sid
		h.streams[sid].blocks++
		h.insert(h.list(b), id, b)
		if h.splitHook != nil {
			h.enter(b)
		}
	} else {
		h.unmapped[pool].ReplaceOrInsert(id)
	}
	return rid, id, nil
}

func (h *Heap) regionRec(rid RegionID) (*regionRec, error) {
	if rid <= 0 || int(rid) >= len(h.regions) || h.regions[rid].head == NoBlock {
		return nil, fmt.Errorf("%w: id %d", ErrBadRegion, rid)
	}
	return &h.regions[rid], nil
}

// Region describes region rid; ok is false if rid names no region.
func (h *Heap) Region(rid RegionID) (info RegionInfo, ok bool) {
	r, err := h.regionRec(rid)
	if err != nil {
		return RegionInfo{}, false
	}
	return RegionInfo{Base: r.base, Size: r.size, Pool: r.pool, Head: r.head}, true
}

// RegionAt is the region whose range holds addr, or 0.
func (h *Heap) RegionAt(addr uintptr) RegionID {
	i := sort.Search(len(h.order), func(i int) bool {
		r := &h.regions[h.order[i]]
		return r.base+uintptr(r.size) > addr
	})
	if i < len(h.order) && h.regions[h.order[i]].base <= addr {
		return h.order[i]
	}
	return 0
}

// Regions calls fn for every region in ascending address order until fn
// returns false. fn must not add or remove regions.
func (h *Heap) Regions(fn func(RegionID) bool) {
	for _, rid := range h.order {
		if !fn(rid) {
			return
		}
	}
}

// RemoveRegion drops region rid and every block in it, whatever its state
// (the owner has accounted for them). It refuses (ErrBusy) while a block
// of the region is Releasing or Mapping.
func (h *Heap) RemoveRegion(rid RegionID) error {
	r, err := h.regionRec(rid)
	if err != nil {
		return err
	}
	for id := r.head; id != NoBlock; id = h.rec(id).next {
		if s := h.rec(id).state; s == Releasing || s == Mapping {
			return fmt.Errorf("%w: block %#x of region %#x is %s", ErrBusy, h.rec(id).addr, r.base, s)
		}
	}
	for id := r.head; id != NoBlock; {
		b := h.rec(id)
		next := b.next
		switch b.state {
		case Free:
			if h.splitHook != nil {
				h.leave(b)
			}
			h.remove(h.list(b), id, b)
		case Unmapped:
			h.unmapped[r.pool].Delete(id)
		case Allocated:
			h.live.remove(h, id, b.addr)
		}
		h.freeRecord(id, b)
		id = next
	}
	for i, x := range h.order {
		if x == rid {
			h.order = append(h.order[:i], h.order[i+1:]...)
			break
		}
	}
	*r = regionRec{}
	h.freeRegions = append(h.freeRegions, rid)
	return nil
}

// ---- blocks ----

// BlockInfo describes a block.
type BlockInfo struct {
	Addr      uintptr        // first byte
	Size      uint64         // nbytes
	Requested uint64         // nbytes asked for; 0 unless Allocated or PendingFree
	Events    int32          // owner's event count; 0 unless Allocated or PendingFree
	State     State          //
	StreamID  StreamID       // 0 for Unmapped and Mapping blocks
	Stream    backend.Stream // the stream StreamID names
	Region    RegionID       //
	Prev      BlockID        // lower neighbour, or NoBlock
	Next      BlockID        // upper neighbour, or NoBlock
}

// End is the address one past the block.
func (b BlockInfo) End() uintptr { return b.Addr + uintptr(b.Size) }

// IsSplit reports whether the block is not the whole of its region.
func (b BlockInfo) IsSplit() bool { return b.Prev != NoBlock || b.Next != NoBlock }

// Block describes block id; ok is false if id names no block.
func (h *Heap) Block(id BlockID) (info BlockInfo, ok bool) {
	b, ok := h.valid(id)
	if !ok {
		return BlockInfo{}, false
	}
	info = BlockInfo{
		Addr: b.addr, Size: b.size, State: b.state, StreamID: b.stream, Stream: h.streams[b.stream].stream,
		Region: b.region, Prev: b.prev, Next: b.next,
	}
	if b.inUse() {
		info.Requested, info.Events = b.aux, b.up
	}
	return info, true
}

// Addr is the first byte of block id (0 if id names no block).
func (h *Heap) Addr(id BlockID) uintptr {
	if b, ok := h.valid(id); ok {
		return b.addr
	}
	return 0
}

// Size is the size of block id (0 if id names no block).
func (h *Heap) Size(id BlockID) uint64 {
	if b, ok := h.valid(id); ok {
		return b.size
	}
	return 0
}

// State is the state of block id (an invalid State if id names no block).
func (h *Heap) State(id BlockID) State {
	if b, ok := h.valid(id); ok {
		return b.state
	}
	return dead
}

// StreamOf is the stream of block id (0 if none).
func (h *Heap) StreamOf(id BlockID) StreamID {
	if b, ok := h.valid(id); ok {
		return b.stream
	}
	return 0
}

// RegionOf is the region of block id (0 if id names no block).
func (h *Heap) RegionOf(id BlockID) RegionID {
	if b, ok := h.valid(id); ok {
		return b.region
	}
	return 0
}

// PoolOf is the pool of block id's region (0 if id names no block).
func (h *Heap) PoolOf(id BlockID) uint8 {
	if b, ok := h.valid(id); ok {
		return h.pool(b)
	}
	return 0
}

// Requested is the nbytes asked for of an Allocated or PendingFree block,
// else 0.
func (h *Heap) Requested(id BlockID) uint64 {
	if b, ok := h.valid(id); ok && b.inUse() {
		return b.aux
	}
	return 0
}

// Next is the upper address neighbour of id, or NoBlock.
func (h *Heap) Next(id BlockID) BlockID {
	if b, ok := h.valid(id); ok {
		return b.next
	}
	return NoBlock
}

// Prev is the lower address neighbour of id, or NoBlock.
func (h *Heap) Prev(id BlockID) BlockID {
	if b, ok := h.valid(id); ok {
		return b.prev
	}
	return NoBlock
}

// Len is the number of blocks.
func (h *Heap) Len() int { return h.used }

// Events is the owner's event count of an Allocated or PendingFree block.
func (h *Heap) Events(id BlockID) int32 {
	if b, ok := h.valid(id); ok && b.inUse() {
		return b.up
	}
	return 0
}

// AddEvents adds d to the event count of an Allocated or PendingFree block
// and returns the new count, which may not be negative.
func (h *Heap) AddEvents(id BlockID, d int32) (int32, error) {
	b, err := h.get(id)
	if err != nil {
		return 0, err
	}
	if !b.inUse() {
		return 0, fmt.Errorf("%w: events of a %s block %#x", ErrBadState, b.state, b.addr)
	}
	n := int64(b.up) + int64(d)
	if n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("%w: event count %d%+d", ErrBadRange, b.up, d)
	}
	b.up = int32(n)
	return b.up, nil
}

// Find is the block whose range holds addr, or NoBlock. It walks the
// region: for error paths and tests.
func (h *Heap) Find(addr uintptr) BlockID {
	rid := h.RegionAt(addr)
	if rid == 0 {
		return NoBlock
	}
	for id := h.regions[rid].head; id != NoBlock; {
		b := h.rec(id)
		if addr < b.end() {
			return id
		}
		id = b.next
	}
	return NoBlock
}

// Lookup is the Allocated block starting at addr, or NoBlock. O(1).
func (h *Heap) Lookup(addr uintptr) BlockID { return h.live.get(h, addr) }

// Allocated is the number of Allocated blocks.
func (h *Heap) Allocated() int { return h.live.len() }

// Coalescable reports whether block id is Free on stream sid: a neighbour
// that a block of sid freed or mapped next to it would merge with.
func (h *Heap) Coalescable(id BlockID, sid StreamID) bool {
	b, ok := h.valid(id)
	return ok && b.state == Free && b.stream == sid
}

// Peek is the part of a block its owner's hot path reads, without the
// stream table lookup that Block does.
type Peek struct {
	Addr      uintptr  // first byte
	Size      uint64   // nbytes
	Requested uint64   // nbytes asked for; 0 unless Allocated or PendingFree
	Events    int32    // owner's event count; 0 unless Allocated or PendingFree
	Stream    StreamID // 0 for Unmapped and Mapping blocks
	Pool      uint8    // the region's pool
	State     State    //
}

// Peek describes block id; ok is false if id names no block.
func (h *Heap) Peek(id BlockID) (p Peek, ok bool) {
	b, ok := h.valid(id)
	if !ok {
		return Peek{}, false
	}
	p = Peek{Addr: b.addr, Size: b.size, Stream: b.stream, Pool: b.pool, State: b.state}
	if b.inUse() {
		p.Requested, p.Events = b.aux, b.up
	}
	return p, true
}

// BestFitAt is BestFit that also returns the block's address and size
// (NoBlock, 0, 0 when none fits).
func (h *Heap) BestFitAt(sid StreamID, pool uint8, size uint64) (BlockID, uintptr, uint64) {
	id := h.BestFit(sid, pool, size)
	if id == NoBlock {
		return NoBlock, 0, 0
	}
	b := h.rec(id)
	return id, b.addr, b.size
}
