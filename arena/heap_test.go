package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

const testBase = uintptr(1 << 32)

// piece is one block of a test layout: units of 512 bytes, left free or
// allocated.
type piece struct {
	units int
	free  bool
}

// buildLayout makes a heap with streams 100 and 200 and one pool-0 region
// at testBase of total units, Free on stream 100, allocates the pieces in
// address order and frees the ones marked free. The rest of the region is
// a free tail. It returns the heap and the two stream ids.
func buildLayout(t *testing.T, total int, pieces []piece) (*Heap, StreamID, StreamID) {
	t.Helper()
	h, err := NewHeap(2)
	require.NoError(t, err)
	s1, err := h.AddStream(100)
	require.NoError(t, err)
	s2, err := h.AddStream(200)
	require.NoError(t, err)
	_, head, err := h.AddRegion(testBase, uint64(total)*unit, 0, Free, s1)
	require.NoError(t, err)
	var ids []BlockID
	next := head
	for _, p := range pieces {
		n := uint64(p.units) * unit
		require.NoError(t, h.Alloc(next, n, n))
		ids = append(ids, next)
		next = h.Next(next)
	}
	for i, p := range pieces {
		if p.free {
			_, err := h.Free(ids[i])
			require.NoError(t, err)
		}
	}
	require.NoError(t, h.Check())
	return h, s1, s2
}

func TestHeapBestFitTable(t *testing.T) {
	// Given these blocks, allocating N lands at X.
	holes := []piece{{4, true}, {2, false}, {2, true}, {2, false}, {8, true}, {1, false}, {2, true}, {1, false}}
	at := func(units int) uintptr { return testBase + uintptr(units)*unit }
	cases := []struct {
		name   string
		pieces []piece
		units  int     // request, in 512-byte units
		want   uintptr // 0: no fit
	}{
		{"smallest hole that fits", holes, 2, at(6)},
		{"equal holes: lowest address", holes, 2, at(6)},
		{"between sizes: next larger", holes, 3, at(0)},
		{"exact larger hole", holes, 4, at(0)},
		{"skips smaller holes", holes, 5, at(10)},
		{"only the tail fits", holes, 9, at(22)},
		{"tail exactly", holes, 42, at(22)},
		{"nothing fits", holes, 43, 0},
		{"freed neighbours coalesce", []piece{{2, true}, {3, true}, {1, false}}, 5, at(0)},
		{"coalesced with the tail", []piece{{2, false}, {3, true}}, 62, at(2)},
		{"one-unit request", []piece{{1, false}, {1, true}, {1, false}}, 1, at(1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, s1, s2 := buildLayout(t, 64, c.pieces)
			got := h.BestFit(s1, 0, uint64(c.units)*unit)
			if c.want == 0 {
				assert.Equal(t, NoBlock, got)
				return
			}
			require.NotEqual(t, NoBlock, got)
			assert.Equal(t, c.want, h.Addr(got))
			// Another stream or another pool sees none of stream 100's blocks.
			assert.Equal(t, NoBlock, h.BestFit(s2, 0, unit))
			assert.Equal(t, NoBlock, h.BestFit(s1, 1, unit))
			require.NoError(t, h.Alloc(got, uint64(c.units)*unit, 1))
			assert.Equal(t, Allocated, h.State(got))
			assert.Equal(t, got, h.Lookup(c.want))
			require.NoError(t, h.Check())
		})
	}
}

func TestHeapAllocSplitsAndFreeMerges(t *testing.T) {
	h, s1, _ := buildLayout(t, 64, nil)
	head := h.BestFit(s1, 0, unit)
	require.NoError(t, h.Alloc(head, 3*unit, 1000))
	b, ok := h.Block(head)
	require.True(t, ok)
	assert.Equal(t, BlockInfo{Addr: testBase, Size: 3 * unit, Requested: 1000, State: Allocated, StreamID: s1,
		Stream: 100, Region: b.Region, Next: b.Next}, b)
	rest, ok := h.Block(b.Next)
	require.True(t, ok)
	assert.Equal(t, Free, rest.State)
	assert.Equal(t, testBase+3*unit, rest.Addr)
	assert.Equal(t, uint64(61*unit), rest.Size)
	assert.Equal(t, head, rest.Prev)
	assert.Equal(t, 1, h.FreeLen(s1, 0))
	assert.Equal(t, uint64(61*unit), h.FreeBytes(s1, 0))
	assert.Equal(t, 2, h.StreamBlocks(s1))

	merged, err := h.Free(head)
	require.NoError(t, err)
	assert.Equal(t, head, merged)
	assert.Equal(t, uint64(64*unit), h.Size(head))
	assert.Equal(t, NoBlock, h.Next(head))
	assert.Equal(t, 1, h.Len())
	assert.Equal(t, NoBlock, h.Lookup(testBase))
	require.NoError(t, h.Check())
}

// TestHeapSameClassCrowd keeps thousands of free blocks in one class of
// one stream, so allocation and free take the in-place treap paths deep in
// a treap, and checks the heap after every step.
func TestHeapSameClassCrowd(t *testing.T) {
	var pieces []piece
	for i := 0; i < 600; i++ {
		pieces = append(pieces, piece{32 + i%2, true}, piece{1, false})
	}
	h, s1, _ := buildLayout(t, 700*40, pieces)
	require.Equal(t, 601, h.FreeLen(s1, 0))
	for i := 0; i < 600; i++ {
		n := uint64(1+i%3) * unit
		id := h.BestFit(s1, 0, n)
		require.NotEqual(t, NoBlock, id)
		want := NoBlock
		h.EachFree(s1, 0, func(x BlockID) bool { // the first in (size, address) order that fits
			if h.Size(x) >= n {
				want = x
				return false
			}
			return true
		})
		require.Equal(t, want, id)
		require.NoError(t, h.Alloc(id, n, n))
		if i%2 == 0 {
			_, err := h.Free(id)
			require.NoError(t, err)
		}
		if i%50 == 0 {
			require.NoError(t, h.Check())
		}
	}
	require.NoError(t, h.Check())
	// EachFree yields ascending (size, address).
	var last BlockInfo
	n := 0
	h.EachFree(s1, 0, func(id BlockID) bool {
		b, _ := h.Block(id)
		if n > 0 {
			require.True(t, last.Size < b.Size || last.Size == b.Size && last.Addr < b.Addr)
		}
		last = b
		n++
		return true
	})
	assert.Equal(t, h.FreeLen(s1, 0), n)
}

func TestHeapTransitionsAreSkipped(t *testing.T) {
	h, s1, s2 := buildLayout(t, 64, []piece{{4, false}, {4, false}, {4, false}})
	a := h.Lookup(testBase)
	mid := h.Next(a)
	// Release the 52-unit tail except its first 4 units.
	tail := h.BestFit(s1, 0, unit)
	require.Equal(t, testBase+12*unit, h.Addr(tail))
	rel, err := h.BeginRelease(tail, 4*unit, 48*unit)
	require.NoError(t, err)
	assert.Equal(t, Releasing, h.State(rel))
	assert.Equal(t, testBase+16*unit, h.Addr(rel))
	// Best fit skips the releasing range: only the 4 units before it fit.
	assert.Equal(t, testBase+12*unit, h.Addr(h.BestFit(s1, 0, unit)))
	assert.Equal(t, NoBlock, h.BestFit(s1, 0, 5*unit))
	// Freeing the block before the 4 free units merges with them, not past.
	last := h.Next(mid)
	merged, err := h.Free(last)
	require.NoError(t, err)
	assert.Equal(t, uint64(8*unit), h.Size(merged))
	assert.Equal(t, rel, h.Next(merged))
	_, err = h.CommitMap(rel, s2)
	assert.ErrorIs(t, err, ErrBadState)
	require.NoError(t, h.Check())
	assert.ErrorIs(t, h.RemoveRegion(h.RegionOf(rel)), ErrBusy)

	// 16 of the 48 bytes could be unmapped: they become Unmapped, the rest
	// Free again, merged with the free block after it.
	u, err := h.CommitRelease(rel, 16*unit)
	require.NoError(t, err)
	assert.Equal(t, Unmapped, h.State(u))
	assert.Equal(t, uint64(16*unit), h.Size(u))
	assert.Equal(t, StreamID(0), h.StreamOf(u))
	rest := h.Next(u)
	assert.Equal(t, Free, h.State(rest))
	assert.Equal(t, uint64(32*unit), h.Size(rest))
	assert.Equal(t, 1, h.UnmappedLen(0))

	// Map 8 units in the middle of the hole for stream 2: Mapping is
	// skipped by the unmapped walk until committed.
	m, err := h.BeginMap(u, 4*unit, 8*unit)
	require.NoError(t, err)
	var seen []uintptr
	h.AscendUnmapped(0, func(id BlockID) bool { seen = append(seen, h.Addr(id)); return true })
	assert.Equal(t, []uintptr{testBase + 16*unit, testBase + 28*unit}, seen)
	got, err := h.CommitMap(m, s2)
	require.NoError(t, err)
	assert.Equal(t, m, got, "no free block of stream 2 to merge with")
	assert.Equal(t, testBase+20*unit, h.Addr(h.BestFit(s2, 0, unit)))
	assert.True(t, h.Coalescable(m, s2))
	assert.False(t, h.Coalescable(m, s1))
	require.NoError(t, h.Check())

	// Releasing it all again and aborting the release restores the block.
	rel, err = h.BeginRelease(m, 0, 8*unit)
	require.NoError(t, err)
	back, err := h.AbortRelease(rel)
	require.NoError(t, err)
	assert.Equal(t, rel, back)
	assert.Equal(t, Free, h.State(back))
	rel, err = h.BeginRelease(m, 0, 8*unit)
	require.NoError(t, err)
	u, err = h.CommitRelease(rel, 8*unit)
	require.NoError(t, err)
	assert.Equal(t, uint64(16*unit), h.Size(u), "the whole hole is one unmapped block again")
	assert.Equal(t, 1, h.UnmappedLen(0))
	require.NoError(t, h.Check())
}

func TestHeapAddRegionErrors(t *testing.T) {
	h, err := NewHeap(2)
	require.NoError(t, err)
	sid, err := h.AddStream(7)
	require.NoError(t, err)
	_, _, err = h.AddRegion(0x10000, 0x10000, 1, Unmapped, 0)
	require.NoError(t, err)
	cases := []struct {
		name string
		base uintptr
		size uint64
		pool uint8
		st   State
		sid  StreamID
		want error
	}{
		{"zero size", 0x40000, 0, 0, Free, sid, ErrBadRange},
		{"wraps around", ^uintptr(0) - 10, 100, 0, Free, sid, ErrBadRange},
		{"overlaps below", 0x8000, 0x9000, 0, Free, sid, ErrBadRegion},
		{"overlaps above", 0x1f000, 0x1000, 0, Free, sid, ErrBadRegion},
		{"inside", 0x11000, 0x1000, 0, Free, sid, ErrBadRegion},
		{"bad pool", 0x40000, 0x1000, 2, Free, sid, ErrBadPool},
		{"free without stream", 0x40000, 0x1000, 0, Free, 0, ErrBadStream},
		{"free on unknown stream", 0x40000, 0x1000, 0, Free, 9, ErrBadStream},
		{"unmapped with stream", 0x40000, 0x1000, 0, Unmapped, sid, ErrBadStream},
		{"allocated", 0x40000, 0x1000, 0, Allocated, sid, ErrBadState},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := h.AddRegion(c.base, c.size, c.pool, c.st, c.sid)
			assert.ErrorIs(t, err, c.want)
			assert.Equal(t, 1, h.Len())
			require.NoError(t, h.Check())
		})
	}
	// Adjacent regions are fine.
	_, _, err = h.AddRegion(0x20000, 0x1000, 1, Unmapped, 0)
	require.NoError(t, err)
	assert.Equal(t, 2, h.UnmappedLen(1), "adjacent regions do not coalesce")
	_, err = NewHeap(0)
	assert.ErrorIs(t, err, ErrBadPool)
}

func TestHeapStreams(t *testing.T) {
	h, err := NewHeap(1)
	require.NoError(t, err)
	_, err = h.AddStream(0)
	assert.ErrorIs(t, err, ErrBadStream)
	a, err := h.AddStream(5)
	require.NoError(t, err)
	dup, err := h.AddStream(5)
	require.NoError(t, err)
	assert.NotEqual(t, a, dup, "a stream value registered twice has two owners")
	require.NoError(t, h.RemoveStream(dup))
	assert.Equal(t, backend.Stream(5), h.Stream(a))
	rid, head, err := h.AddRegion(0x100000, 4096, 0, Free, a)
	require.NoError(t, err)
	require.NoError(t, h.Alloc(head, 512, 512))
	assert.ErrorIs(t, h.RemoveStream(a), ErrBusy)
	require.NoError(t, h.RemoveRegion(rid))
	assert.Equal(t, 0, h.StreamBlocks(a))
	assert.Equal(t, 0, h.Allocated())
	require.NoError(t, h.RemoveStream(a))
	assert.ErrorIs(t, h.RemoveStream(a), ErrBadStream)
	assert.Equal(t, NoBlock, h.BestFit(a, 0, 1))
	b, err := h.AddStream(6)
	require.NoError(t, err)
	assert.Equal(t, a, b, "the last freed slot is reused")
	assert.Equal(t, 0, h.FreeLen(b, 0))
	require.NoError(t, h.Check())
}

func TestHeapFindAndEvents(t *testing.T) {
	h, s1, _ := buildLayout(t, 16, []piece{{2, false}, {2, false}})
	first := h.Lookup(testBase)
	assert.Equal(t, first, h.Find(testBase+700))
	assert.Equal(t, NoBlock, h.Find(testBase+16*unit))
	assert.Equal(t, NoBlock, h.Find(testBase-1))
	assert.Equal(t, h.RegionOf(first), h.RegionAt(testBase+5))
	n, err := h.AddEvents(first, 3)
	require.NoError(t, err)
	assert.Equal(t, int32(3), n)
	_, err = h.AddEvents(first, -4)
	assert.ErrorIs(t, err, ErrBadRange)
	require.NoError(t, h.MarkPending(first))
	assert.Equal(t, NoBlock, h.Lookup(testBase), "pending blocks are not live")
	assert.Equal(t, int32(3), h.Events(first))
	assert.Equal(t, uint64(2*unit), h.Requested(first))
	tail := h.BestFit(s1, 0, unit)
	_, err = h.AddEvents(tail, 1)
	assert.ErrorIs(t, err, ErrBadState)
	_, err = h.Free(first)
	require.NoError(t, err)
	assert.Equal(t, int32(0), h.Events(first))
	require.NoError(t, h.Check())
}

// TestHeapCheckCatchesCorruption breaks one invariant at a time behind the
// heap's back and expects Check to name it.
func TestHeapCheckCatchesCorruption(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(h *Heap)
		want   string
	}{
		{"gap", func(h *Heap) { h.rec(h.Find(testBase + 2*unit)).addr += unit }, "expected to start"},
		{"uncoalesced", func(h *Heap) {
			id := h.Lookup(testBase + 4*unit)
			h.live.remove(h, id, h.rec(id).addr)
			b := h.rec(id)
			b.state, b.aux, b.up = Free, 0, 0
		}, "not coalesced"},
		{"stream count", func(h *Heap) { h.streams[1].blocks++ }, "counts"},
		{"treap order", func(h *Heap) {
			id := h.BestFit(1, 0, unit)
			h.rec(id).up = 3
		}, "parent link"},
		{"address table", func(h *Heap) { h.live.remove(h, h.Lookup(testBase), testBase) }, "address table"},
		{"bitmap", func(h *Heap) { h.streams[1].free[0].flMap |= 1 << 40 }, "bitmap"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, _, _ := buildLayout(t, 16, []piece{{2, false}, {2, true}, {2, false}})
			c.break_(h)
			err := h.Check()
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func ExampleHeap() {
	h, _ := NewHeap(1)
	s, _ := h.AddStream(1)
	// A 1 MiB region of free memory on stream 1.
	_, _, _ = h.AddRegion(0x7f0000000000, 1<<20, 0, Free, s)
	id := h.BestFit(s, 0, 4096)
	_ = h.Alloc(id, 4096, 4000) // split: 4 KiB allocated, the rest stays free
	b, _ := h.Block(id)
	fmt.Printf("%s %#x+%d, next free block %d bytes\n", b.State, b.Addr, b.Size, h.Size(b.Next))
	merged, _ := h.Free(id) // coalesces with the free rest
	fmt.Println(h.Size(merged), h.Len(), h.Check())
	// Output:
	// allocated 0x7f0000000000+4096, next free block 1044480 bytes
	// 1048576 1 <nil>
}
