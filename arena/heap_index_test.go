package arena

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

// freeKey is a free block of the reference model of one index.
type freeKey struct {
	size uint64
	addr uintptr
}

// refBestFit is the smallest (size, address) of at least size in free, or
// the zero key.
func refBestFit(free []freeKey, size uint64) freeKey {
	var best freeKey
	for _, k := range free {
		if k.size >= size && (best.size == 0 || k.size < best.size || k.size == best.size && k.addr < best.addr) {
			best = k
		}
	}
	return best
}

// firstLevels is the set of first levels (bits) the sizes of free fall in.
func firstLevels(free []freeKey) uint64 {
	var m uint64
	for _, k := range free {
		m |= 1 << uint(classOf(k.size)/slCount)
	}
	return m
}

// TestSparseIndexAgainstReference inserts and removes free blocks of sizes
// spread over every first level (1 byte to 2^62) in one index, in random
// order, and after every step compares the index with a plain list: best
// fit for random requests, the blocks EachFree walks and their order, the
// counts, that the first levels marked non-empty are those holding a
// block, and that at most maxEmptyGroups groups, or as many as hold a
// block, stay without one.
func TestSparseIndexAgainstReference(t *testing.T) {
	h, err := NewHeap(1)
	require.NoError(t, err)
	sid, err := h.AddStream(7)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(16, 4))
	randSize := func() uint64 {
		k := rng.IntN(48) // sizes in [2^k, 2^(k+1)); rarely up to 2^63
		if rng.IntN(32) == 0 {
			k = 48 + rng.IntN(15)
		}
		lo := uint64(1) << uint(k)
		return lo + rng.Uint64N(lo)
	}
	// Regions lie one after the other from a low base, a page apart; when
	// the next would pass 2^63, every region is removed and the addresses
	// start over.
	type live struct {
		rid RegionID
		key freeKey
	}
	var regions []live
	next := uintptr(1 << 12)
	var free []freeKey
	for step := 0; step < 4000; step++ {
		if len(regions) == 0 || len(regions) < 200 && rng.IntN(3) > 0 {
			size := randSize()
			if uint64(next)+size < uint64(next) || uint64(next)+size > 1<<63 {
				next = 1 << 12
				for _, r := range regions {
					require.NoError(t, h.RemoveRegion(r.rid))
				}
				regions, free = regions[:0], free[:0]
			}
			rid, _, err := h.AddRegion(next, size, 0, Free, sid)
			require.NoError(t, err)
			k := freeKey{size, next}
			regions = append(regions, live{rid, k})
			free = append(free, k)
			next += uintptr(size + 1<<12)
		} else {
			i := rng.IntN(len(regions))
			require.NoError(t, h.RemoveRegion(regions[i].rid))
			free = slices.DeleteFunc(free, func(k freeKey) bool { return k == regions[i].key })
			regions = slices.Delete(regions, i, i+1)
		}
		l := &h.streams[sid].free[0]
		require.Equal(t, firstLevels(free), nonEmptyLevels(l), "step %d: first levels with blocks", step)
		require.Len(t, l.groups, bits.OnesCount64(l.flMap), "step %d", step)
		nonEmpty := bits.OnesCount64(nonEmptyLevels(l))
		require.LessOrEqual(t, len(l.groups)-nonEmpty, max(maxEmptyGroups, nonEmpty), "step %d: empty groups", step)
		require.Equal(t, len(free), h.FreeLen(sid, 0))
		for q := 0; q < 8; q++ {
			size := randSize()
			if q == 0 && len(free) > 0 {
				size = free[rng.IntN(len(free))].size // an exact size
			}
			want := refBestFit(free, size)
			got := h.BestFit(sid, 0, size)
			if want.size == 0 {
				require.Equal(t, NoBlock, got, "step %d: best fit of %d", step, size)
				continue
			}
			require.NotEqual(t, NoBlock, got, "step %d: best fit of %d", step, size)
			require.Equal(t, want, freeKey{h.Size(got), h.Addr(got)}, "step %d: best fit of %d", step, size)
		}
		if step%50 == 0 {
			require.NoError(t, h.Check())
			walked := []freeKey{}
			h.EachFree(sid, 0, func(id BlockID) bool {
				walked = append(walked, freeKey{h.Size(id), h.Addr(id)})
				return true
			})
			want := append([]freeKey{}, free...)
			slices.SortFunc(want, func(x, y freeKey) int {
				if x.size != y.size {
					return cmpU64(x.size, y.size)
				}
				return cmpU64(uint64(x.addr), uint64(y.addr))
			})
			require.Equal(t, want, walked, "step %d: EachFree order", step)
		}
	}
	for _, r := range regions {
		require.NoError(t, h.RemoveRegion(r.rid))
	}
	l := &h.streams[sid].free[0]
	assert.Zero(t, nonEmptyLevels(l))
	assert.LessOrEqual(t, len(l.groups), maxEmptyGroups, "an empty index keeps at most %d groups", maxEmptyGroups)
	require.NoError(t, h.Check())
}

// nonEmptyLevels is the set of first levels (bits) whose group holds a
// block.
func nonEmptyLevels(l *tlsfIndex) uint64 {
	var m uint64
	for fl := range l.pos {
		if l.flMap&(1<<uint(fl)) != 0 && l.group(uint(fl)).slMap != 0 {
			m |= 1 << uint(fl)
		}
	}
	return m
}

func cmpU64(x, y uint64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// TestSparseIndexCheckFindsCorruption: Check reports groups and bitmaps
// that disagree, and empty groups kept beyond their bound, instead of
// reading past the groups.
func TestSparseIndexCheckFindsCorruption(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(l *tlsfIndex)
	}{
		{"bit without group", func(l *tlsfIndex) { l.flMap |= 1 << 50 }},
		{"bit above the first levels", func(l *tlsfIndex) { l.flMap |= 1 << 63; l.groups = append(l.groups, tlsfGroup{slMap: 1}) }},
		{"first level without its group", func(l *tlsfIndex) { l.pos[bits.TrailingZeros64(l.flMap)] = 0 }},
		{"group without first level", func(l *tlsfIndex) { l.pos[50] = 1 }},
		{"empty groups miscounted", func(l *tlsfIndex) { l.empty++ }},
		{"too many empty groups", func(l *tlsfIndex) {
			for fl := 50; fl <= 50+maxEmptyGroups; fl++ {
				l.flMap |= 1 << uint(fl)
				l.groups = append(l.groups, tlsfGroup{})
				l.pos[fl] = uint8(len(l.groups))
				l.empty++
			}
		}},
		{"second-level bits flipped", func(l *tlsfIndex) { l.groups[0].slMap ^= 0xffff }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHeap(1)
			require.NoError(t, err)
			sid, err := h.AddStream(7)
			require.NoError(t, err)
			_, _, err = h.AddRegion(1<<20, 1<<20, 0, Free, sid)
			require.NoError(t, err)
			require.NoError(t, h.Check())
			tc.corrupt(&h.streams[sid].free[0])
			err = h.Check()
			require.ErrorIs(t, err, ErrCorrupt)
		})
	}
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// streamCost registers n streams on a fresh heap, each with one free
// region of size bytes when size > 0, and returns the Go heap bytes the
// heap holds per stream.
func streamCost(tb testing.TB, n int, size uint64) float64 {
	tb.Helper()
	h, err := NewHeap(2)
	require.NoError(tb, err)
	before := heapInUse()
	for i := range n {
		sid, err := h.AddStream(backend.Stream(i + 1))
		require.NoError(tb, err)
		if size > 0 {
			_, _, err = h.AddRegion(uintptr(i+1)<<32, size, uint8(i%2), Free, sid)
			require.NoError(tb, err)
		}
	}
	after := heapInUse()
	runtime.KeepAlive(h)
	return float64(after-before) / float64(n)
}

// Bounds of what one stream costs a Heap, in Go heap bytes (see
// TestStreamCost): measured 269 with no block (its record and two 112-byte
// indexes) and 432 with one (a 48-byte block record, a region, the 68-byte
// group of its first level); a full table of class roots per pool, as
// before the index was sparse, cost 8,237 and 8,320.
const (
	maxEmptyStreamCost = 384
	maxOneBlockCost    = 640
)

// TestStreamCost: a stream costs the heap in proportion to what it holds,
// bytes rather than kilobytes: a hostile trace may name a hundred thousand
// streams, each with one block or none.
func TestStreamCost(t *testing.T) {
	const n = 20000
	empty := streamCost(t, n, 0)
	one := streamCost(t, n, 2<<20)
	t.Logf("heap per stream: %.0f B with no block, %.0f B with one", empty, one)
	assert.Less(t, empty, float64(maxEmptyStreamCost))
	assert.Less(t, one, float64(maxOneBlockCost))
}

// BenchmarkStreamCost reports the Go heap a Heap holds per registered
// stream, empty and with one free block.
func BenchmarkStreamCost(b *testing.B) {
	for _, c := range []struct {
		name string
		size uint64
	}{{"empty", 0}, {"one-block", 2 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			var cost float64
			for b.Loop() {
				cost = streamCost(b, 10000, c.size)
			}
			b.ReportMetric(cost, "B/stream")
		})
	}
}

// TestCacheHitAcrossFirstLevels: the cache-hit cycle that splits a 2 MiB
// free block (first level 18) into 4 KiB allocated and a rest of first
// level 17, then merges it back, moves a block between two first levels
// every call. It allocates nothing and keeps both groups, instead of
// adding and dropping one each way.
func TestCacheHitAcrossFirstLevels(t *testing.T) {
	h, err := NewHeap(1)
	require.NoError(t, err)
	sid, err := h.AddStream(7)
	require.NoError(t, err)
	_, _, err = h.AddRegion(1<<21, 2<<20, 0, Free, sid)
	require.NoError(t, err)
	cycle := func() {
		id, addr, _ := h.AllocFit(sid, 0, 4096, 4096, math.MaxUint64, 512)
		if id == NoBlock {
			t.Fatal("AllocFit found no block")
		}
		if _, ok := h.FreeAt(addr); !ok {
			t.Fatal("FreeAt refused")
		}
	}
	cycle()
	l := &h.streams[sid].free[0]
	groups := &l.groups[0]
	assert.Zero(t, testing.AllocsPerRun(1000, cycle))
	assert.Equal(t, uint64(1<<17|1<<18), l.flMap, "groups of first levels 17 and 18")
	assert.Equal(t, uint64(1<<18), nonEmptyLevels(l), "the whole block is free again")
	assert.Same(t, groups, &l.groups[0], "the groups did not move")
	require.NoError(t, h.Check())
}
