package segment

import (
	"fmt"
	"sort"
	"sync"

	"github.com/vmmalloc/vmmalloc/backend"
)

// fakeDriver is a minimal in-memory backend.Driver for this package's
// tests. It enforces the VMM rules a segment must respect (whole-handle
// maps inside a reservation without overlap, unmap and set-access by the
// exact mapping, deferred free of a mapped handle, release only after
// every mapping inside is gone), records every call in order, injects
// faults (fail the n-th call of an Op) and exposes its live state.
type fakeDriver struct {
	mu      sync.Mutex
	gran    uint64 // granularity for every prop, nbytes
	devices int
	total   uint64 // device memory, nbytes
	used    uint64 // nbytes held by live handles

	nextVA     uintptr
	nextHandle backend.Handle
	nextStream backend.Stream
	nextEvent  backend.Event

	reservations map[uintptr]uint64 // base → nbytes
	handles      map[backend.Handle]*fakeHandle
	mappings     map[uintptr]*fakeMapping // mapping base → mapping
	streams      map[backend.Stream]int   // stream → device
	events       map[backend.Event]bool

	calls      [backend.NumOps]int // calls per Op, failed ones included
	log        []fakeCall          // every call in order, unless noLog
	noLog      bool                // benchmarks: keep no log
	faults     map[backend.Op]*fakeFault
	violations []string // rule violations the caller made
}

type fakeHandle struct {
	size   uint64
	prop   backend.PhysicalProp
	maps   int  // live mappings of it
	freed  bool // FreePhysical called; memory goes with the last unmap (R3)
	retain int  // extra references from RetainHandle
}

type fakeMapping struct {
	size   uint64
	h      backend.Handle
	access []backend.AccessDesc // nil until SetAccess (R8)
}

type fakeCall struct {
	op     backend.Op
	va     uintptr
	h      backend.Handle
	stream backend.Stream
	failed bool
}

// fakeFault fails calls of one Op: it lets skip calls through, then fails
// the next times calls (times < 0: every later call).
type fakeFault struct {
	skip, times int
	kind        error
}

func newFakeDriver() *fakeDriver {
	return &fakeDriver{
		gran:         2 << 20,
		devices:      2,
		total:        1 << 40,
		nextVA:       0x7f00_0000_0000,
		reservations: map[uintptr]uint64{},
		handles:      map[backend.Handle]*fakeHandle{},
		mappings:     map[uintptr]*fakeMapping{},
		streams:      map[backend.Stream]int{},
		events:       map[backend.Event]bool{},
		faults:       map[backend.Op]*fakeFault{},
	}
}

// failNth makes the n-th call of op from now on (1 = the next) fail once
// with kind.
func (d *fakeDriver) failNth(op backend.Op, n int, kind error) {
	d.failFrom(op, n, 1, kind)
}

// failFrom makes times calls of op fail starting with the n-th from now
// (times < 0: all of them).
func (d *fakeDriver) failFrom(op backend.Op, n, times int, kind error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults[op] = &fakeFault{skip: n - 1, times: times, kind: kind}
}

// clearFaults removes every armed fault.
func (d *fakeDriver) clearFaults() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.faults)
}

// enter counts and logs a call and reports an injected fault. d.mu held.
func (d *fakeDriver) enter(c fakeCall) error {
	d.calls[c.op]++
	if f := d.faults[c.op]; f != nil {
		if f.skip > 0 {
			f.skip--
		} else if f.times != 0 {
			if f.times > 0 {
				f.times--
			}
			c.failed = true
			if !d.noLog {
				d.log = append(d.log, c)
			}
			return backend.Errorf(c.op, f.kind, "", "injected fault")
		}
	}
	if !d.noLog {
		d.log = append(d.log, c)
	}
	return nil
}

// violate records a broken rule and returns the driver's error for it.
// d.mu held.
func (d *fakeDriver) violate(op backend.Op, rule, format string, args ...any) error {
	e := backend.Errorf(op, backend.ErrInvalidArgument, rule, format, args...)
	d.violations = append(d.violations, e.Error())
	if !d.noLog {
		d.log[len(d.log)-1].failed = true
	}
	return e
}

// --- introspection ---

func (d *fakeDriver) count(op backend.Op) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[op]
}

// liveHandles is the number of handles whose memory still exists (not
// freed, or freed but still mapped).
func (d *fakeDriver) liveHandles() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.handles)
}

func (d *fakeDriver) liveMappings() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.mappings)
}

func (d *fakeDriver) liveReservations() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.reservations)
}

// mapping returns the mapping starting at va.
func (d *fakeDriver) mapping(va uintptr) (fakeMapping, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.mappings[va]
	if !ok {
		return fakeMapping{}, false
	}
	return *m, true
}

// handleLive reports whether h exists and has not been freed.
func (d *fakeDriver) handleLive(h backend.Handle) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	fh, ok := d.handles[h]
	return ok && !fh.freed
}

// handleSize returns the nbytes of live handle h (0 if it is gone).
func (d *fakeDriver) handleSize(h backend.Handle) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if fh, ok := d.handles[h]; ok {
		return fh.size
	}
	return 0
}

// mappingsIn lists the bases of the mappings inside [base, base+size), in
// address order.
func (d *fakeDriver) mappingsIn(base uintptr, size uint64) []uintptr {
	d.mu.Lock()
	defer d.mu.Unlock()
	var vas []uintptr
	for va := range d.mappings {
		if va >= base && uint64(va-base) < size {
			vas = append(vas, va)
		}
	}
	sort.Slice(vas, func(i, j int) bool { return vas[i] < vas[j] })
	return vas
}

func (d *fakeDriver) ruleViolations() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.violations...)
}

// ops returns the Ops of the logged calls, from index from on.
func (d *fakeDriver) ops(from int) []fakeCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]fakeCall(nil), d.log[from:]...)
}

func (d *fakeDriver) logLen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.log)
}

// --- backend.Driver ---

func (d *fakeDriver) Name() string     { return "fake" }
func (d *fakeDriver) DeviceCount() int { return d.devices }

func (d *fakeDriver) MemGetInfo(dev int) (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpMemGetInfo}); err != nil {
		return 0, 0, err
	}
	if dev < 0 || dev >= d.devices {
		return 0, 0, d.violate(backend.OpMemGetInfo, "", "no device %d", dev)
	}
	return d.total - d.used, d.total, nil
}

// checkProp enforces R2. d.mu held.
func (d *fakeDriver) checkProp(op backend.Op, prop backend.PhysicalProp) error {
	switch prop.Location.Type {
	case backend.LocationDevice:
		if prop.Location.ID < 0 || prop.Location.ID >= d.devices {
			return d.violate(op, "R2", "no device %d", prop.Location.ID)
		}
	case backend.LocationHost:
		if prop.Attr == backend.PageHuge1G {
			return d.violate(op, "R2", "1 GiB pages are device only")
		}
	default:
		return d.violate(op, "R2", "bad location %v", prop.Location.Type)
	}
	if prop.Attr < backend.PageNormal || prop.Attr > backend.PageHuge1G {
		return d.violate(op, "R2", "bad page attribute %v", prop.Attr)
	}
	return nil
}

func (d *fakeDriver) Granularity(prop backend.PhysicalProp, opt backend.GranularityOption) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpGranularity}); err != nil {
		return 0, err
	}
	if err := d.checkProp(backend.OpGranularity, prop); err != nil {
		return 0, err
	}
	return d.gran, nil
}

func (d *fakeDriver) ReserveAddress(size uint64) (uintptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpReserve}); err != nil {
		return 0, err
	}
	if size == 0 || size%d.gran != 0 {
		return 0, d.violate(backend.OpReserve, "R4", "size %d not a nonzero multiple of %d", size, d.gran)
	}
	va := d.nextVA
	d.nextVA += uintptr(size + d.gran) // leave a gap between reservations
	d.reservations[va] = size
	return va, nil
}

func (d *fakeDriver) ReleaseAddress(va uintptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpRelease, va: va}); err != nil {
		return err
	}
	rs, ok := d.reservations[va]
	if !ok || rs != size {
		return d.violate(backend.OpRelease, "", "no reservation [%#x, +%d)", va, size)
	}
	for mva := range d.mappings {
		if mva >= va && uint64(mva-va) < size {
			return d.violate(backend.OpRelease, "R5", "mapping at %#x still inside", mva)
		}
	}
	delete(d.reservations, va)
	return nil
}

func (d *fakeDriver) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpCreate}); err != nil {
		return 0, err
	}
	if size == 0 || size%d.gran != 0 {
		return 0, d.violate(backend.OpCreate, "R1", "size %d not a nonzero multiple of %d", size, d.gran)
	}
	if err := d.checkProp(backend.OpCreate, prop); err != nil {
		return 0, err
	}
	if size > d.total-d.used {
		return 0, backend.Errorf(backend.OpCreate, backend.ErrOutOfMemory, "", "%d bytes requested, %d free", size, d.total-d.used)
	}
	d.nextHandle++
	h := d.nextHandle
	d.handles[h] = &fakeHandle{size: size, prop: prop}
	d.used += size
	return h, nil
}

func (d *fakeDriver) FreePhysical(h backend.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpFree, h: h}); err != nil {
		return err
	}
	fh, ok := d.handles[h]
	if !ok || fh.freed {
		return d.violate(backend.OpFree, "", "handle %#x not live", uint64(h))
	}
	if fh.retain > 0 {
		fh.retain--
		return nil
	}
	fh.freed = true
	d.dropIfDead(h, fh)
	return nil
}

// dropIfDead removes a freed handle with no mappings left (R3). d.mu held.
func (d *fakeDriver) dropIfDead(h backend.Handle, fh *fakeHandle) {
	if fh.freed && fh.maps == 0 {
		delete(d.handles, h)
		d.used -= fh.size
	}
}

func (d *fakeDriver) Map(va uintptr, size uint64, h backend.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpMap, va: va, h: h}); err != nil {
		return err
	}
	fh, ok := d.handles[h]
	if !ok || fh.freed {
		return d.violate(backend.OpMap, "", "handle %#x not live", uint64(h))
	}
	if size != fh.size {
		return d.violate(backend.OpMap, "R6", "size %d is not the handle's %d", size, fh.size)
	}
	inside := false
	for rva, rsize := range d.reservations {
		if va >= rva && uint64(va-rva) < rsize && size <= rsize-uint64(va-rva) {
			inside = true
			break
		}
	}
	if !inside {
		return d.violate(backend.OpMap, "R6", "[%#x, +%d) not inside one reservation", va, size)
	}
	for mva, m := range d.mappings {
		if va < mva+uintptr(m.size) && mva < va+uintptr(size) {
			return d.violate(backend.OpMap, "", "[%#x, +%d) overlaps the mapping at %#x", va, size, mva)
		}
	}
	d.mappings[va] = &fakeMapping{size: size, h: h}
	fh.maps++
	return nil
}

func (d *fakeDriver) Unmap(va uintptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpUnmap, va: va}); err != nil {
		return err
	}
	m, ok := d.mappings[va]
	if !ok || m.size != size {
		return d.violate(backend.OpUnmap, "R9", "no mapping [%#x, +%d)", va, size)
	}
	delete(d.mappings, va)
	fh := d.handles[m.h]
	fh.maps--
	d.dropIfDead(m.h, fh)
	return nil
}

func (d *fakeDriver) SetAccess(va uintptr, size uint64, desc []backend.AccessDesc) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpSetAccess, va: va}); err != nil {
		return err
	}
	m, ok := d.mappings[va]
	if !ok || m.size != size {
		return d.violate(backend.OpSetAccess, "R10", "[%#x, +%d) is not a mapping", va, size)
	}
	if len(desc) == 0 {
		return d.violate(backend.OpSetAccess, "R10", "no access descriptors")
	}
	m.access = append([]backend.AccessDesc(nil), desc...)
	return nil
}

// containing returns the mapping containing va. d.mu held.
func (d *fakeDriver) containing(va uintptr) (uintptr, *fakeMapping) {
	for mva, m := range d.mappings {
		if va >= mva && uint64(va-mva) < m.size {
			return mva, m
		}
	}
	return 0, nil
}

func (d *fakeDriver) GetAccess(va uintptr, loc backend.Location) (backend.AccessFlags, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpGetAccess, va: va}); err != nil {
		return 0, err
	}
	_, m := d.containing(va)
	if m == nil {
		return 0, d.violate(backend.OpGetAccess, "R10", "%#x not mapped", va)
	}
	for _, a := range m.access {
		if a.Location == loc {
			return a.Flags, nil
		}
	}
	return backend.AccessNone, nil
}

func (d *fakeDriver) AddressRange(va uintptr) (uintptr, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpAddressRange, va: va}); err != nil {
		return 0, 0, err
	}
	mva, m := d.containing(va)
	if m == nil {
		return 0, 0, d.violate(backend.OpAddressRange, "R14", "%#x not mapped", va)
	}
	return mva, m.size, nil
}

func (d *fakeDriver) RetainHandle(va uintptr) (backend.Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpRetain, va: va}); err != nil {
		return 0, err
	}
	_, m := d.containing(va)
	if m == nil {
		return 0, d.violate(backend.OpRetain, "R12", "%#x not mapped", va)
	}
	d.handles[m.h].retain++
	return m.h, nil
}

func (d *fakeDriver) HandleProperties(h backend.Handle) (backend.PhysicalProp, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpHandleProps, h: h}); err != nil {
		return backend.PhysicalProp{}, 0, err
	}
	fh, ok := d.handles[h]
	if !ok {
		return backend.PhysicalProp{}, 0, d.violate(backend.OpHandleProps, "R13", "handle %#x not live", uint64(h))
	}
	return fh.prop, fh.size, nil
}

func (d *fakeDriver) StreamCreate(dev int) (backend.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpStreamCreate}); err != nil {
		return 0, err
	}
	if dev < 0 || dev >= d.devices {
		return 0, d.violate(backend.OpStreamCreate, "", "no device %d", dev)
	}
	d.nextStream++
	d.streams[d.nextStream] = dev
	return d.nextStream, nil
}

func (d *fakeDriver) StreamDestroy(s backend.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpStreamDestroy, stream: s}); err != nil {
		return err
	}
	if _, ok := d.streams[s]; !ok {
		return d.violate(backend.OpStreamDestroy, "", "no stream %d", s)
	}
	delete(d.streams, s)
	return nil
}

func (d *fakeDriver) StreamSynchronize(s backend.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpStreamSync, stream: s}); err != nil {
		return err
	}
	if _, ok := d.streams[s]; !ok {
		return d.violate(backend.OpStreamSync, "", "no stream %d", s)
	}
	return nil
}

func (d *fakeDriver) StreamDevice(s backend.Stream) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// backend has no Op for this query; it is neither counted nor logged.
	dev, ok := d.streams[s]
	if !ok {
		return 0, backend.Errorf(backend.OpStreamSync, backend.ErrInvalidArgument, "", "no stream %d", s)
	}
	return dev, nil
}

func (d *fakeDriver) EventCreate(dev int) (backend.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: backend.OpEventCreate}); err != nil {
		return 0, err
	}
	d.nextEvent++
	d.events[d.nextEvent] = true
	return d.nextEvent, nil
}

func (d *fakeDriver) EventDestroy(e backend.Event) error { return d.eventOp(backend.OpEventDestroy, e) }
func (d *fakeDriver) EventRecord(e backend.Event, s backend.Stream) error {
	return d.eventOp(backend.OpEventRecord, e)
}
func (d *fakeDriver) EventSynchronize(e backend.Event) error {
	return d.eventOp(backend.OpEventSync, e)
}
func (d *fakeDriver) EventQuery(e backend.Event) (bool, error) {
	return true, d.eventOp(backend.OpEventQuery, e)
}

// eventOp implements the event calls: work completes at once here.
func (d *fakeDriver) eventOp(op backend.Op, e backend.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter(fakeCall{op: op}); err != nil {
		return err
	}
	if !d.events[e] {
		return d.violate(op, "", "no event %d", e)
	}
	if op == backend.OpEventDestroy {
		delete(d.events, e)
	}
	return nil
}

var _ backend.Driver = (*fakeDriver)(nil)

func (c fakeCall) String() string {
	return fmt.Sprintf("%v(va=%#x h=%d s=%d failed=%v)", c.op, c.va, c.h, c.stream, c.failed)
}
