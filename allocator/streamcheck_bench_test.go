package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkRecordStreamKnown is the RecordStream of a stream the allocator
// already knows, between a cache-hit Malloc and a Free that records an
// event on it: RecordStream asks the driver about the stream each time
// (backend.StreamValidator), so that a stream destroyed since is refused.
func BenchmarkRecordStreamKnown(b *testing.B) {
	a, e := newAlloc(b, "")
	s, err := e.StreamCreate(0)
	require.NoError(b, err)
	p, err := a.Malloc(1<<20, 0)
	require.NoError(b, err)
	require.NoError(b, a.RecordStream(p, s)) // s is known from here on
	require.NoError(b, a.Free(p))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, err := a.Malloc(1<<20, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.RecordStream(p, s); err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}
