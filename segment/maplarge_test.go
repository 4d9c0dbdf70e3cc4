package segment

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// TestMapLargeCutsPieces: MapLarge cuts a range into handles of the piece
// size from its start (the last one shorter), creates them fresh even when
// the cache holds full-size handles, and Unmap frees them (none enters the
// cache, except a piece that happens to be exactly a page).
func TestMapLargeCutsPieces(t *testing.T) {
	const page = 2 * gr // 4 MiB pages
	tests := []struct {
		name      string
		off, n    uint64
		piece     uint64
		handles   [][2]uint64 // MiB
		cachedOut int         // handles in the cache after Unmap (2 before MapLarge)
	}{
		{"piece is a page: Map", 2 * mib, 10 * mib, page, [][2]uint64{{2, 6}, {6, 10}, {10, 12}}, 2},
		// The 4 MiB tail is exactly a page: the cache keeps it too.
		{"three pieces, short tail", 0, 20 * mib, 8 * mib, [][2]uint64{{0, 8}, {8, 16}, {16, 20}}, 3},
		{"exact multiple", 4 * mib, 16 * mib, 8 * mib, [][2]uint64{{4, 12}, {12, 20}}, 2},
		{"one piece smaller than the piece size", 6 * mib, 6 * mib, 16 * mib, [][2]uint64{{6, 12}}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, s, c := newSegFromStart(t, page, 16, 8)
			// Two full-size handles in the cache.
			require.NoError(t, s.Map(40*mib, 2*page))
			_, err := s.Unmap(40*mib, 2*page)
			require.NoError(t, err)
			require.Equal(t, 2, s.cache.Len())
			before := *c

			require.NoError(t, s.MapLarge(tc.off, tc.n, tc.piece))
			assert.Equal(t, tc.handles, runsMiB(s.Handles()))
			assert.Equal(t, []Run{{tc.off, tc.n}}, s.MappedRuns())
			assert.Equal(t, int64(len(tc.handles)), c.Maps-before.Maps)
			reused := c.HandlesReused - before.HandlesReused
			assert.Equal(t, int64(len(tc.handles))-reused, c.HandlesCreated-before.HandlesCreated)
			if tc.piece == page {
				assert.Equal(t, int64(2), reused, "pages come from the cache")
			} else {
				assert.Zero(t, reused, "larger pieces are created fresh")
			}
			checkConsistent(t, d, s)

			done, err := s.Unmap(tc.off, tc.n)
			require.NoError(t, err)
			assert.Equal(t, tc.n, done)
			assert.Equal(t, tc.cachedOut, s.cache.Len())
			checkConsistent(t, d, s)
			require.NoError(t, s.Release())
			require.NoError(t, s.cache.Trim(0))
			assert.Zero(t, d.liveHandles())
		})
	}
}

// TestMapLargeBadInput: a piece below a page or off the granule grid, and
// the ranges Map refuses, change nothing.
func TestMapLargeBadInput(t *testing.T) {
	const page = 2 * gr
	tests := []struct {
		name          string
		off, n, piece uint64
		want          error
	}{
		{"piece of zero bytes", 0, 8 * mib, 0, ErrInvalidRange},
		{"piece off the granule grid", 0, 8 * mib, page + mib, ErrInvalidRange},
		{"unaligned offset", mib, 8 * mib, 2 * page, ErrInvalidRange},
		{"beyond the segment", 60 * mib, 8 * mib, 2 * page, ErrOutOfRange},
		{"already mapped", 0, 16 * mib, 2 * page, ErrAlreadyMapped},
	}
	t.Run("larger pieces cutting at the page grid", func(t *testing.T) {
		d, s, c := newSeg(t, page, 16, 8)
		before, cBefore := snap(s), *c
		require.ErrorIs(t, s.MapLarge(0, 16*mib, 2*page), ErrInvalidRange)
		require.ErrorIs(t, s.MapLarge(0, 16*mib, gr), ErrInvalidRange, "smaller pieces too")
		assert.Equal(t, before, snap(s))
		assert.Equal(t, cBefore, *c)
		assert.Zero(t, d.liveHandles())
		require.NoError(t, s.MapLarge(0, 16*mib, page), "a page is Map")
		assert.Equal(t, 4, s.HandleCount())
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, s, c := newSegFromStart(t, page, 16, 8)
			require.NoError(t, s.Map(12*mib, gr))
			before, cBefore, live := snap(s), *c, d.liveHandles()
			err := s.MapLarge(tc.off, tc.n, tc.piece)
			require.ErrorIs(t, err, tc.want)
			assert.Equal(t, before, snap(s))
			assert.Equal(t, cBefore, *c)
			assert.Equal(t, live, d.liveHandles())
			checkConsistent(t, d, s)
		})
	}
}

// TestMapLargeRollback: a fault at any step of a MapLarge rolls it back
// completely, and the range maps afterwards.
func TestMapLargeRollback(t *testing.T) {
	const page = 2 * gr
	const pieces = 3 // [0, 8) [8, 16) [16, 20) MiB
	for _, step := range mapSteps {
		for k := 1; k <= pieces; k++ {
			t.Run(step.op.String()+"/call="+itoa(k), func(t *testing.T) {
				d, s, c := newSegFromStart(t, page, 16, 8)
				require.NoError(t, s.Map(40*mib, page)) // an unrelated handle that must survive
				before, live := snap(s), d.liveHandles()
				cBefore := *c
				cache := slices.Clone(s.cache.handles)
				d.failNth(step.op, k, step.kind)
				err := s.MapLarge(0, 20*mib, 2*page)
				require.ErrorIs(t, err, step.kind)
				assert.Equal(t, before, snap(s))
				assert.Equal(t, live, d.liveHandles())
				assert.Equal(t, 1, d.liveMappings())
				assert.Equal(t, cache, s.cache.handles)
				assert.Equal(t, c.Maps-cBefore.Maps, c.Unmaps-cBefore.Unmaps, "maps not all undone")
				assert.Equal(t, c.HandlesCreated-cBefore.HandlesCreated, c.HandlesFreed-cBefore.HandlesFreed)
				checkConsistent(t, d, s)

				require.NoError(t, s.MapLarge(0, 20*mib, 2*page))
				assert.Equal(t, [][2]uint64{{0, 8}, {8, 16}, {16, 20}, {40, 44}}, runsMiB(s.Handles()))
			})
		}
	}
}

// newSegFromStart is newSeg with CutFromStart, as the allocator uses.
func newSegFromStart(t *testing.T, pageSize uint64, npages, maxCache int) (*fakeDriver, *Segment, *Counters) {
	t.Helper()
	d := newFakeDriver()
	c := new(Counters)
	cfg := Config{Prop: prop0, PageSize: pageSize, VASize: uint64(npages) * pageSize, Counters: c, Cut: CutFromStart}
	if maxCache >= 0 {
		cfg.Cache = NewHandleCache(d, pageSize, prop0, maxCache, c)
	}
	s, err := New(d, cfg)
	require.NoError(t, err)
	return d, s, c
}

// TestHandleCacheHoldsSizes: a cache that holds piece-size handles as
// well as pages (Hold) takes them back at Unmap within its byte budget,
// whatever their size, and MapLarge reuses those of its piece size only;
// granule pieces need no page.
func TestHandleCacheHoldsSizes(t *testing.T) {
	const page = 8 * mib                       // 4 granules
	d, s, c := newSegFromStart(t, page, 16, 4) // budget: 4 pages, 32 MiB
	hc := s.cache
	hc.Hold(2 * page)
	hc.Hold(gr)
	require.NoError(t, s.MapLarge(0, 40*mib, 2*page)) // 16, 16 and 8 MiB
	require.NoError(t, s.MapLarge(40*mib, 4*gr, gr))  // four granule handles
	assert.Equal(t, 7, s.HandleCount())
	_, err := s.Unmap(0, 40*mib+4*gr)
	require.NoError(t, err)
	// 16 + 16 MiB fill the 32 MiB budget; the 8 MiB tail is a page, but
	// the budget is spent, and so are the granules: freed.
	assert.Equal(t, uint64(32*mib), hc.Bytes())
	assert.Equal(t, 2, hc.Len())
	assert.Equal(t, int64(5), c.HandlesFreed)

	creates := d.count(backend.OpCreate)
	require.NoError(t, s.MapLarge(0, 4*gr, gr)) // granules: none cached
	assert.Equal(t, creates+4, d.count(backend.OpCreate))
	require.NoError(t, s.MapLarge(16*mib, 32*mib, 2*page)) // both 16 MiB handles reused
	assert.Equal(t, creates+4, d.count(backend.OpCreate))
	assert.Equal(t, int64(2), c.HandlesReused)
	assert.Zero(t, hc.Bytes())
	checkConsistent(t, d, s)
	require.NoError(t, s.Destroy())
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())
	assert.Equal(t, c.HandlesCreated, c.HandlesFreed)
}

func TestHandleCacheTrimLarger(t *testing.T) {
	const page = 8 * mib                        // 4 granules
	d, s, c := newSegFromStart(t, page, 16, 16) // budget: 16 pages
	hc := s.cache
	hc.Hold(2 * page)
	hc.Hold(gr)
	require.NoError(t, s.MapLarge(0, 32*mib, 2*page)) // two 16 MiB handles
	require.NoError(t, s.Map(32*mib, 2*page))         // two pages
	require.NoError(t, s.MapLarge(48*mib, 2*gr, gr))  // two granules
	_, err := s.Unmap(0, 48*mib+2*gr)
	require.NoError(t, err)
	require.Equal(t, 6, hc.Len())
	freed := c.HandlesFreed

	// A failed free keeps that handle and stops there.
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	err = hc.TrimLarger(gr)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	require.ErrorIs(t, err, ErrHandleNotFreed)
	assert.Equal(t, 6, hc.Len())
	assert.Equal(t, freed, c.HandlesFreed)

	require.NoError(t, hc.TrimLarger(page)) // the 16 MiB handles only
	assert.Equal(t, 4, hc.Len())
	assert.Equal(t, uint64(2*page+2*gr), hc.Bytes())
	require.NoError(t, hc.TrimLarger(gr)) // then the pages
	assert.Equal(t, 2, hc.Len())
	assert.Equal(t, 2*gr, hc.Bytes())
	assert.Equal(t, freed+4, c.HandlesFreed)
	require.NoError(t, hc.TrimLarger(gr), "nothing larger left")
	assert.Equal(t, 2, hc.Len())
	require.NoError(t, s.Destroy())
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())
	assert.Empty(t, d.ruleViolations())
}
