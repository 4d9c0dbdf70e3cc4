package benchmarks

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
)

// BenchmarkPoolMallocFree measures a cache-hit Malloc+Free pair inside a
// private pool (pool.Malloc, Allocator.Free) with live blocks around it,
// as BenchmarkMallocFree does for the default pool; other=N private pools
// hold live blocks beside it.
func BenchmarkPoolMallocFree(b *testing.B) {
	for _, c := range []struct{ live, other int }{{100, 0}, {100, 7}} {
		b.Run(fmt.Sprintf("live=%d/other=%d", c.live, c.other), func(b *testing.B) {
			a, _ := newAllocator(b, "")
			defer a.Close()
			p, err := a.NewPool(allocator.PoolOptions{Name: "bench"})
			require.NoError(b, err)
			for i := 0; i < c.other; i++ {
				q, err := a.NewPool(allocator.PoolOptions{})
				require.NoError(b, err)
				_, err = q.Malloc(4096, 0)
				require.NoError(b, err)
			}
			for i := 0; i < c.live; i++ {
				if _, err := p.Malloc(uint64(512*(1+i%7)), 0); err != nil {
					b.Fatal(err)
				}
			}
			ptr, err := p.Malloc(4096, 0)
			require.NoError(b, err)
			require.NoError(b, a.Free(ptr))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ptr, err := p.Malloc(4096, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(ptr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
