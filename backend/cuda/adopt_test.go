//go:build unix

package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
)

// TestAdoptStream uses, through one Driver, a stream another Driver made
// (as the CUDA runtime makes PyTorch's), and the default streams.
func TestAdoptStream(t *testing.T) {
	owner, _ := openDouble(t, nil)
	_, path := double(t)
	d, err := cuda.Open(cuda.WithLibrary(path))
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	s, err := owner.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, owner.StreamDestroy(s)) }()

	_, err = d.StreamDevice(s)
	conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument)
	for _, c := range []struct {
		name string
		dev  int
		s    uintptr
	}{
		{"another device's context", 1, uintptr(s)},
		{"not a stream", 0, 0xdead000},
		{"a stand-in's value", 0, uintptr(cuda.LegacyStream(0))},
		{"no such device", 2, uintptr(s)},
		{"negative device", -1, 0},
	} {
		_, err := d.AdoptStream(c.dev, c.s)
		conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument)
		_, err = d.StreamDevice(s)
		require.Error(t, err, "%s: nothing recorded", c.name)
	}

	got, err := d.AdoptStream(0, uintptr(s))
	require.NoError(t, err)
	assert.Equal(t, s, got)
	again, err := d.AdoptStream(0, uintptr(s))
	require.NoError(t, err)
	assert.Equal(t, s, again)
	_, err = d.AdoptStream(1, uintptr(s))
	conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument)
	dev, err := d.StreamDevice(s)
	require.NoError(t, err)
	assert.Equal(t, 0, dev)
	e, err := d.EventCreate(0)
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(e, s))
	require.NoError(t, d.StreamSynchronize(s))
	conformance.RequireKind(t, d.StreamDestroy(s), backend.OpStreamDestroy, backend.ErrInvalidArgument)

	// The default streams: stand-ins per device, turned back into
	// CU_STREAM_LEGACY / CU_STREAM_PER_THREAD on every call.
	for _, c := range []struct {
		dev  int
		s    uintptr
		want backend.Stream
	}{{0, 0, cuda.LegacyStream(0)}, {1, 1, cuda.LegacyStream(1)}, {1, 2, cuda.PerThreadStream(1)}} {
		got, err := d.AdoptStream(c.dev, c.s)
		require.NoError(t, err)
		assert.Equal(t, c.want, got)
		dev, err := d.StreamDevice(got)
		require.NoError(t, err)
		assert.Equal(t, c.dev, dev)
		conformance.RequireKind(t, d.StreamDestroy(got), backend.OpStreamDestroy, backend.ErrInvalidArgument)
		require.NoError(t, d.DisownStream(got), "a stand-in needs no disowning")
	}
	require.NoError(t, d.EventRecord(e, cuda.LegacyStream(0)))
	done, err := d.EventQuery(e)
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, d.StreamSynchronize(cuda.PerThreadStream(0)))
	_, err = d.StreamDevice(cuda.LegacyStream(2))
	conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument) // two devices only

	// An allocator serves the adopted and default streams.
	a, err := allocator.New(d, allocator.DefaultConfig())
	require.NoError(t, err)
	p, err := a.Malloc(3<<20, s)
	require.NoError(t, err)
	q, err := a.Malloc(4096, cuda.LegacyStream(0))
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, cuda.LegacyStream(0)))
	require.NoError(t, d.CopyHtoD(q, []byte("vmmalloc"), cuda.LegacyStream(0)))
	got8 := make([]byte, 8)
	require.NoError(t, d.CopyDtoH(got8, q, s))
	assert.Equal(t, "vmmalloc", string(got8))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Check())
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, a.Close())

	require.NoError(t, d.DisownStream(s))
	_, err = d.StreamDevice(s)
	conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument)
	conformance.RequireKind(t, d.DisownStream(s), backend.OpStreamDestroy, backend.ErrInvalidArgument)
	require.NoError(t, d.EventDestroy(e))
}
