package acl_test

import (
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
)

// These tests call the double's C entry points directly, without the
// binding in between, so that each seed rule is proven to be enforced by the
// double itself (the binding rejects some requests before they reach it).

const (
	eInvalid     = 100000 // ACL_ERROR_INVALID_PARAM
	eContextNull = 107002 // ACL_ERROR_RT_CONTEXT_NULL
	eNotSupport  = 207000 // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
	eOOM         = 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION
	eNoPerm      = 207006 // ACL_ERROR_RT_NO_PERMISSION
	eRegistered  = 507910
	eNotReg      = 507911
	gran         = 2 << 20
)

// cprop mirrors aclrtPhysicalMemProp.
type cprop struct {
	HandleType, AllocationType, MemAttr int32
	LocID                               uint32
	LocType                             int32
	Reserve                             uint64
}

// cdesc mirrors aclrtMemAccessDesc.
type cdesc struct {
	Flags   int32
	LocID   uint32
	LocType int32
	Rsv     [12]byte
}

func devProp(dev uint32) cprop { return cprop{MemAttr: 4, LocID: dev, LocType: 1} } // ACL_HBM_MEM_HUGE

// raw is a direct call into one copy of the double on a locked thread with
// device dev current (dev < 0: no current device on a fresh thread).
type raw struct {
	t *testing.T
	f *fake
}

//go:uintptrescapes
func (r raw) on(dev int, fn uintptr, args ...uintptr) int32 {
	done := make(chan int32)
	go func() { // a fresh goroutine on a thread of its own: no context unless set
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		purego.SyscallN(r.f.clearContext)
		if dev >= 0 {
			if c, _, _ := purego.SyscallN(r.f.setDevice, uintptr(dev)); int32(c) != 0 {
				done <- int32(c)
				return
			}
		}
		c, _, _ := purego.SyscallN(fn, args...)
		done <- int32(c)
	}()
	return <-done
}

func (r raw) ok(fn uintptr, args ...uintptr) {
	r.t.Helper()
	require.Equal(r.t, int32(0), r.on(0, fn, args...))
}

func (r raw) create(size uint64, p cprop) uintptr {
	r.t.Helper()
	var h uintptr
	r.ok(r.f.mallocPhysical, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&p)), 0)
	return h
}

func (r raw) reserve(size uint64) uintptr {
	r.t.Helper()
	var va uintptr
	r.ok(r.f.reserve, uintptr(unsafe.Pointer(&va)), uintptr(size), 0, 0, 0)
	return va
}

func (r raw) access(va uintptr) int64 {
	r.t.Helper()
	loc := [2]int32{0, 1}
	var flags uint64
	r.ok(r.f.getAccess, va, uintptr(unsafe.Pointer(&loc)), uintptr(unsafe.Pointer(&flags)))
	return int64(flags)
}

// newRaw initialises the main copy (through a binding Open, which also
// checks at the end that the test left nothing behind).
func newRaw(t *testing.T) raw {
	open(t)
	return raw{t, main_}
}

func TestDoubleR1R2PhysicalProps(t *testing.T) {
	r := newRaw(t)
	var h uintptr
	ph := uintptr(unsafe.Pointer(&h))
	for _, c := range []struct {
		name  string
		size  uint64
		prop  cprop
		flags uintptr
	}{
		{"R1 size 0", 0, devProp(0), 0},
		{"R1 size not a granule multiple", gran + 4096, devProp(0), 0},
		{"R1 flags not 0", gran, devProp(0), 1},
		{"R2 handle type POSIX", gran, cprop{HandleType: 2, MemAttr: 4, LocType: 1}, 0},
		{"R2 allocation type not pinned", gran, cprop{AllocationType: 1, MemAttr: 4, LocType: 1}, 0},
		{"R2 DDR memory on a device", gran, cprop{MemAttr: 2, LocType: 1}, 0},
		{"R2 1 GiB pages on the host", gran, cprop{MemAttr: 10, LocType: 0}, 0},
		{"R2 unregistered location", gran, cprop{MemAttr: 4, LocType: 2}, 0},
		{"R2 device out of range", gran, devProp(2), 0},
		{"R2 reserve not 0", gran, cprop{MemAttr: 4, LocType: 1, Reserve: gran}, 0},
	} {
		assert.Equal(t, int32(eInvalid), r.on(0, r.f.mallocPhysical, ph, uintptr(c.size), uintptr(unsafe.Pointer(&c.prop)), c.flags), c.name)
	}
	assert.Zero(t, r.f.objects().Handles, "a rejected create left a handle")
	// Host memory with normal pages is fine; 1 GiB device pages have 1 GiB granularity.
	h = r.create(gran, cprop{MemAttr: 3, LocType: 0})
	r.ok(r.f.freePhysical, h)
	gfn, err := purego.Dlsym(main_.dl, "aclrtMemGetAllocationGranularity")
	require.NoError(t, err)
	var g uint64
	p := cprop{MemAttr: 10, LocType: 1}
	r.ok(gfn, uintptr(unsafe.Pointer(&p)), 0, uintptr(unsafe.Pointer(&g)))
	assert.Equal(t, uint64(1<<30), g)
	p = devProp(0)
	r.ok(gfn, uintptr(unsafe.Pointer(&p)), 1, uintptr(unsafe.Pointer(&g)))
	assert.Equal(t, uint64(gran), g)
	assert.Equal(t, int32(eInvalid), r.on(0, gfn, uintptr(unsafe.Pointer(&p)), 2, uintptr(unsafe.Pointer(&g))), "R11 unknown option")
}

func TestDoubleCapacity(t *testing.T) {
	r := newRaw(t)
	r.f.capacity(t, 0, 4*gran)
	h1 := r.create(3*gran, devProp(0))
	var h uintptr
	p := devProp(0)
	assert.Equal(t, int32(eOOM), r.on(0, r.f.mallocPhysical, uintptr(unsafe.Pointer(&h)), 2*gran, uintptr(unsafe.Pointer(&p)), 0))
	h2 := r.create(gran, devProp(0))
	assert.Equal(t, uint64(4*gran), r.f.objects().Used[0])
	r.ok(r.f.freePhysical, h1)
	r.ok(r.f.freePhysical, h2)
}

func TestDoubleR3R8R9R10MapRules(t *testing.T) {
	r := newRaw(t)
	base := r.reserve(8 * gran)
	h := r.create(2*gran, devProp(0))
	for _, c := range []struct {
		name        string
		va          uintptr
		size, off   uint64
		flags       uintptr
		handleDelta uintptr
	}{
		{"R6 offset not 0", base, 2 * gran, gran, 0, 0},
		{"R6 flags not 0", base, 2 * gran, 0, 1, 0},
		{"R6 part of the handle", base, gran, 0, 0, 0},
		{"R6 more than the handle", base, 4 * gran, 0, 0, 0},
		{"R6 misaligned address", base + 4096, 2 * gran, 0, 0, 0},
		{"R6 outside the reservation", base + 7*gran, 2 * gran, 0, 0, 0},
		{"R6 unknown handle", base, 2 * gran, 0, 0, 64},
	} {
		assert.Equal(t, int32(eInvalid), r.on(0, r.f.mapMem, c.va, uintptr(c.size), uintptr(c.off), h+c.handleDelta, c.flags), c.name)
	}
	assert.Zero(t, r.f.objects().Mappings)

	r.ok(r.f.mapMem, base+gran, 2*gran, 0, h, 0) // R6: any granule offset of the reservation
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.mapMem, base, 2*gran, 0, h, 0), "R6 overlap")
	assert.Equal(t, int64(0), r.access(base+gran), "R8: inaccessible until SetAccess")
	src := make([]byte, 64)
	var s uintptr
	r.ok(r.f.createStream, uintptr(unsafe.Pointer(&s)))
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.memcpy, base+gran, 64, uintptr(unsafe.Pointer(&src[0])), 64, 1, s),
		"R8: a copy into an inaccessible mapping")

	rw := cdesc{Flags: 3, LocType: 1}
	prw := uintptr(unsafe.Pointer(&rw))
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.setAccess, base+gran, gran, prw, 1), "R10 size of part of a mapping")
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.setAccess, base+2*gran, gran, prw, 1), "R10 inside a mapping")
	r.ok(r.f.setAccess, base+gran, 2*gran, prw, 1)
	assert.Equal(t, int64(3), r.access(base+gran))
	loc := [2]int32{0, 1}
	var flags uint64
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.getAccess, base+2*gran, uintptr(unsafe.Pointer(&loc)), uintptr(unsafe.Pointer(&flags))),
		"R10 GetAccess wants the mapping's address")
	src[0], src[63] = 0xa5, 0x5a
	r.ok(r.f.memcpy, base+gran, 64, uintptr(unsafe.Pointer(&src[0])), 64, 1, s)
	dst := make([]byte, 64)
	r.ok(r.f.memcpy, uintptr(unsafe.Pointer(&dst[0])), 64, base+gran, 64, 2, s)
	assert.Equal(t, src, dst)

	assert.Equal(t, int32(eInvalid), r.on(0, r.f.release, base), "R5 release with a mapping")
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.unmapMem, base+2*gran), "R9 unmap inside a mapping")
	used := r.f.objects().Used[0]
	r.ok(r.f.freePhysical, h) // R3: deferred while mapped
	assert.Equal(t, used, r.f.objects().Used[0], "R3 memory released while mapped")
	assert.Equal(t, int64(1), r.f.objects().Handles)
	r.ok(r.f.unmapMem, base+gran)
	assert.Equal(t, used-2*gran, r.f.objects().Used[0], "R3 memory not released by the unmap")
	assert.Zero(t, r.f.objects().Handles)
	r.ok(r.f.release, base)
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.release, base), "R5 release twice")
	destroyStream(t, s)
}

func destroyStream(t *testing.T, s uintptr) {
	fn, err := purego.Dlsym(main_.dl, "aclrtDestroyStream")
	require.NoError(t, err)
	require.Equal(t, int32(0), raw{t, main_}.on(0, fn, s))
}

func TestDoubleR4Reserve(t *testing.T) {
	r := newRaw(t)
	var va uintptr
	pv := uintptr(unsafe.Pointer(&va))
	for _, c := range []struct {
		name                string
		size, align, expect uintptr
		flags               uintptr
	}{
		{"size 0", 0, 0, 0, 0},
		{"alignment not 0", gran, gran, 0, 0},
		{"fixed address", gran, 0, 1 << 44, 0},
		{"flags 2", gran, 0, 0, 2},
	} {
		assert.Equal(t, int32(eInvalid), r.on(0, r.f.reserve, pv, c.size, c.align, c.expect, c.flags), c.name)
	}
	r.ok(r.f.reserve, pv, gran+1, 0, 0, 1) // flags 1 (legacy) and any size
	assert.Zero(t, uint64(va)%gran)
	r.ok(r.f.release, va)
}

func TestDoubleR7OneDevicePerReservation(t *testing.T) {
	r := newRaw(t)
	base := r.reserve(4 * gran)
	h0 := r.create(gran, devProp(0))
	h1 := r.create(gran, devProp(1))
	r.ok(r.f.mapMem, base, gran, 0, h0, 0)
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.mapMem, base+2*gran, gran, 0, h1, 0))
	r.ok(r.f.unmapMem, base)
	r.ok(r.f.mapMem, base+2*gran, gran, 0, h1, 0) // empty again: any device
	r.ok(r.f.unmapMem, base+2*gran)
	r.ok(r.f.freePhysical, h0)
	r.ok(r.f.freePhysical, h1)
	r.ok(r.f.release, base)
}

func TestDoubleR12R13R14Retain(t *testing.T) {
	r := newRaw(t)
	base := r.reserve(2 * gran)
	h := r.create(gran, devProp(0))
	r.ok(r.f.mapMem, base, gran, 0, h, 0)
	var got uintptr
	r.ok(r.f.retain, base+100, uintptr(unsafe.Pointer(&got)))
	assert.Equal(t, h, got)
	// R14: the mapping containing an address; nothing outside one.
	rangeFn, err := purego.Dlsym(main_.dl, "aclrtMemGetAddressRange")
	require.NoError(t, err)
	var rb uintptr
	var rn uint64
	r.ok(rangeFn, base+gran-1, uintptr(unsafe.Pointer(&rb)), uintptr(unsafe.Pointer(&rn)))
	assert.Equal(t, base, rb)
	assert.Equal(t, uint64(gran), rn)
	assert.Equal(t, int32(eInvalid), r.on(0, rangeFn, base+gran, uintptr(unsafe.Pointer(&rb)), uintptr(unsafe.Pointer(&rn))), "R14 unmapped")
	propsFn, err := purego.Dlsym(main_.dl, "aclrtMemGetAllocationPropertiesFromHandle")
	require.NoError(t, err)
	var p cprop
	r.ok(propsFn, h, uintptr(unsafe.Pointer(&p)))
	assert.Equal(t, devProp(0), p, "R13")
	r.ok(r.f.freePhysical, h)
	r.ok(r.f.unmapMem, base)
	assert.Equal(t, int64(1), r.f.objects().Handles, "R12 the retained reference keeps the handle")
	r.ok(r.f.freePhysical, h)
	assert.Zero(t, r.f.objects().Handles)
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.freePhysical, h), "free of a released handle")
	assert.Equal(t, int32(eInvalid), r.on(0, propsFn, h, uintptr(unsafe.Pointer(&p))), "R13 properties of a released handle")
	r.ok(r.f.release, base)
}

func TestDoubleR15R16R17IPC(t *testing.T) {
	r := newRaw(t)
	openPeer(t, nil) // initialises the peer copy
	p := raw{t, peer}
	h := r.create(gran, devProp(0))
	var sh uint64
	psh := uintptr(unsafe.Pointer(&sh))
	r.ok(r.f.exportSh, h, 0, 0, psh)
	var sh2 uint64
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.exportSh, h, 0, 0, uintptr(unsafe.Pointer(&sh2))), "R15 export twice")
	var hb uintptr
	phb := uintptr(unsafe.Pointer(&hb))
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.importSh, uintptr(sh), 0, phb), "R17 import in the exporting process")
	assert.Equal(t, int32(eNoPerm), p.on(0, p.f.importSh, uintptr(sh), 0, phb), "R16 importer not whitelisted")
	pid := int32(0)
	getPid, err := purego.Dlsym(peer.dl, "aclrtDeviceGetBareTgid")
	require.NoError(t, err)
	p.ok(getPid, uintptr(unsafe.Pointer(&pid)))
	r.ok(r.f.setPids, uintptr(sh), uintptr(unsafe.Pointer(&pid)), 1)
	p.ok(p.f.importSh, uintptr(sh), 1, phb) // R17: onto another device
	var hb2 uintptr
	assert.Equal(t, int32(eInvalid), p.on(0, p.f.importSh, uintptr(sh), 0, uintptr(unsafe.Pointer(&hb2))), "R15 import twice")

	// R7: an imported handle does not share a reservation with a local one.
	vb := p.reserve(4 * gran)
	local := p.create(gran, devProp(1))
	p.ok(p.f.mapMem, vb, gran, 0, local, 0)
	assert.Equal(t, int32(eInvalid), p.on(0, p.f.mapMem, vb+2*gran, gran, 0, hb, 0), "R7 local and imported")
	p.ok(p.f.unmapMem, vb)
	p.ok(p.f.freePhysical, local)

	// R17: the memory lives until every process has freed its handle.
	used := r.f.objects().Used[0]
	r.ok(r.f.freePhysical, h)
	assert.Equal(t, used, r.f.objects().Used[0], "R17 released while the importer holds it")
	p.ok(p.f.freePhysical, hb)
	assert.Equal(t, used-gran, r.f.objects().Used[0])
	assert.Zero(t, r.f.objects().Exports)
	p.ok(p.f.release, vb)
}

func TestDoubleR18R19Host(t *testing.T) {
	r := newRaw(t)
	var hp uintptr
	php := uintptr(unsafe.Pointer(&hp))
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.mallocHost, php, 0), "R18 size 0")
	r.ok(r.f.mallocHost, php, 3*4096)
	assert.Zero(t, hp%64, "R18 64-byte aligned")
	var dp uintptr
	pdp := uintptr(unsafe.Pointer(&dp))
	assert.Equal(t, int32(eInvalid), r.on(0, r.f.hostRegister, hp+64, 4096, 0, pdp), "R19 not 4 KiB aligned")
	assert.Equal(t, int32(eNotSupport), r.on(0, r.f.hostRegister, hp, 4096, 4, pdp), "R19 IOMEMORY reserved")
	assert.Equal(t, int32(eNotSupport), r.on(0, r.f.hostRegister, hp, 4096, 8, pdp), "R19 READONLY reserved")
	r.ok(r.f.hostRegister, hp, 4096, 0, pdp)
	assert.Equal(t, hp, dp)
	assert.Equal(t, int32(eRegistered), r.on(0, r.f.hostRegister, hp, 4096, 0, pdp), "R19 registered twice")
	unreg, err := purego.Dlsym(main_.dl, "aclrtHostUnregister")
	require.NoError(t, err)
	free, err := purego.Dlsym(main_.dl, "aclrtFreeHost")
	require.NoError(t, err)
	assert.Equal(t, int32(eInvalid), r.on(0, free, hp), "free with a registered range")
	r.ok(unreg, hp)
	assert.Equal(t, int32(eNotReg), r.on(0, unreg, hp), "R19 unregister twice")
	r.ok(free, hp)
}

func TestDoubleStrictContext(t *testing.T) {
	r := newRaw(t)
	r.f.strictMode(t)
	var va uintptr
	assert.Equal(t, int32(eContextNull), r.on(-1, r.f.reserve, uintptr(unsafe.Pointer(&va)), gran, 0, 0, 0),
		"a VMM call without a current device")
	var s uintptr
	assert.Equal(t, int32(eContextNull), r.on(-1, r.f.createStream, uintptr(unsafe.Pointer(&s))))
	r.ok(r.f.createStream, uintptr(unsafe.Pointer(&s)))
	sync, err := purego.Dlsym(main_.dl, "aclrtSynchronizeStream")
	require.NoError(t, err)
	assert.Equal(t, int32(eContextNull), r.on(1, sync, s), "a stream of device 0 used with device 1 current")
	r.ok(sync, s)
	destroyStream(t, s)
}

func TestDoubleFaultInjection(t *testing.T) {
	r := newRaw(t)
	r.f.failAt(t, "aclrtReserveMemAddress", 2, eOOM)
	va := r.reserve(gran)
	var vb uintptr
	assert.Equal(t, int32(eOOM), r.on(0, r.f.reserve, uintptr(unsafe.Pointer(&vb)), gran, 0, 0, 0), "the 2nd call fails")
	assert.Equal(t, int64(1), r.f.objects().Reservations, "the failed call reserved nothing")
	vc := r.reserve(gran) // only the 2nd
	r.ok(r.f.release, va)
	r.ok(r.f.release, vc)
}

// aclMemfds lists the double's memfds open in this process, by fd number.
func aclMemfds(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	out := map[int]bool{}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(target, "/memfd:fakeacl") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		out[fd] = true
	}
	return out
}

// createWithFD creates a handle of one granule and returns it with the
// number of the memfd behind it.
func (r raw) createWithFD() (uintptr, int) {
	r.t.Helper()
	before := aclMemfds(r.t)
	h := r.create(gran, devProp(0))
	var fds []int
	for fd := range aclMemfds(r.t) {
		if !before[fd] {
			fds = append(fds, fd)
		}
	}
	require.Len(r.t, fds, 1, "one new memfd per handle")
	return h, fds[0]
}

// TestDoubleBackingChanged: a handle whose memfd someone else closed (as a
// stray os.File finalizer does), and whose fd number a new handle then
// reuses, is refused at map and export with ACL_ERROR_RT_INTERNAL_ERROR and
// reported, instead of mapping the other handle's memory; its free reports
// it too and drops the handle without closing the fd number, which is no
// longer the double's.
func TestDoubleBackingChanged(t *testing.T) {
	const eInternal = 507000 // ACL_ERROR_RT_INTERNAL_ERROR
	for _, reused := range []bool{false, true} {
		for _, call := range []string{"aclrtMapMem", "aclrtMemExportToShareableHandle", "aclrtFreePhysical"} {
			name := call + "/closed"
			if reused {
				name = call + "/reused"
			}
			t.Run(name, func(t *testing.T) {
				r := newRaw(t)
				va := r.reserve(2 * gran)
				h, fd := r.createWithFD()
				require.NoError(t, syscall.Close(fd)) // what the stray finalizer does
				var other uintptr
				if reused {
					var ofd int
					other, ofd = r.createWithFD()
					require.Equal(t, fd, ofd, "the kernel hands out the lowest free number")
				}
				var sh uint64
				switch call {
				case "aclrtMapMem":
					assert.Equal(t, int32(eInternal), r.on(0, r.f.mapMem, va, gran, 0, h, 0))
				case "aclrtMemExportToShareableHandle":
					assert.Equal(t, int32(eInternal), r.on(0, r.f.exportSh, h, 0, 1, uintptr(unsafe.Pointer(&sh))))
				}
				keep, err := os.Open(os.DevNull) // in the closed case, takes fd
				require.NoError(t, err)
				defer keep.Close()
				assert.Equal(t, int32(eInternal), r.on(0, r.f.freePhysical, h), "the free reports it, and drops the handle")
				assert.Equal(t, int32(eInvalid), r.on(0, r.f.freePhysical, h), "dropped")
				why := main_.backingError()
				require.Error(t, why)
				assert.Contains(t, why.Error(), call)
				if reused {
					assert.Contains(t, why.Error(), "now names another file")
					// The other handle is intact: it maps, and its free
					// closes its own memfd.
					r.ok(r.f.mapMem, va+gran, gran, 0, other, 0)
					r.ok(r.f.unmapMem, va+gran)
					r.ok(r.f.freePhysical, other)
					assert.False(t, aclMemfds(t)[fd], "freeing the other handle closed its memfd")
				} else {
					assert.Contains(t, why.Error(), "was closed")
					var st syscall.Stat_t
					require.NoError(t, syscall.Fstat(int(keep.Fd()), &st), "the double closed an fd it no longer owns")
				}
				r.ok(r.f.release, va)
				require.NoError(t, main_.backingError(), "backingError forgets what it reported")
			})
		}
	}
}
