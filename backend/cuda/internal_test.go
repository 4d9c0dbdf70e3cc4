//go:build unix

package cuda

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

func TestKindOf(t *testing.T) {
	for _, c := range []struct {
		rc   cuResult
		kind error
	}{
		{cuErrOutOfMemory, backend.ErrOutOfMemory},
		{cuErrInvalidValue, backend.ErrInvalidArgument},
		{cuErrInvalidDevice, backend.ErrInvalidArgument},
		{cuErrInvalidContext, backend.ErrInvalidArgument},
		{cuErrInvalidHandle, backend.ErrInvalidArgument},
		{cuErrAlreadyMapped, backend.ErrInvalidArgument},
		{cuErrNotMapped, backend.ErrInvalidArgument},
		{cuErrNotFound, backend.ErrInvalidArgument},
		{cuErrHostMemAlreadyRegisterd, backend.ErrInvalidArgument},
		{cuErrHostMemNotRegistered, backend.ErrInvalidArgument},
		{cuErrNotSupported, backend.ErrNotSupported},
		{cuErrNotPermitted, backend.ErrNotPermitted},
		{cuErrNotInitialized, backend.ErrUnavailable},
		{cuErrDeinitialized, backend.ErrUnavailable},
		{cuErrNoDevice, backend.ErrUnavailable},
		{cuErrIllegalAddress, backend.ErrUnavailable},
		{cuErrUnknown, backend.ErrUnavailable},
		{cuResult(12345), backend.ErrUnavailable},
	} {
		err := driverError(backend.OpMap, symMemMap, c.rc)
		var be *backend.Error
		require.ErrorAs(t, err, &be)
		assert.ErrorIs(t, err, c.kind, "CUresult %d", c.rc)
		assert.Equal(t, int(c.rc), be.Code)
		assert.Equal(t, backend.OpMap, be.Op)
		assert.Contains(t, be.Msg, "cuMemMap")
	}
}

func TestHostRegisterFlags(t *testing.T) {
	for _, c := range []struct {
		in   backend.HostRegisterFlags
		want uint32
		ok   bool
	}{
		{backend.HostRegisterMapped, cuMemHostRegisterPortable | cuMemHostRegisterDeviceMap, true},
		{backend.HostRegisterPinned, cuMemHostRegisterPortable, true},
		{backend.HostRegisterIOMemory, cuMemHostRegisterPortable | cuMemHostRegisterDeviceMap | cuMemHostRegisterIOMemory, true},
		{backend.HostRegisterReadOnly, cuMemHostRegisterPortable | cuMemHostRegisterDeviceMap | cuMemHostRegisterReadOnly, true},
		{backend.HostRegisterPinned | backend.HostRegisterReadOnly, cuMemHostRegisterPortable | cuMemHostRegisterReadOnly, true},
		{8, 0, false},
	} {
		got, ok := hostRegisterFlags(c.in)
		assert.Equal(t, c.ok, ok, "flags %d", c.in)
		assert.Equal(t, c.want, got, "flags %d", c.in)
	}
}

func TestShareableRoundTrip(t *testing.T) {
	for _, c := range []struct {
		fd   int
		size uint64
	}{{3, 2 << 20}, {0, ShareUnit}, {1<<31 - 1, 80 << 30}} {
		sh := Shareable(c.fd, c.size)
		assert.Equal(t, c.fd, BorrowedFD(sh))
		assert.Equal(t, c.size, ShareableSize(sh))
	}
}

// benchDriver opens the binding over the double for the overhead benchmarks.
func benchDriver(b *testing.B) *Driver {
	path, err := cudatest.Shared()
	if err != nil {
		b.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(b, err)
	dbl.Reset()
	d, err := Open(WithLibrary(path))
	require.NoError(b, err)
	b.Cleanup(func() { _ = d.Close() })
	return d
}

// BenchmarkCallOverhead splits the cost of one binding call into its parts,
// against the double's cheapest entry point (cuDeviceGetCount: a mutex, a
// counter and a store), so the numbers are the binding's, not a driver's:
//
//   - SyscallN: one purego call;
//   - LockOSThread: the LockOSThread/UnlockOSThread pair alone;
//   - Pinned: what every context call pays (lock the thread,
//     cuCtxSetCurrent, the call itself);
//   - GetAccess: a whole backend.Driver method (its mutex, bookkeeping
//     lookup and the pinned driver call).
func BenchmarkCallOverhead(b *testing.B) {
	d := benchDriver(b)
	var n int32
	b.Run("SyscallN", func(b *testing.B) {
		for b.Loop() {
			d.lib.call(symDeviceGetCount, uintptr(unsafe.Pointer(&n)))
		}
	})
	b.Run("LockOSThread", func(b *testing.B) {
		for b.Loop() {
			runtime.LockOSThread()
			runtime.UnlockOSThread()
		}
	})
	b.Run("Pinned", func(b *testing.B) {
		for b.Loop() {
			d.onDevice(0, func() cuResult { return d.lib.call(symDeviceGetCount, uintptr(unsafe.Pointer(&n))) })
		}
	})
	b.Run("GetAccess", func(b *testing.B) {
		g := d.devs[0].gran
		va, err := d.ReserveAddress(g)
		require.NoError(b, err)
		h, err := d.CreatePhysical(g, backend.DeviceProp(0))
		require.NoError(b, err)
		require.NoError(b, d.Map(va, g, h))
		loc := backend.Location{Type: backend.LocationDevice}
		b.ResetTimer()
		for b.Loop() {
			if _, err := d.GetAccess(va, loc); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		require.NoError(b, d.Unmap(va, g))
		require.NoError(b, d.FreePhysical(h))
		require.NoError(b, d.ReleaseAddress(va, g))
	})
}

// BenchmarkMapCycle is the driver-call cost of growing and shrinking by one
// granule through the binding: create, map, set access, unmap, release.
func BenchmarkMapCycle(b *testing.B) {
	d := benchDriver(b)
	g := d.devs[0].gran
	va, err := d.ReserveAddress(g)
	require.NoError(b, err)
	rw := []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}
	for b.Loop() {
		h, err := d.CreatePhysical(g, backend.DeviceProp(0))
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Map(va, g, h); err != nil {
			b.Fatal(err)
		}
		if err := d.SetAccess(va, g, rw); err != nil {
			b.Fatal(err)
		}
		if err := d.Unmap(va, g); err != nil {
			b.Fatal(err)
		}
		if err := d.FreePhysical(h); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/5, "ns/driver-call")
	require.NoError(b, d.ReleaseAddress(va, g))
}
