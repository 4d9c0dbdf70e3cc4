package emulated

import (
	"sort"

	"github.com/vmmalloc/vmmalloc/backend"
)

// granOf is the granularity of pages of attr, nbytes.
func (w *world) granOf(attr backend.PageAttr) uint64 {
	if attr == backend.PageHuge1G {
		return w.cfg.gran1G
	}
	return w.cfg.granularity
}

// checkProp enforces R2 on a physical-memory property.
func (e *Emulator) checkProp(op backend.Op, prop backend.PhysicalProp) error {
	switch prop.Attr {
	case backend.PageNormal, backend.PageHuge, backend.PageHuge1G:
	default:
		return e.fail(op, backend.ErrInvalidArgument, "R2", "unknown page attribute %v", prop.Attr)
	}
	switch prop.Location.Type {
	case backend.LocationDevice:
		if !e.w.checkDevice(prop.Location.ID) {
			return e.fail(op, backend.ErrInvalidArgument, "R2", "device %d out of range [0,%d)",
				prop.Location.ID, len(e.w.devs))
		}
	case backend.LocationHost:
		if prop.Location.ID != 0 {
			return e.fail(op, backend.ErrInvalidArgument, "R2", "host NUMA node %d out of range [0,1)",
				prop.Location.ID)
		}
		if prop.Attr == backend.PageHuge1G {
			return e.fail(op, backend.ErrInvalidArgument, "R2", "1 GiB pages are device memory only")
		}
	default:
		return e.fail(op, backend.ErrInvalidArgument, "R2", "unknown location type %v", prop.Location.Type)
	}
	if prop.Attr == backend.PageHuge1G && e.w.cfg.no1G {
		return e.fail(op, backend.ErrNotSupported, "R2", "1 GiB pages are not supported by this device")
	}
	return nil
}

// MemGetInfo reports free and total memory of dev in bytes: free is the
// capacity less the physical memory that exists on dev (freed-pending
// included) and the memory other tenants occupy.
func (e *Emulator) MemGetInfo(dev int) (free, total uint64, err error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := e.begin(backend.OpMemGetInfo); err != nil {
		return 0, 0, err
	}
	if !w.checkDevice(dev) {
		return 0, 0, e.fail(backend.OpMemGetInfo, backend.ErrInvalidArgument, "", "device %d out of range [0,%d)", dev, len(w.devs))
	}
	d := &w.devs[dev]
	e.charge(backend.OpMemGetInfo, 0)
	return d.free(), d.capacity, nil
}

// Granularity returns the granularity of prop; MINIMUM and RECOMMENDED are
// equal (R11).
func (e *Emulator) Granularity(prop backend.PhysicalProp, opt backend.GranularityOption) (uint64, error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpGranularity
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if opt != backend.GranularityMinimum && opt != backend.GranularityRecommended {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R11", "granularity option %d is neither MINIMUM nor RECOMMENDED", opt)
	}
	if err := e.checkProp(op, prop); err != nil {
		return 0, err
	}
	e.charge(op, 0)
	return w.granOf(prop.Attr), nil
}

// ReserveAddress reserves size bytes of address space (R4: size ≠ 0; the
// system picks the address).
func (e *Emulator) ReserveAddress(size uint64) (uintptr, error) {
	return e.reserve(size, 0)
}

// ReserveAddressAt is ReserveAddress with ACL's experimental expectPtr
// (R4): a nonzero expect must lie with the whole reservation in the
// 16 TiB–24 TiB window, be aligned to 1 GiB when size ≥ 1 GiB and otherwise
// to the smallest power of two ≥ size (and to the granularity), and be
// free. Zero expect means "system chooses", like ReserveAddress.
func (e *Emulator) ReserveAddressAt(size uint64, expect uintptr) (uintptr, error) {
	return e.reserve(size, uint64(expect))
}

func (e *Emulator) reserve(size, expect uint64) (uintptr, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpReserve
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R4", "size must not be 0")
	}
	g := w.cfg.granularity
	extent, ok := alignUp(size, g)
	if !ok || extent > maxVA {
		return 0, e.fail(op, backend.ErrOutOfMemory, "", "reservation of %d bytes exceeds the address space", size)
	}
	align := g
	if extent >= w.cfg.gran1G {
		align = w.cfg.gran1G
	}
	var va uint64
	if expect == 0 {
		v, err := w.back.reserve(extent, align)
		if err != nil {
			return 0, e.failBacking(op, err)
		}
		va = v
	} else {
		want := uint64(1) << 30
		if size < want {
			want = g
			for want < size {
				want <<= 1
			}
		}
		if expect < fixedVABase || expect >= fixedVALimit || fixedVALimit-expect < extent {
			return 0, e.fail(op, backend.ErrInvalidArgument, "R4",
				"expected address %#x (+%d bytes) is outside the 16 TiB–24 TiB window", expect, extent)
		}
		if expect%want != 0 {
			return 0, e.fail(op, backend.ErrInvalidArgument, "R4",
				"expected address %#x is not aligned to %#x", expect, want)
		}
		if p.res.overlaps(expect, expect+extent) {
			return 0, e.fail(op, backend.ErrInvalidArgument, "R4", "expected address %#x is occupied", expect)
		}
		if err := w.back.reserveAt(expect, extent); err != nil {
			if err == errOccupied {
				return 0, e.fail(op, backend.ErrInvalidArgument, "R4", "expected address %#x is occupied", expect)
			}
			return 0, e.failBacking(op, err)
		}
		va = expect
	}
	p.res.put(va, va+extent, &reservation{va: va, size: size, extent: extent})
	e.charge(op, 0)
	return uintptr(va), nil
}

// ReleaseAddress frees the reservation at va; size must be the size
// reserved and every mapping in it must be unmapped (R5).
func (e *Emulator) ReleaseAddress(va uintptr, size uint64) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpRelease
	if err := e.begin(op); err != nil {
		return err
	}
	a := uint64(va)
	x, ok := p.res.at(a)
	if !ok {
		if c, in := p.res.containing(a); in {
			return e.fail(op, backend.ErrInvalidArgument, "", "%#x is inside the reservation at %#x, not its start", a, c.start)
		}
		return e.fail(op, backend.ErrInvalidArgument, "", "no reservation at %#x", a)
	}
	r := x.v
	if size != r.size {
		return e.fail(op, backend.ErrInvalidArgument, "", "size %d differs from the reserved size %d", size, r.size)
	}
	if r.nmaps > 0 {
		return e.fail(op, backend.ErrInvalidArgument, "R5", "reservation at %#x still has %d mapping(s)", a, r.nmaps)
	}
	if err := w.back.release(r.va, r.extent); err != nil {
		return e.failBacking(op, err)
	}
	p.res.del(a)
	e.charge(op, 0)
	return nil
}

// CreatePhysical creates size bytes of physical memory (R1: size a nonzero
// multiple of the granularity; R2: a valid property).
func (e *Emulator) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpCreate
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if err := e.checkProp(op, prop); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R1", "size must not be 0")
	}
	if g := w.granOf(prop.Attr); size%g != 0 {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R1", "size %d is not a multiple of the granularity %d", size, g)
	}
	if prop.Location.Type == backend.LocationDevice {
		d := &w.devs[prop.Location.ID]
		if size > d.free() {
			return 0, e.fail(op, backend.ErrOutOfMemory, "", "device %d: %d bytes wanted, %d free", prop.Location.ID, size, d.free())
		}
	} else if size > w.cfg.hostCapacity-w.hostBytes {
		return 0, e.fail(op, backend.ErrOutOfMemory, "", "host: %d bytes wanted, %d free", size, w.cfg.hostCapacity-w.hostBytes)
	}
	fd, err := w.back.create(size)
	if err != nil {
		return 0, e.failBacking(op, err)
	}
	w.next.mem++
	m := &physMem{id: w.next.mem, loc: prop.Location, size: size, holders: 1, fd: fd}
	w.account(m, +1)
	w.next.handle++
	h := &handle{id: backend.Handle(w.next.handle), mem: m, prop: prop, size: size, refs: 1}
	p.handles[h.id] = h
	e.charge(op, size)
	return h.id, nil
}

// account adds (sign +1) or removes (−1) m from its location's usage.
func (w *world) account(m *physMem, sign int) {
	if m.loc.Type == backend.LocationDevice {
		if sign > 0 {
			w.devs[m.loc.ID].physical += m.size
		} else {
			w.devs[m.loc.ID].physical -= m.size
		}
		return
	}
	if sign > 0 {
		w.hostBytes += m.size
	} else {
		w.hostBytes -= m.size
	}
}

// lookup finds a live (not freed) handle of this process.
func (e *Emulator) lookup(op backend.Op, id backend.Handle) (*handle, error) {
	h, ok := e.p.handles[id]
	if !ok {
		return nil, e.fail(op, backend.ErrInvalidArgument, "", "unknown handle %d", id)
	}
	if h.refs == 0 {
		return nil, e.fail(op, backend.ErrInvalidArgument, "R3", "handle %d was freed; its memory is released when its %d mapping(s) are unmapped", id, h.mapped)
	}
	return h, nil
}

// FreePhysical drops one reference to h (R12). When the last goes, h is
// freed at once if unmapped, else it becomes freed-pending and its memory
// is released by the last Unmap (R3).
func (e *Emulator) FreePhysical(id backend.Handle) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpFree
	if err := e.begin(op); err != nil {
		return err
	}
	h, err := e.lookup(op, id)
	if err != nil {
		return err
	}
	if h.refs == 1 && h.mapped == 0 {
		w.dropHandle(p, h, true)
	} else {
		h.refs--
		if h.refs == 0 {
			w.unexport(h)
		}
	}
	e.charge(op, h.size)
	return nil
}

// unexport destroys the shareable handle h was exported as, if any.
func (w *world) unexport(h *handle) {
	if h.imported || h.mem.exp == nil || h.mem.exp.h != h {
		return
	}
	delete(w.exports, h.mem.exp.id)
	h.mem.exp = nil
	h.shareable = 0
}

// dropHandle removes h (freed and unmapped) from p's table; its memory is
// released when no process holds it any more. check records violations
// against pending work.
func (w *world) dropHandle(p *process, h *handle, check bool) {
	m := h.mem
	if m.holders == 1 {
		if m.fd >= 0 {
			w.back.free(m.fd)
			m.fd = -1
		}
		if check {
			w.checkFree(m)
		}
		w.account(m, -1)
	}
	m.holders--
	w.unexport(h)
	delete(p.handles, h.id)
	if h.imported {
		delete(p.imports, h.shareable)
	}
}

// Map maps the whole of h at va (R6: size is h's size, va a multiple of h's
// granularity inside one reservation, not overlapping a mapping; R7: the
// reservation's mappings share one location and are all local or all
// imported). The mapping is inaccessible until SetAccess (R8).
func (e *Emulator) Map(va uintptr, size uint64, id backend.Handle) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpMap
	if err := e.begin(op); err != nil {
		return err
	}
	h, err := e.lookup(op, id)
	if err != nil {
		return err
	}
	a := uint64(va)
	if size != h.size {
		return e.fail(op, backend.ErrInvalidArgument, "R6", "size %d differs from handle %d's size %d", size, id, h.size)
	}
	if g := w.granOf(h.prop.Attr); a%g != 0 {
		return e.fail(op, backend.ErrInvalidArgument, "R6", "address %#x is not a multiple of the granularity %#x", a, g)
	}
	end := a + size
	x, ok := p.res.containing(a)
	if !ok || end < a || end > x.v.va+x.v.size {
		return e.fail(op, backend.ErrInvalidArgument, "R6", "[%#x,%#x) is not inside one reservation", a, end)
	}
	r := x.v
	if p.maps.overlaps(a, end) {
		return e.fail(op, backend.ErrInvalidArgument, "R6", "[%#x,%#x) overlaps an existing mapping", a, end)
	}
	if r.nmaps > 0 {
		if r.boundLoc != h.prop.Location {
			return e.fail(op, backend.ErrInvalidArgument, "R7", "reservation at %#x holds %v %d memory, handle %d is %v %d",
				r.va, r.boundLoc.Type, r.boundLoc.ID, id, h.prop.Location.Type, h.prop.Location.ID)
		}
		if r.boundImported != h.imported {
			return e.fail(op, backend.ErrInvalidArgument, "R7", "reservation at %#x may not mix local and imported handles", r.va)
		}
	}
	if err := w.back.mapMem(a, size, h.mem.fd); err != nil {
		return e.failBacking(op, err)
	}
	p.maps.put(a, end, &mapping{va: a, size: size, h: h, res: r})
	if r.nmaps == 0 {
		r.boundLoc, r.boundImported = h.prop.Location, h.imported
	}
	r.nmaps++
	h.mapped++
	e.charge(op, size)
	return nil
}

// Unmap removes the mapping that starts at va; size must be its size (R9).
// The last unmap of a freed-pending handle frees it (R3).
func (e *Emulator) Unmap(va uintptr, size uint64) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpUnmap
	if err := e.begin(op); err != nil {
		return err
	}
	m, err := e.mappingAt(op, "R9", uint64(va))
	if err != nil {
		return err
	}
	if size != m.size {
		return e.fail(op, backend.ErrInvalidArgument, "R9", "size %d differs from the mapping's size %d", size, m.size)
	}
	h := m.h
	if err := w.back.unmap(m.va, m.size); err != nil {
		return e.failBacking(op, err)
	}
	w.checkUnmap(p, m)
	p.maps.del(m.va)
	m.res.nmaps--
	h.mapped--
	if h.refs == 0 && h.mapped == 0 {
		w.dropHandle(p, h, true)
	}
	e.charge(op, m.size)
	return nil
}

// mappingAt finds the mapping that starts exactly at a.
func (e *Emulator) mappingAt(op backend.Op, rule string, a uint64) (*mapping, error) {
	x, ok := e.p.maps.at(a)
	if ok {
		return x.v, nil
	}
	if c, in := e.p.maps.containing(a); in {
		return nil, e.fail(op, backend.ErrInvalidArgument, rule, "%#x is inside the mapping at %#x, not its start", a, c.start)
	}
	return nil, e.fail(op, backend.ErrInvalidArgument, rule, "no mapping at %#x", a)
}

// checkLocation validates an access location (R10).
func (e *Emulator) checkLocation(op backend.Op, loc backend.Location) (backend.Location, error) {
	switch loc.Type {
	case backend.LocationDevice:
		if !e.w.checkDevice(loc.ID) {
			return loc, e.fail(op, backend.ErrInvalidArgument, "R10", "device %d out of range [0,%d)", loc.ID, len(e.w.devs))
		}
		return loc, nil
	case backend.LocationHost:
		return backend.Location{Type: backend.LocationHost}, nil // the id of a host location is ignored
	}
	return loc, e.fail(op, backend.ErrInvalidArgument, "R10", "unknown location type %v", loc.Type)
}

// SetAccess sets the protection of exactly one mapping for each location in
// desc (R10). With real memory the host protection becomes the widest of
// all locations'.
func (e *Emulator) SetAccess(va uintptr, size uint64, desc []backend.AccessDesc) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpSetAccess
	if err := e.begin(op); err != nil {
		return err
	}
	m, err := e.mappingAt(op, "R10", uint64(va))
	if err != nil {
		return err
	}
	if size != m.size {
		return e.fail(op, backend.ErrInvalidArgument, "R10", "size %d differs from the mapping's size %d", size, m.size)
	}
	if len(desc) == 0 {
		return e.fail(op, backend.ErrInvalidArgument, "R10", "no access descriptors")
	}
	next := append([]backend.AccessDesc(nil), m.access...)
	for _, d := range desc {
		loc, err := e.checkLocation(op, d.Location)
		if err != nil {
			return err
		}
		switch d.Flags {
		case backend.AccessNone, backend.AccessRead, backend.AccessReadWrite:
		default:
			return e.fail(op, backend.ErrInvalidArgument, "R10", "unknown access flags %d", d.Flags)
		}
		next = setAccess(next, loc, d.Flags)
	}
	if err := w.back.protect(m.va, m.size, widest(next)); err != nil {
		return e.failBacking(op, err)
	}
	m.access = next
	e.charge(op, m.size)
	return nil
}

func locLess(a, b backend.Location) bool {
	if a.Type != b.Type {
		return a.Type < b.Type
	}
	return a.ID < b.ID
}

// setAccess sets loc's flags in the sorted list l; AccessNone removes it.
func setAccess(l []backend.AccessDesc, loc backend.Location, f backend.AccessFlags) []backend.AccessDesc {
	i := sort.Search(len(l), func(i int) bool { return !locLess(l[i].Location, loc) })
	if i < len(l) && l[i].Location == loc {
		if f == backend.AccessNone {
			return append(l[:i], l[i+1:]...)
		}
		l[i].Flags = f
		return l
	}
	if f == backend.AccessNone {
		return l
	}
	l = append(l, backend.AccessDesc{})
	copy(l[i+1:], l[i:])
	l[i] = backend.AccessDesc{Location: loc, Flags: f}
	return l
}

func widest(l []backend.AccessDesc) backend.AccessFlags {
	f := backend.AccessNone
	for _, d := range l {
		f |= d.Flags
	}
	return f
}

func accessOf(l []backend.AccessDesc, loc backend.Location) backend.AccessFlags {
	for _, d := range l {
		if d.Location == loc {
			return d.Flags
		}
	}
	return backend.AccessNone
}

// GetAccess reads loc's protection of the mapping containing va (R10).
func (e *Emulator) GetAccess(va uintptr, loc backend.Location) (backend.AccessFlags, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpGetAccess
	if err := e.begin(op); err != nil {
		return 0, err
	}
	loc, err := e.checkLocation(op, loc)
	if err != nil {
		return 0, err
	}
	x, ok := p.maps.containing(uint64(va))
	if !ok {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R10", "%#x is not mapped", uint64(va))
	}
	e.charge(op, 0)
	return accessOf(x.v.access, loc), nil
}

// AddressRange returns the base and size of the mapping, or MallocHost
// block, containing va (R14).
func (e *Emulator) AddressRange(va uintptr) (uintptr, uint64, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpAddressRange
	if err := e.begin(op); err != nil {
		return 0, 0, err
	}
	a := uint64(va)
	if x, ok := p.maps.containing(a); ok {
		e.charge(op, 0)
		return uintptr(x.start), x.v.size, nil
	}
	if x, ok := p.hosts.containing(a); ok {
		e.charge(op, 0)
		return uintptr(x.start), x.v.size, nil
	}
	return 0, 0, e.fail(op, backend.ErrInvalidArgument, "R14", "%#x is not in a mapping or host allocation", a)
}

// RetainHandle returns the handle mapped at va, which must be the mapping's
// start, and takes a reference that needs its own FreePhysical (R12). It
// revives a freed-pending handle.
func (e *Emulator) RetainHandle(va uintptr) (backend.Handle, error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpRetain
	if err := e.begin(op); err != nil {
		return 0, err
	}
	m, err := e.mappingAt(op, "R12", uint64(va))
	if err != nil {
		return 0, err
	}
	m.h.refs++
	e.charge(op, 0)
	return m.h.id, nil
}

// HandleProperties returns the property and size of h (R13).
func (e *Emulator) HandleProperties(id backend.Handle) (backend.PhysicalProp, uint64, error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpHandleProps
	if err := e.begin(op); err != nil {
		return backend.PhysicalProp{}, 0, err
	}
	h, err := e.lookup(op, id)
	if err != nil {
		return backend.PhysicalProp{}, 0, err
	}
	e.charge(op, 0)
	return h.prop, h.size, nil
}
