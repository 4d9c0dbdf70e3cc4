package acl_test

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// BenchmarkCall measures the binding's cost per ACL call over the double,
// layer by layer, on aclrtGetMemInfo (a trivial C function that takes the
// double's mutex):
//
//	raw        purego.SyscallN alone, on a thread that already has a device
//	pinned     + LockOSThread/UnlockOSThread + aclrtSetCurrentContext
//	           (what every binding call does)
//	setDevice  the same with aclrtSetDevice instead (for comparison)
//	MemGetInfo the Driver method: pinned + argument and error handling
//
// pinned − raw is the price of being correct from any goroutine; the
// double's own work is in raw.
func BenchmarkCall(b *testing.B) {
	needDouble(b)
	d := open(b)
	var free, total uint64
	args := []uintptr{1, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))}
	b.Run("raw", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		purego.SyscallN(main_.setDevice, 0)
		b.ReportAllocs()
		for b.Loop() {
			if r, _, _ := purego.SyscallN(main_.getMemInfo, args...); r != 0 {
				b.Fatal(r)
			}
		}
	})
	setCtx, err := purego.Dlsym(main_.dl, "aclrtSetCurrentContext")
	require.NoError(b, err)
	getCtx, err := purego.Dlsym(main_.dl, "aclrtGetCurrentContext")
	require.NoError(b, err)
	var ctx uintptr
	runtime.LockOSThread()
	purego.SyscallN(main_.setDevice, 0)
	purego.SyscallN(getCtx, uintptr(unsafe.Pointer(&ctx)))
	runtime.UnlockOSThread()
	b.Run("pinned", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			runtime.LockOSThread()
			purego.SyscallN(setCtx, ctx)
			r, _, _ := purego.SyscallN(main_.getMemInfo, args...)
			runtime.UnlockOSThread()
			if r != 0 {
				b.Fatal(r)
			}
		}
	})
	// The alternative the binding does not take: aclrtSetDevice per call
	// (on a real runtime it also takes a device reference each time).
	b.Run("setDevice", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			runtime.LockOSThread()
			purego.SyscallN(main_.setDevice, 0)
			r, _, _ := purego.SyscallN(main_.getMemInfo, args...)
			runtime.UnlockOSThread()
			if r != 0 {
				b.Fatal(r)
			}
		}
	})
	b.Run("MemGetInfo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := d.MemGetInfo(0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("MemGetInfoParallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, _, err := d.MemGetInfo(0); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkMapCycle is one expandable-segment page's driver traffic through
// the binding: create, map, set access, unmap, free (5 ACL calls plus 5
// context switches), over the double's real mmap work.
func BenchmarkMapCycle(b *testing.B) {
	d := open(b)
	const g = 2 << 20
	va, err := d.ReserveAddress(g)
	require.NoError(b, err)
	prop := backend.DeviceProp(0)
	b.ReportAllocs()
	for b.Loop() {
		h, err := d.CreatePhysical(g, prop)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Map(va, g, h); err != nil {
			b.Fatal(err)
		}
		if err := d.SetAccess(va, g, rw0); err != nil {
			b.Fatal(err)
		}
		if err := d.Unmap(va, g); err != nil {
			b.Fatal(err)
		}
		if err := d.FreePhysical(h); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/5, "ns/acl-call")
	require.NoError(b, d.ReleaseAddress(va, g))
}
