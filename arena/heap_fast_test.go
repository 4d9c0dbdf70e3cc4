package arena

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeapAllocFitKeepsTheSplitRecord(t *testing.T) {
	h, s1, _ := buildLayout(t, 64, []piece{{2, false}})
	tail := h.Next(h.Lookup(testBase))
	require.NotEqual(t, NoBlock, tail)
	require.Equal(t, testBase+2*unit, h.Addr(tail))

	id, addr, n := h.AllocFit(s1, 0, 4*unit, 4*unit-7, math.MaxUint64, unit)
	require.NotEqual(t, NoBlock, id)
	assert.Equal(t, testBase+2*unit, addr)
	assert.Equal(t, uint64(4*unit), n)
	assert.Equal(t, id, h.Lookup(addr))
	assert.Equal(t, uint64(4*unit-7), h.Requested(id))
	// The free rest is the record that was split, now above the new block.
	assert.Equal(t, addr+4*unit, h.Addr(tail))
	assert.Equal(t, uint64(58*unit), h.Size(tail))
	assert.Equal(t, Free, h.State(tail))
	assert.Equal(t, tail, h.Next(id))
	assert.Equal(t, uint64(58*unit), h.FreeBytes(s1, 0))
	require.NoError(t, h.Check())

	p, ok := h.FreeAt(addr)
	require.True(t, ok)
	assert.Equal(t, Freed{Size: 4 * unit, Requested: 4*unit - 7, Stream: s1, Pool: 0}, p)
	// Merged back into the same record.
	assert.Equal(t, testBase+2*unit, h.Addr(tail))
	assert.Equal(t, uint64(62*unit), h.Size(tail))
	assert.Equal(t, State(dead), h.State(id))
	assert.Equal(t, 1, h.FreeLen(s1, 0))
	require.NoError(t, h.Check())
}

func TestHeapAllocFitLimits(t *testing.T) {
	// One free block of 8 units after an allocated one.
	cases := []struct {
		name     string
		units    int
		maxSize  uint64
		minSplit uint64
		wantN    uint64 // 0: refused
	}{
		{"split", 2, math.MaxUint64, unit, 2 * unit},
		{"rest below minSplit: whole block", 2, math.MaxUint64, 6*unit + 1, 8 * unit},
		{"rest exactly minSplit: split", 2, math.MaxUint64, 6 * unit, 2 * unit},
		{"exact fit", 8, math.MaxUint64, unit, 8 * unit},
		{"never split", 1, math.MaxUint64, math.MaxUint64, 8 * unit},
		{"best block larger than maxSize", 2, 8*unit - 1, unit, 0},
		{"best block exactly maxSize", 2, 8 * unit, unit, 2 * unit},
		{"nothing fits", 9, math.MaxUint64, unit, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, s1, _ := buildLayout(t, 10, []piece{{2, false}})
			before := dumpHeap(h)
			n := uint64(c.units) * unit
			id, addr, got := h.AllocFit(s1, 0, n, n, c.maxSize, c.minSplit)
			if c.wantN == 0 {
				assert.Equal(t, NoBlock, id)
				assert.Equal(t, before, dumpHeap(h), "a refused AllocFit changes nothing")
				return
			}
			require.NotEqual(t, NoBlock, id)
			assert.Equal(t, testBase+2*unit, addr)
			assert.Equal(t, c.wantN, got)
			assert.Equal(t, c.wantN, h.Size(id))
			require.NoError(t, h.Check())
		})
	}
}

func TestHeapFastPathsRefuseBadInput(t *testing.T) {
	h, s1, s2 := buildLayout(t, 16, []piece{{2, false}, {2, false}})
	pending := h.Next(h.Lookup(testBase))
	_, err := h.AddEvents(pending, 1)
	require.NoError(t, err)
	before := dumpHeap(h)
	const max = math.MaxUint64
	refused := []struct {
		name string
		fn   func() bool // reports whether the call was refused
	}{
		{"AllocFit stream 0", func() bool { id, _, _ := h.AllocFit(0, 0, unit, unit, max, unit); return id == NoBlock }},
		{"AllocFit negative stream", func() bool { id, _, _ := h.AllocFit(-1, 0, unit, unit, max, unit); return id == NoBlock }},
		{"AllocFit unknown stream", func() bool { id, _, _ := h.AllocFit(99, 0, unit, unit, max, unit); return id == NoBlock }},
		{"AllocFit stream without blocks", func() bool { id, _, _ := h.AllocFit(s2, 0, unit, unit, max, unit); return id == NoBlock }},
		{"AllocFit bad pool", func() bool { id, _, _ := h.AllocFit(s1, 2, unit, unit, max, unit); return id == NoBlock }},
		{"AllocFit zero bytes", func() bool { id, _, _ := h.AllocFit(s1, 0, 0, 0, max, unit); return id == NoBlock }},
		{"AllocFit requested 0", func() bool { id, _, _ := h.AllocFit(s1, 0, unit, 0, max, unit); return id == NoBlock }},
		{"AllocFit requested above n", func() bool { id, _, _ := h.AllocFit(s1, 0, unit, unit+1, max, unit); return id == NoBlock }},
		{"AllocFit minSplit 0", func() bool { id, _, _ := h.AllocFit(s1, 0, unit, unit, max, 0); return id == NoBlock }},
		{"FreeAt of a block with events", func() bool { _, ok := h.FreeAt(testBase + 2*unit); return !ok }},
		{"FreeAt of a free block", func() bool { _, ok := h.FreeAt(testBase + 4*unit); return !ok }},
		{"FreeAt inside a block", func() bool { _, ok := h.FreeAt(testBase + unit); return !ok }},
		{"FreeAt of 0", func() bool { _, ok := h.FreeAt(0); return !ok }},
	}
	for _, c := range refused {
		assert.True(t, c.fn(), c.name)
		assert.Equal(t, before, dumpHeap(h), "%s changed the heap", c.name)
	}
	require.NoError(t, h.Check())
}

// The best-fit memo of AllocFit must hand out exactly what a search would,
// through split-then-merge-back cycles mixed with the general path's
// Alloc and Free, which change the index behind it. Each AllocFit is
// compared with BestFit just before it, and Check (which verifies a memo
// that claims to be valid) runs after every step.
func TestHeapAllocFitMemoIsBestFit(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 19))
			h, s1, _ := buildLayout(t, 512, []piece{{3, false}, {5, true}, {2, false}, {9, true}, {1, false}, {4, true}, {6, false}})
			sizes := []uint64{unit, 2 * unit, 4 * unit, 4 * unit, 4 * unit, 7 * unit}
			var live []uintptr
			hits := 0
			n := sizes[0]
			for step := 0; step < 3000; step++ {
				switch op := r.IntN(10); {
				case op < 2 && len(live) > 0: // free the block just allocated: the cycle of a cache hit
					_, ok := h.FreeAt(live[len(live)-1])
					require.True(t, ok, "step %d", step)
					live = live[:len(live)-1]
				case op < 6 || len(live) == 0: // the cache-hit Malloc, often of the last size
					if r.IntN(3) == 0 {
						n = sizes[r.IntN(len(sizes))]
					}
					want := h.BestFit(s1, 0, n)
					wantAddr := h.Addr(want) // AllocFit moves a split block's record up
					if id, _ := h.memoFit(&h.streams[s1].free[0], n); id != NoBlock {
						hits++
						require.Equal(t, want, id, "step %d: the memo is not the best fit", step)
					}
					id, addr, _ := h.AllocFit(s1, 0, n, n, math.MaxUint64, unit)
					if want == NoBlock {
						require.Equal(t, NoBlock, id, "step %d", step)
						continue
					}
					require.NotEqual(t, NoBlock, id, "step %d", step)
					require.Equal(t, wantAddr, addr, "step %d: AllocFit and BestFit differ", step)
					live = append(live, addr)
				case op < 9: // the cache-hit Free, most recent first half the time
					j := len(live) - 1
					if r.IntN(2) == 0 {
						j = r.IntN(len(live))
					}
					_, ok := h.FreeAt(live[j])
					require.True(t, ok, "step %d", step)
					live = append(live[:j], live[j+1:]...)
				default: // the general path: Free through Lookup, Alloc of a best fit
					if r.IntN(2) == 0 {
						j := r.IntN(len(live))
						_, err := h.Free(h.Lookup(live[j]))
						require.NoError(t, err)
						live = append(live[:j], live[j+1:]...)
					} else if id := h.BestFit(s1, 0, 3*unit); id != NoBlock {
						require.NoError(t, h.Alloc(id, 3*unit, 3*unit))
						live = append(live, h.Addr(id))
					}
				}
				require.NoError(t, h.Check(), "step %d", step)
			}
			assert.Greater(t, hits, 10, "the memo served few AllocFits: the test no longer exercises it")
		})
	}
}

// dumpHeap renders every block of h.
func dumpHeap(h *Heap) []BlockInfo {
	var out []BlockInfo
	h.Regions(func(rid RegionID) bool {
		ri, _ := h.Region(rid)
		for id := ri.Head; id != NoBlock; id = h.Next(id) {
			b, _ := h.Block(id)
			out = append(out, b)
		}
		return true
	})
	return out
}

func ExampleHeap_AllocFit() {
	h, _ := NewHeap(1)
	s, _ := h.AddStream(1)
	_, rest, _ := h.AddRegion(0x7f0000000000, 1<<20, 0, Free, s)
	// Best fit for 4 KiB, any block size, split off rests of 512 bytes
	// or more: the cache-hit Malloc.
	id, addr, n := h.AllocFit(s, 0, 4096, 4000, math.MaxUint64, 512)
	fmt.Printf("allocated %#x+%d; the rest keeps its record: %#x+%d\n", addr, n, h.Addr(rest), h.Size(rest))
	// The cache-hit Free: the block merges back into the rest.
	p, ok := h.FreeAt(addr)
	fmt.Println(ok, p.Size, p.Requested, h.State(id) == Free, h.Size(rest), h.Len(), h.Check())
	// Output:
	// allocated 0x7f0000000000+4096; the rest keeps its record: 0x7f0000001000+1044480
	// true 4096 4000 false 1048576 1 <nil>
}
