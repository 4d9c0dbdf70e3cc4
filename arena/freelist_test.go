package arena

import (
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func blk(addr uintptr, size uint64) *Block { return &Block{Addr: addr, Size: size} }

func TestClassOf(t *testing.T) {
	cases := []struct {
		size  uint64
		class int
	}{
		{0, 0}, {1, 1}, {15, 15}, {16, 16}, {17, 17}, {31, 31}, {32, 32}, {33, 32}, {34, 33},
		{512, 6*16 + 0}, {544, 6*16 + 1}, {1023, 6*16 + 15}, {1024, 7 * 16},
		{2 << 20, 18 * 16}, {1<<63 + 1<<62, 60*16 + 8},
	}
	for _, c := range cases {
		assert.Equal(t, c.class, classOf(c.size), "size %d", c.size)
		assert.LessOrEqual(t, ClassLowerBound(c.class), c.size, "size %d", c.size)
		if c.class+1 < numClass {
			assert.Greater(t, ClassLowerBound(c.class+1), c.size, "size %d", c.size)
		}
	}
}

// TestClassWidth states the class table's spread: every class spans at most
// 1/16 of its lower bound, so blocks in one class differ by < 6.25%.
func TestClassWidth(t *testing.T) {
	worst := 0.0
	for c := linearMax; c+1 < numClass; c++ {
		lo, hi := ClassLowerBound(c), ClassLowerBound(c+1)
		require.Greater(t, hi, lo)
		w := float64(hi-lo) / float64(lo)
		if w > worst {
			worst = w
		}
	}
	assert.InDelta(t, 1.0/16, worst, 1e-9)
}

func TestBestFitTable(t *testing.T) {
	// Given these free blocks, a request of N lands at X.
	blocks := []*Block{blk(0x1000, 512), blk(0x2000, 2048), blk(0x3000, 2048), blk(0x4000, 1<<20), blk(0x5000, 1536)}
	cases := []struct {
		req  uint64
		want uintptr // 0 = none
	}{
		{1, 0x1000}, {512, 0x1000}, {513, 0x5000}, {1536, 0x5000}, {1537, 0x2000},
		{2048, 0x2000}, {4096, 0x4000}, {1 << 20, 0x4000}, {1<<20 + 1, 0},
	}
	var l FreeList
	for _, b := range blocks {
		l.Insert(b)
	}
	for _, c := range cases {
		got := l.BestFit(c.req)
		if c.want == 0 {
			assert.Nil(t, got, "req %d", c.req)
			continue
		}
		require.NotNil(t, got, "req %d", c.req)
		assert.Equal(t, c.want, got.Addr, "req %d", c.req)
	}
	assert.Equal(t, 5, l.Len())
	assert.Equal(t, uint64(512+2048*2+1<<20+1536), l.Bytes())
}

// TestFreeListAgainstModel drives FreeList, BTreeFreeList and a sorted slice
// with the same random operations and compares every answer.
func TestFreeListAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l FreeList
	bt := NewBTreeFreeList()
	var model []*Block
	next := uintptr(0x10000)
	for i := 0; i < 20000; i++ {
		switch op := rng.IntN(3); {
		case op == 0 || len(model) == 0:
			sz := uint64(rng.IntN(64)+1) * 512
			if rng.IntN(4) == 0 {
				sz = uint64(rng.Int64N(1 << 30))
			}
			b := blk(next, sz)
			next += 1 << 32
			l.Insert(b)
			bt.Insert(b)
			model = append(model, b)
		case op == 1:
			k := rng.IntN(len(model))
			b := model[k]
			l.Remove(b)
			bt.Remove(b)
			model = append(model[:k], model[k+1:]...)
		default:
			req := uint64(rng.Int64N(1<<20) + 1)
			if rng.IntN(8) == 0 {
				req = uint64(rng.Int64N(1 << 31))
			}
			sort.Slice(model, func(i, j int) bool { return less(model[i], model[j]) })
			var want *Block
			for _, b := range model {
				if b.Size >= req {
					want = b
					break
				}
			}
			assert.Same(t, want, l.BestFit(req))
			assert.Same(t, want, bt.BestFit(req))
		}
		require.Equal(t, len(model), l.Len())
		require.Equal(t, len(model), bt.Len())
		if i%500 == 0 {
			checkTreaps(t, &l)
		}
	}
	var sum uint64
	count := 0
	var last *Block
	l.Each(func(b *Block) bool {
		if last != nil {
			assert.True(t, less(last, b))
		}
		last = b
		sum += b.Size
		count++
		return true
	})
	assert.Equal(t, len(model), count)
	assert.Equal(t, l.Bytes(), sum)
	assert.Equal(t, bt.Bytes(), sum)
}

func TestSplitMerge(t *testing.T) {
	var pool BlockPool
	r := NewRegion(&pool, 0x1000_0000, 8192, Free, 7, nil)
	hi := Split(&pool, r.Head, 2048)
	assert.Equal(t, uintptr(0x1000_0000+2048), hi.Addr)
	assert.Equal(t, uint64(6144), hi.Size)
	assert.Equal(t, uint64(2048), r.Head.Size)
	assert.Equal(t, Free, hi.State)
	assert.Equal(t, r, hi.Region)
	assert.Same(t, hi, r.Head.Next)
	assert.Same(t, r.Head, hi.Prev)
	assert.True(t, hi.IsSplit())
	assert.Same(t, hi, r.Find(0x1000_0000+4000))
	assert.Nil(t, r.Find(0x1000_0000+8192))
	Merge(&pool, r.Head)
	assert.Equal(t, uint64(8192), r.Head.Size)
	assert.Nil(t, r.Head.Next)
	assert.Equal(t, 1, pool.Len())
	assert.False(t, r.Head.IsSplit())
}

func TestInsertRemovePanicsOnMisuse(t *testing.T) {
	var l, m FreeList
	b := blk(1, 512)
	l.Insert(b)
	assert.Panics(t, func() { l.Insert(b) })
	assert.Panics(t, func() { m.Remove(b) })
}

// TestSplitFrontMergeNext drives the in-place list operations over a
// region against a brute-force view: after every step the list holds
// exactly the blocks marked free, in (size, address) order, and BestFit
// answers as a scan would.
func TestSplitFrontMergeNext(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var pool BlockPool
	var l FreeList
	r := NewRegion(&pool, 1<<30, 1<<30, Free, 1, nil)
	l.Insert(r.Head)
	inPlace := 0
	for step := 0; step < 3000; step++ {
		blocks := r.Blocks()
		b := blocks[rng.IntN(len(blocks))]
		switch {
		case b.InList() && b.Size >= 1024:
			n := uint64(rng.IntN(int(b.Size/512-1))+1) * 512
			fits, oldPrio := fitsSlot(b, b.Size-n, b.Addr+uintptr(n)), b.prio
			rest := l.SplitFront(&pool, b, n)
			if fits {
				require.Equal(t, oldPrio, rest.prio, "the remainder did not take the slot")
				inPlace++
			}
			require.False(t, b.InList())
			require.True(t, rest.InList())
			require.Equal(t, b.End(), rest.Addr)
		case !b.InList() && b.Next != nil && b.Next.InList() && (b.Prev == nil || !b.Prev.InList()):
			l.MergeNext(&pool, b)
			require.True(t, b.InList())
		case !b.InList():
			// Make b free the plain way (prev/next may be free: no merge,
			// so the test also covers lists with adjacent free blocks).
			l.Insert(b)
		}
		// Brute-force view.
		var free []*Block
		var sum uint64
		for x := r.Head; x != nil; x = x.Next {
			if x.InList() {
				free = append(free, x)
				sum += x.Size
			}
		}
		require.Equal(t, len(free), l.Len())
		require.Equal(t, sum, l.Bytes())
		var last *Block
		n := 0
		l.Each(func(x *Block) bool {
			if last != nil {
				require.True(t, less(last, x))
			}
			last = x
			n++
			return true
		})
		require.Equal(t, len(free), n)
		req := uint64(rng.IntN(1<<22) + 1)
		sort.Slice(free, func(i, j int) bool { return less(free[i], free[j]) })
		var want *Block
		for _, x := range free {
			if x.Size >= req {
				want = x
				break
			}
		}
		require.Same(t, want, l.BestFit(req))
		if step%50 == 0 {
			checkTreaps(t, &l)
		}
	}
	require.Positive(t, inPlace, "no split took the in-place path")
}

// checkTreaps verifies every class treap: parent links, (size, address)
// order, heap order of priorities, class membership, bitmaps and counts.
func checkTreaps(t *testing.T, l *FreeList) {
	t.Helper()
	n := 0
	var sum uint64
	var walk func(b, parent *Block, c int, lo, hi *Block)
	walk = func(b, parent *Block, c int, lo, hi *Block) {
		if b == nil {
			return
		}
		n++
		sum += b.Size
		require.Same(t, parent, b.parent)
		require.Same(t, l, b.list)
		require.Equal(t, int32(c), b.class)
		require.Equal(t, c, classOf(b.Size))
		if parent != nil {
			require.LessOrEqual(t, parent.prio, b.prio, "heap order")
		}
		if lo != nil {
			require.True(t, less(lo, b), "order")
		}
		if hi != nil {
			require.True(t, less(b, hi), "order")
		}
		walk(b.left, b, c, lo, b)
		walk(b.right, b, c, b, hi)
	}
	for c := range l.roots {
		fl, sl := c/slCount, c%slCount
		nonEmpty := l.roots[c] != nil
		require.Equal(t, nonEmpty, l.slMap[fl]&(1<<uint(sl)) != 0, "class %d bitmap", c)
		if nonEmpty {
			require.NotZero(t, l.flMap&(1<<uint(fl)), "first-level bitmap %d", fl)
		}
		walk(l.roots[c], nil, c, nil, nil)
	}
	require.Equal(t, l.Len(), n)
	require.Equal(t, l.Bytes(), sum)
}
