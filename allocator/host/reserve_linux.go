package host

import "syscall"

// canReserve reports whether expandable segments can reserve address space
// here: Linux's mmap(PROT_NONE, MAP_NORESERVE), mprotect and madvise.
const canReserve = true

// reserveVA reserves n bytes of address space with no access and no
// commit charge (MAP_NORESERVE): nothing is backed until commitVA.
func reserveVA(n uint64) (uintptr, error) {
	p, _, e := syscall.Syscall6(syscall.SYS_MMAP, 0, uintptr(n), syscall.PROT_NONE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE, ^uintptr(0), 0)
	if e != 0 {
		return 0, e
	}
	return p, nil
}

// commitVA makes [p, p+n) of a reservation readable and writable; its pages
// are zero-filled on first touch.
func commitVA(p uintptr, n uint64) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MPROTECT, p, uintptr(n), syscall.PROT_READ|syscall.PROT_WRITE); e != 0 {
		return e
	}
	return nil
}

// decommitVA gives the pages of [p, p+n) back to the operating system
// (MADV_DONTNEED) and removes access, leaving the range reserved.
func decommitVA(p uintptr, n uint64) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, p, uintptr(n), syscall.MADV_DONTNEED); e != 0 {
		return e
	}
	if _, _, e := syscall.Syscall(syscall.SYS_MPROTECT, p, uintptr(n), syscall.PROT_NONE); e != 0 {
		return e
	}
	return nil
}

// unreserveVA gives a reservation back (munmap).
func unreserveVA(p uintptr, n uint64) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MUNMAP, p, uintptr(n), 0); e != 0 {
		return e
	}
	return nil
}
