package arena

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// freeIndex is what FreeList and BTreeFreeList share, for the comparison.
type freeIndex interface {
	Insert(*Block)
	Remove(*Block)
	BestFit(uint64) *Block
}

// BenchmarkFreeListVsBTree measures one best-fit search, removal and
// reinsertion of the found block (split off and put back) against n free
// blocks of mixed sizes, for the TLSF FreeList and the B-tree ordered set.
// Both return the same block for every request (TestFreeListAgainstModel),
// so their fragmentation is identical; only speed and allocations differ.
func BenchmarkFreeListVsBTree(b *testing.B) {
	for _, n := range []int{100, 10_000, 1_000_000} {
		rng := rand.New(rand.NewPCG(9, 9))
		blocks := make([]*Block, n)
		for i := range blocks {
			blocks[i] = &Block{Addr: uintptr(i+1) << 32, Size: uint64(rng.IntN(4096)+1) * 512}
		}
		reqs := make([]uint64, 4096)
		for i := range reqs {
			reqs[i] = uint64(rng.IntN(4096)+1) * 512
		}
		for _, impl := range []struct {
			name string
			make func() freeIndex
		}{
			{"tlsf", func() freeIndex { return new(FreeList) }},
			{"btree", func() freeIndex { return NewBTreeFreeList() }},
		} {
			b.Run(fmt.Sprintf("%s/free=%d", impl.name, n), func(b *testing.B) {
				idx := impl.make()
				for _, blk := range blocks {
					idx.Insert(blk)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if blk := idx.BestFit(reqs[i%len(reqs)]); blk != nil {
						idx.Remove(blk)
						idx.Insert(blk)
					}
				}
				b.StopTimer()
				for _, blk := range blocks {
					idx.Remove(blk)
				}
			})
		}
	}
}
