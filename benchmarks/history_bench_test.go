package benchmarks

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
)

// BenchmarkMallocFreeHistory measures a cache-hit Malloc+Free pair while
// the memory history records (allocator.RecordHistory), without and with
// Go call stacks; BenchmarkMallocFree is the same pair with recording
// off.
func BenchmarkMallocFreeHistory(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts allocator.HistoryOptions
	}{
		{"entries", allocator.HistoryOptions{MaxEntries: 1 << 16}},
		{"stacks", allocator.HistoryOptions{MaxEntries: 1 << 16, Stacks: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			a, _ := newAllocator(b, "")
			defer a.Close()
			require.NoError(b, a.RecordHistory(bc.opts))
			p, err := a.Malloc(4096, 0)
			require.NoError(b, err)
			require.NoError(b, a.Free(p))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := a.Malloc(4096, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			h, _ := a.History()
			b.ReportMetric(float64(h.Dropped+int64(len(h.Entries)))/float64(b.N), "entries/op")
		})
	}
}
