//go:build unix

package host

import "syscall"

// canMapAnonymous reports whether UseHostRegister can get memory from the
// operating system.
const canMapAnonymous = true

// mapAnonymous maps n bytes of zeroed, page-aligned private memory.
func mapAnonymous(n uint64) ([]byte, error) {
	return syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
}

// unmapAnonymous undoes mapAnonymous.
func unmapAnonymous(b []byte) error { return syscall.Munmap(b) }
