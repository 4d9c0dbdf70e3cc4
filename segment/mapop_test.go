package segment

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

// TestMapOpInFlight checks what a map begun and not ended does to the
// segment: its granules read as unmapped, an overlapping map is refused,
// Release and Destroy return ErrBusy, and EndMap records it.
func TestMapOpInFlight(t *testing.T) {
	const page = 10 * gr
	d, s, c := newSeg(t, page, 4, 4)
	op, err := s.BeginMap(0, 2*page)
	require.NoError(t, err)
	assert.False(t, s.IsMappedAt(0))
	assert.Zero(t, s.MappedBytes())

	for _, r := range []Run{{0, gr}, {page, page}, {2*page - gr, 2 * gr}} {
		_, err := s.BeginMap(r.Off, r.Len)
		require.ErrorIs(t, err, ErrAlreadyMapped, "overlap %v", r)
		require.ErrorIs(t, s.Map(r.Off, r.Len), ErrAlreadyMapped)
	}
	require.ErrorIs(t, s.Release(), ErrBusy)
	require.ErrorIs(t, s.Destroy(), ErrBusy)
	assert.Zero(t, d.liveHandles(), "BeginMap created a handle")

	op.Run()
	assert.Equal(t, 2, d.liveMappings(), "Run maps")
	assert.Zero(t, c.Maps, "Run counts without the lock")
	assert.False(t, s.IsMappedAt(0), "Run changed the segment")
	require.NoError(t, s.EndMap(op))
	assert.Equal(t, 2*page, s.MappedBytes())
	assert.Equal(t, int64(2), c.Maps)
	assert.Equal(t, int64(2), c.HandlesCreated)
	require.ErrorIs(t, s.EndMap(op), ErrInvalidRange, "ended twice")
	require.ErrorIs(t, s.EndMap(nil), ErrInvalidRange)

	// The range after it is free to map now.
	require.NoError(t, s.Map(2*page, page))
	done, err := s.Unmap(0, 3*page)
	require.NoError(t, err)
	assert.Equal(t, 3*page, done)
	require.NoError(t, s.Release())
	assert.Empty(t, d.ruleViolations())
}

// TestMapOpEndedUnrun: an op ended without Run gives its cached handles
// back and maps nothing.
func TestMapOpEndedUnrun(t *testing.T) {
	const page = 10 * gr
	d, s, _ := newSeg(t, page, 4, 4)
	require.NoError(t, s.Map(0, 2*page))
	_, err := s.Unmap(0, 2*page)
	require.NoError(t, err)
	require.Equal(t, 2, s.cache.Len())
	op, err := s.BeginMap(page, 2*page)
	require.NoError(t, err)
	assert.Zero(t, s.cache.Len(), "BeginMap takes the cached handles")
	require.ErrorIs(t, s.EndMap(op), ErrBusy)
	assert.Equal(t, 2, s.cache.Len())
	assert.Zero(t, s.MappedBytes())
	assert.Zero(t, d.liveMappings())
	require.NoError(t, s.Release())
}

// TestMapOpFaults fails each driver step of a map run without the lock
// and checks that EndMap rolls it back as Map does: the error wraps the
// driver's, nothing stays mapped, cached handles go back to the cache,
// created ones are freed.
func TestMapOpFaults(t *testing.T) {
	const page = 10 * gr
	cases := []struct {
		op backend.Op
		n  int
	}{
		{backend.OpCreate, 1}, {backend.OpMap, 1}, {backend.OpMap, 3},
		{backend.OpSetAccess, 2}, {backend.OpSetAccess, 3},
	}
	for _, tc := range cases {
		t.Run(tc.op.String(), func(t *testing.T) {
			d, s, c := newSeg(t, page, 8, 8)
			require.NoError(t, s.Map(0, 2*page)) // two full handles to cache
			_, err := s.Unmap(0, 2*page)
			require.NoError(t, err)
			handles := d.liveHandles()
			d.failNth(tc.op, tc.n, backend.ErrInvalidArgument)
			// 2 cached + 1 created (the 4-granule tail).
			op, err := s.BeginMap(page, 2*page+4*gr)
			require.NoError(t, err)
			op.Run()
			err = s.EndMap(op)
			require.ErrorIs(t, err, backend.ErrInvalidArgument)
			assert.Zero(t, s.MappedBytes())
			assert.Zero(t, d.liveMappings())
			assert.Equal(t, handles, d.liveHandles(), "handle leaked or lost")
			assert.Equal(t, 2, s.cache.Len())
			assert.Equal(t, c.Maps, c.Unmaps)
			assert.Empty(t, d.ruleViolations())
			d.clearFaults()
			require.NoError(t, s.Map(page, 2*page+4*gr))
		})
	}
}

// TestMapOpsConcurrent runs the driver calls of maps of disjoint ranges
// of one segment on several goroutines at once, Begin and End under one
// lock, as the allocator does (meaningful with -race).
func TestMapOpsConcurrent(t *testing.T) {
	const page = 4 * gr
	d, s, c := newSeg(t, page, 16, 4)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			op, err := s.BeginMapLarge(uint64(i)*2*page, 2*page, page)
			mu.Unlock()
			if err != nil {
				errs[i] = err
				return
			}
			op.Run()
			mu.Lock()
			errs[i] = s.EndMap(op)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, uint64(16*page), s.MappedBytes())
	assert.Equal(t, 16, s.HandleCount())
	assert.Equal(t, int64(16), c.Maps)
	assert.Equal(t, []Run{{0, 16 * page}}, s.MappedRuns())
	assert.Empty(t, d.ruleViolations())
}

// TestUnmapOpInFlight checks an unmap begun and not ended: its handles
// still read as mapped, an overlapping unmap is refused, Release and
// Destroy return ErrBusy, Run unmaps with the driver without touching
// the segment, and EndUnmap records and counts it.
func TestUnmapOpInFlight(t *testing.T) {
	const page = 10 * gr
	d, s, c := newSeg(t, page, 4, 1)
	require.NoError(t, s.Map(0, 3*page))
	op, err := s.BeginUnmap(page, 2*page)
	require.NoError(t, err)
	_, err = s.BeginUnmap(2*page, page)
	require.ErrorIs(t, err, ErrInvalidRange)
	_, err = s.Unmap(page, page)
	require.ErrorIs(t, err, ErrInvalidRange)
	require.ErrorIs(t, s.Destroy(), ErrBusy)
	_, err = s.BeginUnmap(page+gr, page)
	require.ErrorIs(t, err, ErrInvalidRange, "inside a handle")

	op.Run()
	assert.Equal(t, 1, d.liveMappings(), "Run unmaps")
	assert.True(t, s.IsMappedAt(page), "Run changed the segment")
	assert.Equal(t, int64(0), c.Unmaps)
	done, err := s.EndUnmap(op)
	require.NoError(t, err)
	assert.Equal(t, 2*page, done)
	assert.Equal(t, page, s.MappedBytes())
	assert.Equal(t, int64(2), c.Unmaps)
	assert.Equal(t, 1, s.cache.Len(), "one full handle cached, the other freed (cache of 1)")
	_, err = s.EndUnmap(op)
	require.ErrorIs(t, err, ErrInvalidRange, "ended twice")

	// An op ended without Run unmaps nothing.
	op, err = s.BeginUnmap(0, page)
	require.NoError(t, err)
	done, err = s.EndUnmap(op)
	require.NoError(t, err)
	assert.Zero(t, done)
	assert.Equal(t, page, s.MappedBytes())
	require.NoError(t, s.Destroy())
	assert.Empty(t, d.ruleViolations())
}

// TestUnmapOpFault: the driver's Unmap fails at the second handle; the
// first is unmapped and recorded, the rest stays mapped, as Unmap does.
func TestUnmapOpFault(t *testing.T) {
	const page = 10 * gr
	d, s, c := newSeg(t, page, 4, 4)
	require.NoError(t, s.Map(0, 3*page))
	d.failNth(backend.OpUnmap, 2, backend.ErrInvalidArgument)
	op, err := s.BeginUnmap(0, 3*page)
	require.NoError(t, err)
	op.Run()
	done, err := s.EndUnmap(op)
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	assert.Equal(t, page, done)
	assert.Equal(t, 2*page, s.MappedBytes())
	assert.Equal(t, int64(1), c.Unmaps)
	assert.Equal(t, 2, d.liveMappings())
	done, err = s.Unmap(page, 2*page)
	require.NoError(t, err)
	assert.Equal(t, 2*page, done)
	assert.Empty(t, d.ruleViolations())
}
