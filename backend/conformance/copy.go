package conformance

import (
	"bytes"
	"errors"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// copier returns the driver's Copier or skips the case. A driver whose
// copies need a configuration it lacks (ErrNotSupported) skips too.
func (s *suite) copier() {
	c := s.copierOrSkip()
	g := s.g
	base := s.reserve(4 * g)
	h1, h2 := s.create(g), s.create(g)
	s.mapRW(base, g, h1, 0)
	s.mapRW(base+uintptr(g), g, h2, 0) // adjacent: copies may span mappings
	st, err := s.d.StreamCreate(0)
	require.NoError(s.t, err)

	want := make([]byte, 2*g)
	for i := range want {
		want[i] = byte(i*131 + i>>11)
	}
	require.NoError(s.t, c.CopyHtoD(base, want, st))
	got := make([]byte, 2*g)
	require.NoError(s.t, c.CopyDtoH(got, base, st))
	require.True(s.t, bytes.Equal(want, got), "bytes read back differ from bytes written")

	// Memset and a device-to-device copy are queued on the stream; a copy to
	// the host is ordered after them.
	require.NoError(s.t, c.Memset(base+10, 0x7e, 100, st))
	copy(want[10:110], bytes.Repeat([]byte{0x7e}, 100))
	require.NoError(s.t, c.CopyDtoD(base+uintptr(g)+5, base, 4096, st))
	copy(want[g+5:g+5+4096], want[:4096])
	require.NoError(s.t, c.CopyDtoH(got, base, st))
	require.True(s.t, bytes.Equal(want, got), "memset or device-to-device copy wrong")

	// Zero-length calls are fine and change nothing.
	require.NoError(s.t, c.CopyHtoD(base, nil, st))
	require.NoError(s.t, c.Memset(base, 0, 0, st))

	// The bytes belong to the handle: they survive unmapping and mapping it
	// elsewhere.
	require.NoError(s.t, s.d.Unmap(base, g))
	s.mapRW(base+uintptr(3*g), g, h1, 0)
	part := make([]byte, g)
	require.NoError(s.t, c.CopyDtoH(part, base+uintptr(3*g), st))
	assert.True(s.t, bytes.Equal(want[:g], part), "data lost across unmap and remap")

	require.NoError(s.t, s.d.StreamDestroy(st))
	require.NoError(s.t, s.d.Unmap(base+uintptr(3*g), g))
	require.NoError(s.t, s.d.Unmap(base+uintptr(g), g))
	require.NoError(s.t, s.d.FreePhysical(h1))
	require.NoError(s.t, s.d.FreePhysical(h2))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) copierOrSkip() backend.Copier {
	c, ok := s.d.(backend.Copier)
	if !ok {
		s.t.Skip("driver does not implement backend.Copier")
	}
	st, err := s.d.StreamCreate(0)
	require.NoError(s.t, err)
	defer func() { require.NoError(s.t, s.d.StreamDestroy(st)) }()
	if err := c.CopyHtoD(0, nil, st); errors.Is(err, backend.ErrNotSupported) {
		s.t.Skip("copies not supported by this configuration")
	}
	return c
}

// copierRejects checks that copies outside accessible mapped memory fail
// with the right kind and move nothing.
func (s *suite) copierRejects() {
	c := s.copierOrSkip()
	g := s.g
	base := s.reserve(4 * g)
	h1, h2, h3 := s.create(g), s.create(g), s.create(g)
	s.mapRW(base, g, h1, 0)
	require.NoError(s.t, s.d.Map(base+uintptr(g), g, h2)) // mapped, no access yet (R8)
	require.NoError(s.t, s.d.Map(base+uintptr(2*g), g, h3))
	require.NoError(s.t, s.d.SetAccess(base+uintptr(2*g), g, []backend.AccessDesc{{Location: devLoc(0), Flags: backend.AccessRead}}))
	st, err := s.d.StreamCreate(0)
	require.NoError(s.t, err)

	orig := bytes.Repeat([]byte{0x11}, int(g))
	require.NoError(s.t, c.CopyHtoD(base, orig, st))
	junk := bytes.Repeat([]byte{0xee}, int(2*g))
	bad := []struct {
		name string
		op   backend.Op
		call func() error
	}{
		{"write spilling into an inaccessible mapping", backend.OpMemcpy, func() error { return c.CopyHtoD(base, junk, st) }},
		{"write to a read-only mapping", backend.OpMemcpy, func() error { return c.CopyHtoD(base+uintptr(2*g), junk[:g], st) }},
		{"read of an inaccessible mapping", backend.OpMemcpy, func() error { return c.CopyDtoH(junk[:16], base+uintptr(g), st) }},
		{"read past the last mapping", backend.OpMemcpy, func() error { return c.CopyDtoH(junk[:16], base+uintptr(4*g)-8, st) }},
		{"device copy into read-only memory", backend.OpMemcpy, func() error { return c.CopyDtoD(base+uintptr(2*g), base, 64, st) }},
		{"device copy from unmapped memory", backend.OpMemcpy, func() error { return c.CopyDtoD(base, base+uintptr(3*g), 64, st) }},
		{"memset of unmapped memory", backend.OpMemset, func() error { return c.Memset(base+uintptr(3*g), 0, 64, st) }},
		{"memset spilling into an inaccessible mapping", backend.OpMemset, func() error { return c.Memset(base+uintptr(g)-8, 0, 16, st) }},
		{"unknown stream", backend.OpMemcpy, func() error { return c.CopyHtoD(base, junk[:8], st+12345) }},
	}
	for _, b := range bad {
		err := b.call()
		require.Error(s.t, err, b.name)
		RequireKind(s.t, err, b.op, backend.ErrInvalidArgument)
	}
	got := make([]byte, g)
	require.NoError(s.t, c.CopyDtoH(got, base, st))
	assert.True(s.t, bytes.Equal(orig, got), "a rejected call changed memory")

	require.NoError(s.t, s.d.StreamDestroy(st))
	for i, h := range []backend.Handle{h1, h2, h3} {
		require.NoError(s.t, s.d.Unmap(base+uintptr(uint64(i)*g), g))
		require.NoError(s.t, s.d.FreePhysical(h))
	}
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) deviceSynchronize() {
	ds, ok := s.d.(backend.DeviceSynchronizer)
	if !ok {
		s.t.Skip("driver does not implement backend.DeviceSynchronizer")
	}
	for dev := 0; dev < s.d.DeviceCount(); dev++ {
		require.NoError(s.t, ds.DeviceSynchronize(dev))
	}
	for _, dev := range []int{-1, s.d.DeviceCount()} {
		RequireKind(s.t, ds.DeviceSynchronize(dev), backend.OpDeviceSync, backend.ErrInvalidArgument)
	}
}
