//go:build linux

package conformance

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// pageable is n bytes of ordinary, page-aligned host memory the suite owns:
// what a user hands to HostRegister. Registering memory that MallocHost
// returned is backend-specific (CUDA refuses it, CUDA_ERROR_INVALID_VALUE
// as measured on an H200; ACL accepts it), so the suite registers this.
type pageable struct{ b []byte }

func newPageable(n int) (*pageable, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	return &pageable{b: b}, nil
}

// addr is the first byte's address; mmap returns page-aligned memory.
func (p *pageable) addr() uintptr { return uintptr(unsafe.Pointer(&p.b[0])) }

// unmap gives the memory back to the OS; the suite calls it after
// HostUnregister.
func (p *pageable) unmap() error { return unix.Munmap(p.b) }
