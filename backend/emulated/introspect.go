package emulated

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// DeviceUsage is the memory of one device, as every process sees it.
type DeviceUsage struct {
	Capacity uint64 // nbytes
	Physical uint64 // nbytes of physical memory that exists on it, freed-pending included
	Tenants  uint64 // nbytes other tenants occupy
	Free     uint64 // Capacity − Physical − Tenants, as MemGetInfo reports
}

// LiveCounts is what one process holds, plus the world's device usage.
type LiveCounts struct {
	Handles       int    // handles in the table, freed-pending included
	FreedPending  int    // handles freed but still mapped (R3)
	HandleBytes   uint64 // nbytes of all handles
	Mappings      int    //
	MappedBytes   uint64 // nbytes
	Reservations  int    //
	ReservedBytes uint64 // nbytes, as reserved (not rounded)
	Exports       int    // live shareable handles this process exported
	Imports       int    // live imported handles
	Streams       int    // streams not destroyed
	Events        int    //
	PendingWork   int    // incomplete work items on this process's streams
	HostAllocs    int    // MallocHost blocks
	HostBytes     uint64 // nbytes of MallocHost blocks, as asked
	HostRegs      int    // registered host ranges
	HostUsed      uint64 // nbytes of pinned host memory in use by every process, rounded
	Devices       []DeviceUsage
}

// Mapping describes one live mapping.
type Mapping struct {
	VA       uintptr
	Size     uint64 // nbytes
	Handle   backend.Handle
	Location backend.Location     // the handle's location
	Access   []backend.AccessDesc // granted access, sorted by location; nil = none (R8)
}

// Reservation describes one live reservation.
type Reservation struct {
	VA       uintptr
	Size     uint64 // nbytes as reserved
	Mappings int    // live mappings inside it
}

// HandleInfo describes one handle of this process.
type HandleInfo struct {
	Handle       backend.Handle
	Prop         backend.PhysicalProp
	Size         uint64 // nbytes
	Refs         int    // references left (1 + retains − frees)
	Mappings     int    // live mappings of it
	FreedPending bool   // freed, released at the last unmap (R3)
	Imported     bool
	Shareable    uint64 // shareable handle it is exported as or was imported from; 0 if none
}

// Live returns counts of what this process holds and the devices' usage.
func (e *Emulator) Live() LiveCounts {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	var c LiveCounts
	for _, h := range p.handles {
		c.Handles++
		c.HandleBytes += h.size
		if h.refs == 0 {
			c.FreedPending++
		}
		if h.imported {
			c.Imports++
		}
	}
	p.maps.each(func(x entry[*mapping]) bool {
		c.Mappings++
		c.MappedBytes += x.v.size
		return true
	})
	p.res.each(func(x entry[*reservation]) bool {
		c.Reservations++
		c.ReservedBytes += x.v.size
		return true
	})
	for _, x := range w.exports {
		if x.owner == p {
			c.Exports++
		}
	}
	for _, s := range p.streams {
		if !s.destroyed {
			c.Streams++
		}
		c.PendingWork += len(s.queue)
	}
	c.Events = len(p.events)
	p.hosts.each(func(x entry[*hostAlloc]) bool {
		c.HostAllocs++
		c.HostBytes += x.v.size
		return true
	})
	c.HostRegs = p.regs.len()
	c.HostUsed = w.hostBytes
	c.Devices = make([]DeviceUsage, len(w.devs))
	for i, d := range w.devs {
		c.Devices[i] = DeviceUsage{Capacity: d.capacity, Physical: d.physical, Tenants: d.tenants, Free: d.free()}
	}
	return c
}

// Mappings returns this process's mappings in address order.
func (e *Emulator) Mappings() []Mapping {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	out := make([]Mapping, 0, e.p.maps.len())
	e.p.maps.each(func(x entry[*mapping]) bool {
		m := x.v
		out = append(out, Mapping{
			VA: uintptr(m.va), Size: m.size, Handle: m.h.id, Location: m.h.prop.Location,
			Access: append([]backend.AccessDesc(nil), m.access...),
		})
		return true
	})
	return out
}

// LiveRanges implements backend.Introspector: this process's reservations,
// its mappings of handles on device dev, and its number of handles on dev,
// freed-pending ones included.
func (e *Emulator) LiveRanges(dev int) (reservations, mappings []backend.Range, handles int) {
	for _, r := range e.Reservations() {
		reservations = append(reservations, backend.Range{Addr: r.VA, Size: r.Size})
	}
	for _, m := range e.Mappings() {
		if m.Location.Type == backend.LocationDevice && m.Location.ID == dev {
			mappings = append(mappings, backend.Range{Addr: m.VA, Size: m.Size})
		}
	}
	for _, h := range e.Handles() {
		if h.Prop.Location.Type == backend.LocationDevice && h.Prop.Location.ID == dev {
			handles++
		}
	}
	return reservations, mappings, handles
}

// Reservations returns this process's reservations in address order.
func (e *Emulator) Reservations() []Reservation {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	out := make([]Reservation, 0, e.p.res.len())
	e.p.res.each(func(x entry[*reservation]) bool {
		out = append(out, Reservation{VA: uintptr(x.v.va), Size: x.v.size, Mappings: x.v.nmaps})
		return true
	})
	return out
}

// Handles returns this process's handles in id order.
func (e *Emulator) Handles() []HandleInfo {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	hs := sortedHandles(e.p)
	out := make([]HandleInfo, len(hs))
	for i, h := range hs {
		out[i] = HandleInfo{
			Handle: h.id, Prop: h.prop, Size: h.size, Refs: h.refs, Mappings: h.mapped,
			FreedPending: h.refs == 0, Imported: h.imported, Shareable: h.shareable,
		}
	}
	return out
}

// TenantID names memory taken by Occupy.
type TenantID uint64

// Occupy takes nbytes of dev's memory for another tenant, so MemGetInfo's
// free shrinks and creation fails sooner. It fails with ErrOutOfMemory if
// nbytes exceed the free memory.
func (e *Emulator) Occupy(dev int, nbytes uint64) (TenantID, error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.checkDevice(dev) {
		return 0, fmt.Errorf("emulated: Occupy: device %d out of range [0,%d): %w", dev, len(w.devs), backend.ErrInvalidArgument)
	}
	if nbytes == 0 {
		return 0, fmt.Errorf("emulated: Occupy: 0 bytes: %w", backend.ErrInvalidArgument)
	}
	d := &w.devs[dev]
	if nbytes > d.free() {
		return 0, fmt.Errorf("emulated: Occupy: device %d: %d bytes wanted, %d free: %w", dev, nbytes, d.free(), backend.ErrOutOfMemory)
	}
	d.tenants += nbytes
	w.next.tenant++
	id := TenantID(w.next.tenant)
	w.tenants[id] = tenant{dev: dev, nbytes: nbytes}
	return id, nil
}

// Vacate gives back memory taken by Occupy.
func (e *Emulator) Vacate(id TenantID) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.tenants[id]
	if !ok {
		return fmt.Errorf("emulated: Vacate: unknown tenant %d: %w", id, backend.ErrInvalidArgument)
	}
	w.devs[t.dev].tenants -= t.nbytes
	delete(w.tenants, id)
	return nil
}

// Bytes returns the memory at [va, va+size) with real memory
// (WithRealMemory): the range must lie in one MallocHost block or in
// consecutive mappings the host may read and write (SetAccess with a
// location granting read-write). A mapping that is only readable is
// refused with ErrNotPermitted: a Go slice cannot be read-only, and a write
// through one would kill the process with SIGSEGV; an inaccessible one is
// ErrInvalidArgument (R8). The slice is valid only while the memory stays
// mapped read-write; touching it afterwards faults. Without real memory it
// returns ErrNotSupported.
func (e *Emulator) Bytes(va uintptr, size uint64) ([]byte, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.cfg.real {
		return nil, fmt.Errorf("emulated: Bytes: needs WithRealMemory: %w", backend.ErrNotSupported)
	}
	if p.closed {
		return nil, fmt.Errorf("emulated: Bytes: process %d is closed: %w", p.pid, backend.ErrUnavailable)
	}
	a := uint64(va)
	end := a + size
	if size == 0 || end < a {
		return nil, fmt.Errorf("emulated: Bytes: bad size %d: %w", size, backend.ErrInvalidArgument)
	}
	if x, ok := p.hosts.containing(a); ok && end <= x.end {
		return w.back.bytes(a, size), nil
	}
	for c := a; c < end; {
		x, ok := p.maps.containing(c)
		if !ok {
			return nil, fmt.Errorf("emulated: Bytes: %#x is not mapped: %w", c, backend.ErrInvalidArgument)
		}
		switch widest(x.v.access) {
		case backend.AccessNone:
			return nil, fmt.Errorf("emulated: Bytes: mapping at %#x is not accessible (R8): %w", x.start, backend.ErrInvalidArgument)
		case backend.AccessRead:
			return nil, fmt.Errorf("emulated: Bytes: mapping at %#x is read-only; a writable slice over it would fault: %w", x.start, backend.ErrNotPermitted)
		}
		c = x.end
	}
	return w.back.bytes(a, size), nil
}
