//go:build unix

package cudatest_test

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

// c calls the double's C entry points directly, below the binding, to show
// that the double itself enforces the driver's rules (the binding checks
// most of them first, so binding tests alone would not reach them).
type c struct {
	t   *testing.T
	lib uintptr
}

func (x c) call(name string, args ...uintptr) int {
	x.t.Helper()
	fn, err := purego.Dlsym(x.lib, name)
	require.NoError(x.t, err)
	r, _, _ := purego.SyscallN(fn, args...)
	return int(int32(r))
}

type prop struct {
	Type, Handles, LocType, LocID int32
	Win32                         uintptr
	Flags                         [8]byte
}

type access struct{ LocType, LocID, Flags int32 }

func open(t *testing.T) (c, *cudatest.Double) {
	path, err := cudatest.Shared()
	if err != nil {
		t.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	dbl.Reset()
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	x := c{t, lib}
	require.Zero(t, x.call("cuInit", 0))
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	var ctx uintptr
	require.Zero(t, x.call("cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&ctx)), 0))
	require.Zero(t, x.call("cuCtxSetCurrent", ctx))
	return x, dbl
}

const g = 2 << 20

func p(v any) uintptr {
	switch v := v.(type) {
	case *uint64:
		return uintptr(unsafe.Pointer(v))
	case *prop:
		return uintptr(unsafe.Pointer(v))
	case *access:
		return uintptr(unsafe.Pointer(v))
	}
	panic("type")
}

func devProp() prop { return prop{Type: 1, LocType: 1, Handles: 1} }

// TestRules lists the driver rules the double enforces, each with the
// CUresult the real driver returns.
func TestRules(t *testing.T) {
	x, dbl := open(t)
	var va, h, h2, out uint64
	pr := devProp()
	require.Zero(t, x.call("cuMemAddressReserve", p(&va), 8*g, 0, 0, 0))
	require.Zero(t, x.call("cuMemCreate", p(&h), 2*g, p(&pr), 0))
	require.Zero(t, x.call("cuMemCreate", p(&h2), g, p(&pr), 0))
	rw := access{1, 0, 3}

	bad := func(mod func(*prop)) *prop { q := devProp(); mod(&q); return &q }
	for _, r := range []struct {
		rule string
		want int
		fn   func() int
	}{
		{"create: size not a multiple of the granularity", 1, func() int { return x.call("cuMemCreate", p(&out), g+4096, p(&pr), 0) }},
		{"create: flags must be 0", 1, func() int { return x.call("cuMemCreate", p(&out), g, p(&pr), 1) }},
		{"create: allocation type must be pinned", 1, func() int { return x.call("cuMemCreate", p(&out), g, p(bad(func(q *prop) { q.Type = 2 })), 0) }},
		{"create: location must be a device", 1, func() int { return x.call("cuMemCreate", p(&out), g, p(bad(func(q *prop) { q.LocType = 2 })), 0) }},
		{"create: device out of range", 1, func() int { return x.call("cuMemCreate", p(&out), g, p(bad(func(q *prop) { q.LocID = 7 })), 0) }},
		{"create: win32 metadata must be NULL", 1, func() int { return x.call("cuMemCreate", p(&out), g, p(bad(func(q *prop) { q.Win32 = 8 })), 0) }},
		{"create: allocFlags must be zero", 1, func() int { return x.call("cuMemCreate", p(&out), g, p(bad(func(q *prop) { q.Flags[2] = 1 })), 0) }},
		{"create: capacity", 2, func() int { return x.call("cuMemCreate", p(&out), 1<<30, p(&pr), 0) }},
		{"reserve: size not a multiple of the granularity", 1, func() int { return x.call("cuMemAddressReserve", p(&out), g/2, 0, 0, 0) }},
		{"map: misaligned address", 1, func() int { return x.call("cuMemMap", uintptr(va)+4096, g, 0, uintptr(h2), 0) }},
		{"map: outside any reservation", 1, func() int { return x.call("cuMemMap", uintptr(va)+7*g, 2*g, 0, uintptr(h), 0) }},
		{"map: beyond the handle", 1, func() int { return x.call("cuMemMap", uintptr(va), 2*g, g, uintptr(h), 0) }},
		{"map: unknown handle", 400, func() int { return x.call("cuMemMap", uintptr(va), g, 0, 12345, 0) }},
		{"get-address-range: unmapped", 500, func() int { return x.call("cuMemGetAddressRange_v2", p(&out), p(&out), uintptr(va)) }},
		{"set-access: unmapped range", 1, func() int { return x.call("cuMemSetAccess", uintptr(va), g, p(&rw), 1) }},
		{"unmap: nothing mapped", 1, func() int { return x.call("cuMemUnmap", uintptr(va), g) }},
		{"address-free: not a whole reservation", 1, func() int { return x.call("cuMemAddressFree", uintptr(va), 4*g) }},
		{"export: wrong handle type", 801, func() int { return x.call("cuMemExportToShareableHandle", p(&out), uintptr(h), 2, 0) }},
		{"granularity: unknown option", 1, func() int { return x.call("cuMemGetAllocationGranularity", p(&out), p(&pr), 5) }},
	} {
		assert.Equal(t, r.want, r.fn(), r.rule)
	}

	// A mapping stays inaccessible until set-access; map overlap, partial
	// unmap and freeing an address range that still holds it are refused;
	// release while mapped is deferred to the last unmap.
	require.Zero(t, x.call("cuMemMap", uintptr(va), 2*g, 0, uintptr(h), 0))
	assert.Equal(t, 1, x.call("cuMemMap", uintptr(va)+g, g, 0, uintptr(h2), 0), "map: overlap")
	var fl uint64
	loc := access{1, 0, 0}
	require.Zero(t, x.call("cuMemGetAccess", p(&fl), p(&loc), uintptr(va)))
	assert.Zero(t, fl, "fresh mapping is inaccessible")
	assert.Equal(t, 1, x.call("cuMemUnmap", uintptr(va), g), "unmap: part of a mapping")
	assert.Equal(t, 1, x.call("cuMemAddressFree", uintptr(va), 8*g), "address-free: still mapped")
	require.Zero(t, x.call("cuMemSetAccess", uintptr(va), 2*g, p(&rw), 1))
	mem := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&va))), 2*g) // device memory is host memory in the double
	assert.Equal(t, byte(0xA5), mem[0], "fresh memory carries the guard pattern, not zeros")
	mem[0] = 42
	var r uint64
	require.Zero(t, x.call("cuMemRetainAllocationHandle", p(&r), uintptr(va)+g))
	assert.Equal(t, h, r)
	require.Zero(t, x.call("cuMemRelease", uintptr(h)))
	require.Zero(t, x.call("cuMemRelease", uintptr(r))) // both references gone, still mapped
	assert.Equal(t, 1, x.call("cuMemRelease", uintptr(h)), "released handle is invalid")
	assert.Equal(t, int64(2), dbl.Live().Handles, "memory kept while mapped")
	assert.Equal(t, byte(42), mem[0])
	require.Zero(t, x.call("cuMemUnmap", uintptr(va), 2*g))
	assert.Equal(t, int64(1), dbl.Live().Handles, "last unmap frees it")
	assert.Equal(t, int64(g), dbl.Live().UsedBytes)

	// Fault injection fires at the nth call only; strict mode refuses calls
	// on a thread without a current context.
	require.NoError(t, dbl.Fail("cuMemCreate", 2, 999))
	require.Zero(t, x.call("cuMemCreate", p(&out), g, p(&pr), 0))
	assert.Equal(t, 999, x.call("cuMemCreate", p(&r), g, p(&pr), 0))
	require.Zero(t, x.call("cuMemRelease", uintptr(out)))
	before := dbl.Calls("cuMemRelease")
	dbl.RequireContext(true)
	require.Zero(t, x.call("cuCtxSetCurrent", 0))
	assert.Equal(t, 201, x.call("cuMemRelease", uintptr(h2)), "strict mode: no context")
	assert.Equal(t, before+1, dbl.Calls("cuMemRelease"), "refused calls are counted")
	assert.Equal(t, int64(-1), dbl.Calls("nosuch"))
	assert.Error(t, dbl.Fail("nosuch", 1, 1))
	dbl.Reset()
	assert.Equal(t, cudatest.Live{}, dbl.Live(), "Reset drops everything")
}

// memfds lists the double's memfds open in this process, by fd number.
func memfds(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	out := map[int]bool{}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(target, "/memfd:fakecu-dev") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		out[fd] = true
	}
	return out
}

// createWithFD creates a handle of g bytes and returns it with the number
// of the memfd behind it, found as the one memfd that appeared.
func createWithFD(t *testing.T, x c) (uint64, int) {
	t.Helper()
	before := memfds(t)
	var h uint64
	pr := devProp()
	require.Zero(t, x.call("cuMemCreate", p(&h), g, p(&pr), 0))
	var fds []int
	for fd := range memfds(t) {
		if !before[fd] {
			fds = append(fds, fd)
		}
	}
	require.Len(t, fds, 1, "one new memfd per handle")
	return h, fds[0]
}

// TestBackingChanged: a handle whose memfd someone else closed (as a stray
// os.File finalizer does), and whose fd number a new handle then reuses, is
// refused at map, export and release with CUDA_ERROR_ILLEGAL_STATE and
// reported by BackingError, instead of mapping the other handle's memory;
// Reset does not close the fd that now belongs to the other handle.
func TestBackingChanged(t *testing.T) {
	for _, reused := range []bool{false, true} {
		for _, call := range []string{"cuMemMap", "cuMemExportToShareableHandle", "cuMemRelease"} {
			name := call + "/closed"
			if reused {
				name = call + "/reused"
			}
			t.Run(name, func(t *testing.T) {
				x, dbl := open(t)
				defer dbl.Reset()
				var va, sh uint64
				require.Zero(t, x.call("cuMemAddressReserve", p(&va), 2*g, 0, 0, 0))
				h, fd := createWithFD(t, x)
				require.NoError(t, dbl.BackingError())
				require.NoError(t, syscall.Close(fd)) // what the stray finalizer does
				var other uint64
				if reused {
					var ofd int
					other, ofd = createWithFD(t, x)
					require.Equal(t, fd, ofd, "the kernel hands out the lowest free number")
				}
				var rc int
				switch call {
				case "cuMemMap":
					rc = x.call(call, uintptr(va), g, 0, uintptr(h), 0)
				case "cuMemExportToShareableHandle":
					rc = x.call(call, p(&sh), uintptr(h), 1, 0)
				case "cuMemRelease":
					rc = x.call(call, uintptr(h))
				}
				assert.Equal(t, 401, rc, "CUDA_ERROR_ILLEGAL_STATE")
				err := dbl.BackingError()
				require.ErrorIs(t, err, cudatest.ErrBackingChanged)
				assert.Contains(t, err.Error(), call)
				if reused {
					assert.Contains(t, err.Error(), "now names another file")
					// The other handle is intact and maps its own memory.
					require.Zero(t, x.call("cuMemMap", uintptr(va)+g, g, 0, uintptr(other), 0))
					require.Zero(t, x.call("cuMemUnmap", uintptr(va)+g, g))
					require.Zero(t, x.call("cuMemRelease", uintptr(other)))
					assert.False(t, memfds(t)[fd], "releasing the other handle closed its memfd")
				} else {
					assert.Contains(t, err.Error(), "was closed")
				}
				// Reset drops the broken handle without closing its fd
				// number, and reports it until the next Reset.
				keep, err := os.Open(os.DevNull) // takes the lowest free number: fd
				require.NoError(t, err)
				defer keep.Close()
				require.Equal(t, uintptr(fd), keep.Fd())
				dbl.Reset()
				var st syscall.Stat_t
				require.NoError(t, syscall.Fstat(fd, &st), "Reset closed an fd the double no longer owns")
				require.ErrorIs(t, dbl.BackingError(), cudatest.ErrBackingChanged)
				dbl.Reset()
				require.NoError(t, dbl.BackingError())
			})
		}
	}
}

// TestCapacityBeforeFirstCall: a capacity set before the process's first
// driver call is the capacity the driver reports (the defaults are set when
// the library loads, not at the first call).
func TestCapacityBeforeFirstCall(t *testing.T) {
	path, err := cudatest.Build(t.TempDir()) // a fresh copy: no call made yet
	if errors.Is(err, cudatest.ErrNoCompiler) {
		t.Skip(err)
	}
	require.NoError(t, err)
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	require.NoError(t, dbl.SetCapacity(0, 256<<20))
	require.NoError(t, dbl.SetCapacity(1, 96<<20))
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	x := c{t, lib}
	require.Zero(t, x.call("cuInit", 0))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for dev, want := range []uint64{256 << 20, 96 << 20} {
		var ctx uintptr
		require.Zero(t, x.call("cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&ctx)), uintptr(dev)))
		require.Zero(t, x.call("cuCtxSetCurrent", ctx))
		var free, total uint64
		require.Zero(t, x.call("cuMemGetInfo_v2", p(&free), p(&total)))
		assert.Equal(t, want, total, "device %d", dev)
		assert.Equal(t, want, free, "device %d", dev)
		require.Zero(t, x.call("cuCtxSetCurrent", 0))
		require.Zero(t, x.call("cuDevicePrimaryCtxRelease_v2", uintptr(dev)))
	}
}
