//go:build unix

package cuda_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

func TestOpenMissingLibrary(t *testing.T) {
	_, err := cuda.Open(cuda.WithLibrary(filepath.Join(t.TempDir(), "libcuda.so.1")))
	require.Error(t, err)
	assert.ErrorIs(t, err, cuda.ErrNoLibrary)
	assert.ErrorIs(t, err, backend.ErrUnavailable)
	assert.Contains(t, err.Error(), "libcuda.so.1 not found: install the NVIDIA driver, or use the emulated backend")
}

func TestOpenMissingSymbols(t *testing.T) {
	double(t) // skips without a C compiler
	dir := t.TempDir()
	src := filepath.Join(dir, "old.c")
	require.NoError(t, os.WriteFile(src, []byte("int cuInit(unsigned f) { return 0; }\nint cuDeviceGetCount(int *n) { *n = 1; return 0; }\n"), 0o644))
	lib := filepath.Join(dir, "libold.so")
	out, err := exec.Command("cc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = cuda.Open(cuda.WithLibrary(lib))
	require.ErrorIs(t, err, cuda.ErrNoLibrary)
	for _, name := range []string{"cuMemCreate", "cuMemGetInfo_v2", "cuMemcpyHtoDAsync_v2", "cuStreamDestroy_v2"} {
		assert.Contains(t, err.Error(), name)
	}
	assert.NotContains(t, err.Error(), "cuInit,")
}

func TestOpenOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  cuda.Option
	}{
		{"empty library", cuda.WithLibrary("")},
		{"no devices", cuda.WithDevices()},
		{"negative device", cuda.WithDevices(-1)},
		{"repeated device", cuda.WithDevices(0, 0)},
	} {
		_, err := cuda.Open(c.opt)
		assert.ErrorIs(t, err, backend.ErrInvalidArgument, c.name)
	}
	_, path := double(t)
	_, err := cuda.Open(cuda.WithLibrary(path), cuda.WithDevices(5))
	assert.ErrorIs(t, err, backend.ErrInvalidArgument, "a device the driver does not have")
}

// TestDeviceVisibility opens physical devices 2 and 0 of three as devices 0
// and 1 and checks that every call lands on the right physical device.
func TestDeviceVisibility(t *testing.T) {
	dbl, path := double(t)
	require.NoError(t, dbl.SetDeviceCount(3))
	require.NoError(t, dbl.SetCapacity(2, 128<<20))
	d, err := cuda.Open(cuda.WithLibrary(path), cuda.WithDevices(2, 0))
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, 2, d.DeviceCount())
	_, total, err := d.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(128<<20), total, "device 0 is physical device 2")
	_, total, err = d.MemGetInfo(1)
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<30), total)
	h, err := d.CreatePhysical(2<<20, backend.DeviceProp(0))
	require.NoError(t, err)
	prop, size, err := d.HandleProperties(h) // checks the driver's location
	require.NoError(t, err)
	assert.Equal(t, 0, prop.Location.ID)
	assert.Equal(t, uint64(2<<20), size)
	free, _, err := d.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(126<<20), free)
	require.NoError(t, d.FreePhysical(h))
}

// TestFaultsRollBack injects a driver failure into each state-changing
// primitive and checks the error (kind, op, CUresult) and that the
// binding's records and the driver's objects are as before the call.
func TestFaultsRollBack(t *testing.T) {
	const g = 2 << 20
	type state struct {
		res, maps []backend.Range
		handles   int
		live      cudatest.Live
	}
	for _, c := range []struct {
		symbol string
		code   int
		op     backend.Op
		kind   error
		call   func(d *cuda.Driver, va, spare uintptr, h backend.Handle) error
	}{
		{"cuMemCreate", 2, backend.OpCreate, backend.ErrOutOfMemory, func(d *cuda.Driver, _, _ uintptr, _ backend.Handle) error {
			_, err := d.CreatePhysical(g, backend.DeviceProp(0))
			return err
		}},
		{"cuMemAddressReserve", 2, backend.OpReserve, backend.ErrOutOfMemory, func(d *cuda.Driver, _, _ uintptr, _ backend.Handle) error {
			_, err := d.ReserveAddress(4 * g)
			return err
		}},
		{"cuMemMap", 1, backend.OpMap, backend.ErrInvalidArgument, func(d *cuda.Driver, va, _ uintptr, h backend.Handle) error {
			return d.Map(va+g, g, h)
		}},
		{"cuMemUnmap", 999, backend.OpUnmap, backend.ErrUnavailable, func(d *cuda.Driver, va, _ uintptr, _ backend.Handle) error {
			return d.Unmap(va, g)
		}},
		{"cuMemSetAccess", 801, backend.OpSetAccess, backend.ErrNotSupported, func(d *cuda.Driver, va, _ uintptr, _ backend.Handle) error {
			return d.SetAccess(va, g, []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessRead}})
		}},
		{"cuMemRelease", 800, backend.OpFree, backend.ErrNotPermitted, func(d *cuda.Driver, _, _ uintptr, h backend.Handle) error {
			return d.FreePhysical(h)
		}},
		{"cuMemAddressFree", 4, backend.OpRelease, backend.ErrUnavailable, func(d *cuda.Driver, _, spare uintptr, _ backend.Handle) error {
			return d.ReleaseAddress(spare, 2*g)
		}},
		{"cuMemRetainAllocationHandle", 1, backend.OpRetain, backend.ErrInvalidArgument, func(d *cuda.Driver, va, _ uintptr, _ backend.Handle) error {
			_, err := d.RetainHandle(va)
			return err
		}},
		{"cuMemExportToShareableHandle", 2, backend.OpExport, backend.ErrOutOfMemory, func(d *cuda.Driver, _, _ uintptr, h backend.Handle) error {
			_, err := d.Export(h, backend.ShareDefault)
			return err
		}},
		{"cuStreamCreate", 2, backend.OpStreamCreate, backend.ErrOutOfMemory, func(d *cuda.Driver, _, _ uintptr, _ backend.Handle) error {
			_, err := d.StreamCreate(0)
			return err
		}},
		{"cuMemHostAlloc", 2, backend.OpMallocHost, backend.ErrOutOfMemory, func(d *cuda.Driver, _, _ uintptr, _ backend.Handle) error {
			_, err := d.MallocHost(4096)
			return err
		}},
		{"cuMemGetInfo_v2", 3, backend.OpMemGetInfo, backend.ErrUnavailable, func(d *cuda.Driver, _, _ uintptr, _ backend.Handle) error {
			_, _, err := d.MemGetInfo(0)
			return err
		}},
	} {
		t.Run(c.symbol, func(t *testing.T) {
			d, dbl := openDouble(t, nil)
			va, err := d.ReserveAddress(4 * g)
			require.NoError(t, err)
			spare, err := d.ReserveAddress(2 * g)
			require.NoError(t, err)
			h, err := d.CreatePhysical(g, backend.DeviceProp(0))
			require.NoError(t, err)
			h2, err := d.CreatePhysical(g, backend.DeviceProp(0))
			require.NoError(t, err)
			require.NoError(t, d.Map(va, g, h2))
			snap := func() state {
				r, m, n := d.LiveRanges(0)
				return state{r, m, n, dbl.Live()}
			}
			before := snap()
			require.NoError(t, dbl.Fail(c.symbol, 1, c.code))
			err = c.call(d, va, spare, h)
			conformance.RequireKind(t, err, c.op, c.kind)
			var be *backend.Error
			require.ErrorAs(t, err, &be)
			assert.Equal(t, c.code, be.Code)
			assert.Contains(t, be.Msg, c.symbol)
			assert.Equal(t, before, snap(), "a failed call changed state")

			require.NoError(t, d.Unmap(va, g))
			require.NoError(t, d.FreePhysical(h))
			require.NoError(t, d.FreePhysical(h2))
			require.NoError(t, d.ReleaseAddress(va, 4*g))
			require.NoError(t, d.ReleaseAddress(spare, 2*g))
		})
	}
}

// TestForeignContext clears the current context of the calling thread
// behind the binding's back, as other code in the process may; with the
// double in strict mode, every binding call must still succeed from any
// goroutine.
func TestForeignContext(t *testing.T) {
	d, _ := openDouble(t, nil)
	path := d.Library()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	setCurrent, err := purego.Dlsym(h, "cuCtxSetCurrent")
	require.NoError(t, err)
	getInfo, err := purego.Dlsym(h, "cuMemGetInfo_v2")
	require.NoError(t, err)

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				runtime.LockOSThread()
				purego.SyscallN(setCurrent, 0)
				var free, total uint64
				rc, _, _ := purego.SyscallN(getInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
				assert.Equal(t, uintptr(201), rc, "the double must refuse a call without a context")
				runtime.UnlockOSThread()
				_, _, err := d.MemGetInfo(0)
				assert.NoError(t, err)
				s, err := d.StreamCreate(0)
				if assert.NoError(t, err) {
					assert.NoError(t, d.StreamDestroy(s))
				}
			}
		}()
	}
	wg.Wait()
}

func TestClosed(t *testing.T) {
	d, _ := openDouble(t, nil)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "Close is idempotent")
	_, err := d.ReserveAddress(2 << 20)
	conformance.RequireKind(t, err, backend.OpReserve, backend.ErrUnavailable)
	_, _, err = d.MemGetInfo(0)
	conformance.RequireKind(t, err, backend.OpMemGetInfo, backend.ErrUnavailable)
}

// exchangeWithChild exports a handle, passes its fd to a child process
// (as its fd 3) and has the child import it, map it, check the parent's
// bytes and write its own, which the parent then reads. It frees
// everything it made, and returns the number of the fd d exported (closed
// by d at FreePhysical). The child gets an fd of the test's own
// (ShareableFile), which the test closes: it never wraps the Driver's fd.
func exchangeWithChild(t *testing.T, d *cuda.Driver) int {
	t.Helper()
	const g = 2 << 20
	va, err := d.ReserveAddress(g)
	require.NoError(t, err)
	h, err := d.CreatePhysical(g, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, d.Map(va, g, h))
	require.NoError(t, d.SetAccess(va, g, []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}))
	st, err := d.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(va, bytes.Repeat([]byte("parent"), 100), st))

	sh, err := d.Export(h, backend.ShareDefault)
	require.NoError(t, err)
	assert.Equal(t, uint64(g), cuda.ShareableSize(sh))
	f, err := d.ShareableFile(sh)
	require.NoError(t, err)
	defer f.Close()
	assert.NotEqual(t, uintptr(cuda.BorrowedFD(sh)), f.Fd(), "a duplicate, not the Driver's fd")
	cmd := exec.Command(os.Args[0], "-test.run=^TestIPCChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "CUDA_IPC_CHILD=1", cuda.EnvLibrary+"="+d.Library(), "CUDA_IPC_SIZE="+strconv.Itoa(g))
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestIPCChild")
	require.NoError(t, f.Close())

	got := make([]byte, 5)
	require.NoError(t, d.CopyDtoH(got, va+1000, st))
	assert.Equal(t, "child", string(got), "the parent sees the child's write")
	require.NoError(t, d.StreamDestroy(st))
	require.NoError(t, d.Unmap(va, g))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseAddress(va, g))
	_, err = d.ShareableFile(sh)
	conformance.RequireKind(t, err, backend.OpExport, backend.ErrInvalidArgument) // freed: no longer an export
	return cuda.BorrowedFD(sh)
}

// TestIPCAcrossProcesses shares a handle with a child process through its
// fd (exchangeWithChild).
func TestIPCAcrossProcesses(t *testing.T) {
	if os.Getenv("CUDA_IPC_CHILD") != "" {
		t.Skip("child side runs in TestIPCChild")
	}
	d, _ := openDouble(t, nil)
	exchangeWithChild(t, d)
}

// runFinalizers returns once every finalizer queued by now has run: the
// garbage collector queues the finalizers of everything unreachable, and
// the one finalizer goroutine runs each batch it takes whole, so a
// sentinel queued by a second collection runs after all of the first's.
func runFinalizers() {
	for range 2 {
		done := make(chan struct{})
		sentinel := &struct{ p *int }{new(int)}
		runtime.SetFinalizer(sentinel, func(*struct{ p *int }) { close(done) })
		sentinel = nil
		runtime.GC()
		<-done
	}
}

// TestIPCExchangeClosesOnlyItsOwnFDs: after an fd exchange and a garbage
// collection, no fd of the Driver or of the double was closed behind its
// back. (An *os.File wrapped around the Driver's exported fd closes that
// number again in its finalizer, after FreePhysical closed it and the next
// handle's memfd took the number: that handle, mapped again, mapped the
// memory of whichever handle got the number next.)
func TestIPCExchangeClosesOnlyItsOwnFDs(t *testing.T) {
	if os.Getenv("CUDA_IPC_CHILD") != "" {
		t.Skip("child side runs in TestIPCChild")
	}
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	d, dbl := openDouble(t, nil)
	fd := exchangeWithChild(t, d)
	const g = 2 << 20
	va, err := d.ReserveAddress(2 * g)
	require.NoError(t, err)
	st, err := d.StreamCreate(0)
	require.NoError(t, err)
	rw := []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}
	// Create handles until one's memfd has the number the Driver exported
	// and closed (the kernel hands out the lowest free number).
	var hs []backend.Handle
	victim := -1
	for i := 0; i < 16 && victim < 0; i++ {
		h, err := d.CreatePhysical(g, backend.DeviceProp(0))
		require.NoError(t, err)
		hs = append(hs, h)
		if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil && strings.HasPrefix(target, "/memfd:fakecu-dev") {
			victim = i
		}
	}
	require.GreaterOrEqual(t, victim, 0, "no handle's memfd took fd %d", fd)
	mine := bytes.Repeat([]byte{0x11}, 4096)
	require.NoError(t, d.Map(va, g, hs[victim]))
	require.NoError(t, d.SetAccess(va, g, rw))
	require.NoError(t, d.CopyHtoD(va, mine, st))
	require.NoError(t, d.Unmap(va, g)) // cached, as an allocator keeps it

	runFinalizers()

	// A new handle takes the lowest free number: fd, if a stray finalizer
	// closed it.
	other, err := d.CreatePhysical(g, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, d.Map(va+g, g, other))
	require.NoError(t, d.SetAccess(va+g, g, rw))
	require.NoError(t, d.CopyHtoD(va+g, bytes.Repeat([]byte{0x22}, 4096), st))
	require.NoError(t, d.Map(va, g, hs[victim]), "the cached handle maps again")
	require.NoError(t, d.SetAccess(va, g, rw))
	got := make([]byte, 4096)
	require.NoError(t, d.CopyDtoH(got, va, st))
	assert.True(t, bytes.Equal(mine, got), "the cached handle maps another handle's memory: byte 0 is %#x, want %#x", got[0], mine[0])
	require.NoError(t, dbl.BackingError())

	require.NoError(t, d.Unmap(va, g))
	require.NoError(t, d.Unmap(va+g, g))
	require.NoError(t, d.FreePhysical(other))
	for _, h := range hs {
		require.NoError(t, d.FreePhysical(h))
	}
	require.NoError(t, d.StreamDestroy(st))
	require.NoError(t, d.ReleaseAddress(va, 2*g))
}

// TestIPCChild is the importing side of TestIPCAcrossProcesses.
func TestIPCChild(t *testing.T) {
	if os.Getenv("CUDA_IPC_CHILD") == "" {
		t.Skip("runs as the child of TestIPCAcrossProcesses")
	}
	size, err := strconv.ParseUint(os.Getenv("CUDA_IPC_SIZE"), 10, 64)
	require.NoError(t, err)
	d, err := cuda.Open() // the library from $VMMALLOC_LIBCUDA
	require.NoError(t, err)
	defer d.Close()
	h, err := d.Import(cuda.Shareable(3, size), 0)
	require.NoError(t, err)
	_, err = d.Import(cuda.Shareable(3, size), 0)
	conformance.RequireKind(t, err, backend.OpImport, backend.ErrInvalidArgument) // once per process (R15)
	_, n, err := d.HandleProperties(h)
	require.NoError(t, err)
	require.Equal(t, size, n)
	va, err := d.ReserveAddress(size)
	require.NoError(t, err)
	require.NoError(t, d.Map(va, size, h))
	require.NoError(t, d.SetAccess(va, size, []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}))
	st, err := d.StreamCreate(0)
	require.NoError(t, err)
	got := make([]byte, 600)
	require.NoError(t, d.CopyDtoH(got, va, st))
	require.Equal(t, bytes.Repeat([]byte("parent"), 100), got)
	require.NoError(t, d.CopyHtoD(va+1000, []byte("child"), st))
	require.NoError(t, d.StreamDestroy(st))
	require.NoError(t, d.Unmap(va, size))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseAddress(va, size))
}

// TestImportRollback imports, in a second Driver of the same process, a
// handle the first exported, and checks that an import failing after the
// driver took a reference (a fault in the property query, a wrong device)
// gives that reference back.
func TestImportRollback(t *testing.T) {
	a, dbl := openDouble(t, nil)
	b, err := cuda.Open(cuda.WithLibrary(a.Library()))
	require.NoError(t, err)
	defer b.Close()
	h, err := a.CreatePhysical(2<<20, backend.DeviceProp(0))
	require.NoError(t, err)
	sh, err := a.Export(h, backend.ShareDefault)
	require.NoError(t, err)
	before := dbl.Live().Handles

	require.NoError(t, dbl.Fail("cuMemGetAllocationPropertiesFromHandle", 1, 999))
	_, err = b.Import(sh, 0)
	conformance.RequireKind(t, err, backend.OpImport, backend.ErrUnavailable)
	assert.Contains(t, err.Error(), "cuMemGetAllocationPropertiesFromHandle")
	assert.Equal(t, before, dbl.Live().Handles, "the failed import kept a driver reference")

	_, err = b.Import(sh, 1) // the memory is on device 0
	conformance.RequireKind(t, err, backend.OpImport, backend.ErrInvalidArgument)
	assert.Equal(t, before, dbl.Live().Handles)

	hb, err := b.Import(sh, 0)
	require.NoError(t, err)
	assert.Equal(t, before+1, dbl.Live().Handles)
	require.NoError(t, a.FreePhysical(h)) // closes the exported fd too
	_, size, err := b.HandleProperties(hb)
	require.NoError(t, err, "the importer's handle outlives the exporter's")
	assert.Equal(t, uint64(2<<20), size)
	require.NoError(t, b.FreePhysical(hb))
	assert.Equal(t, before-1, dbl.Live().Handles)
}
