package allocator

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// handleSizesMiB lists the sizes, in MiB, of the handles a maps, by
// address.
func handleSizesMiB(a *Allocator) []uint64 {
	_, maps, _ := a.Footprint()
	var out []uint64
	for _, m := range maps {
		out = append(out, m.Size>>20)
	}
	return out
}

// TestGrowthHandleSize: a growth of at least expandable_handle_mb maps
// handles of that size (the last one shorter); a smaller one maps 20 MiB
// pages; expandable_handle_mb at or below the page size always maps pages.
func TestGrowthHandleSize(t *testing.T) {
	tests := []struct {
		conf    string
		size    uint64
		handles []uint64 // MiB
		calls   int64    // driver Map calls
	}{
		{"", 30 << 20, []uint64{20, 10}, 2},
		{"", 150 << 20, []uint64{64, 64, 22}, 3},
		{"", 64 << 20, []uint64{64}, 1},
		{"expandable_handle_mb:0", 150 << 20, []uint64{20, 20, 20, 20, 20, 20, 20, 10}, 8},
		{"expandable_handle_mb:20", 150 << 20, []uint64{20, 20, 20, 20, 20, 20, 20, 10}, 8},
		{"expandable_handle_mb:100", 150 << 20, []uint64{100, 50}, 2},
		{"expandable_handle_mb:3", 150 << 20, []uint64{20, 20, 20, 20, 20, 20, 20, 10}, 8}, // rounded up to the granule, below a page
	}
	for _, tc := range tests {
		t.Run(tc.conf+"/"+itoaMiB(tc.size), func(t *testing.T) {
			a, e := newAlloc(t, tc.conf)
			maps := mapCalls(e)
			p, err := a.Malloc(tc.size, 0)
			require.NoError(t, err)
			assert.Equal(t, tc.handles, handleSizesMiB(a))
			assert.Equal(t, tc.calls, mapCalls(e)-maps)
			mustCheck(t, a, e)
			require.NoError(t, a.Free(p))
			require.NoError(t, a.EmptyCache())
			assert.Empty(t, handleSizesMiB(a))
			mustCheck(t, a, e)
			assert.Empty(t, e.Violations())
		})
	}
}

func itoaMiB(n uint64) string { return strconv.FormatUint(n>>20, 10) + "MiB" }

func unmapCalls(e *emulated.Emulator) int64 { return e.CallCounts()[backend.OpUnmap] }

// TestDefragHighWater: below the pool's high water mark of allocated
// bytes a growth keeps the holes left mapped (no stream sync, no unmap)
// instead of unmapping them and remapping their handles at the top; above
// it, defragmentation works as before, so peak reserved stays within
// (1 + defrag_threshold) × the peak plus a page.
func TestDefragHighWater(t *testing.T) {
	const mib = 1 << 20
	a, e := newAlloc(t, "", emulated.WithCapacity(4<<30))
	// A 300 MiB peak, released: the high water mark is 300 MiB.
	x, err := a.Malloc(300*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(x))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.MemoryReserved())

	// Two 60 MiB holes between 2 MiB pins.
	var held []uintptr
	for _, n := range []uint64{60, 2, 60, 2} {
		p, err := a.Malloc(n*mib, 0)
		require.NoError(t, err)
		held = append(held, p)
	}
	for _, i := range []int{0, 2} {
		require.NoError(t, a.Free(held[i]))
	}
	require.Equal(t, uint64(124*mib), a.MemoryReserved())

	// 100 MiB fits no hole. Mapping it makes 224 MiB, within 1.01 × 300
	// MiB + a page; a limit on the 104 MiB allocated now (1.01 × 104 MiB
	// + a page) would have unmapped both holes first.
	st0 := a.Stats()
	unmaps := unmapCalls(e)
	q, err := a.Malloc(100*mib, 0)
	require.NoError(t, err)
	st := a.Stats()
	assert.Equal(t, uint64(224*mib), a.MemoryReserved())
	assert.Equal(t, st0.NumStreamSyncs, st.NumStreamSyncs, "no sync for a defrag")
	assert.Equal(t, unmaps, unmapCalls(e), "no unmap")
	mustCheck(t, a, e)

	// Past the mark (4 + 100 + 250 MiB allocated) the holes go: mapping
	// 250 MiB more would make 474 MiB, 96.5 MiB above 1.01 × 354 MiB + 20
	// MiB, so one hole and two pages of the other (100 MiB) are unmapped:
	// 224 - 100 + 250 MiB.
	r, err := a.Malloc(250*mib, 0)
	require.NoError(t, err)
	assert.Greater(t, a.Stats().NumStreamSyncs, st.NumStreamSyncs, "defrag synchronised the stream")
	assert.Greater(t, unmapCalls(e), unmaps, "defrag unmapped the holes")
	assert.Equal(t, uint64(374*mib), a.MemoryReserved())
	assert.LessOrEqual(t, float64(a.MemoryReserved()), 1.01*354*mib+20*mib)
	mustCheck(t, a, e)
	for _, p := range []uintptr{held[1], held[3], q, r} {
		require.NoError(t, a.Free(p))
	}
	mustCheck(t, a, e)
	assert.Empty(t, e.Violations())
}
