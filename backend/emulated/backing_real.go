//go:build linux && (amd64 || arm64 || riscv64 || loong64 || ppc64le)

package emulated

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmmalloc/vmmalloc/backend"
)

// realBacking maps real memory: reservations are PROT_NONE anonymous
// regions, physical memory is a memfd, a mapping is a MAP_SHARED|MAP_FIXED
// view of the memfd. Addresses are chosen by the kernel.
type realBacking struct {
	page uint64 // host page size, nbytes
}

func newReal(cfg *config) (backing, error) {
	page := uint64(os.Getpagesize())
	if cfg.granularity%page != 0 {
		return nil, backingErrorf(backend.ErrInvalidArgument,
			"granularity %d is not a multiple of the page size %d", cfg.granularity, page)
	}
	return &realBacking{page: page}, nil
}

const anonNone = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE

func mmap(addr, length uint64, prot, flags, fd int) (uint64, error) {
	r, _, e := unix.Syscall6(unix.SYS_MMAP, uintptr(addr), uintptr(length), uintptr(prot),
		uintptr(flags), uintptr(fd), 0)
	if e != 0 {
		return 0, e
	}
	return uint64(r), nil
}

func munmap(addr, length uint64) error {
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(addr), uintptr(length), 0); e != 0 {
		return e
	}
	return nil
}

func sysErr(what string, err error) error {
	kind := backend.ErrUnavailable
	switch {
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EMFILE),
		errors.Is(err, unix.ENFILE):
		kind = backend.ErrOutOfMemory
	case errors.Is(err, unix.EINVAL):
		kind = backend.ErrInvalidArgument
	}
	return backingErrorf(kind, "%s: %v", what, err)
}

func (r *realBacking) reserve(extent, align uint64) (uint64, error) {
	if align < r.page {
		align = r.page
	}
	over := extent + align
	if over < extent {
		return 0, backingErrorf(backend.ErrOutOfMemory, "reservation of %d bytes too large", extent)
	}
	p, err := mmap(0, over, unix.PROT_NONE, anonNone, -1)
	if err != nil {
		return 0, sysErr("mmap reservation", err)
	}
	start, _ := alignUp(p, align)
	if start > p {
		_ = munmap(p, start-p)
	}
	if end := start + extent; end < p+over {
		_ = munmap(end, p+over-end)
	}
	return start, nil
}

func (r *realBacking) reserveAt(va, extent uint64) error {
	p, err := mmap(va, extent, unix.PROT_NONE, anonNone|unix.MAP_FIXED_NOREPLACE, -1)
	if errors.Is(err, unix.EEXIST) {
		return errOccupied
	}
	if err != nil {
		return sysErr("mmap fixed reservation", err)
	}
	if p != va { // kernels before 4.17 treat the address as a hint
		_ = munmap(p, extent)
		return errOccupied
	}
	return nil
}

func (r *realBacking) release(va, extent uint64) error {
	if err := munmap(va, extent); err != nil {
		return sysErr("munmap reservation", err)
	}
	return nil
}

func (r *realBacking) create(size uint64) (int, error) {
	fd, err := unix.MemfdCreate("vmmalloc-emulated", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, sysErr("memfd_create", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return -1, sysErr("ftruncate memfd", err)
	}
	return fd, nil
}

func (r *realBacking) free(id int) { _ = unix.Close(id) }

func (r *realBacking) mapMem(va, size uint64, id int) error {
	if _, err := mmap(va, size, unix.PROT_NONE, unix.MAP_SHARED|unix.MAP_FIXED, id); err != nil {
		return sysErr("mmap memfd", err)
	}
	return nil
}

func (r *realBacking) unmap(va, size uint64) error {
	if _, err := mmap(va, size, unix.PROT_NONE, anonNone|unix.MAP_FIXED, -1); err != nil {
		return sysErr("mmap over mapping", err)
	}
	return nil
}

func (r *realBacking) protect(va, size uint64, flags backend.AccessFlags) error {
	prot := unix.PROT_NONE
	switch flags {
	case backend.AccessRead:
		prot = unix.PROT_READ
	case backend.AccessReadWrite:
		prot = unix.PROT_READ | unix.PROT_WRITE
	}
	if _, _, e := unix.Syscall(unix.SYS_MPROTECT, uintptr(va), uintptr(size), uintptr(prot)); e != 0 {
		return sysErr("mprotect", e)
	}
	return nil
}

func (r *realBacking) mallocHost(extent uint64) (uint64, error) {
	p, err := mmap(0, extent, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, -1)
	if err != nil {
		return 0, sysErr("mmap host memory", err)
	}
	return p, nil
}

func (r *realBacking) freeHost(p, extent uint64) error {
	if err := munmap(p, extent); err != nil {
		return sysErr("munmap host memory", err)
	}
	return nil
}

func (r *realBacking) bytes(va, size uint64) []byte {
	a := uintptr(va)
	// Reinterpret the address without a uintptr→unsafe.Pointer conversion:
	// the memory is not Go's, so the GC never looks at it.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&a))
	return unsafe.Slice((*byte)(p), size)
}

func (r *realBacking) pageSize() uint64 {
	if r.page < hostAlign {
		return hostAlign
	}
	return r.page
}
