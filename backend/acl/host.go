package acl

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// MallocHost allocates pinned host memory (aclrtMallocHost).
func (d *Driver) MallocHost(size uint64) (uintptr, error) {
	const op = backend.OpMallocHost
	if size == 0 {
		return 0, invalid(op, "R18", "size must not be 0")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var p uintptr
	if c := d.call(0, d.lib.mallocHost, uintptr(unsafe.Pointer(&p)), uintptr(size)); c != codeSuccess {
		return 0, driverError(op, "aclrtMallocHost", c)
	}
	d.hosts[p] = &hostBlock{size: size}
	return p, nil
}

// FreeHost frees pinned host memory at once (aclrtFreeHost).
func (d *Driver) FreeHost(p uintptr) error { return d.freeHost(p, d.lib.freeHost, "aclrtFreeHost") }

// FreeHostWithDevSync frees pinned host memory once the device work using
// it has completed (aclrtFreeHostWithDevSync).
func (d *Driver) FreeHostWithDevSync(p uintptr) error {
	return d.freeHost(p, d.lib.freeHostWithDevSync, "aclrtFreeHostWithDevSync")
}

func (d *Driver) freeHost(p uintptr, fn uintptr, sym string) error {
	const op = backend.OpFreeHost
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	b, ok := d.hosts[p]
	if !ok {
		return invalid(op, "R18", "%#x is not the start of a MallocHost block", p)
	}
	if b.regs > 0 {
		return invalid(op, "R19", "block at %#x still has %d registered range(s); HostUnregister first", p, b.regs)
	}
	if c := d.call(0, fn, p); c != codeSuccess {
		return driverError(op, sym, c)
	}
	delete(d.hosts, p)
	return nil
}

// hostRegisterType translates backend flags to aclrtHostRegisterType.
func hostRegisterType(f backend.HostRegisterFlags) (uintptr, error) {
	const op = backend.OpHostRegister
	switch f {
	case backend.HostRegisterMapped:
		return hostRegMapped, nil
	case backend.HostRegisterIOMemory:
		return hostRegIOMem, nil
	case backend.HostRegisterReadOnly:
		return hostRegRdOnly, nil
	case backend.HostRegisterPinned:
		return 0, backend.Errorf(op, backend.ErrNotSupported, "R19", "aclrtHostRegister has no pin-only type")
	}
	return 0, invalid(op, "R19", "unknown host register flags %#x", uint32(f))
}

// HostRegister pins and maps an existing 4 KiB-aligned host range
// (aclrtHostRegister). The device address comes from HostGetDevicePointer.
func (d *Driver) HostRegister(p uintptr, size uint64, flags backend.HostRegisterFlags) error {
	const op = backend.OpHostRegister
	t, err := hostRegisterType(flags)
	if err != nil {
		return err
	}
	if p%4096 != 0 || size == 0 || uint64(p)+size < uint64(p) {
		return invalid(op, "R19", "range %#x+%d must start 4 KiB aligned, not be empty and not wrap the address space", p, size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	var dev uintptr
	if c := d.call(0, d.lib.hostRegister, p, uintptr(size), t, uintptr(unsafe.Pointer(&dev))); c != codeSuccess {
		return driverError(op, "aclrtHostRegister", c)
	}
	var block uintptr
	for a, b := range d.hosts { // a range inside a MallocHost block keeps it from being freed
		if a <= p && uint64(p-a) < b.size {
			block = a
			b.regs++
		}
	}
	d.regs[p] = hostRegister{size: size, block: block}
	return nil
}

// HostGetDevicePointer returns the device address of registered memory
// (aclrtHostGetDevicePointer).
func (d *Driver) HostGetDevicePointer(p uintptr) (uintptr, error) {
	const op = backend.OpHostDevicePointer
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var dev uintptr
	if c := d.call(0, d.lib.hostGetDevicePointer, p, uintptr(unsafe.Pointer(&dev)), 0); c != codeSuccess {
		return 0, driverError(op, "aclrtHostGetDevicePointer", c)
	}
	return dev, nil
}

// HostUnregister undoes HostRegister (aclrtHostUnregister).
func (d *Driver) HostUnregister(p uintptr) error {
	const op = backend.OpHostUnregister
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	r, ok := d.regs[p]
	if !ok {
		return invalid(op, "R19", "%#x is not a registered range", p)
	}
	if c := d.call(0, d.lib.hostUnregister, p); c != codeSuccess {
		return driverError(op, "aclrtHostUnregister", c)
	}
	delete(d.regs, p)
	if b, ok := d.hosts[r.block]; ok {
		b.regs--
	}
	return nil
}
