//go:build unix

package cuda

import (
	"os"
	"syscall"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// A shareable handle (backend.IPC's uint64) carries a POSIX file
// descriptor and the handle's size:
//
//	bits  0..31  the fd, in the process that holds it
//	bits 32..63  the size in units of ShareUnit bytes
//
// CUDA cannot report the size of an imported handle (PyTorch sends sizes
// beside its fds for the same reason), so the size travels in the
// shareable. An fd is a number valid only in its own process: the exporter
// passes the fd to the importer (SCM_RIGHTS, pidfd_getfd, or inheritance),
// and the importer rebuilds the shareable around its own fd number with
// Shareable(fd, size) before calling Import. Holding the fd is the access
// control: CUDA has no pid whitelist, so SetPids only checks its argument.
//
// Ownership of the fd is explicit:
//
//   - The exporting Driver owns the fd inside the shareable Export returns
//     and closes it when the handle's last reference is freed (or at
//     Close). BorrowedFD reads that number: a borrowed fd, good only while
//     the handle is exported and held, which the caller must never close or
//     wrap in an *os.File (whose finalizer would close it at some later
//     garbage collection, by then perhaps the fd of other memory).
//   - ShareableFile gives the exporter an fd of its own: a duplicate, as an
//     *os.File the caller closes when it likes (after handing it to a child
//     process, say), independent of the handle's life in the Driver.
//   - Import does not take the importer's fd: the driver keeps its own
//     reference to the memory, and the importer closes its fd when it likes.

// ShareUnit is the unit of the size field of a shareable handle.
const ShareUnit = 64 << 10

// Shareable builds a shareable handle from an fd of the calling process and
// the exported handle's size in bytes (a multiple of ShareUnit).
func Shareable(fd int, size uint64) uint64 {
	return size/ShareUnit<<32 | uint64(uint32(fd))
}

// BorrowedFD is the fd number inside a shareable handle. On the exporting
// side the fd belongs to the Driver that exported it, which closes it when
// the handle is freed: the number is borrowed, valid only while the handle
// is exported and held, for a call that copies it at once (SCM_RIGHTS,
// cmd.ExtraFiles through ShareableFile). Never close it, and never wrap it
// in an *os.File: use ShareableFile for an fd of one's own.
func BorrowedFD(sh uint64) int { return int(int32(uint32(sh))) }

// ShareableSize is the size in bytes a shareable handle carries.
func ShareableSize(sh uint64) uint64 { return sh >> 32 * ShareUnit }

func closeFD(fd int) error { return syscall.Close(fd) }

// ShareableFile returns a duplicate of the fd inside shareable handle sh,
// which d exported and still holds, as an *os.File the caller owns: the
// caller closes it (or lets its finalizer do so), and d's own fd is not
// affected. It stays open after d frees the handle. It fails with
// backend.ErrInvalidArgument when sh is not a live export of d (the handle
// was freed, and its fd number may name another file now).
func (d *Driver) ShareableFile(sh uint64) (*os.File, error) {
	const op = backend.OpExport
	if err := d.lockOpen(op); err != nil {
		return nil, err
	}
	defer d.mu.Unlock() // FreePhysical cannot close the fd while it is duplicated
	fd := BorrowedFD(sh)
	h, ok := d.exports[uint64(fd)]
	if !ok || fd < 0 {
		return nil, invalid(op, "", "%#x is not a live shareable handle of this process", sh)
	}
	if x := d.handles[h]; x == nil || ShareableSize(sh) != x.size {
		return nil, invalid(op, "", "%#x does not carry the size of handle %#x", sh, uint64(h))
	}
	dup, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return nil, backend.Errorf(op, backend.ErrOutOfMemory, "", "duplicating fd %d: %v", fd, errno)
	}
	return os.NewFile(dup, "cuda-shareable"), nil
}

// fileID names the open file behind an fd (st_dev, st_ino): the same
// memory imported through two fds of one file is one import (R15).
type fileID struct{ dev, ino uint64 }

// Export implements backend.IPC (cuMemExportToShareableHandle, POSIX fd).
// Each handle is exported at most once (R15).
func (d *Driver) Export(h backend.Handle, flags backend.ShareFlags) (uint64, error) {
	const op = backend.OpExport
	if flags != backend.ShareDefault && flags != backend.ShareDisablePidValidation {
		return 0, invalid(op, "R15", "unknown share flags %#x", uint64(flags))
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	x := d.handles[h]
	switch {
	case x == nil:
		return 0, invalid(op, "", "unknown handle %#x", uint64(h))
	case x.imported:
		return 0, invalid(op, "R15", "handle %#x was imported", uint64(h))
	case x.exported >= 0:
		return 0, invalid(op, "R15", "handle %#x is already exported", uint64(h))
	case !d.devs[x.prop.Location.ID].posixFDs:
		return 0, backend.Errorf(op, backend.ErrNotSupported, "", "device %d cannot export POSIX file descriptors", x.prop.Location.ID)
	case x.size%ShareUnit != 0 || x.size/ShareUnit > 1<<32-1:
		return 0, backend.Errorf(op, backend.ErrNotSupported, "", "size %d cannot travel in a shareable handle", x.size)
	}
	var fd int32 = -1
	rc := d.onDevice(x.prop.Location.ID, func() cuResult {
		return d.lib.call(symMemExportToShareableHandle, uintptr(unsafe.Pointer(&fd)), uintptr(h), cuMemHandleTypePosixFD, 0)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemExportToShareableHandle, rc)
	}
	x.exported = int(fd)
	sh := Shareable(int(fd), x.size)
	d.exports[uint64(fd)] = h
	return sh, nil
}

// SetPids implements backend.IPC. CUDA has no importer whitelist: passing
// the fd is what grants access, so this only checks that shareable is one
// of this Driver's exports.
func (d *Driver) SetPids(shareable uint64, pids []int32) error {
	const op = backend.OpSetPids
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if _, ok := d.exports[uint64(BorrowedFD(shareable))]; !ok {
		return invalid(op, "R16", "%#x is not a shareable handle of this process", shareable)
	}
	return nil
}

// Import implements backend.IPC (cuMemImportFromShareableHandle). The fd in
// shareable must be open in this process and not be one this Driver
// exported (R17); dev must be the device the memory lives on.
func (d *Driver) Import(shareable uint64, dev int) (backend.Handle, error) {
	const op = backend.OpImport
	fd, size := BorrowedFD(shareable), ShareableSize(shareable)
	if !d.validDevice(dev) {
		return 0, invalid(op, "R17", "device %d out of range [0,%d)", dev, len(d.devs))
	}
	if fd < 0 || size == 0 || size%d.devs[dev].gran != 0 {
		return 0, invalid(op, "R17", "shareable %#x: fd %d, size %d is not a valid handle", shareable, fd, size)
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if _, ok := d.exports[uint64(fd)]; ok {
		return 0, invalid(op, "R17", "fd %d was exported by this process; import works only in another process", fd)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, invalid(op, "R17", "fd %d: %v", fd, err)
	}
	key := fileID{uint64(st.Dev), uint64(st.Ino)}
	if prev, ok := d.imports[key]; ok {
		return 0, invalid(op, "R15", "the memory of fd %d is already imported as handle %#x", fd, uint64(prev))
	}
	var h uint64
	var p cuMemAllocationProp
	failed := symMemImportFromShareableHandle
	rc := d.onDevice(dev, func() cuResult {
		if rc := d.lib.call(symMemImportFromShareableHandle, uintptr(unsafe.Pointer(&h)), uintptr(fd), cuMemHandleTypePosixFD); rc != cuSuccess {
			return rc
		}
		if rc := d.lib.call(symMemGetAllocationPropertiesFromHandle, uintptr(unsafe.Pointer(&p)), uintptr(h)); rc != cuSuccess {
			failed = symMemGetAllocationPropertiesFromHandle
			d.lib.call(symMemRelease, uintptr(h)) // give the reference back
			return rc
		}
		return cuSuccess
	})
	if rc != cuSuccess {
		return 0, driverError(op, failed, rc)
	}
	id := backend.Handle(h)
	if x := d.handles[id]; x != nil && x.imported {
		// The driver gives the same handle for the same memory: one import
		// per process (R15). Drop the reference just taken.
		d.onDevice(dev, func() cuResult { return d.lib.call(symMemRelease, uintptr(h)) })
		return 0, invalid(op, "R15", "shareable %#x is already imported as handle %#x", shareable, h)
	}
	if int(p.Location.ID) != d.devs[dev].ordinal {
		d.onDevice(dev, func() cuResult { return d.lib.call(symMemRelease, uintptr(h)) })
		return 0, invalid(op, "R17", "the memory lives on physical device %d, not on device %d", p.Location.ID, dev)
	}
	d.handles[id] = &handle{id: id, size: size, prop: backend.DeviceProp(dev), refs: 1, imported: true, exported: -1, file: key}
	d.imports[key] = id
	return id, nil
}

// Pid implements backend.IPC: the calling process's id.
func (d *Driver) Pid() int32 { return int32(syscall.Getpid()) }
