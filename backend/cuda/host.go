//go:build unix

package cuda

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Host memory is portable (usable from every context) and mapped into the
// device address space (unified addressing), so the calls run in device 0's
// context.

// MallocHost implements backend.HostMemory (cuMemHostAlloc, PORTABLE |
// DEVICEMAP; page-aligned, so 64-byte aligned).
func (d *Driver) MallocHost(size uint64) (uintptr, error) {
	const op = backend.OpMallocHost
	if size == 0 {
		return 0, invalid(op, "R18", "size 0")
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	var p uintptr
	rc := d.onDevice(0, func() cuResult {
		return d.lib.call(symMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size), cuMemHostAllocPortable|cuMemHostAllocDeviceMap)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemHostAlloc, rc)
	}
	d.hosts[p] = size
	return p, nil
}

// FreeHost implements backend.HostMemory (cuMemFreeHost).
func (d *Driver) FreeHost(p uintptr) error { return d.freeHost(p, false) }

// FreeHostWithDevSync implements backend.HostMemory: cuCtxSynchronize on
// every device, then cuMemFreeHost.
func (d *Driver) FreeHostWithDevSync(p uintptr) error { return d.freeHost(p, true) }

func (d *Driver) freeHost(p uintptr, sync bool) error {
	const op = backend.OpFreeHost
	if err := d.lockOpen(op); err != nil {
		return err
	}
	_, ok := d.hosts[p]
	d.mu.Unlock()
	if !ok {
		return invalid(op, "R18", "%#x is not a MallocHost block", p)
	}
	if sync {
		for dev := range d.devs {
			if err := d.DeviceSynchronize(dev); err != nil {
				return err
			}
		}
	}
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if _, ok := d.hosts[p]; !ok { // freed by another goroutine meanwhile
		return invalid(op, "R18", "%#x is not a MallocHost block", p)
	}
	if rc := d.onDevice(0, func() cuResult { return d.lib.call(symMemFreeHost, p) }); rc != cuSuccess {
		return driverError(op, symMemFreeHost, rc)
	}
	delete(d.hosts, p)
	return nil
}

// hostRegisterFlags translates backend flags to CU_MEMHOSTREGISTER_*: the
// backend's values are ACL's (PINNED 1, IOMEMORY 2, READONLY 4; 0 is
// MAPPED), CUDA's are bits PORTABLE 1, DEVICEMAP 2, IOMEMORY 4, READ_ONLY 8.
func hostRegisterFlags(f backend.HostRegisterFlags) (uint32, bool) {
	const known = backend.HostRegisterPinned | backend.HostRegisterIOMemory | backend.HostRegisterReadOnly
	if f&^known != 0 {
		return 0, false
	}
	cu := uint32(cuMemHostRegisterPortable)
	if f&backend.HostRegisterPinned == 0 {
		cu |= cuMemHostRegisterDeviceMap
	}
	if f&backend.HostRegisterIOMemory != 0 {
		cu |= cuMemHostRegisterIOMemory
	}
	if f&backend.HostRegisterReadOnly != 0 {
		cu |= cuMemHostRegisterReadOnly
	}
	return cu, true
}

// HostRegister implements backend.HostMemory (cuMemHostRegister_v2). p must
// be 4 KiB-aligned (R19).
func (d *Driver) HostRegister(p uintptr, size uint64, flags backend.HostRegisterFlags) error {
	const op = backend.OpHostRegister
	cu, ok := hostRegisterFlags(flags)
	switch {
	case p == 0 || p%4096 != 0:
		return invalid(op, "R19", "%#x is not 4 KiB-aligned", p)
	case size == 0:
		return invalid(op, "R19", "size 0")
	case !ok:
		return invalid(op, "R19", "unknown flags %#x", uint32(flags))
	}
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if rc := d.onDevice(0, func() cuResult { return d.lib.call(symMemHostRegister, p, uintptr(size), uintptr(cu)) }); rc != cuSuccess {
		return driverError(op, symMemHostRegister, rc)
	}
	d.regs[p] = size
	return nil
}

// HostGetDevicePointer implements backend.HostMemory
// (cuMemHostGetDevicePointer_v2).
func (d *Driver) HostGetDevicePointer(p uintptr) (uintptr, error) {
	const op = backend.OpHostDevicePointer
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	var dp uintptr
	rc := d.onDevice(0, func() cuResult {
		return d.lib.call(symMemHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), p, 0)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemHostGetDevicePointer, rc)
	}
	return dp, nil
}

// HostUnregister implements backend.HostMemory (cuMemHostUnregister).
func (d *Driver) HostUnregister(p uintptr) error {
	const op = backend.OpHostUnregister
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if _, ok := d.regs[p]; !ok {
		return invalid(op, "R19", "%#x is not registered", p)
	}
	if rc := d.onDevice(0, func() cuResult { return d.lib.call(symMemHostUnregister, p) }); rc != cuSuccess {
		return driverError(op, symMemHostUnregister, rc)
	}
	delete(d.regs, p)
	return nil
}
