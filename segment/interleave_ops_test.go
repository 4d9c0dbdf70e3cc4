package segment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMapAndUnmapOpsInterleaved keeps an UnmapOp and a MapOp in flight on
// one segment at once, attacks them with every overlapping and empty
// request (each refused, changing nothing), runs and ends them in the
// opposite order to their beginning, and checks the segment, the cache
// and the driver agree after each step.
func TestMapAndUnmapOpsInterleaved(t *testing.T) {
	const page = 10 * gr
	d, s, c := newSeg(t, page, 6, 4)
	_, s2, _ := newSeg(t, page, 2, 0)
	require.NoError(t, s.Map(0, 2*page))
	un, err := s.BeginUnmap(0, 2*page)
	require.NoError(t, err)
	mp, err := s.BeginMap(3*page, 2*page)
	require.NoError(t, err)

	refused := []struct {
		name string
		call func() error
		want error
	}{
		{"BeginUnmap inside unmap", func() error { _, err := s.BeginUnmap(page, page); return err }, ErrInvalidRange},
		{"Unmap inside unmap", func() error { _, err := s.Unmap(0, page); return err }, ErrInvalidRange},
		{"Map over unmap", func() error { return s.Map(page, page) }, ErrAlreadyMapped},
		{"BeginMap over map", func() error { _, err := s.BeginMap(4*page, page); return err }, ErrAlreadyMapped},
		{"BeginMap straddling map", func() error { _, err := s.BeginMap(2*page, 2*page); return err }, ErrAlreadyMapped},
		{"BeginMap empty", func() error { _, err := s.BeginMap(2*page, 0); return err }, ErrInvalidRange},
		{"BeginUnmap empty", func() error { _, err := s.BeginUnmap(0, 0); return err }, ErrInvalidRange},
		{"BeginUnmap of map in flight", func() error { _, err := s.BeginUnmap(3*page, page); return err }, ErrNotMapped},
		{"Release", s.Release, ErrNotEmpty},
		{"Destroy", func() error { return s.Destroy() }, ErrBusy},
		{"EndMap on another segment", func() error { return s2.EndMap(mp) }, ErrInvalidRange},
		{"EndUnmap on another segment", func() error { _, err := s2.EndUnmap(un); return err }, ErrInvalidRange},
	}
	for _, r := range refused {
		require.ErrorIs(t, r.call(), r.want, r.name)
		assert.Equal(t, 2*page, s.MappedBytes(), "%s changed the segment", r.name)
		assert.Equal(t, 2, d.liveMappings(), "%s changed the driver", r.name)
	}

	un.Run()
	assert.Zero(t, d.liveMappings(), "UnmapOp.Run unmaps with the driver")
	assert.Equal(t, 2*page, s.MappedBytes(), "the segment changes only at EndUnmap")
	mp.Run()
	require.NoError(t, s.EndMap(mp))
	assert.Equal(t, 4*page, s.MappedBytes())
	done, err := s.EndUnmap(un)
	require.NoError(t, err)
	assert.Equal(t, 2*page, done)
	assert.Equal(t, 2*page, s.MappedBytes())
	assert.Equal(t, 2, d.liveMappings())
	assert.Equal(t, 2, s.cache.Len(), "the unmapped pages go to the cache")
	assert.Equal(t, int64(4), c.Maps, "driver Maps counted once each")
	assert.Equal(t, int64(2), c.Unmaps, "driver Unmaps counted once each")

	// The unmapped range maps again from the cache; everything unmaps.
	require.NoError(t, s.Map(0, 2*page))
	assert.Zero(t, s.cache.Len())
	done, err = s.Unmap(0, 5*page)
	require.ErrorIs(t, err, ErrNotMapped, "[2p, 3p) is a hole")
	assert.Zero(t, done)
	_, err = s.Unmap(0, 2*page)
	require.NoError(t, err)
	_, err = s.Unmap(3*page, 2*page)
	require.NoError(t, err)
	require.NoError(t, s.Release())
	assert.Zero(t, d.liveMappings())
	assert.Empty(t, d.ruleViolations())
}
