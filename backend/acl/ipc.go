package acl

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Export makes the 64-bit shareable handle of h
// (aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, flags)).
// With backend.ShareDefault only processes whitelisted by SetPids may import
// it.
func (d *Driver) Export(h backend.Handle, flags backend.ShareFlags) (uint64, error) {
	const op = backend.OpExport
	if flags != backend.ShareDefault && flags != backend.ShareDisablePidValidation {
		return 0, invalid(op, "R15", "unknown share flags %#x", uint64(flags))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	hi, err := d.handle(op, h)
	if err != nil {
		return 0, err
	}
	var sh uint64
	if c := d.call(hi.dev, d.lib.export, uintptr(h), handleTypeNone, uintptr(flags), uintptr(unsafe.Pointer(&sh))); c != codeSuccess {
		return 0, driverError(op, "aclrtMemExportToShareableHandle", c)
	}
	d.exported[sh] = hi.size
	return sh, nil
}

// ExportedSize is the size of the handle this driver exported as
// shareable. ACL cannot tell an importer the size, so an exporter sends it
// along with the shareable handle (as torch_npu does), and the importer
// passes it to ImportSized.
func (d *Driver) ExportedSize(shareable uint64) (uint64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, ok := d.exported[shareable]
	return n, ok
}

// SetPids whitelists the processes (aclrtDeviceGetBareTgid pids) allowed to
// import shareable (aclrtMemSetPidToShareableHandle).
func (d *Driver) SetPids(shareable uint64, pids []int32) error {
	const op = backend.OpSetPids
	if len(pids) == 0 {
		return invalid(op, "R16", "no pid")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	if c := d.call(0, d.lib.setPids, uintptr(shareable), uintptr(unsafe.Pointer(&pids[0])), uintptr(len(pids))); c != codeSuccess {
		return driverError(op, "aclrtMemSetPidToShareableHandle", c)
	}
	return nil
}

// Import opens a shareable handle exported by another process on dev
// (aclrtMemImportFromShareableHandle). ACL does not report the handle's
// size: HandleProperties fails until the first Map, which learns it. Use
// ImportSized when the exporter sent the size.
func (d *Driver) Import(shareable uint64, dev int) (backend.Handle, error) {
	return d.ImportSized(shareable, dev, 0)
}

// ImportSized is Import of a handle whose size the exporter sent
// (ExportedSize); 0 means unknown.
func (d *Driver) ImportSized(shareable uint64, dev int, size uint64) (backend.Handle, error) {
	const op = backend.OpImport
	if !d.validDev(dev) {
		return 0, invalid(op, "R17", "device %d of %d", dev, len(d.phys))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var h uintptr
	if c := d.call(dev, d.lib.importShareable, uintptr(shareable), uintptr(d.phys[dev]), uintptr(unsafe.Pointer(&h))); c != codeSuccess {
		return 0, driverError(op, "aclrtMemImportFromShareableHandle", c)
	}
	bh := backend.Handle(h)
	d.handles[bh] = &handleInfo{size: size, prop: backend.DeviceProp(dev), dev: dev, refs: 1, imported: true}
	return bh, nil
}

// Pid is the calling process's id as ACL knows it (aclrtDeviceGetBareTgid:
// the host pid, also inside a container).
func (d *Driver) Pid() int32 { return d.pid }
