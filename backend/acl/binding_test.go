package acl_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/acl"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
)

var rw0 = []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}

func TestOpenMissingLibrary(t *testing.T) {
	_, err := acl.Open(acl.WithLibrary(filepath.Join(t.TempDir(), "libascendcl.so")))
	require.ErrorIs(t, err, acl.ErrLibrary)
	assert.Contains(t, err.Error(), "libascendcl.so not found: install the CANN toolkit, or use the emulated backend")
}

func TestOpenMissingSymbols(t *testing.T) {
	needDouble(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "partial.c")
	require.NoError(t, os.WriteFile(src, []byte("int aclInit(const char *c) { (void)c; return 0; }\nint aclrtSetDevice(int d) { (void)d; return 0; }\n"), 0o644))
	lib := filepath.Join(dir, "libpartial.so")
	out, err := exec.Command("cc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = acl.Open(acl.WithLibrary(lib))
	require.ErrorIs(t, err, acl.ErrLibrary)
	// One error names every missing symbol, and not the present ones.
	assert.Contains(t, err.Error(), "lacks 37 symbol(s)")
	assert.Contains(t, err.Error(), "aclrtMapMem")
	assert.Contains(t, err.Error(), "aclrtMemsetAsync")
	assert.NotContains(t, err.Error(), "aclrtSetDevice,")
}

func TestOpenLibraryFromEnv(t *testing.T) {
	needDouble(t)
	t.Setenv(acl.EnvLibrary, libPath)
	d, err := acl.Open()
	require.NoError(t, err)
	assert.Equal(t, libPath, d.Library())
	require.NoError(t, d.Close())
}

func TestKind(t *testing.T) {
	for _, c := range []struct {
		code int32
		kind error
	}{
		{100000, backend.ErrInvalidArgument},
		{107000, backend.ErrInvalidArgument},
		{107001, backend.ErrInvalidArgument},
		{107016, backend.ErrInvalidArgument},
		{507910, backend.ErrInvalidArgument},
		{507911, backend.ErrInvalidArgument},
		{200000, backend.ErrOutOfMemory},
		{207001, backend.ErrOutOfMemory},
		{207005, backend.ErrOutOfMemory},
		{200001, backend.ErrNotSupported},
		{200006, backend.ErrNotSupported},
		{207000, backend.ErrNotSupported},
		{207006, backend.ErrNotPermitted},
		{100001, backend.ErrUnavailable},
		{107002, backend.ErrUnavailable},
		{207004, backend.ErrUnavailable},
		{507899, backend.ErrUnavailable},
		{123456, backend.ErrUnavailable},
	} {
		assert.Equal(t, c.kind, acl.Kind(c.code), "code %d", c.code)
	}
}

// TestDevices checks device visibility: backend device 0 is ACL device 1.
func TestDevices(t *testing.T) {
	d := open(t, acl.WithDevices(1))
	assert.Equal(t, 1, d.DeviceCount())
	h, err := d.CreatePhysical(2<<20, backend.DeviceProp(0))
	require.NoError(t, err)
	used := main_.objects().Used
	assert.Equal(t, uint64(0), used[0])
	assert.Equal(t, uint64(2<<20), used[1], "created on ACL device 1")
	prop, size, err := d.HandleProperties(h)
	require.NoError(t, err)
	assert.Equal(t, backend.DeviceProp(0), prop)
	assert.Equal(t, uint64(2<<20), size)
	_, err = d.CreatePhysical(2<<20, backend.DeviceProp(1))
	conformance.RequireKind(t, err, backend.OpCreate, backend.ErrInvalidArgument)
	require.NoError(t, d.FreePhysical(h))

	for _, ids := range [][]int{{2}, {-1}, {0, 0}, {}} {
		_, err := acl.Open(acl.WithLibrary(libPath), acl.WithDevices(ids...))
		require.Error(t, err, "WithDevices(%v)", ids)
	}
}

// TestFaults injects each driver code at a call and checks the error's
// kind and code, and that the failed call changed nothing.
func TestFaults(t *testing.T) {
	const g = 2 << 20
	for _, c := range []struct {
		sym  string
		code int32
		kind error
		op   backend.Op
		do   func(d *acl.Driver, va uintptr, h backend.Handle) error
	}{
		{"aclrtMallocPhysical", 207001, backend.ErrOutOfMemory, backend.OpCreate, func(d *acl.Driver, _ uintptr, _ backend.Handle) error {
			_, err := d.CreatePhysical(g, backend.DeviceProp(0))
			return err
		}},
		{"aclrtReserveMemAddress", 207005, backend.ErrOutOfMemory, backend.OpReserve, func(d *acl.Driver, _ uintptr, _ backend.Handle) error {
			_, err := d.ReserveAddress(g)
			return err
		}},
		{"aclrtMapMem", 507899, backend.ErrUnavailable, backend.OpMap, func(d *acl.Driver, va uintptr, h backend.Handle) error {
			return d.Map(va, g, h)
		}},
		{"aclrtFreePhysical", 207002, backend.ErrInvalidArgument, backend.OpFree, func(d *acl.Driver, _ uintptr, h backend.Handle) error {
			return d.FreePhysical(h)
		}},
		{"aclrtReleaseMemAddress", 500000, backend.ErrUnavailable, backend.OpRelease, func(d *acl.Driver, va uintptr, _ backend.Handle) error {
			return d.ReleaseAddress(va, 4*g)
		}},
		{"aclrtMemExportToShareableHandle", 207000, backend.ErrNotSupported, backend.OpExport, func(d *acl.Driver, _ uintptr, h backend.Handle) error {
			_, err := d.Export(h, backend.ShareDefault)
			return err
		}},
		{"aclrtCreateStream", 207006, backend.ErrNotPermitted, backend.OpStreamCreate, func(d *acl.Driver, _ uintptr, _ backend.Handle) error {
			_, err := d.StreamCreate(0)
			return err
		}},
	} {
		t.Run(c.sym, func(t *testing.T) {
			d := open(t)
			va, err := d.ReserveAddress(4 * g)
			require.NoError(t, err)
			h, err := d.CreatePhysical(g, backend.DeviceProp(0))
			require.NoError(t, err)
			before := main_.objects()
			main_.failAt(t, c.sym, 1, c.code)
			err = c.do(d, va, h)
			conformance.RequireKind(t, err, c.op, c.kind)
			var be *backend.Error
			require.ErrorAs(t, err, &be)
			assert.Equal(t, int(c.code), be.Code)
			assert.Contains(t, be.Msg, c.sym)
			assert.Equal(t, before, main_.objects(), "the failed call changed the double's state")
			// The binding's bookkeeping is unchanged too: the same calls work.
			require.NoError(t, c.do(d, va, h), "retry after the fault")
		})
	}
}

func TestCopier(t *testing.T) {
	d := open(t)
	const g = 2 << 20
	va, err := d.ReserveAddress(4 * g)
	require.NoError(t, err)
	// Two adjacent mappings of two handles: copies may span both.
	for i := uintptr(0); i < 2; i++ {
		h, err := d.CreatePhysical(g, backend.DeviceProp(0))
		require.NoError(t, err)
		require.NoError(t, d.Map(va+i*g, g, h))
		require.NoError(t, d.FreePhysical(h)) // released at the unmap
	}
	s, err := d.StreamCreate(0)
	require.NoError(t, err)

	src := make([]byte, g)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	// Inaccessible until SetAccess: the copy fails with ACL's code.
	err = d.CopyHtoD(va+g/2, src, s)
	conformance.RequireKind(t, err, backend.OpMemcpy, backend.ErrInvalidArgument)
	var be *backend.Error
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 100000, be.Code)
	for i := uintptr(0); i < 2; i++ {
		require.NoError(t, d.SetAccess(va+i*g, g, rw0))
	}

	require.NoError(t, d.CopyHtoD(va+g/2, src, s))
	got := make([]byte, g)
	require.NoError(t, d.CopyDtoH(got, va+g/2, s))
	assert.True(t, bytes.Equal(src, got), "HtoD then DtoH across two mappings")

	require.NoError(t, d.CopyDtoD(va, va+g/2, 8192, s))
	require.NoError(t, d.Memset(va+4096, 0xab, 100, s))
	require.NoError(t, d.StreamSynchronize(s))
	head := make([]byte, 4096+101)
	require.NoError(t, d.CopyDtoH(head, va, s))
	assert.Equal(t, src[:4096], head[:4096])
	assert.Equal(t, bytes.Repeat([]byte{0xab}, 100), head[4096:4196])
	assert.Equal(t, src[4196], head[4196], "memset stops at n")

	err = d.CopyHtoD(va+3*g, src[:10], s) // unmapped
	conformance.RequireKind(t, err, backend.OpMemcpy, backend.ErrInvalidArgument)
	err = d.Memset(va, 0, 10, backend.Stream(12345))
	conformance.RequireKind(t, err, backend.OpMemset, backend.ErrInvalidArgument)
	require.NoError(t, d.CopyHtoD(va, nil, s), "an empty copy is a no-op")
	require.NoError(t, d.DeviceSynchronize(0))
	conformance.RequireKind(t, d.DeviceSynchronize(2), backend.OpDeviceSync, backend.ErrInvalidArgument)

	require.NoError(t, d.StreamDestroy(s))
	require.NoError(t, d.Unmap(va, g))
	require.NoError(t, d.Unmap(va+g, g))
	require.NoError(t, d.ReleaseAddress(va, 4*g))
}

// TestImportUnknownSize: ACL cannot report an imported handle's size; the
// binding says so until the first map tells it.
func TestImportUnknownSize(t *testing.T) {
	d := open(t)
	p := openPeer(t, d)
	const g = 2 << 20
	h, err := d.CreatePhysical(2*g, backend.DeviceProp(0))
	require.NoError(t, err)
	sh, err := d.Export(h, backend.ShareDisablePidValidation)
	require.NoError(t, err)
	n, ok := d.ExportedSize(sh)
	require.True(t, ok)
	assert.Equal(t, uint64(2*g), n)
	hb, err := p.Driver.Import(sh, 0) // the plain binding, not the size-aware test wrapper
	require.NoError(t, err)
	_, _, err = p.HandleProperties(hb)
	conformance.RequireKind(t, err, backend.OpHandleProps, backend.ErrNotSupported)
	va, err := p.ReserveAddress(4 * g)
	require.NoError(t, err)
	err = p.Map(va, g, hb) // the driver checks the size
	conformance.RequireKind(t, err, backend.OpMap, backend.ErrInvalidArgument)
	require.NoError(t, p.Map(va, 2*g, hb))
	_, size, err := p.HandleProperties(hb)
	require.NoError(t, err)
	assert.Equal(t, uint64(2*g), size)
	require.NoError(t, p.Unmap(va, 2*g))
	require.NoError(t, p.FreePhysical(hb))
	require.NoError(t, p.ReleaseAddress(va, 4*g))
	require.NoError(t, d.FreePhysical(h))
}

func TestClose(t *testing.T) {
	needDouble(t)
	d, err := acl.Open(acl.WithLibrary(libPath))
	require.NoError(t, err)
	// Leave one of everything behind; Close releases it all.
	va, err := d.ReserveAddress(4 << 20)
	require.NoError(t, err)
	h, err := d.CreatePhysical(2<<20, backend.DeviceProp(1))
	require.NoError(t, err)
	require.NoError(t, d.Map(va, 2<<20, h))
	_, err = d.RetainHandle(va)
	require.NoError(t, err)
	_, err = d.StreamCreate(1)
	require.NoError(t, err)
	_, err = d.EventCreate(0)
	require.NoError(t, err)
	hp, err := d.MallocHost(8192)
	require.NoError(t, err)
	require.NoError(t, d.HostRegister(hp, 4096, backend.HostRegisterMapped))
	_, err = d.Export(h, backend.ShareDefault)
	require.NoError(t, err)
	require.NotEqual(t, liveObjects{}, main_.objects())
	require.NoError(t, d.Close())
	assert.Equal(t, liveObjects{}, main_.objects())
	require.NoError(t, d.Close(), "Close twice")
	_, err = d.ReserveAddress(4 << 20)
	conformance.RequireKind(t, err, backend.OpReserve, backend.ErrUnavailable)
	_, err = d.StreamCreate(0)
	conformance.RequireKind(t, err, backend.OpStreamCreate, backend.ErrUnavailable)
	_, _, err = d.MemGetInfo(0)
	conformance.RequireKind(t, err, backend.OpMemGetInfo, backend.ErrUnavailable)
	conformance.RequireKind(t, d.DeviceSynchronize(0), backend.OpDeviceSync, backend.ErrUnavailable)
}

func TestHostRegisterFlags(t *testing.T) {
	d := open(t)
	p, err := d.MallocHost(8192)
	require.NoError(t, err)
	for _, c := range []struct {
		flags backend.HostRegisterFlags
		kind  error
	}{
		{backend.HostRegisterPinned, backend.ErrNotSupported},
		{backend.HostRegisterIOMemory, backend.ErrNotSupported}, // ACL_HOST_REGISTER_IOMEMORY, refused by ACL
		{backend.HostRegisterReadOnly, backend.ErrNotSupported},
		{backend.HostRegisterFlags(64), backend.ErrInvalidArgument},
	} {
		conformance.RequireKind(t, d.HostRegister(p, 4096, c.flags), backend.OpHostRegister, c.kind)
	}
	require.NoError(t, d.HostRegister(p, 4096, backend.HostRegisterMapped))
	conformance.RequireKind(t, d.FreeHost(p), backend.OpFreeHost, backend.ErrInvalidArgument)
	require.NoError(t, d.HostUnregister(p))
	require.NoError(t, d.FreeHost(p))
	conformance.RequireKind(t, d.FreeHost(p), backend.OpFreeHost, backend.ErrInvalidArgument)
}

// TestConcurrentStrict drives both devices from many goroutines with the
// double failing any call whose device context the binding did not set on
// that thread right before it.
func TestConcurrentStrict(t *testing.T) {
	d := open(t)
	main_.strictMode(t)
	const g = 2 << 20
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(dev int) {
			defer wg.Done()
			errs <- func() error {
				s, err := d.StreamCreate(dev)
				if err != nil {
					return err
				}
				va, err := d.ReserveAddress(2 * g)
				if err != nil {
					return err
				}
				buf := []byte{byte(dev), 1, 2, 3}
				for i := 0; i < 20; i++ {
					h, err := d.CreatePhysical(g, backend.DeviceProp(dev))
					if err != nil {
						return err
					}
					err = errors.Join(d.Map(va, g, h), d.SetAccess(va, g, []backend.AccessDesc{{
						Location: backend.Location{Type: backend.LocationDevice, ID: dev}, Flags: backend.AccessReadWrite}}))
					if err != nil {
						return err
					}
					got := make([]byte, 4)
					if err := errors.Join(d.CopyHtoD(va+100, buf, s), d.CopyDtoH(got, va+100, s)); err != nil {
						return err
					}
					if !bytes.Equal(buf, got) {
						return errors.New("copy mismatch")
					}
					if err := errors.Join(d.Unmap(va, g), d.FreePhysical(h)); err != nil {
						return err
					}
				}
				return errors.Join(d.ReleaseAddress(va, 2*g), d.StreamDestroy(s))
			}()
		}(w % 2)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestDeviceSynchronize: aclrtSynchronizeDevice completes the work of every
// stream of that device, and only of that device.
func TestDeviceSynchronize(t *testing.T) {
	d := open(t)
	w := hostView{d, main_}
	var streams [2]backend.Stream
	var events [2]backend.Event
	for dev := range 2 {
		s, err := d.StreamCreate(dev)
		require.NoError(t, err)
		e, err := d.EventCreate(dev)
		require.NoError(t, err)
		require.NoError(t, w.Hold(s))
		require.NoError(t, w.ctl(main_.launch, uintptr(s)))
		require.NoError(t, d.EventRecord(e, s))
		done, err := d.EventQuery(e)
		require.NoError(t, err)
		require.False(t, done, "device %d: held work", dev)
		streams[dev], events[dev] = s, e
	}
	require.NoError(t, d.DeviceSynchronize(1))
	for dev, want := range []bool{false, true} {
		done, err := d.EventQuery(events[dev])
		require.NoError(t, err)
		assert.Equal(t, want, done, "device %d after synchronizing device 1", dev)
	}
	require.NoError(t, d.StreamDestroy(streams[0])) // destroying a stream completes its work
	done, err := d.EventQuery(events[0])
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, d.EventDestroy(events[0]))
	require.NoError(t, d.EventDestroy(events[1]))
	require.NoError(t, d.StreamDestroy(streams[1]))
}
