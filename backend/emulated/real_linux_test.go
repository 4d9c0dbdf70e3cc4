//go:build linux && (amd64 || arm64 || riscv64 || loong64 || ppc64le)

package emulated_test

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

const g64 = 64 * emulated.KiB

func newReal(t *testing.T, opts ...emulated.Option) *emulated.Emulator {
	t.Helper()
	return newEmu(t, append([]emulated.Option{emulated.WithRealMemory()}, opts...)...)
}

// sink keeps loads in faults' callbacks from being optimised away.
var sink byte

// faults reports whether fn hit a memory fault.
func faults(fn func()) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	fn()
	return false
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func bytesAt(t *testing.T, e *emulated.Emulator, va uintptr, n uint64) []byte {
	t.Helper()
	b, err := e.Bytes(va, n)
	require.NoError(t, err)
	require.Len(t, b, int(n))
	return b
}

func TestRealDefaults(t *testing.T) {
	e := newReal(t)
	g, err := e.Granularity(backend.DeviceProp(0), backend.GranularityMinimum)
	require.NoError(t, err)
	assert.Equal(t, g64, g)
	_, total, err := e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, 256*MiB, total)
	_, err = emulated.New(emulated.WithRealMemory(), emulated.WithGranularity(uint64(os.Getpagesize())/2))
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
}

func TestRealSharedBytes(t *testing.T) {
	e := newReal(t)
	base, err := e.ReserveAddress(4 * g64)
	require.NoError(t, err)
	assert.Zero(t, uint64(base)%g64)
	h, err := e.CreatePhysical(g64, backend.DeviceProp(0))
	require.NoError(t, err)
	v1, v2 := base, base+uintptr(2*g64)
	for _, va := range []uintptr{v1, v2} {
		require.NoError(t, e.Map(va, g64, h))
	}
	_, err = e.Bytes(v1, g64)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument, "inaccessible before SetAccess (R8)")
	for _, va := range []uintptr{v1, v2} {
		require.NoError(t, e.SetAccess(va, g64, rw0))
	}
	a, b := bytesAt(t, e, v1, g64), bytesAt(t, e, v2, g64)
	copy(a, "hello, device")
	assert.Equal(t, "hello, device", string(b[:13]))

	// Unmap both, map again elsewhere: the bytes are the handle's.
	require.NoError(t, e.Unmap(v1, g64))
	require.NoError(t, e.Unmap(v2, g64))
	assert.True(t, faults(func() { sink = a[0] }), "an unmapped range must fault")
	require.NoError(t, e.Map(base+uintptr(g64), g64, h))
	require.NoError(t, e.SetAccess(base+uintptr(g64), g64, rw0))
	c := bytesAt(t, e, base+uintptr(g64), g64)
	assert.Equal(t, "hello, device", string(c[:13]))
	require.NoError(t, e.Unmap(base+uintptr(g64), g64))
	require.NoError(t, e.FreePhysical(h))
	require.NoError(t, e.ReleaseAddress(base, 4*g64))
}

func TestRealProtection(t *testing.T) {
	e := newReal(t)
	va, err := e.ReserveAddress(g64)
	require.NoError(t, err)
	h, err := e.CreatePhysical(g64, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, g64, h))
	require.NoError(t, e.SetAccess(va, g64, rw0))
	b := bytesAt(t, e, va, g64)
	assert.False(t, faults(func() { b[7] = 7 }))
	require.NoError(t, e.SetAccess(va, g64, []backend.AccessDesc{{Location: dev(0), Flags: backend.AccessRead}}))
	assert.True(t, faults(func() { b[7] = 8 }), "read-only mapping accepted a write")
	assert.False(t, faults(func() { assert.Equal(t, byte(7), b[7]) }))
	// No writable slice is handed out over a read-only mapping.
	_, err = e.Bytes(va, g64)
	assert.ErrorIs(t, err, backend.ErrNotPermitted, "Bytes of a read-only mapping")
	_, err = e.Bytes(va+8, 16)
	assert.ErrorIs(t, err, backend.ErrNotPermitted, "Bytes inside a read-only mapping")
	require.NoError(t, e.SetAccess(va, g64, []backend.AccessDesc{{Location: dev(0), Flags: backend.AccessNone}}))
	assert.True(t, faults(func() { sink = b[7] }), "no-access mapping was readable")
	require.NoError(t, e.Unmap(va, g64))
	require.NoError(t, e.FreePhysical(h))
	require.NoError(t, e.ReleaseAddress(va, g64))
}

// TestRealDeferredFree: the memfd lives until the last unmap (R3), and the
// bytes stay readable through the mapping of a freed-pending handle.
func TestRealDeferredFree(t *testing.T) {
	e := newReal(t)
	fds := openFDs(t)
	va, err := e.ReserveAddress(g64)
	require.NoError(t, err)
	h, err := e.CreatePhysical(g64, backend.DeviceProp(0))
	require.NoError(t, err)
	assert.Equal(t, fds+1, openFDs(t))
	require.NoError(t, e.Map(va, g64, h))
	require.NoError(t, e.SetAccess(va, g64, rw0))
	b := bytesAt(t, e, va, g64)
	b[0] = 42
	require.NoError(t, e.FreePhysical(h))
	assert.Equal(t, fds+1, openFDs(t), "freed while mapped: kept")
	assert.Equal(t, byte(42), b[0])
	require.NoError(t, e.Unmap(va, g64))
	assert.Equal(t, fds, openFDs(t), "closed by the last unmap")
	require.NoError(t, e.ReleaseAddress(va, g64))
}

func TestRealIPC(t *testing.T) {
	a := newReal(t, emulated.WithDevices(2))
	b, err := a.Process(2000)
	require.NoError(t, err)
	va, h := mappedReal(t, a, 0)
	sh, err := a.Export(h, backend.ShareDefault)
	require.NoError(t, err)
	require.NoError(t, a.SetPids(sh, []int32{b.Pid()}))
	hb, err := b.Import(sh, 1)
	require.NoError(t, err)
	vb, err := b.ReserveAddress(g64)
	require.NoError(t, err)
	require.NoError(t, b.Map(vb, g64, hb))
	require.NoError(t, b.SetAccess(vb, g64, []backend.AccessDesc{{Location: dev(1), Flags: backend.AccessReadWrite}}))
	copy(bytesAt(t, a, va, g64), "shared")
	assert.Equal(t, "shared", string(bytesAt(t, b, vb, g64)[:6]))
	_, err = a.Bytes(vb, g64)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument, "b's mapping is not a's")

	// Closing the exporter leaves the importer's bytes intact.
	require.NoError(t, a.Close())
	assert.Equal(t, "shared", string(bytesAt(t, b, vb, g64)[:6]))
	require.NoError(t, b.Unmap(vb, g64))
	require.NoError(t, b.FreePhysical(hb))
	require.NoError(t, b.ReleaseAddress(vb, g64))
}

func mappedReal(t *testing.T, e *emulated.Emulator, d int) (uintptr, backend.Handle) {
	t.Helper()
	va, err := e.ReserveAddress(g64)
	require.NoError(t, err)
	h, err := e.CreatePhysical(g64, backend.DeviceProp(d))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, g64, h))
	require.NoError(t, e.SetAccess(va, g64, []backend.AccessDesc{{Location: dev(d), Flags: backend.AccessReadWrite}}))
	return va, h
}

func TestRealHostMemory(t *testing.T) {
	e := newReal(t)
	p, err := e.MallocHost(100)
	require.NoError(t, err)
	assert.Zero(t, p%4096)
	b := bytesAt(t, e, p, 100)
	for i := range b {
		b[i] = byte(i)
	}
	assert.Equal(t, byte(99), bytesAt(t, e, p, 100)[99])
	_, err = e.Bytes(p, 101)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
	require.NoError(t, e.HostRegister(p, 4096, backend.HostRegisterMapped))
	require.NoError(t, e.HostUnregister(p))
	require.NoError(t, e.FreeHost(p))
	assert.True(t, faults(func() { sink = b[0] }), "freed host memory must fault")
}

func TestRealReserveAt(t *testing.T) {
	e := newReal(t)
	at := addr(20*TiB + 64*GiB)
	va, err := e.ReserveAddressAt(g64, at)
	if err != nil {
		// Some environments (sanitizers) keep this window for themselves.
		requireErr(t, err, backend.OpReserve, backend.ErrInvalidArgument, "R4")
		t.Skipf("fixed window unavailable here: %v", err)
	}
	assert.Equal(t, at, va)
	_, err = e.ReserveAddressAt(g64, at)
	requireErr(t, err, backend.OpReserve, backend.ErrInvalidArgument, "R4")
	h, err := e.CreatePhysical(g64, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, g64, h))
	require.NoError(t, e.SetAccess(va, g64, rw0))
	bytesAt(t, e, va, g64)[0] = 1
	require.NoError(t, e.Unmap(va, g64))
	require.NoError(t, e.FreePhysical(h))
	require.NoError(t, e.ReleaseAddress(va, g64))
}

func TestRealCloseReleases(t *testing.T) {
	fds := openFDs(t)
	e, err := emulated.New(emulated.WithRealMemory())
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		mappedReal(t, e, 0)
	}
	_, err = e.MallocHost(4096)
	require.NoError(t, err)
	assert.Equal(t, fds+3, openFDs(t))
	require.NoError(t, e.Close())
	assert.Equal(t, fds, openFDs(t))
}

func TestAccountingHasNoBytes(t *testing.T) {
	e := newEmu(t)
	va, _ := mapped(t, e, 2*MiB, 2*MiB)
	_, err := e.Bytes(va, 1)
	assert.ErrorIs(t, err, backend.ErrNotSupported)
}
