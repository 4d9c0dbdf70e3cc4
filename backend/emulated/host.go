package emulated

import (
	"github.com/vmmalloc/vmmalloc/backend"
)

// ACL codes of HostRegister / HostUnregister failures.
const (
	codeHostRegistered   = 507910 // host memory already registered
	codeHostUnregistered = 507911 // host memory not registered
)

// MallocHost allocates size bytes of pinned host memory (R18: size ≠ 0).
// The block is 4 KiB aligned (so at least 64-byte aligned, and usable by
// HostRegister) and not initialised.
func (e *Emulator) MallocHost(size uint64) (uintptr, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpMallocHost
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R18", "size must not be 0")
	}
	extent, ok := alignUp(size, w.back.pageSize())
	if !ok || extent > w.cfg.hostCapacity-w.hostBytes {
		return 0, e.fail(op, backend.ErrOutOfMemory, "", "host: %d bytes wanted, %d free", size, w.cfg.hostCapacity-w.hostBytes)
	}
	a, err := w.back.mallocHost(extent)
	if err != nil {
		return 0, e.failBacking(op, err)
	}
	p.hosts.put(a, a+size, &hostAlloc{p: a, size: size, extent: extent})
	w.hostBytes += extent
	e.charge(op, size)
	return uintptr(a), nil
}

// FreeHost frees pinned host memory at once, without waiting for device
// work (R18); freeing memory pending work still touches is recorded as a
// Violation. Registered ranges inside the block must be unregistered first.
func (e *Emulator) FreeHost(ptr uintptr) error { return e.freeHost(ptr, false) }

// FreeHostWithDevSync completes the pending device work that touches the
// block, then frees it (R18).
func (e *Emulator) FreeHostWithDevSync(ptr uintptr) error { return e.freeHost(ptr, true) }

func (e *Emulator) freeHost(ptr uintptr, sync bool) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpFreeHost
	if err := e.begin(op); err != nil {
		return err
	}
	a := uint64(ptr)
	x, ok := p.hosts.at(a)
	if !ok {
		return e.fail(op, backend.ErrInvalidArgument, "R18", "%#x is not the start of a MallocHost block", a)
	}
	b := x.v
	if b.regs > 0 {
		return e.fail(op, backend.ErrInvalidArgument, "R19", "block at %#x still has %d registered range(s); HostUnregister first", a, b.regs)
	}
	if err := w.back.freeHost(b.p, b.extent); err != nil {
		return e.failBacking(op, err)
	}
	if sync {
		for _, s := range w.busyStreams() {
			for i := len(s.queue) - 1; i >= 0; i-- {
				if s.queue[i].host == b {
					w.completeTo(s, s.queue[i].seq)
					break
				}
			}
		}
	} else {
		w.checkFreeHost(b)
	}
	p.hosts.del(a)
	w.hostBytes -= b.extent
	e.charge(op, b.size)
	return nil
}

// HostRegister registers [ptr, ptr+size) for the device (R19): ptr must be
// 4 KiB aligned, size nonzero, the range not already registered.
// HostRegisterMapped gives it a device address (HostGetDevicePointer),
// HostRegisterPinned only pins it; IOMemory and ReadOnly are unsupported.
// The memory itself is never touched.
func (e *Emulator) HostRegister(ptr uintptr, size uint64, flags backend.HostRegisterFlags) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpHostRegister
	if err := e.begin(op); err != nil {
		return err
	}
	switch {
	case flags&(backend.HostRegisterIOMemory|backend.HostRegisterReadOnly) != 0:
		return e.fail(op, backend.ErrNotSupported, "R19", "IOMEMORY and READONLY registration are reserved and unsupported (flags %#x)", uint32(flags))
	case flags != backend.HostRegisterMapped && flags != backend.HostRegisterPinned:
		return e.fail(op, backend.ErrInvalidArgument, "R19", "unknown flags %#x", uint32(flags))
	}
	a := uint64(ptr)
	if a == 0 || a%hostAlign != 0 {
		return e.fail(op, backend.ErrInvalidArgument, "R19", "address %#x is not 4 KiB aligned", a)
	}
	end := a + size
	if size == 0 || end < a {
		return e.fail(op, backend.ErrInvalidArgument, "R19", "bad size %d", size)
	}
	if p.regs.overlaps(a, end) {
		return e.failCode(op, backend.ErrInvalidArgument, codeHostRegistered, "R19", "[%#x,%#x) overlaps registered host memory", a, end)
	}
	r := &hostReg{p: a, size: size, flags: flags}
	if x, ok := p.hosts.containing(a); ok && end <= x.end {
		r.alloc = x.v
	}
	if flags == backend.HostRegisterMapped {
		extent, _ := alignUp(size, hostAlign)
		d, ok := w.devPtrs.alloc(extent, hostAlign)
		if !ok {
			return e.fail(op, backend.ErrOutOfMemory, "", "device address window for host memory exhausted")
		}
		r.dev = d
		p.devRegs.put(d, d+size, r)
	}
	if r.alloc != nil {
		r.alloc.regs++
	}
	p.regs.put(a, end, r)
	e.charge(op, size)
	return nil
}

// HostGetDevicePointer returns the device address of registered host
// memory at ptr (R19); the range must have been registered as mapped.
func (e *Emulator) HostGetDevicePointer(ptr uintptr) (uintptr, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpHostDevicePointer
	if err := e.begin(op); err != nil {
		return 0, err
	}
	a := uint64(ptr)
	x, ok := p.regs.containing(a)
	if !ok {
		return 0, e.failCode(op, backend.ErrInvalidArgument, codeHostUnregistered, "R19", "%#x is not registered", a)
	}
	if x.v.dev == 0 {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R19", "%#x was registered pinned-only, without a device mapping", a)
	}
	e.charge(op, 0)
	return uintptr(x.v.dev + (a - x.start)), nil
}

// HostUnregister undoes the HostRegister made at ptr (R19).
func (e *Emulator) HostUnregister(ptr uintptr) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpHostUnregister
	if err := e.begin(op); err != nil {
		return err
	}
	x, ok := p.regs.at(uint64(ptr))
	if !ok {
		return e.failCode(op, backend.ErrInvalidArgument, codeHostUnregistered, "R19", "%#x is not the start of a registered range", uint64(ptr))
	}
	w.unregister(p, x.v)
	e.charge(op, 0)
	return nil
}

// unregister removes registration r of p.
func (w *world) unregister(p *process, r *hostReg) {
	if r.dev != 0 {
		extent, _ := alignUp(r.size, hostAlign)
		w.devPtrs.release(r.dev, extent)
		p.devRegs.del(r.dev)
	}
	if r.alloc != nil {
		r.alloc.regs--
	}
	p.regs.del(r.p)
}
