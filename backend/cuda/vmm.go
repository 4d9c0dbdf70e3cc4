//go:build unix

package cuda

import (
	"sort"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// reservation is a range of address space from cuMemAddressReserve.
type reservation struct {
	va   uintptr
	size uint64 // nbytes
	maps int    // live mappings inside; guarded by Driver.mu
	dev  int    // device of those mappings (R7); meaningful while maps > 0
	imp  bool   // those mappings are of imported handles (R7)
}

// mapping is one cuMemMap of a whole handle.
type mapping struct {
	va     uintptr
	h      *handle
	res    *reservation
	access []backend.AccessFlags // per visible device, as last set; starts AccessNone (R8)
}

// handle is the binding's record of a physical handle: what the driver does
// not report (its size, the backend prop it was made with) and the
// references the caller holds.
type handle struct {
	id       backend.Handle
	size     uint64 // nbytes; cuMemGetAllocationPropertiesFromHandle has no size
	prop     backend.PhysicalProp
	refs     int    // creation/import + retains not yet freed; 0: released
	maps     int    // live mappings
	imported bool   // from Import
	file     fileID // for an imported handle, the file it came from
	exported int    // fd from Export, or -1
}

// findRes returns the reservation holding [va, va+size), or nil.
func (d *Driver) findRes(va uintptr, size uint64) *reservation {
	i := sort.Search(len(d.res), func(i int) bool { return d.res[i].va > va }) - 1
	if i < 0 {
		return nil
	}
	r := d.res[i]
	if off := uint64(va - r.va); off <= r.size && size <= r.size-off {
		return r
	}
	return nil
}

// mappingAt returns the index of the mapping containing va, or -1.
func (d *Driver) mappingAt(va uintptr) int {
	i := sort.Search(len(d.maps), func(i int) bool { return d.maps[i].va > va }) - 1
	if i >= 0 && uint64(va-d.maps[i].va) < d.maps[i].h.size {
		return i
	}
	return -1
}

// overlaps reports whether [va, va+size) overlaps a mapping.
func (d *Driver) overlaps(va uintptr, size uint64) bool {
	i := sort.Search(len(d.maps), func(i int) bool { return d.maps[i].va >= va+uintptr(size) })
	return i > 0 && d.maps[i-1].va+uintptr(d.maps[i-1].h.size) > va
}

// ReserveAddress implements backend.Driver (cuMemAddressReserve, aligned to
// the minimum granularity of device 0, address chosen by the driver).
func (d *Driver) ReserveAddress(size uint64) (uintptr, error) {
	const op = backend.OpReserve
	g := d.devs[0].gran
	if size == 0 || size%g != 0 {
		return 0, invalid(op, "R4", "size %d is not a positive multiple of the granularity %d", size, g)
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	var va uintptr
	rc := d.onDevice(0, func() cuResult {
		return d.lib.call(symMemAddressReserve, uintptr(unsafe.Pointer(&va)), uintptr(size), uintptr(g), 0, 0)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemAddressReserve, rc)
	}
	if uint64(va)%g != 0 { // not expected of any driver; never hand it out
		d.onDevice(0, func() cuResult { return d.lib.call(symMemAddressFree, va, uintptr(size)) })
		return 0, backend.Errorf(op, backend.ErrUnavailable, "R4", "driver returned %#x, not aligned to %d", va, g)
	}
	r := &reservation{va: va, size: size}
	i := sort.Search(len(d.res), func(i int) bool { return d.res[i].va > va })
	d.res = append(d.res, nil)
	copy(d.res[i+1:], d.res[i:])
	d.res[i] = r
	return va, nil
}

// ReleaseAddress implements backend.Driver (cuMemAddressFree). The range must
// be exactly one reservation with nothing mapped in it (R5).
func (d *Driver) ReleaseAddress(va uintptr, size uint64) error {
	const op = backend.OpRelease
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	i := sort.Search(len(d.res), func(i int) bool { return d.res[i].va >= va })
	if i == len(d.res) || d.res[i].va != va || d.res[i].size != size {
		return invalid(op, "", "%#x+%d is not a reservation", va, size)
	}
	r := d.res[i]
	if r.maps > 0 {
		return invalid(op, "R5", "reservation %#x+%d still holds %d mappings", va, size, r.maps)
	}
	rc := d.onDevice(0, func() cuResult { return d.lib.call(symMemAddressFree, va, uintptr(size)) })
	if rc != cuSuccess {
		return driverError(op, symMemAddressFree, rc)
	}
	d.res = append(d.res[:i], d.res[i+1:]...)
	return nil
}

// CreatePhysical implements backend.Driver (cuMemCreate, pinned device
// memory, exportable as a POSIX fd where the device supports it).
func (d *Driver) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	const op = backend.OpCreate
	dev, err := d.checkProp(op, prop)
	if err != nil {
		return 0, err
	}
	dv := &d.devs[dev]
	if size == 0 || size%dv.gran != 0 {
		return 0, invalid(op, "R1", "size %d is not a positive multiple of the granularity %d", size, dv.gran)
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	p := dv.allocProp()
	var h uint64
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symMemCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&p)), 0)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemCreate, rc)
	}
	id := backend.Handle(h)
	d.handles[id] = &handle{id: id, size: size, prop: prop, refs: 1, exported: -1}
	return id, nil
}

// FreePhysical implements backend.Driver (cuMemRelease). The driver keeps
// the memory of a handle still mapped until its last unmap (R3).
func (d *Driver) FreePhysical(h backend.Handle) error {
	const op = backend.OpFree
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	x := d.handles[h]
	if x == nil {
		return invalid(op, "", "unknown handle %#x", uint64(h))
	}
	rc := d.onDevice(x.prop.Location.ID, func() cuResult { return d.lib.call(symMemRelease, uintptr(h)) })
	if rc != cuSuccess {
		return driverError(op, symMemRelease, rc)
	}
	x.refs--
	if x.refs == 0 {
		delete(d.handles, h)
		if x.imported {
			delete(d.imports, x.file)
		}
		if x.exported >= 0 {
			delete(d.exports, uint64(x.exported))
			_ = closeFD(x.exported)
			x.exported = -1
		}
	}
	return nil
}

// Map implements backend.Driver: cuMemMap of the whole handle at offset 0,
// inside one reservation, overlapping no mapping, one device per
// reservation (R6, R7). The mapping is inaccessible until SetAccess.
func (d *Driver) Map(va uintptr, size uint64, h backend.Handle) error {
	const op = backend.OpMap
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	x := d.handles[h]
	if x == nil {
		return invalid(op, "", "unknown handle %#x", uint64(h))
	}
	dev := x.prop.Location.ID
	switch r := d.findRes(va, size); {
	case size != x.size:
		return invalid(op, "R6", "size %d is not the handle's size %d", size, x.size)
	case uint64(va)%d.devs[dev].gran != 0:
		return invalid(op, "R6", "%#x is not aligned to the granularity %d", va, d.devs[dev].gran)
	case r == nil:
		return invalid(op, "R6", "%#x+%d is not inside one reservation", va, size)
	case d.overlaps(va, size):
		return invalid(op, "", "%#x+%d overlaps a mapping", va, size)
	case r.maps > 0 && (r.dev != dev || r.imp != x.imported):
		return invalid(op, "R7", "the reservation already maps memory of device %d (imported %v)", r.dev, r.imp)
	default:
		rc := d.onDevice(dev, func() cuResult { return d.lib.call(symMemMap, va, uintptr(size), 0, uintptr(h), 0) })
		if rc != cuSuccess {
			return driverError(op, symMemMap, rc)
		}
		r.maps++
		r.dev, r.imp = dev, x.imported
		x.maps++
		m := &mapping{va: va, h: x, res: r, access: make([]backend.AccessFlags, len(d.devs))}
		i := sort.Search(len(d.maps), func(i int) bool { return d.maps[i].va > va })
		d.maps = append(d.maps, nil)
		copy(d.maps[i+1:], d.maps[i:])
		d.maps[i] = m
		return nil
	}
}

// Unmap implements backend.Driver (cuMemUnmap of exactly one mapping, R9).
func (d *Driver) Unmap(va uintptr, size uint64) error {
	const op = backend.OpUnmap
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	i := d.mappingAt(va)
	if i < 0 || d.maps[i].va != va {
		return invalid(op, "R9", "no mapping starts at %#x", va)
	}
	m := d.maps[i]
	if m.h.size != size {
		return invalid(op, "R9", "size %d is not the mapping's size %d", size, m.h.size)
	}
	rc := d.onDevice(m.h.prop.Location.ID, func() cuResult { return d.lib.call(symMemUnmap, va, uintptr(size)) })
	if rc != cuSuccess {
		return driverError(op, symMemUnmap, rc)
	}
	d.maps = append(d.maps[:i], d.maps[i+1:]...)
	m.res.maps--
	m.h.maps--
	return nil
}

// SetAccess implements backend.Driver (cuMemSetAccess on exactly one
// mapping, R10).
func (d *Driver) SetAccess(va uintptr, size uint64, desc []backend.AccessDesc) error {
	const op = backend.OpSetAccess
	if len(desc) == 0 {
		return invalid(op, "R10", "no access descriptor")
	}
	cd := make([]cuMemAccessDesc, len(desc))
	for i, a := range desc {
		if a.Location.Type != backend.LocationDevice || !d.validDevice(a.Location.ID) {
			return invalid(op, "R10", "location %v %d is not a visible device", a.Location.Type, a.Location.ID)
		}
		if a.Flags != backend.AccessNone && a.Flags != backend.AccessRead && a.Flags != backend.AccessReadWrite {
			return invalid(op, "R10", "unknown access flags %d", int(a.Flags))
		}
		cd[i] = cuMemAccessDesc{Location: cuMemLocation{Type: cuMemLocationTypeDevice, ID: int32(d.devs[a.Location.ID].ordinal)}, Flags: int32(a.Flags)}
	}
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	i := d.mappingAt(va)
	if i < 0 || d.maps[i].va != va || d.maps[i].h.size != size {
		return invalid(op, "R10", "%#x+%d is not one mapping", va, size)
	}
	dev := d.maps[i].h.prop.Location.ID
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symMemSetAccess, va, uintptr(size), uintptr(unsafe.Pointer(&cd[0])), uintptr(len(cd)))
	})
	if rc != cuSuccess {
		return driverError(op, symMemSetAccess, rc)
	}
	for _, a := range desc {
		d.maps[i].access[a.Location.ID] = a.Flags
	}
	return nil
}

// GetAccess implements backend.Driver (cuMemGetAccess).
func (d *Driver) GetAccess(va uintptr, loc backend.Location) (backend.AccessFlags, error) {
	const op = backend.OpGetAccess
	if loc.Type != backend.LocationDevice || !d.validDevice(loc.ID) {
		return 0, invalid(op, "R10", "location %v %d is not a visible device", loc.Type, loc.ID)
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	i := d.mappingAt(va)
	if i < 0 {
		return 0, invalid(op, "R10", "%#x is not mapped", va)
	}
	cl := cuMemLocation{Type: cuMemLocationTypeDevice, ID: int32(d.devs[loc.ID].ordinal)}
	var flags uint64
	rc := d.onDevice(d.maps[i].h.prop.Location.ID, func() cuResult {
		return d.lib.call(symMemGetAccess, uintptr(unsafe.Pointer(&flags)), uintptr(unsafe.Pointer(&cl)), va)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemGetAccess, rc)
	}
	return backend.AccessFlags(flags), nil
}

// AddressRange implements backend.Driver from the binding's records: the
// mapping containing va (R14). The driver's cuMemGetAddressRange_v2 answers
// the same for mapped VMM memory; the records need no context switch.
func (d *Driver) AddressRange(va uintptr) (uintptr, uint64, error) {
	const op = backend.OpAddressRange
	if err := d.lockOpen(op); err != nil {
		return 0, 0, err
	}
	defer d.mu.Unlock()
	i := d.mappingAt(va)
	if i < 0 {
		return 0, 0, invalid(op, "R14", "%#x is not mapped", va)
	}
	return d.maps[i].va, d.maps[i].h.size, nil
}

// RetainHandle implements backend.Driver (cuMemRetainAllocationHandle, R12).
func (d *Driver) RetainHandle(va uintptr) (backend.Handle, error) {
	const op = backend.OpRetain
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	i := d.mappingAt(va)
	if i < 0 {
		return 0, invalid(op, "R12", "%#x is not mapped", va)
	}
	x := d.maps[i].h
	var h uint64
	rc := d.onDevice(x.prop.Location.ID, func() cuResult {
		return d.lib.call(symMemRetainAllocationHandle, uintptr(unsafe.Pointer(&h)), va)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemRetainAllocationHandle, rc)
	}
	if backend.Handle(h) != x.id {
		// The driver named another handle for the same memory: release that
		// reference and report the inconsistency rather than guess.
		d.onDevice(x.prop.Location.ID, func() cuResult { return d.lib.call(symMemRelease, uintptr(h)) })
		return 0, backend.Errorf(op, backend.ErrUnavailable, "R12", "driver returned handle %#x for memory of handle %#x", h, uint64(x.id))
	}
	x.refs++
	d.handles[x.id] = x // back in the table if it had been released while mapped
	return x.id, nil
}

// HandleProperties implements backend.Driver. The prop is the one the handle
// was created with (checked against the driver's
// cuMemGetAllocationPropertiesFromHandle); the size is the binding's record.
func (d *Driver) HandleProperties(h backend.Handle) (backend.PhysicalProp, uint64, error) {
	const op = backend.OpHandleProps
	if err := d.lockOpen(op); err != nil {
		return backend.PhysicalProp{}, 0, err
	}
	defer d.mu.Unlock()
	x := d.handles[h]
	if x == nil {
		return backend.PhysicalProp{}, 0, invalid(op, "R13", "unknown handle %#x", uint64(h))
	}
	var p cuMemAllocationProp
	rc := d.onDevice(x.prop.Location.ID, func() cuResult {
		return d.lib.call(symMemGetAllocationPropertiesFromHandle, uintptr(unsafe.Pointer(&p)), uintptr(h))
	})
	if rc != cuSuccess {
		return backend.PhysicalProp{}, 0, driverError(op, symMemGetAllocationPropertiesFromHandle, rc)
	}
	if int(p.Location.ID) != d.devs[x.prop.Location.ID].ordinal {
		return backend.PhysicalProp{}, 0, backend.Errorf(op, backend.ErrUnavailable, "R13",
			"driver reports device %d for a handle of device %d", p.Location.ID, d.devs[x.prop.Location.ID].ordinal)
	}
	return x.prop, x.size, nil
}

// LiveRanges implements backend.Introspector from the binding's records.
func (d *Driver) LiveRanges(dev int) (reservations, mappings []backend.Range, handles int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.res {
		reservations = append(reservations, backend.Range{Addr: r.va, Size: r.size})
	}
	for _, m := range d.maps {
		if m.h.prop.Location.ID == dev {
			mappings = append(mappings, backend.Range{Addr: m.va, Size: m.h.size})
		}
	}
	seen := map[*handle]bool{}
	for _, x := range d.handles {
		if x.prop.Location.ID == dev {
			seen[x] = true
		}
	}
	for _, m := range d.maps {
		if m.h.prop.Location.ID == dev {
			seen[m.h] = true
		}
	}
	return reservations, mappings, len(seen)
}
