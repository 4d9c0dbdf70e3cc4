package trace

import (
	"encoding/binary"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSnapshotLongSharedAction: a 1 MiB action shared by 100000 entries
// (2 bytes each, memo references) is counted under its first 64 bytes:
// hashing it whole per entry would cost 100 GB of hashing. The import
// allocates a bounded multiple of its input.
func TestSnapshotLongSharedAction(t *testing.T) {
	action := strings.Repeat("w", 1<<20)
	const entries = 100_000
	snap := "\x80\x04}X\x0d\x00\x00\x00device_traces](](}\x94X\x06\x00\x00\x00actionX" +
		string(binary.LittleEndian.AppendUint32(nil, uint32(len(action)))) + action + "s" +
		strings.Repeat("h\x00", entries-1) + "ees."
	var tr *PyTorchTrace
	var err error
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tr, err = ImportPyTorchSnapshot(strings.NewReader(snap), 0)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.Equal(t, entries, tr.Entries)
	assert.Equal(t, map[string]int{action[:maxActionName]: entries}, tr.UnknownActions)
	assert.Empty(t, tr.Events)
	allocated := after.TotalAlloc - before.TotalAlloc
	assert.Less(t, allocated, 64*uint64(len(snap)), "%d bytes allocated for %d input bytes", allocated, len(snap))
}

// TestErrorsQuoteLittle: a megabyte-long bad field yields a short message.
func TestErrorsQuoteLittle(t *testing.T) {
	long := strings.Repeat("z", 1<<20)
	_, err := ImportRMMLog(strings.NewReader("action,pointer,size\n" + long + ",1,1\n"))
	require.ErrorIs(t, err, ErrRMMLog)
	assert.Less(t, len(err.Error()), 200, err.Error())
	assert.Contains(t, err.Error(), "(1048576 bytes)")

	_, err = ImportRMMLog(strings.NewReader("action,pointer,size,time\nallocate,1,1," + long + "\n"))
	require.ErrorIs(t, err, ErrRMMLog)
	assert.Less(t, len(err.Error()), 200, err.Error())

	line := strings.Repeat("y", 60<<10)
	_, _, err = decodeText(t, TextHeader+"\n"+line+"\n")
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Less(t, len(err.Error()), 200, err.Error())
	assert.Contains(t, err.Error(), "(61440 bytes)")
}

// TestSnapshotSegmentSumsSaturate: one segment of 2^62 bytes listed five
// times (memo references) saturates the sums instead of wrapping.
func TestSnapshotSegmentSumsSaturate(t *testing.T) {
	seg := "}\x94(X\x0a\x00\x00\x00total_size\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40" +
		"X\x0e\x00\x00\x00allocated_sizeK\x01u"
	snap := "\x80\x04}(X\x0d\x00\x00\x00device_traces](]eX\x08\x00\x00\x00segments](" + seg +
		strings.Repeat("h\x00", 4) + "eu."
	tr, err := ImportPyTorchSnapshot(strings.NewReader(snap), 0)
	require.NoError(t, err)
	assert.Equal(t, 5, tr.SnapshotSegments)
	assert.Equal(t, uint64(math.MaxUint64), tr.SnapshotReserved)
	assert.Equal(t, uint64(5), tr.SnapshotAllocated)
}
