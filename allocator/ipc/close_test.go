package ipc_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/ipc"
)

// TestCloseContract: after Close, every method of an Exporter and an
// Export fails with an error wrapping ErrClosed (Exported reads 0: the
// Exporter holds nothing), Close again succeeds and changes nothing, and
// a closed Mapping's Close is idempotent too. Closing an Export does not
// close its Exporter, and an Exporter's Close gives back the handles the
// allocator still maps.
func TestCloseContract(t *testing.T) {
	w := newWorld(t)
	p, err := w.a.Malloc(3<<20, w.s)
	require.NoError(t, err)
	x, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
	require.NoError(t, err)
	m, err := ipc.Import(w.b, x.Descriptor, 0)
	require.NoError(t, err)

	require.NoError(t, m.Close())
	for i := 0; i < 2; i++ {
		require.NoError(t, m.Close(), "Mapping.Close is idempotent")
	}
	assert.Zero(t, held(w.b))

	require.NoError(t, x.Close())
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Export.Allow", func() error { return x.Allow(2000) }},
	} {
		require.ErrorIs(t, c.call(), ipc.ErrClosed, c.name)
	}
	require.NoError(t, x.Close(), "Export.Close is idempotent")
	assert.Equal(t, 2, w.x.Exported(), "the allocator still maps the export's two handles")

	x2, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
	require.NoError(t, err, "closing an Export leaves its Exporter open")
	require.NoError(t, x2.Close())

	require.NoError(t, w.x.Close())
	assert.Zero(t, w.x.Exported(), "a closed Exporter holds nothing")
	assert.Equal(t, 2, w.e.Live().Exports, "the allocator maps the handles: still exported by the driver")
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Exporter.Export", func() error { _, err := w.x.Export(p, ipc.ExportOptions{DisablePidValidation: true}); return err }},
		{"Export.Allow after Exporter.Close", func() error { return x2.Allow(2000) }},
	} {
		require.ErrorIs(t, c.call(), ipc.ErrClosed, c.name)
	}
	for i := 0; i < 2; i++ {
		require.NoError(t, w.x.Close(), "Exporter.Close is idempotent")
		require.NoError(t, x2.Close())
	}
	require.NoError(t, w.a.Check())
	require.NoError(t, w.a.Free(p))
	require.NoError(t, w.a.EmptyCache())
	assert.Zero(t, w.e.Live().Exports)
	w.done(t)
}
