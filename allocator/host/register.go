package host

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Register pins [p, p+size), memory the program already owns (for
// example from mmap), for the device: HostRegister with flags
// HostRegisterMapped (pinned, with a device address: see DevicePointer) or
// HostRegisterPinned (pinned only). The seed rules are checked before the
// driver is called, each with its own error, and nothing changes on error:
//   - p must be nonzero and 4 KiB aligned (ErrMisaligned);
//   - size must be nonzero and the range must not wrap (ErrInvalidSize);
//   - flags must be MAPPED or PINNED; IOMEMORY and READONLY are reserved
//     by the driver and unsupported (ErrInvalidFlags);
//   - the range must not overlap a block of this allocator or another
//     registered range (ErrOverlap): a block already has a device address.
//
// The range stays registered until Unregister or Close.
func (a *Allocator) Register(p uintptr, size uint64, flags backend.HostRegisterFlags) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed { // before the arguments: after Close every call is ErrClosed
		return ErrClosed
	}
	switch {
	case p == 0 || p%pageSize != 0:
		return fmt.Errorf("%w: %#x", ErrMisaligned, p)
	case size == 0 || uint64(p)+size < uint64(p) || uint64(uintptr(uint64(p)+size)) != uint64(p)+size:
		return fmt.Errorf("%w: %d bytes at %#x", ErrInvalidSize, size, p)
	case flags != backend.HostRegisterMapped && flags != backend.HostRegisterPinned:
		return fmt.Errorf("%w: %#x (want HostRegisterMapped or HostRegisterPinned)", ErrInvalidFlags, uint32(flags))
	}
	end := p + uintptr(size)
	if a.overlaps(p, end) {
		return fmt.Errorf("%w: [%#x,%#x)", ErrOverlap, p, end)
	}
	if err := a.hm.HostRegister(p, size, flags); err != nil {
		return err
	}
	r := &registration{ptr: p, size: size, flags: flags}
	a.spans.ReplaceOrInsert(span{start: p, end: end, r: r})
	a.st.Registered.Add(1)
	a.st.RegisteredBytes.Add(int64(size))
	return nil
}

// Unregister undoes the Register made at p (HostUnregister). On error
// nothing changes.
func (a *Allocator) Unregister(p uintptr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	s, ok := a.spanAt(p)
	switch {
	case !ok:
		return fmt.Errorf("%w: %#x", ErrNotRegistered, p)
	case s.b != nil || s.c != nil:
		return fmt.Errorf("%w: %#x lies in a block of this allocator (use Free)", ErrNotRegistered, p)
	case s.start != p:
		return fmt.Errorf("%w: %#x is %d bytes into the range registered at %#x", ErrInteriorPointer, p, p-s.start, s.start)
	}
	return a.unregister(s.r)
}

// unregister undoes registration r. mu held.
func (a *Allocator) unregister(r *registration) error {
	if err := a.hm.HostUnregister(r.ptr); err != nil {
		return err
	}
	a.spans.Delete(span{start: r.ptr})
	a.st.Registered.Add(-1)
	a.st.RegisteredBytes.Add(-int64(r.size))
	return nil
}
