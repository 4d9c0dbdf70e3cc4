package pickle_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// snapshotPath returns the path of the real snapshot name
// (trace.SharedFile), skipping tb when it is not there.
func snapshotPath(tb testing.TB, name string) string {
	tb.Helper()
	p, err := trace.SharedFile(name)
	if err != nil {
		tb.Skip(err)
	}
	return p
}

func TestDecodeRealSnapshot(t *testing.T) {
	data, err := os.ReadFile(snapshotPath(t, "cs336_ctx128_fullstep.pickle"))
	require.NoError(t, err)
	v, work, err := pickle.DecodeCharged(data)
	require.NoError(t, err)
	assert.Zero(t, work, "no str key of a real snapshot is long enough to be charged")
	assert.LessOrEqual(t, pickle.AllocatedBy(func() { _, _ = pickle.Decode(data) }), pickle.AllocBound(len(data)))
	m := v.(map[string]any)
	traces := m["device_traces"].([]any)
	require.Len(t, traces, 1)
	assert.Len(t, traces[0].([]any), 19342)
	assert.Len(t, m["segments"].([]any), 1010)
	settings := m["allocator_settings"].(map[string]any)
	assert.Equal(t, false, settings["expandable_segments"])
}

func BenchmarkDecodeSnapshot(b *testing.B) {
	data, err := os.ReadFile(snapshotPath(b, "cs336_ctx128_fullstep.pickle"))
	require.NoError(b, err)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pickle.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
