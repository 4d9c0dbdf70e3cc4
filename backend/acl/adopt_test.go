package acl_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/acl"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
)

// TestAdoptStream uses, through one Driver, a stream another Driver made
// (as torch_npu's runtime makes its streams), and Close leaves it alone.
func TestAdoptStream(t *testing.T) {
	owner := open(t)
	s, err := owner.StreamCreate(1)
	require.NoError(t, err)
	d, err := acl.Open(acl.WithLibrary(libPath))
	require.NoError(t, err)

	for _, c := range []struct {
		name string
		dev  int
		s    uintptr
	}{{"NULL stream", 0, 0}, {"no such device", 2, uintptr(s)}, {"negative device", -1, uintptr(s)}} {
		_, err := d.AdoptStream(c.dev, c.s)
		conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument)
	}
	got, err := d.AdoptStream(1, uintptr(s))
	require.NoError(t, err)
	assert.Equal(t, s, got)
	_, err = d.AdoptStream(0, uintptr(s))
	conformance.RequireKind(t, err, backend.OpStreamSync, backend.ErrInvalidArgument)
	dev, err := d.StreamDevice(s)
	require.NoError(t, err)
	assert.Equal(t, 1, dev)
	e, err := d.EventCreate(1)
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(e, s))
	require.NoError(t, d.StreamSynchronize(s))
	conformance.RequireKind(t, d.StreamDestroy(s), backend.OpStreamDestroy, backend.ErrInvalidArgument)
	require.NoError(t, d.EventDestroy(e))

	// Close destroys what d made, not the adopted stream: its owner can
	// still use and destroy it.
	require.NoError(t, d.Close())
	require.NoError(t, owner.StreamSynchronize(s))
	require.NoError(t, owner.StreamDestroy(s))

	d2, err := acl.Open(acl.WithLibrary(libPath))
	require.NoError(t, err)
	defer func() { require.NoError(t, d2.Close()) }()
	s2, err := owner.StreamCreate(0)
	require.NoError(t, err)
	_, err = d2.AdoptStream(0, uintptr(s2))
	require.NoError(t, err)
	require.NoError(t, d2.DisownStream(s2))
	conformance.RequireKind(t, d2.DisownStream(s2), backend.OpStreamDestroy, backend.ErrInvalidArgument)
	_, err = d2.StreamDevice(s2)
	require.Error(t, err)
	require.NoError(t, owner.StreamDestroy(s2))
}
