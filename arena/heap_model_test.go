package arena

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/vmmalloc/vmmalloc/backend"
)

// The reference model: every region a slice of plain blocks in address
// order; every operation done the obvious way, then every pair of
// neighbours that must be coalesced merged. The heap must agree with it
// block for block after every operation.

type mBlock struct {
	addr      uintptr
	size      uint64
	state     State
	stream    StreamID
	requested uint64
	events    int32
}

type mRegion struct {
	id     RegionID
	base   uintptr
	size   uint64
	pool   uint8
	blocks []mBlock
}

type model struct {
	regions []*mRegion // ascending base
	// inactive split per pool, as the split hook should report it
	splitN, splitBytes [2]int64
}

func (m *model) region(addr uintptr) *mRegion {
	for _, r := range m.regions {
		if addr >= r.base && addr < r.base+uintptr(r.size) {
			return r
		}
	}
	return nil
}

// at is the index of the block starting at addr in r, or -1.
func (r *mRegion) at(addr uintptr) int {
	for i, b := range r.blocks {
		if b.addr == addr {
			return i
		}
	}
	return -1
}

// normalize merges neighbours that must be coalesced.
func (r *mRegion) normalize() {
	out := r.blocks[:1]
	for _, b := range r.blocks[1:] {
		p := &out[len(out)-1]
		if (p.state == Free && b.state == Free && p.stream == b.stream) || (p.state == Unmapped && b.state == Unmapped) {
			p.size += b.size
			continue
		}
		out = append(out, b)
	}
	r.blocks = out
}

// cut splits block i of r at offset k (0 < k < size).
func (r *mRegion) cut(i int, k uint64) {
	b := r.blocks[i]
	hi := b
	hi.addr += uintptr(k)
	hi.size -= k
	r.blocks[i].size = k
	r.blocks = slices.Insert(r.blocks, i+1, hi)
}

// bestFit is the model's best fit: scan every free block of sid in pool.
func (m *model) bestFit(sid StreamID, pool uint8, size uint64) (uintptr, bool) {
	var best *mBlock
	for _, r := range m.regions {
		if r.pool != pool {
			continue
		}
		for i := range r.blocks {
			b := &r.blocks[i]
			if b.state == Free && b.stream == sid && b.size >= size &&
				(best == nil || b.size < best.size || b.size == best.size && b.addr < best.addr) {
				best = b
			}
		}
	}
	if best == nil {
		return 0, false
	}
	return best.addr, true
}

func (m *model) recountSplit() {
	m.splitN, m.splitBytes = [2]int64{}, [2]int64{}
	for _, r := range m.regions {
		if len(r.blocks) < 2 {
			continue
		}
		for _, b := range r.blocks {
			if b.state == Free {
				m.splitN[r.pool]++
				m.splitBytes[r.pool] += int64(b.size)
			}
		}
	}
}

// chooser supplies the random choices of a run: a PRNG or fuzz bytes.
type chooser interface {
	intn(n int) int // in [0, n); n > 0
	done() bool
}

type rngChooser struct {
	r    *rand.Rand
	left int
}

func (c *rngChooser) intn(n int) int { return c.r.IntN(n) }
func (c *rngChooser) done() bool     { c.left--; return c.left < 0 }

type byteChooser struct{ data []byte }

func (c *byteChooser) intn(n int) int {
	if len(c.data) == 0 {
		return 0
	}
	v := int(c.data[0])
	if n > 256 && len(c.data) > 1 {
		v = v<<8 | int(c.data[1])
		c.data = c.data[1:]
	}
	c.data = c.data[1:]
	return v % n
}
func (c *byteChooser) done() bool { return len(c.data) == 0 }

// harness runs random operations on a heap and the model side by side.
type harness struct {
	h       *Heap
	m       model
	c       chooser
	streams []StreamID
	hooked  bool // the heap has a split hook, counting into hookN and hookB
	hookN   [2]int64
	hookB   [2]int64
	fail    func(format string, args ...any)
	inTrans []uintptr // addresses of Mapping and Releasing blocks
	nextVA  uintptr
}

const unit = 512

// newHarness makes a harness over a new heap, with a split hook that
// counts inactive_split when hooked. Without one, AllocFit and FreeAt
// take their fast paths (the memo's split and merge back), which a hook
// turns off.
func newHarness(c chooser, fail func(string, ...any), hooked bool) *harness {
	h, err := NewHeap(2)
	if err != nil {
		fail("NewHeap: %v", err)
	}
	x := &harness{h: h, c: c, fail: fail, nextVA: 1 << 30, hooked: hooked}
	if hooked {
		h.SetSplitHook(func(pool uint8, _ StreamID, n, bytes int64) {
			x.hookN[pool] += n
			x.hookB[pool] += bytes
		})
	}
	for s := backend.Stream(1); s <= 3; s++ {
		sid, err := h.AddStream(s * 100)
		if err != nil {
			fail("AddStream: %v", err)
		}
		x.streams = append(x.streams, sid)
	}
	return x
}

// pick returns a random block of the model in state st (any state if st
// is dead), its region and index.
func (x *harness) pick(st State) (*mRegion, int, bool) {
	var cands [][2]int
	for ri, r := range x.m.regions {
		for i, b := range r.blocks {
			if st == dead || b.state == st {
				cands = append(cands, [2]int{ri, i})
			}
		}
	}
	if len(cands) == 0 {
		return nil, 0, false
	}
	c := cands[x.c.intn(len(cands))]
	return x.m.regions[c[0]], c[1], true
}

func (x *harness) id(addr uintptr) BlockID {
	id := x.h.Find(addr)
	if id == NoBlock || x.h.Addr(id) != addr {
		x.fail("no heap block at %#x", addr)
	}
	return id
}

// units returns a random multiple of 512 in [512, max].
func (x *harness) units(max uint64) uint64 {
	n := int(max / unit)
	if n > 64 && x.c.intn(4) != 0 {
		n = 64
	}
	return uint64(x.c.intn(n)+1) * unit
}

// expectErr checks that err wraps want and that the heap did not change.
func (x *harness) expectErr(op string, err, want error) {
	if err == nil || !errors.Is(err, want) {
		x.fail("%s: error %v, want %v", op, err, want)
	}
}

func (x *harness) step() {
	h, m := x.h, &x.m
	switch op := x.c.intn(16); op {
	case 0: // add a region
		if len(m.regions) >= 6 {
			break
		}
		size := uint64(x.c.intn(32)+1) * 4 * unit
		if x.c.intn(3) == 0 {
			size *= 64 // large enough that small allocations keep the remainder's class
		}
		pool := uint8(x.c.intn(2))
		base := x.nextVA
		x.nextVA += uintptr(size) + uintptr(x.c.intn(2))*unit // sometimes adjacent to the last
		st, sid := Unmapped, StreamID(0)
		if x.c.intn(2) == 0 {
			st, sid = Free, x.streams[x.c.intn(len(x.streams))]
		}
		rid, id, err := h.AddRegion(base, size, pool, st, sid)
		if err != nil {
			x.fail("AddRegion: %v", err)
		}
		if h.Addr(id) != base {
			x.fail("AddRegion: block at %#x, want %#x", h.Addr(id), base)
		}
		m.regions = append(m.regions, &mRegion{id: rid, base: base, size: size, pool: pool,
			blocks: []mBlock{{addr: base, size: size, state: st, stream: sid}}})
	case 1, 2, 3: // best fit and alloc
		sid := x.streams[x.c.intn(len(x.streams))]
		pool := uint8(x.c.intn(2))
		size := x.units(16 * unit)
		want, ok := m.bestFit(sid, pool, size)
		if x.c.intn(2) == 0 {
			x.allocFit(sid, pool, size, want, ok)
			break
		}
		got := h.BestFit(sid, pool, size)
		if !ok {
			if got != NoBlock {
				x.fail("BestFit(%d, %d, %d) = %#x, model none", sid, pool, size, h.Addr(got))
			}
			break
		}
		if h.Addr(got) != want {
			x.fail("BestFit(%d, %d, %d) = %#x, model %#x", sid, pool, size, h.Addr(got), want)
		}
		x.alloc(got, want, size)
	case 4: // alloc a random free block
		r, i, ok := x.pick(Free)
		if !ok {
			break
		}
		b := r.blocks[i]
		x.alloc(x.id(b.addr), b.addr, x.units(b.size))
	case 5, 6: // free
		r, i, ok := x.pick(dead)
		if !ok {
			break
		}
		b := r.blocks[i]
		id := x.id(b.addr)
		if b.state != Allocated && b.state != PendingFree {
			_, err := h.Free(id)
			x.expectErr("Free of "+b.state.String(), err, ErrBadState)
			break
		}
		if x.c.intn(2) == 0 { // the cache-hit path
			p, ok := h.FreeAt(b.addr)
			if b.state != Allocated || b.events != 0 {
				if ok {
					x.fail("FreeAt(%#x) of a %s block with %d events freed it", b.addr, b.state, b.events)
				}
				break
			}
			want := Freed{Size: b.size, Requested: b.requested, Stream: b.stream, Pool: r.pool}
			if !ok || p != want {
				x.fail("FreeAt(%#x) = %+v, %v, want %+v", b.addr, p, ok, want)
			}
		} else if _, err := h.Free(id); err != nil {
			x.fail("Free: %v", err)
		}
		r.blocks[i].state, r.blocks[i].requested, r.blocks[i].events = Free, 0, 0
		r.normalize()
	case 7: // mark pending, add events
		r, i, ok := x.pick(Allocated)
		if !ok {
			break
		}
		id := x.id(r.blocks[i].addr)
		if _, err := h.AddEvents(id, 2); err != nil {
			x.fail("AddEvents: %v", err)
		}
		if err := h.MarkPending(id); err != nil {
			x.fail("MarkPending: %v", err)
		}
		r.blocks[i].state = PendingFree
		r.blocks[i].events += 2
		if err := h.MarkPending(id); !errors.Is(err, ErrBadState) {
			x.fail("MarkPending twice: %v", err)
		}
	case 8: // begin map
		r, i, ok := x.pick(Unmapped)
		if !ok {
			break
		}
		b := r.blocks[i]
		off := uint64(x.c.intn(int(b.size/unit))) * unit
		n := x.units(b.size - off)
		mid, err := h.BeginMap(x.id(b.addr), off, n)
		if err != nil {
			x.fail("BeginMap: %v", err)
		}
		x.carve(r, i, off, n, Mapping, 0)
		x.inTrans = append(x.inTrans, h.Addr(mid))
		if h.Addr(mid) != b.addr+uintptr(off) {
			x.fail("BeginMap: block at %#x, want %#x", h.Addr(mid), b.addr+uintptr(off))
		}
	case 9: // begin release
		r, i, ok := x.pick(Free)
		if !ok {
			break
		}
		b := r.blocks[i]
		off := uint64(x.c.intn(int(b.size/unit))) * unit
		n := x.units(b.size - off)
		mid, err := h.BeginRelease(x.id(b.addr), off, n)
		if err != nil {
			x.fail("BeginRelease: %v", err)
		}
		x.carve(r, i, off, n, Releasing, b.stream)
		x.inTrans = append(x.inTrans, h.Addr(mid))
	case 10, 11: // finish a transition
		if len(x.inTrans) == 0 {
			break
		}
		k := x.c.intn(len(x.inTrans))
		addr := x.inTrans[k]
		x.inTrans = slices.Delete(x.inTrans, k, k+1)
		r := m.region(addr)
		i := r.at(addr)
		b := r.blocks[i]
		id := x.id(addr)
		switch {
		case b.state == Mapping && x.c.intn(3) > 0:
			sid := x.streams[x.c.intn(len(x.streams))]
			if _, err := h.CommitMap(id, sid); err != nil {
				x.fail("CommitMap: %v", err)
			}
			r.blocks[i].state, r.blocks[i].stream = Free, sid
		case b.state == Mapping:
			if _, err := h.AbortMap(id); err != nil {
				x.fail("AbortMap: %v", err)
			}
			r.blocks[i].state = Unmapped
		case x.c.intn(4) == 0:
			if _, err := h.AbortRelease(id); err != nil {
				x.fail("AbortRelease: %v", err)
			}
			r.blocks[i].state = Free
		default:
			done := uint64(x.c.intn(int(b.size/unit)+1)) * unit
			if _, err := h.CommitRelease(id, done); err != nil {
				x.fail("CommitRelease: %v", err)
			}
			if done == 0 {
				r.blocks[i].state = Free
				break
			}
			if done < b.size {
				r.cut(i, done)
				r.blocks[i+1].state = Free
			}
			r.blocks[i].state, r.blocks[i].stream = Unmapped, 0
		}
		r.normalize()
	case 12: // remove a region
		if len(m.regions) == 0 {
			break
		}
		k := x.c.intn(len(m.regions))
		r := m.regions[k]
		busy := slices.ContainsFunc(r.blocks, func(b mBlock) bool { return b.state == Mapping || b.state == Releasing })
		err := h.RemoveRegion(r.id)
		if busy {
			x.expectErr("RemoveRegion", err, ErrBusy)
			break
		}
		if err != nil {
			x.fail("RemoveRegion: %v", err)
		}
		m.regions = slices.Delete(m.regions, k, k+1)
	case 13: // misuse changes nothing
		r, i, ok := x.pick(dead)
		if !ok {
			break
		}
		b := r.blocks[i]
		id := x.id(b.addr)
		before := x.dump()
		var err error
		switch x.c.intn(7) {
		case 6:
			if b.state != Free {
				_, err = h.AdoptRange(id, 0, unit, x.streams[0])
				x.expectErr("AdoptRange", err, ErrBadState)
			} else if _, err = h.AdoptRange(id, 0, 1<<40, x.streams[0]); !errors.Is(err, ErrBadState) {
				x.expectErr("AdoptRange past the region", err, ErrBadRange)
			}
		case 0:
			err = h.Alloc(id, b.size+unit, 1)
			if b.state == Free {
				x.expectErr("Alloc too big", err, ErrBadRange)
			} else {
				x.expectErr("Alloc", err, ErrBadState)
			}
		case 1:
			if b.state != Unmapped {
				_, err = h.BeginMap(id, 0, unit)
				x.expectErr("BeginMap", err, ErrBadState)
			} else {
				_, err = h.BeginMap(id, b.size, unit)
				x.expectErr("BeginMap past the end", err, ErrBadRange)
			}
		case 2:
			if b.state != Free {
				_, err = h.BeginRelease(id, 0, unit)
				x.expectErr("BeginRelease", err, ErrBadState)
			} else {
				_, err = h.BeginRelease(id, 0, b.size+1)
				x.expectErr("BeginRelease too long", err, ErrBadRange)
			}
		case 3:
			if b.state != Releasing {
				_, err = h.CommitRelease(id, 0)
				x.expectErr("CommitRelease", err, ErrBadState)
			} else {
				_, err = h.CommitRelease(id, b.size+unit)
				x.expectErr("CommitRelease too much", err, ErrBadRange)
			}
		case 4:
			_, err = h.Free(BlockID(h.nrec) + 5)
			x.expectErr("Free of no block", err, ErrBadBlock)
		default:
			if b.state == Mapping {
				_, err = h.CommitMap(id, 99)
				x.expectErr("CommitMap on a bad stream", err, ErrBadStream)
			} else {
				_, err = h.CommitMap(id, x.streams[0])
				x.expectErr("CommitMap", err, ErrBadState)
			}
		}
		if after := x.dump(); after != before {
			x.fail("a failed operation changed the heap:\nbefore %s\nafter  %s", before, after)
		}
	case 14: // move every block of one stream to another
		from := x.streams[x.c.intn(len(x.streams))]
		to := x.streams[x.c.intn(len(x.streams))]
		if err := h.MoveStream(from, to); err != nil {
			x.fail("MoveStream: %v", err)
		}
		for _, r := range m.regions {
			for i := range r.blocks {
				if r.blocks[i].stream == from {
					r.blocks[i].stream = to
				}
			}
			r.normalize()
		}
	case 15: // adopt a range of a run of free blocks
		r, i, ok := x.pick(Free)
		if !ok {
			break
		}
		j := i + 1
		run := r.blocks[i].size
		for j < len(r.blocks) && r.blocks[j].state == Free && x.c.intn(3) > 0 {
			run += r.blocks[j].size
			j++
		}
		off := uint64(x.c.intn(int(r.blocks[i].size/unit))) * unit
		n := x.units(run - off)
		sid := x.streams[x.c.intn(len(x.streams))]
		start := r.blocks[i].addr
		if _, err := h.AdoptRange(x.id(start), off, n, sid); err != nil {
			x.fail("AdoptRange: %v", err)
		}
		lo, hi := start+uintptr(off), start+uintptr(off+n)
		for k := 0; k < len(r.blocks); k++ {
			b := r.blocks[k]
			if b.addr+uintptr(b.size) <= lo || b.addr >= hi {
				continue
			}
			if b.addr < lo {
				r.cut(k, uint64(lo-b.addr))
				continue // the next iteration sees the upper part
			}
			if b.addr+uintptr(b.size) > hi {
				r.cut(k, uint64(hi-b.addr))
			}
			r.blocks[k].stream = sid
		}
		r.normalize()
	}
	x.compare()
}

// alloc allocates n bytes (rounded to whole units) of Free block id at addr.
func (x *harness) alloc(id BlockID, addr uintptr, n uint64) {
	r := x.m.region(addr)
	i := r.at(addr)
	b := r.blocks[i]
	n = min(n, b.size)
	req := n - uint64(x.c.intn(unit))
	if err := x.h.Alloc(id, n, req); err != nil {
		x.fail("Alloc(%#x, %d): %v", addr, n, err)
	}
	if n < b.size {
		r.cut(i, n)
	}
	r.blocks[i].state, r.blocks[i].requested = Allocated, req
	if x.h.Lookup(addr) != id {
		x.fail("Lookup(%#x) after Alloc = %d, want %d", addr, x.h.Lookup(addr), id)
	}
}

// allocFit runs AllocFit for size bytes of stream sid in pool, whose
// best fit the model says is at want (ok), with random limits.
func (x *harness) allocFit(sid StreamID, pool uint8, size uint64, want uintptr, ok bool) {
	maxSize := uint64(math.MaxUint64)
	if x.c.intn(4) == 0 {
		maxSize = size + x.units(8*unit) - unit
	}
	minSplit := []uint64{1, unit, 4 * unit, math.MaxUint64}[x.c.intn(4)]
	req := size - uint64(x.c.intn(unit))
	id, addr, n := x.h.AllocFit(sid, pool, size, req, maxSize, minSplit)
	var b mBlock
	if ok {
		b = x.m.region(want).blocks[x.m.region(want).at(want)]
	}
	if !ok || b.size > maxSize {
		if id != NoBlock {
			x.fail("AllocFit(%d, %d, %d, max %d) = %#x, model none", sid, pool, size, maxSize, addr)
		}
		return
	}
	wantN := b.size
	if b.size-size >= minSplit {
		wantN = size
	}
	if id == NoBlock || addr != want || n != wantN {
		x.fail("AllocFit(%d, %d, %d, max %d, split %d) = %d %#x+%d, model %#x+%d", sid, pool, size, maxSize, minSplit, id, addr, n, want, wantN)
	}
	r := x.m.region(want)
	i := r.at(want)
	if n < b.size {
		r.cut(i, n)
	}
	r.blocks[i].state, r.blocks[i].requested = Allocated, req
	if x.h.Lookup(addr) != id {
		x.fail("Lookup(%#x) after AllocFit = %d, want %d", addr, x.h.Lookup(addr), id)
	}
}

// carve makes [off, off+n) of block i of r a block of state st.
func (x *harness) carve(r *mRegion, i int, off, n uint64, st State, sid StreamID) {
	if off > 0 {
		r.cut(i, off)
		i++
	}
	if n < r.blocks[i].size {
		r.cut(i, n)
	}
	r.blocks[i].state, r.blocks[i].stream = st, sid
}

// dump renders the whole heap as the model sees it.
func (x *harness) dump() string {
	var s strings.Builder
	x.h.Regions(func(rid RegionID) bool {
		ri, _ := x.h.Region(rid)
		fmt.Fprintf(&s, "[%#x+%d p%d:", ri.Base, ri.Size, ri.Pool)
		for id := ri.Head; id != NoBlock; id = x.h.Next(id) {
			b, _ := x.h.Block(id)
			fmt.Fprintf(&s, " %#x+%d %s s%d r%d e%d", b.Addr, b.Size, b.State, b.StreamID, b.Requested, b.Events)
		}
		s.WriteString("]")
		return true
	})
	return s.String()
}

func (x *harness) compare() {
	if err := x.h.Check(); err != nil {
		x.fail("Check: %v\n%s", err, x.dump())
	}
	var w strings.Builder
	for _, r := range x.m.regions {
		fmt.Fprintf(&w, "[%#x+%d p%d:", r.base, r.size, r.pool)
		for _, b := range r.blocks {
			fmt.Fprintf(&w, " %#x+%d %s s%d r%d e%d", b.addr, b.size, b.state, b.stream, b.requested, b.events)
		}
		w.WriteString("]")
	}
	if got, want := x.dump(), w.String(); got != want {
		x.fail("heap and model differ:\nheap  %s\nmodel %s", got, want)
	}
	x.m.recountSplit()
	if x.hooked && (x.hookN != x.m.splitN || x.hookB != x.m.splitBytes) {
		x.fail("split hook says %v blocks %v bytes, model %v %v", x.hookN, x.hookB, x.m.splitN, x.m.splitBytes)
	}
	// Lookup finds exactly the allocated blocks.
	n := 0
	for _, r := range x.m.regions {
		for _, b := range r.blocks {
			got := x.h.Lookup(b.addr)
			if (got != NoBlock) != (b.state == Allocated) {
				x.fail("Lookup(%#x) = %d for a %s block", b.addr, got, b.state)
			}
			if b.state == Allocated {
				n++
			}
			if b.size > unit && x.h.Lookup(b.addr+unit) != NoBlock {
				x.fail("Lookup of an interior address found a block")
			}
		}
	}
	if x.h.Allocated() != n {
		x.fail("Allocated() = %d, model %d", x.h.Allocated(), n)
	}
}

func TestHeapAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		for _, hooked := range []bool{true, false} {
			t.Run(fmt.Sprintf("seed=%d/hook=%v", seed, hooked), func(t *testing.T) {
				c := &rngChooser{r: rand.New(rand.NewPCG(seed, 77)), left: 2500}
				x := newHarness(c, t.Fatalf, hooked)
				for !c.done() {
					x.step()
				}
			})
		}
	}
}

func FuzzHeap(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 2, 5, 5, 9, 3, 10, 0})
	f.Add([]byte("\x00\x10\x01\x00\x01\x02\x08\x02\x04\x00\x0a\x01\x06\x0c\x00"))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &byteChooser{data: data}
		// Inputs of even length run with a split hook, odd ones without.
		hooked := len(data)%2 == 0
		x := newHarness(c, t.Fatalf, hooked)
		for !c.done() {
			x.step()
		}
	})
}
