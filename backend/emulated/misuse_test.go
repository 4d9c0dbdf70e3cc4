package emulated_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestMisuse runs the edge-argument table over the emulator, in both
// memory modes (only real memory has a Copier that moves bytes).
func TestMisuse(t *testing.T) {
	for name, opts := range map[string][]emulated.Option{
		"accounting": nil,
		"real":       {emulated.WithRealMemory(), emulated.WithCapacity(1 << 30)},
	} {
		t.Run(name, func(t *testing.T) {
			e, err := emulated.New(opts...)
			require.NoError(t, err)
			defer e.Close()
			conformance.Misuse(t, e)
			require.Empty(t, e.Violations())
		})
	}
}

// TestCopierFaultsMoveNothing: an injected fault fails a copy or memset
// before any byte moves, and a closed emulator refuses both.
func TestCopierFaultsMoveNothing(t *testing.T) {
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(64<<20), emulated.WithGranularity(64<<10))
	require.NoError(t, err)
	const n = 64 << 10
	prop := backend.PhysicalProp{Location: backend.Location{Type: backend.LocationDevice}, Attr: backend.PageHuge}
	va, err := e.ReserveAddress(n)
	require.NoError(t, err)
	h, err := e.CreatePhysical(n, prop)
	require.NoError(t, err)
	require.NoError(t, e.Map(va, n, h))
	require.NoError(t, e.SetAccess(va, n, []backend.AccessDesc{{Location: prop.Location, Flags: backend.AccessReadWrite}}))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	want := bytes.Repeat([]byte{0xa5}, 16)
	require.NoError(t, e.CopyHtoD(va, want, s))

	for _, tc := range []struct {
		name string
		op   backend.Op
		call func() error
	}{
		{"CopyHtoD", backend.OpMemcpy, func() error { return e.CopyHtoD(va, make([]byte, 16), s) }},
		{"CopyDtoD", backend.OpMemcpy, func() error { return e.CopyDtoD(va, va+32, 16, s) }},
		{"Memset", backend.OpMemset, func() error { return e.Memset(va, 0, 16, s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, e.FailNth(tc.op, 1, backend.ErrUnavailable))
			require.ErrorIs(t, tc.call(), backend.ErrUnavailable)
			got := make([]byte, 16)
			require.NoError(t, e.CopyDtoH(got, va, s))
			assert.Equal(t, want, got, "a failed call moved bytes")
		})
	}
	require.NoError(t, e.StreamSynchronize(s))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, e.Unmap(va, n))
	require.NoError(t, e.FreePhysical(h))
	require.NoError(t, e.ReleaseAddress(va, n))
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.CopyHtoD(va, want, s), backend.ErrUnavailable)
	require.ErrorIs(t, e.Memset(va, 0, 1, s), backend.ErrUnavailable)
	require.ErrorIs(t, e.DeviceSynchronize(0), backend.ErrUnavailable)
}
