package acl

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/vmmalloc/vmmalloc/backend"
)

// ACL enum values the binding passes (acl_rt.h; values are only ever
// appended, so they are stable).
const (
	locHost   = 0 // ACL_MEM_LOCATION_TYPE_HOST
	locDevice = 1 // ACL_MEM_LOCATION_TYPE_DEVICE

	attrHBM        = 1  // ACL_HBM_MEM, for aclrtGetMemInfo
	attrDDRHuge    = 2  // ACL_DDR_MEM_HUGE
	attrDDRNormal  = 3  // ACL_DDR_MEM_NORMAL
	attrHBMHuge    = 4  // ACL_HBM_MEM_HUGE
	attrHBMNormal  = 5  // ACL_HBM_MEM_NORMAL
	attrHBMHuge1G  = 10 // ACL_HBM_MEM_HUGE1G
	eventSync      = 1  // ACL_EVENT_SYNC
	eventComplete  = 1  // ACL_EVENT_RECORDED_STATUS_COMPLETE
	memcpyHtoD     = 1  // ACL_MEMCPY_HOST_TO_DEVICE
	memcpyDtoH     = 2  // ACL_MEMCPY_DEVICE_TO_HOST
	memcpyDtoD     = 3  // ACL_MEMCPY_DEVICE_TO_DEVICE
	hostRegMapped  = 0  // ACL_HOST_REGISTER_MAPPED
	hostRegIOMem   = 4  // ACL_HOST_REGISTER_IOMEMORY
	hostRegRdOnly  = 8  // ACL_HOST_REGISTER_READONLY
	handleTypeNone = 0  // ACL_MEM_HANDLE_TYPE_NONE
)

// memLocation is aclrtMemLocation: id@0, type@4 (the reverse of CUDA).
type memLocation struct {
	ID   uint32
	Type int32
}

// physicalMemProp is aclrtPhysicalMemProp (32 bytes; Go pads before
// Reserve exactly as C does).
type physicalMemProp struct {
	HandleType     int32
	AllocationType int32 // ACL_MEM_ALLOCATION_TYPE_PINNED = 0
	MemAttr        int32
	Location       memLocation
	Reserve        uint64
}

// memAccessDesc is aclrtMemAccessDesc (24 bytes).
type memAccessDesc struct {
	Flags    int32
	Location memLocation
	Rsv      [12]byte
}

// Option configures Open.
type Option func(*options)

type options struct {
	library string
	devices []int
}

// WithLibrary loads the ACL runtime from path instead of
// $VMMALLOC_LIBASCENDCL or DefaultLibrary.
func WithLibrary(path string) Option { return func(o *options) { o.library = path } }

// WithDevices makes only the given ACL device ids visible, in that order:
// backend device i is ACL device ids[i]. By default every device is, in
// ACL's order (which ASCEND_RT_VISIBLE_DEVICES already filters).
func WithDevices(ids ...int) Option {
	return func(o *options) { o.devices = append(make([]int, 0, len(ids)), ids...) }
}

// Driver is a backend.Driver over the ACL runtime. It also implements
// backend.IPC, backend.HostMemory, backend.Copier and
// backend.DeviceSynchronizer. Safe for concurrent use.
type Driver struct {
	lib  *library
	phys []int32   // backend device → ACL device id; immutable
	ctx  []uintptr // backend device → its default aclrtContext; immutable
	pid  int32     // aclrtDeviceGetBareTgid; immutable

	// mu guards everything below. VMM calls run under it, so the
	// bookkeeping and the library agree; synchronising calls (stream, event,
	// device synchronize, copies) run without it.
	mu       sync.Mutex
	closed   bool
	handles  map[backend.Handle]*handleInfo
	resv     map[uintptr]uint64 // reservation base → size, nbytes
	maps     []mapping          // ascending va, disjoint
	streams  map[backend.Stream]int
	adopted  map[backend.Stream]bool // streams adopted (adopt.go), never destroyed here
	events   map[backend.Event]int
	exported map[uint64]uint64        // shareable → size, nbytes
	hosts    map[uintptr]*hostBlock   // MallocHost block start → block
	regs     map[uintptr]hostRegister // HostRegister start → range
}

// handleInfo is the binding's record of one live handle.
type handleInfo struct {
	size     uint64 // nbytes; 0 for an imported handle of unknown size until mapped
	prop     backend.PhysicalProp
	dev      int // backend device the calls on it use
	refs     int // creation or import, plus retains, minus frees
	maps     int // live mappings
	imported bool
}

// mapping is one live aclrtMapMem.
type mapping struct {
	va   uintptr
	size uint64 // nbytes
	h    backend.Handle
}

// hostBlock is one live MallocHost block.
type hostBlock struct {
	size uint64 // nbytes
	regs int    // HostRegister ranges inside it
}

// hostRegister is one live HostRegister range.
type hostRegister struct {
	size  uint64 // nbytes
	block uintptr
}

// Open loads the ACL runtime, initialises it and takes the default context
// of every visible device.
func Open(opts ...Option) (*Driver, error) {
	var o options
	for _, fn := range opts {
		fn(&o)
	}
	lib, err := load(libraryPath(o.library))
	if err != nil {
		return nil, err
	}
	if r, _, _ := purego.SyscallN(lib.aclInit, 0); int32(r) != codeSuccess && int32(r) != codeRepeatInitialize {
		return nil, fmt.Errorf("acl: aclInit: %w", driverError(backend.OpMemGetInfo, "aclInit", int32(r)))
	}
	d := &Driver{
		lib:      lib,
		handles:  make(map[backend.Handle]*handleInfo),
		resv:     make(map[uintptr]uint64),
		streams:  make(map[backend.Stream]int),
		events:   make(map[backend.Event]int),
		exported: make(map[uint64]uint64),
		hosts:    make(map[uintptr]*hostBlock),
		regs:     make(map[uintptr]hostRegister),
	}
	var n uint32
	if c := d.raw(lib.getDeviceCount, uintptr(unsafe.Pointer(&n))); c != codeSuccess {
		return nil, fmt.Errorf("acl: %w", driverError(backend.OpMemGetInfo, "aclrtGetDeviceCount", c))
	}
	ids := o.devices
	if ids == nil {
		for i := 0; i < int(n); i++ {
			ids = append(ids, i)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("acl: no device visible (the runtime reports %d): %w", n, backend.ErrUnavailable)
	}
	seen := make(map[int]bool)
	for _, id := range ids {
		if id < 0 || id >= int(n) || seen[id] {
			return nil, fmt.Errorf("acl: WithDevices(%v): device %d is not one of the runtime's %d, or repeated: %w",
				ids, id, n, backend.ErrInvalidArgument)
		}
		seen[id] = true
		ctx, err := d.deviceContext(int32(id))
		if err != nil {
			return nil, err
		}
		d.phys = append(d.phys, int32(id))
		d.ctx = append(d.ctx, ctx)
	}
	if c := d.raw(lib.deviceGetBareTgid, uintptr(unsafe.Pointer(&d.pid))); c != codeSuccess {
		return nil, fmt.Errorf("acl: %w", driverError(backend.OpImport, "aclrtDeviceGetBareTgid", c))
	}
	return d, nil
}

// deviceContext sets device id on a locked thread and returns its default
// context.
func (d *Driver) deviceContext(id int32) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r, _, _ := purego.SyscallN(d.lib.setDevice, uintptr(id)); int32(r) != codeSuccess {
		return 0, fmt.Errorf("acl: device %d: %w", id, driverError(backend.OpStreamCreate, "aclrtSetDevice", int32(r)))
	}
	var ctx uintptr
	if c := d.raw(d.lib.getCurrentContext, uintptr(unsafe.Pointer(&ctx))); c != codeSuccess {
		return 0, fmt.Errorf("acl: device %d: %w", id, driverError(backend.OpStreamCreate, "aclrtGetCurrentContext", c))
	}
	return ctx, nil
}

// raw calls fn on the current thread, whatever its context.
//
//go:uintptrescapes
func (d *Driver) raw(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// call runs fn with backend device dev's context current on the calling OS
// thread, held for the call. Pointer arguments converted to uintptr in the
// call expression stay alive and in place until it returns.
//
//go:uintptrescapes
func (d *Driver) call(dev int, fn uintptr, args ...uintptr) int32 {
	runtime.LockOSThread()
	r, _, _ := purego.SyscallN(d.lib.setCurrentContext, d.ctx[dev])
	if int32(r) == codeSuccess {
		r, _, _ = purego.SyscallN(fn, args...)
	}
	runtime.UnlockOSThread()
	return int32(r)
}

// Name returns "acl".
func (d *Driver) Name() string { return "acl" }

// DeviceCount is the number of visible devices.
func (d *Driver) DeviceCount() int { return len(d.phys) }

// Library is the path the runtime was loaded from.
func (d *Driver) Library() string { return d.lib.path }

func (d *Driver) validDev(dev int) bool { return dev >= 0 && dev < len(d.phys) }

// errClosed is what every call on a closed driver returns.
func errClosed(op backend.Op) error {
	return backend.Errorf(op, backend.ErrUnavailable, "", "driver is closed")
}

// MemGetInfo reports free and total HBM of dev (aclrtGetMemInfo(ACL_HBM_MEM)).
func (d *Driver) MemGetInfo(dev int) (free, total uint64, err error) {
	const op = backend.OpMemGetInfo
	if !d.validDev(dev) {
		return 0, 0, invalid(op, "", "device %d of %d", dev, len(d.phys))
	}
	if err := d.closedErr(op); err != nil {
		return 0, 0, err
	}
	if c := d.call(dev, d.lib.getMemInfo, attrHBM, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))); c != codeSuccess {
		return 0, 0, driverError(op, "aclrtGetMemInfo", c)
	}
	return free, total, nil
}

// toProp translates a backend property into ACL's, and names the backend
// device its calls use.
func (d *Driver) toProp(op backend.Op, p backend.PhysicalProp) (physicalMemProp, int, error) {
	var c physicalMemProp
	c.HandleType = handleTypeNone
	switch p.Location.Type {
	case backend.LocationDevice:
		if !d.validDev(p.Location.ID) {
			return c, 0, invalid(op, "R2", "device %d of %d", p.Location.ID, len(d.phys))
		}
		c.Location = memLocation{ID: uint32(d.phys[p.Location.ID]), Type: locDevice}
		switch p.Attr {
		case backend.PageNormal:
			c.MemAttr = attrHBMNormal
		case backend.PageHuge:
			c.MemAttr = attrHBMHuge
		case backend.PageHuge1G:
			c.MemAttr = attrHBMHuge1G
		default:
			return c, 0, invalid(op, "R2", "unknown page attribute %v", p.Attr)
		}
		return c, p.Location.ID, nil
	case backend.LocationHost:
		if p.Location.ID < 0 {
			return c, 0, invalid(op, "R2", "host NUMA node %d", p.Location.ID)
		}
		c.Location = memLocation{ID: uint32(p.Location.ID), Type: locHost}
		switch p.Attr {
		case backend.PageNormal:
			c.MemAttr = attrDDRNormal
		case backend.PageHuge:
			c.MemAttr = attrDDRHuge
		default:
			return c, 0, invalid(op, "R2", "%v pages are device only", p.Attr)
		}
		return c, 0, nil
	}
	return c, 0, invalid(op, "R2", "unknown location type %v", p.Location.Type)
}

// fromProp translates ACL's property back; ok is false for values the
// binding never creates.
func (d *Driver) fromProp(c physicalMemProp) (backend.PhysicalProp, bool) {
	var p backend.PhysicalProp
	switch c.Location.Type {
	case locDevice:
		p.Location.Type = backend.LocationDevice
		p.Location.ID = -1
		for i, id := range d.phys {
			if uint32(id) == c.Location.ID {
				p.Location.ID = i
			}
		}
		if p.Location.ID < 0 {
			return p, false
		}
	case locHost:
		p.Location = backend.Location{Type: backend.LocationHost, ID: int(c.Location.ID)}
	default:
		return p, false
	}
	switch c.MemAttr {
	case attrHBMNormal, attrDDRNormal:
		p.Attr = backend.PageNormal
	case attrHBMHuge, attrDDRHuge:
		p.Attr = backend.PageHuge
	case attrHBMHuge1G:
		p.Attr = backend.PageHuge1G
	default:
		return p, false
	}
	return p, true
}

// Granularity is aclrtMemGetAllocationGranularity for prop.
func (d *Driver) Granularity(prop backend.PhysicalProp, opt backend.GranularityOption) (uint64, error) {
	const op = backend.OpGranularity
	if opt != backend.GranularityMinimum && opt != backend.GranularityRecommended {
		return 0, invalid(op, "R11", "unknown granularity option %d", opt)
	}
	c, dev, err := d.toProp(op, prop)
	if err != nil {
		return 0, err
	}
	if err := d.closedErr(op); err != nil {
		return 0, err
	}
	var g uint64
	if code := d.call(dev, d.lib.granularity, uintptr(unsafe.Pointer(&c)), uintptr(opt), uintptr(unsafe.Pointer(&g))); code != codeSuccess {
		return 0, driverError(op, "aclrtMemGetAllocationGranularity", code)
	}
	return g, nil
}

// ReserveAddress reserves size bytes of address space
// (aclrtReserveMemAddress(&va, size, 0, NULL, 0)).
func (d *Driver) ReserveAddress(size uint64) (uintptr, error) {
	const op = backend.OpReserve
	if size == 0 {
		return 0, invalid(op, "R4", "size must not be 0")
	}
	if size > maxReserve {
		// The runtime rounds sizes up to its granularity; a size this large
		// would wrap (the test double accepted 2^64-1).
		return 0, invalid(op, "R4", "size %d exceeds the %d-byte user address space", size, uint64(maxReserve))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var va uintptr
	if c := d.call(0, d.lib.reserve, uintptr(unsafe.Pointer(&va)), uintptr(size), 0, 0, 0); c != codeSuccess {
		return 0, driverError(op, "aclrtReserveMemAddress", c)
	}
	d.resv[va] = size
	return va, nil
}

// maxReserve is the largest reservation ReserveAddress passes to the
// runtime: the 256 TiB (2^48 bytes) of a 48-bit user address space.
const maxReserve = 1 << 48

// ReleaseAddress releases a whole reservation. aclrtReleaseMemAddress takes
// no size, so the binding checks it.
func (d *Driver) ReleaseAddress(va uintptr, size uint64) error {
	const op = backend.OpRelease
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	n, ok := d.resv[va]
	if !ok {
		return invalid(op, "R5", "%#x is not the start of a reservation", va)
	}
	if n != size {
		return invalid(op, "R5", "reservation at %#x is %d bytes, not %d", va, n, size)
	}
	if c := d.call(0, d.lib.release, va); c != codeSuccess {
		return driverError(op, "aclrtReleaseMemAddress", c)
	}
	delete(d.resv, va)
	return nil
}

// CreatePhysical allocates physical memory (aclrtMallocPhysical, flags 0).
func (d *Driver) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	const op = backend.OpCreate
	c, dev, err := d.toProp(op, prop)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, invalid(op, "R1", "size must not be 0")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var h uintptr
	if code := d.call(dev, d.lib.mallocPhysical, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&c)), 0); code != codeSuccess {
		return 0, driverError(op, "aclrtMallocPhysical", code)
	}
	bh := backend.Handle(h)
	d.handles[bh] = &handleInfo{size: size, prop: prop, dev: dev, refs: 1}
	return bh, nil
}

// handle returns the live record of h; mu held.
func (d *Driver) handle(op backend.Op, h backend.Handle) (*handleInfo, error) {
	hi, ok := d.handles[h]
	if !ok || hi.refs == 0 {
		return nil, invalid(op, "", "unknown or freed handle %#x", uint64(h))
	}
	return hi, nil
}

// forget drops h from the table once nothing refers to it; mu held.
func (d *Driver) forget(h backend.Handle, hi *handleInfo) {
	if hi.refs == 0 && hi.maps == 0 {
		delete(d.handles, h)
	}
}

// FreePhysical drops one reference of h (aclrtFreePhysical). The memory is
// released with the last reference, or at the last unmap if still mapped.
func (d *Driver) FreePhysical(h backend.Handle) error {
	const op = backend.OpFree
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	hi, err := d.handle(op, h)
	if err != nil {
		return err
	}
	if c := d.call(hi.dev, d.lib.freePhysical, uintptr(h)); c != codeSuccess {
		return driverError(op, "aclrtFreePhysical", c)
	}
	hi.refs--
	d.forget(h, hi)
	return nil
}

// mappingAt returns the index of the mapping containing va, or -1; mu held.
func (d *Driver) mappingAt(va uintptr) int {
	i := sort.Search(len(d.maps), func(i int) bool { return d.maps[i].va+uintptr(d.maps[i].size) > va })
	if i < len(d.maps) && d.maps[i].va <= va {
		return i
	}
	return -1
}

// Map maps the whole of h at va (aclrtMapMem(va, size, 0, h, 0)).
func (d *Driver) Map(va uintptr, size uint64, h backend.Handle) error {
	const op = backend.OpMap
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	hi, err := d.handle(op, h)
	if err != nil {
		return err
	}
	if hi.size != 0 && size != hi.size {
		return invalid(op, "R6", "handle %#x is %d bytes; a map covers the whole handle, not %d", uint64(h), hi.size, size)
	}
	if c := d.call(hi.dev, d.lib.mapMem, va, uintptr(size), 0, uintptr(h), 0); c != codeSuccess {
		return driverError(op, "aclrtMapMem", c)
	}
	i := sort.Search(len(d.maps), func(i int) bool { return d.maps[i].va > va })
	d.maps = append(d.maps, mapping{})
	copy(d.maps[i+1:], d.maps[i:])
	d.maps[i] = mapping{va: va, size: size, h: h}
	hi.maps++
	hi.size = size // learnt here for an import of unknown size
	return nil
}

// Unmap removes the mapping that starts at va (aclrtUnmapMem(va)); size
// must be its size, which ACL does not take, so the binding checks it.
func (d *Driver) Unmap(va uintptr, size uint64) error {
	const op = backend.OpUnmap
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	i := d.mappingAt(va)
	if i < 0 || d.maps[i].va != va {
		return invalid(op, "R9", "no mapping starts at %#x", va)
	}
	m := d.maps[i]
	if m.size != size {
		return invalid(op, "R9", "mapping at %#x is %d bytes, not %d", va, m.size, size)
	}
	hi := d.handles[m.h]
	if c := d.call(hi.dev, d.lib.unmapMem, va); c != codeSuccess {
		return driverError(op, "aclrtUnmapMem", c)
	}
	d.maps = append(d.maps[:i], d.maps[i+1:]...)
	hi.maps--
	d.forget(m.h, hi)
	return nil
}

// location translates a backend location for an access descriptor.
func (d *Driver) location(op backend.Op, l backend.Location) (memLocation, error) {
	switch l.Type {
	case backend.LocationDevice:
		if !d.validDev(l.ID) {
			return memLocation{}, invalid(op, "R10", "device %d of %d", l.ID, len(d.phys))
		}
		return memLocation{ID: uint32(d.phys[l.ID]), Type: locDevice}, nil
	case backend.LocationHost:
		return memLocation{ID: uint32(l.ID), Type: locHost}, nil
	}
	return memLocation{}, invalid(op, "R10", "unknown location type %v", l.Type)
}

// mappingDev is the device of the mapping containing va, or 0; mu held.
func (d *Driver) mappingDev(va uintptr) int {
	if i := d.mappingAt(va); i >= 0 {
		return d.handles[d.maps[i].h].dev
	}
	return 0
}

// SetAccess sets the protection of exactly one mapping (aclrtMemSetAccess).
func (d *Driver) SetAccess(va uintptr, size uint64, desc []backend.AccessDesc) error {
	const op = backend.OpSetAccess
	if len(desc) == 0 {
		return invalid(op, "R10", "no access descriptor")
	}
	c := make([]memAccessDesc, len(desc))
	for i, a := range desc {
		if a.Flags != backend.AccessNone && a.Flags != backend.AccessRead && a.Flags != backend.AccessReadWrite {
			return invalid(op, "R10", "unknown access flags %d", a.Flags)
		}
		loc, err := d.location(op, a.Location)
		if err != nil {
			return err
		}
		c[i] = memAccessDesc{Flags: int32(a.Flags), Location: loc}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	if code := d.call(d.mappingDev(va), d.lib.setAccess, va, uintptr(size), uintptr(unsafe.Pointer(&c[0])), uintptr(len(c))); code != codeSuccess {
		return driverError(op, "aclrtMemSetAccess", code)
	}
	return nil
}

// GetAccess reads the protection of the mapping containing va for loc
// (aclrtMemGetAccess on the mapping's own address).
func (d *Driver) GetAccess(va uintptr, loc backend.Location) (backend.AccessFlags, error) {
	const op = backend.OpGetAccess
	l, err := d.location(op, loc)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	i := d.mappingAt(va)
	if i < 0 {
		return 0, invalid(op, "R10", "no mapping contains %#x", va)
	}
	m := d.maps[i]
	var flags uint64
	if c := d.call(d.handles[m.h].dev, d.lib.getAccess, m.va, uintptr(unsafe.Pointer(&l)), uintptr(unsafe.Pointer(&flags))); c != codeSuccess {
		return 0, driverError(op, "aclrtMemGetAccess", c)
	}
	return backend.AccessFlags(flags), nil
}

// AddressRange returns the mapping containing va (aclrtMemGetAddressRange).
func (d *Driver) AddressRange(va uintptr) (uintptr, uint64, error) {
	const op = backend.OpAddressRange
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, 0, errClosed(op)
	}
	var base uintptr
	var size uint64
	if c := d.call(d.mappingDev(va), d.lib.addressRange, va, uintptr(unsafe.Pointer(&base)), uintptr(unsafe.Pointer(&size))); c != codeSuccess {
		return 0, 0, driverError(op, "aclrtMemGetAddressRange", c)
	}
	return base, size, nil
}

// RetainHandle returns the handle mapped at va with a new reference
// (aclrtMemRetainAllocationHandle).
func (d *Driver) RetainHandle(va uintptr) (backend.Handle, error) {
	const op = backend.OpRetain
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	i := d.mappingAt(va)
	if i < 0 {
		return 0, invalid(op, "R12", "no mapping contains %#x", va)
	}
	m := d.maps[i]
	hi := d.handles[m.h]
	var h uintptr
	if c := d.call(hi.dev, d.lib.retain, va, uintptr(unsafe.Pointer(&h))); c != codeSuccess {
		return 0, driverError(op, "aclrtMemRetainAllocationHandle", c)
	}
	bh := backend.Handle(h)
	if bh != m.h { // ACL returned another handle value for the same memory
		if x, ok := d.handles[bh]; ok {
			x.refs++
			return bh, nil
		}
		cp := *hi
		cp.refs, cp.maps = 1, 0
		d.handles[bh] = &cp
		return bh, nil
	}
	hi.refs++
	return bh, nil
}

// HandleProperties returns the properties of h from
// aclrtMemGetAllocationPropertiesFromHandle and its size from the binding's
// table.
func (d *Driver) HandleProperties(h backend.Handle) (backend.PhysicalProp, uint64, error) {
	const op = backend.OpHandleProps
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return backend.PhysicalProp{}, 0, errClosed(op)
	}
	hi, err := d.handle(op, h)
	if err != nil {
		return backend.PhysicalProp{}, 0, err
	}
	var c physicalMemProp
	if code := d.call(hi.dev, d.lib.propsFromHandle, uintptr(h), uintptr(unsafe.Pointer(&c))); code != codeSuccess {
		return backend.PhysicalProp{}, 0, driverError(op, "aclrtMemGetAllocationPropertiesFromHandle", code)
	}
	p, ok := d.fromProp(c)
	if !ok {
		return backend.PhysicalProp{}, 0, backend.Errorf(op, backend.ErrNotSupported, "",
			"aclrtMemGetAllocationPropertiesFromHandle reported attribute %d at location type %d id %d",
			c.MemAttr, c.Location.Type, c.Location.ID)
	}
	if hi.size == 0 {
		return p, 0, backend.Errorf(op, backend.ErrNotSupported, "R17",
			"ACL does not report the size of imported handle %#x: import it with ImportSized or map it first", uint64(h))
	}
	return p, hi.size, nil
}

// LiveRanges lists, from the binding's bookkeeping of the calls that
// succeeded, the reservations in address order, the mappings of device
// dev's memory and the number of live handles of device dev (a freed handle
// that is still mapped included): backend.Introspector, so an allocator's
// Check can compare its view with the driver's.
func (d *Driver) LiveRanges(dev int) (reservations, mappings []backend.Range, handles int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for va, n := range d.resv {
		reservations = append(reservations, backend.Range{Addr: va, Size: n})
	}
	sort.Slice(reservations, func(i, j int) bool { return reservations[i].Addr < reservations[j].Addr })
	for _, m := range d.maps {
		if p := d.handles[m.h].prop; p.Location.Type == backend.LocationDevice && d.handles[m.h].dev == dev {
			mappings = append(mappings, backend.Range{Addr: m.va, Size: m.size})
		}
	}
	for _, hi := range d.handles {
		if hi.prop.Location.Type == backend.LocationDevice && hi.dev == dev {
			handles++
		}
	}
	return reservations, mappings, handles
}

// closedErr reports errClosed(op) if the driver is closed.
func (d *Driver) closedErr(op backend.Op) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	return nil
}

// Close releases everything the driver still holds (mappings, handles,
// reservations, streams, events, host memory), then refuses further calls.
// The ACL runtime itself stays initialised and loaded for the process.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	var errs []error
	keep := func(c int32, op backend.Op, sym string) {
		if c != codeSuccess {
			errs = append(errs, driverError(op, sym, c))
		}
	}
	for _, m := range d.maps {
		keep(d.call(d.handles[m.h].dev, d.lib.unmapMem, m.va), backend.OpUnmap, "aclrtUnmapMem")
	}
	d.maps = nil
	for h, hi := range d.handles {
		for ; hi.refs > 0; hi.refs-- {
			keep(d.call(hi.dev, d.lib.freePhysical, uintptr(h)), backend.OpFree, "aclrtFreePhysical")
		}
	}
	clear(d.handles)
	for va := range d.resv {
		keep(d.call(0, d.lib.release, va), backend.OpRelease, "aclrtReleaseMemAddress")
	}
	clear(d.resv)
	for e, dev := range d.events {
		keep(d.call(dev, d.lib.destroyEvent, uintptr(e)), backend.OpEventDestroy, "aclrtDestroyEvent")
	}
	clear(d.events)
	for s, dev := range d.streams {
		if d.adopted[s] {
			continue // its owner's to destroy
		}
		keep(d.call(dev, d.lib.destroyStream, uintptr(s)), backend.OpStreamDestroy, "aclrtDestroyStream")
	}
	clear(d.streams)
	clear(d.adopted)
	for p := range d.regs {
		keep(d.call(0, d.lib.hostUnregister, p), backend.OpHostUnregister, "aclrtHostUnregister")
	}
	clear(d.regs)
	for p := range d.hosts {
		keep(d.call(0, d.lib.freeHost, p), backend.OpFreeHost, "aclrtFreeHost")
	}
	clear(d.hosts)
	d.closed = true
	return errors.Join(errs...)
}
