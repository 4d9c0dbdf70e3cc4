package segment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// TestUnmappedSharedNeverCached: Config.Unmapped hears of every handle
// unmapped, by Unmap, BeginUnmap/EndUnmap and Destroy, with its size; a
// full-size handle it calls shared is freed instead of cached (and kept
// as a leftover when that free fails), the others go to the cache as
// before.
func TestUnmappedSharedNeverCached(t *testing.T) {
	d := newFakeDriver()
	c := new(Counters)
	hc := NewHandleCache(d, gr, prop0, 8, c)
	shared := map[backend.Handle]bool{}
	var heard []backend.Handle
	s, err := New(d, Config{Prop: prop0, PageSize: gr, VASize: 8 * gr, Counters: c, Cache: hc,
		Unmapped: func(h backend.Handle, size uint64) bool {
			assert.Equal(t, gr, size)
			heard = append(heard, h)
			return shared[h]
		}})
	require.NoError(t, err)
	require.NoError(t, s.Map(0, 6*gr))
	hs := make([]backend.Handle, 6)
	for i := range hs {
		hs[i], _, _, _ = s.HandleAt(uint64(i) * gr)
		require.Equal(t, handleAt(s, uint64(i)*gr), hs[i])
	}
	shared[hs[0]], shared[hs[2]], shared[hs[4]] = true, true, true

	_, err = s.Unmap(0, 2*gr)
	require.NoError(t, err)
	assert.Equal(t, []backend.Handle{hs[1]}, hc.handles, "the shared handle is not cached")
	assert.False(t, d.handleLive(hs[0]), "the shared handle is freed")

	op, err := s.BeginUnmap(2*gr, 2*gr)
	require.NoError(t, err)
	op.Run()
	_, err = s.EndUnmap(op)
	require.NoError(t, err)
	assert.Equal(t, []backend.Handle{hs[1], hs[3]}, hc.handles)
	assert.False(t, d.handleLive(hs[2]))

	// A failing free of a shared handle keeps it as a leftover, never in
	// the cache.
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	_, err = s.Unmap(4*gr, gr)
	require.ErrorIs(t, err, ErrHandleNotFreed)
	assert.Equal(t, []backend.Handle{hs[1], hs[3]}, hc.handles)
	assert.Equal(t, 1, s.Leftovers())
	assert.True(t, d.handleLive(hs[4]))
	require.NoError(t, s.Destroy())
	assert.Equal(t, []backend.Handle{hs[1], hs[3], hs[5]}, hc.handles)
	assert.Equal(t, hs, heard, "every unmapped handle heard of, in order")
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())

	_, _, _, ok := s.HandleAt(0)
	assert.False(t, ok, "released")
}
