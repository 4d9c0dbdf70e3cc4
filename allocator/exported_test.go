package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// refHolder is a ShareHolder as allocator/ipc's Exporter is one, reduced
// to its references: it retains every handle it registers, keeps those
// pinned (an open export), and records what the allocator told it.
type refHolder struct {
	drv    backend.Driver
	refs   map[backend.Handle]bool // handles it holds a reference to
	pinned map[backend.Handle]bool
	heard  []backend.Handle // ReleaseUnmapped calls, in order
}

func newRefHolder(drv backend.Driver) *refHolder {
	return &refHolder{drv: drv, refs: map[backend.Handle]bool{}, pinned: map[backend.Handle]bool{}}
}

func (r *refHolder) share(t *testing.T, a *Allocator, p uintptr) []HandleSpan {
	t.Helper()
	_, spans, err := a.ShareSpans(p, r)
	require.NoError(t, err)
	for _, sp := range spans {
		if !r.refs[sp.Handle] {
			h, err := r.drv.RetainHandle(sp.VA)
			require.NoError(t, err)
			require.Equal(t, sp.Handle, h, "RetainHandle returns the allocator's handle")
			r.refs[h] = true
		}
	}
	return spans
}

func (r *refHolder) ReleaseUnmapped(h backend.Handle) (bool, error) {
	r.heard = append(r.heard, h)
	if !r.refs[h] {
		return false, nil
	}
	if r.pinned[h] {
		return true, nil
	}
	if err := r.drv.FreePhysical(h); err != nil {
		return true, err
	}
	delete(r.refs, h)
	return false, nil
}

// TestShareSpansRegistry drives the exported-handle registry with a
// holder of its own: registered handles are counted, never enter the
// handle cache, are reported to the holder when unmapped, count as held
// while it pins them, and leave the registry once it lets go.
func TestShareSpansRegistry(t *testing.T) {
	a, e := newAlloc(t, "large_segment_size_mb:2,expandable_handle_mb:0")
	r := newRefHolder(e)
	p, err := a.Malloc(4<<20, 0)
	require.NoError(t, err)
	spans := r.share(t, a, p)
	require.Len(t, spans, 2)
	_, again, err := a.ShareSpans(p, r)
	require.NoError(t, err, "the same holder registers again")
	assert.Equal(t, spans, again)
	st := a.Stats()
	assert.Equal(t, [4]int64{2, 4 << 20, 0, 0}, [4]int64{st.ExportedHandles, st.ExportedBytes, st.ExporterHeldHandles, st.ExporterHeldBytes})
	mustCheck(t, a, e)

	// Another holder, a nil one, a bad pointer: refused, nothing registered.
	_, _, err = a.ShareSpans(p, newRefHolder(e))
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	_, _, err = a.ShareSpans(p, nil)
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	_, _, err = a.ShareSpans(p+512, r)
	require.ErrorIs(t, err, ErrInteriorPointer)
	assert.Equal(t, int64(2), a.Stats().ExportedHandles)

	r.pinned[spans[1].Handle] = true
	freed := a.Stats().HandlesFreed
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	assert.Equal(t, []backend.Handle{spans[0].Handle, spans[1].Handle, spans[1].Handle}, r.heard,
		"told at the unmap, and the pinned one asked again by EmptyCache")
	_, _, cached := a.Footprint()
	assert.Zero(t, cached, "exported handles never enter the handle cache")
	assert.Equal(t, freed+2, a.Stats().HandlesFreed, "the allocator freed its references")
	st = a.Stats()
	assert.Equal(t, [4]int64{1, 2 << 20, 1, 2 << 20}, [4]int64{st.ExportedHandles, st.ExportedBytes, st.ExporterHeldHandles, st.ExporterHeldBytes})
	mustCheck(t, a, e) // the driver's extra handle is the held one

	// ReleaseShared ignores handles of other holders and unknown ones.
	require.NoError(t, a.ReleaseShared(newRefHolder(e), spans[1].Handle, 12345))
	assert.Equal(t, int64(1), a.Stats().ExporterHeldHandles)
	delete(r.pinned, spans[1].Handle)
	require.NoError(t, a.ReleaseShared(r, spans[1].Handle))
	assert.Empty(t, r.refs)
	st = a.Stats()
	assert.Zero(t, st.ExportedHandles+st.ExportedBytes+st.ExporterHeldHandles+st.ExporterHeldBytes)
	mustCheck(t, a, e)
	assert.Zero(t, e.Live().Handles)

	require.NoError(t, a.Close())
	_, _, err = a.ShareSpans(p, r)
	require.ErrorIs(t, err, ErrClosed)
}

// TestCheckExportedRegistry: Check reports a registry that disagrees with
// the segments.
func TestCheckExportedRegistry(t *testing.T) {
	a, e := newAlloc(t, "large_segment_size_mb:2,expandable_handle_mb:0")
	r := newRefHolder(e)
	p, err := a.Malloc(2<<20, 0)
	require.NoError(t, err)
	spans := r.share(t, a, p)
	x := a.exported[spans[0].Handle]
	for _, c := range []struct {
		name    string
		breakIt func()
	}{
		{"mapped registered as held", func() { x.mapped = false }},
		{"wrong size", func() { x.size = 4 << 20 }},
		{"no holder", func() { x.holder = nil }},
	} {
		saved := *x
		c.breakIt()
		require.ErrorIs(t, a.Check(), ErrCorrupt, c.name)
		*x = saved
		require.NoError(t, a.Check(), c.name)
	}
	stray := spans[0].Handle + 1000
	a.exported[stray] = &exportedHandle{holder: r, size: 2 << 20, mapped: true}
	require.ErrorIs(t, a.Check(), ErrCorrupt, "a registered handle no segment maps")
	delete(a.exported, stray)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	assert.Empty(t, r.refs)
}
