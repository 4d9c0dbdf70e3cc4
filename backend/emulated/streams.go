package emulated

import (
	"fmt"
	"sort"

	"github.com/vmmalloc/vmmalloc/backend"
)

// stream is a queue of work on one device. The world's lock guards it.
//
// A process may create streams by the hundred thousand (one per request,
// or a hostile trace naming that many), so the record is kept to 64 bytes,
// one allocation size class.
type stream struct {
	id        backend.Stream
	proc      *process
	submitted uint64 // work items ever queued
	completed uint64 // work items completed; pending = submitted − completed
	queue     []work // pending items, oldest first
	dev       int32
	held      bool // work waits for the test to complete it
	destroyed bool // StreamDestroy was called; kept while work is pending
}

// work is one launched kernel touching [va, va+size).
type work struct {
	seq      uint64 // 1-based position on its stream
	va, size uint64
	mems     []*physMem // physical memory it touches through mappings
	host     *hostAlloc // pinned host block it touches, if any
}

// event captures a point on a stream.
type event struct {
	id  backend.Event
	dev int
	s   *stream // nil until recorded
	seq uint64  // work on s up to and including seq
}

// ViolationKind says what a Violation is.
type ViolationKind int

const (
	// ViolationUnmapInUse: Unmap of memory pending work still touches.
	ViolationUnmapInUse ViolationKind = iota
	// ViolationFreeInUse: physical memory released while pending work
	// still touches it.
	ViolationFreeInUse
	// ViolationFreeHostInUse: FreeHost of pinned memory pending work still
	// touches.
	ViolationFreeHostInUse
	// ViolationIllegalAccess: Launch of work on memory that is not mapped,
	// or not accessible (SetAccess read-write) to the stream's device.
	ViolationIllegalAccess
)

func (k ViolationKind) String() string {
	switch k {
	case ViolationUnmapInUse:
		return "unmap-in-use"
	case ViolationFreeInUse:
		return "free-in-use"
	case ViolationFreeHostInUse:
		return "free-host-in-use"
	case ViolationIllegalAccess:
		return "illegal-access"
	}
	return fmt.Sprintf("ViolationKind(%d)", int(k))
}

// Violation is a use of memory by device work that a real device would turn
// into corruption or an illegal-memory-access fault.
type Violation struct {
	Kind   ViolationKind
	Pid    int32          // process whose stream ran the work
	Stream backend.Stream // the stream
	Device int            // the stream's device
	Seq    uint64         // the work item's 1-based position on the stream
	VA     uintptr        // start of the range the work touches
	Size   uint64         // nbytes the work touches
	Msg    string         // what happened
}

func (v Violation) String() string {
	return fmt.Sprintf("%v: pid %d stream %d (device %d) work #%d [%#x,+%d): %s",
		v.Kind, v.Pid, v.Stream, v.Device, v.Seq, v.VA, v.Size, v.Msg)
}

// violate records a violation by item it of stream s.
func (w *world) violate(kind ViolationKind, s *stream, it *work, format string, args ...any) {
	w.viols = append(w.viols, Violation{
		Kind: kind, Pid: s.proc.pid, Stream: s.id, Device: int(s.dev), Seq: it.seq,
		VA: uintptr(it.va), Size: it.size, Msg: fmt.Sprintf(format, args...),
	})
}

// busyStreams returns the streams with pending work in id order, so that
// violations are recorded deterministically.
func (w *world) busyStreams() []*stream {
	if len(w.busy) == 0 {
		return nil
	}
	ss := make([]*stream, 0, len(w.busy))
	for s := range w.busy {
		ss = append(ss, s)
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].id < ss[j].id })
	return ss
}

// checkUnmap records pending work of p that touches mapping m.
func (w *world) checkUnmap(p *process, m *mapping) {
	for _, s := range w.busyStreams() {
		if s.proc != p {
			continue
		}
		for i := range s.queue {
			it := &s.queue[i]
			if it.size > 0 && it.va < m.va+m.size && m.va < it.va+it.size {
				w.violate(ViolationUnmapInUse, s, it, "unmap of [%#x,+%d) while the work is pending", m.va, m.size)
			}
		}
	}
}

// checkFree records pending work that touches physical memory m.
func (w *world) checkFree(m *physMem) {
	for _, s := range w.busyStreams() {
		for i := range s.queue {
			it := &s.queue[i]
			for _, x := range it.mems {
				if x == m {
					w.violate(ViolationFreeInUse, s, it, "physical memory %d (%d bytes) released while the work is pending", m.id, m.size)
					break
				}
			}
		}
	}
}

// checkFreeHost records pending work that touches host block a.
func (w *world) checkFreeHost(a *hostAlloc) {
	for _, s := range w.busyStreams() {
		for i := range s.queue {
			if it := &s.queue[i]; it.host == a {
				w.violate(ViolationFreeHostInUse, s, it, "FreeHost of %#x while the work is pending", a.p)
			}
		}
	}
}

// complete finishes the first n pending items of s.
func (w *world) complete(s *stream, n int) {
	if n <= 0 {
		return
	}
	clear(s.queue[:n]) // drop references for the GC
	s.queue = s.queue[n:]
	s.completed += uint64(n)
	if len(s.queue) == 0 {
		s.queue = s.queue[:0:0]
		delete(w.busy, s)
		if s.destroyed {
			delete(s.proc.streams, s.id)
		}
	}
}

// completeTo finishes the work of s up to and including seq.
func (w *world) completeTo(s *stream, seq uint64) {
	if seq > s.completed {
		w.complete(s, int(seq-s.completed))
	}
}

// stream finds a live stream of this process.
func (e *Emulator) stream(op backend.Op, id backend.Stream) (*stream, error) {
	s, ok := e.p.streams[id]
	if !ok || s.destroyed {
		return nil, e.fail(op, backend.ErrInvalidArgument, "", "unknown stream %d", id)
	}
	return s, nil
}

func (e *Emulator) event(op backend.Op, id backend.Event) (*event, error) {
	ev, ok := e.p.events[id]
	if !ok {
		return nil, e.fail(op, backend.ErrInvalidArgument, "", "unknown event %d", id)
	}
	return ev, nil
}

// StreamCreate creates a stream on dev, held if WithManualCompletion.
func (e *Emulator) StreamCreate(dev int) (backend.Stream, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpStreamCreate
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if !w.checkDevice(dev) {
		return 0, e.fail(op, backend.ErrInvalidArgument, "", "device %d out of range [0,%d)", dev, len(w.devs))
	}
	w.next.stream++
	s := &stream{id: backend.Stream(w.next.stream), dev: int32(dev), proc: p, held: w.cfg.manual}
	p.streams[s.id] = s
	e.charge(op, 0)
	return s.id, nil
}

// StreamDestroy destroys a stream. Pending work stays pending (and can
// still be completed through Complete) as on a device, which finishes it
// in the background.
func (e *Emulator) StreamDestroy(id backend.Stream) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpStreamDestroy
	if err := e.begin(op); err != nil {
		return err
	}
	s, err := e.stream(op, id)
	if err != nil {
		return err
	}
	s.destroyed = true
	if len(s.queue) == 0 {
		delete(p.streams, id)
	}
	e.charge(op, 0)
	return nil
}

// StreamSynchronize completes all work queued on s.
func (e *Emulator) StreamSynchronize(id backend.Stream) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpStreamSync
	if err := e.begin(op); err != nil {
		return err
	}
	s, err := e.stream(op, id)
	if err != nil {
		return err
	}
	w.complete(s, len(s.queue))
	e.charge(op, 0)
	return nil
}

// StreamDevice reports the device of s. It is not a driver primitive: it is
// not counted, and its errors name OpStreamSync.
func (e *Emulator) StreamDevice(id backend.Stream) (int, error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.p.closed {
		return 0, newErr(backend.OpStreamSync, backend.ErrUnavailable, "", "StreamDevice: process %d is closed", e.p.pid)
	}
	s, ok := e.p.streams[id]
	if !ok || s.destroyed {
		return 0, newErr(backend.OpStreamSync, backend.ErrInvalidArgument, "", "StreamDevice: unknown stream %d", id)
	}
	return int(s.dev), nil
}

// EventCreate creates an event on dev.
func (e *Emulator) EventCreate(dev int) (backend.Event, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpEventCreate
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if !w.checkDevice(dev) {
		return 0, e.fail(op, backend.ErrInvalidArgument, "", "device %d out of range [0,%d)", dev, len(w.devs))
	}
	w.next.event++
	ev := &event{id: backend.Event(w.next.event), dev: dev}
	p.events[ev.id] = ev
	e.charge(op, 0)
	return ev.id, nil
}

// EventDestroy destroys an event.
func (e *Emulator) EventDestroy(id backend.Event) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpEventDestroy
	if err := e.begin(op); err != nil {
		return err
	}
	if _, err := e.event(op, id); err != nil {
		return err
	}
	delete(e.p.events, id)
	e.charge(op, 0)
	return nil
}

// EventRecord captures the work queued on s so far into ev; the event and
// the stream must belong to one device.
func (e *Emulator) EventRecord(evID backend.Event, sID backend.Stream) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpEventRecord
	if err := e.begin(op); err != nil {
		return err
	}
	ev, err := e.event(op, evID)
	if err != nil {
		return err
	}
	s, err := e.stream(op, sID)
	if err != nil {
		return err
	}
	if ev.dev != int(s.dev) {
		return e.fail(op, backend.ErrInvalidArgument, "", "event %d is on device %d, stream %d on device %d", evID, ev.dev, sID, s.dev)
	}
	ev.s, ev.seq = s, s.submitted
	e.charge(op, 0)
	return nil
}

// EventQuery reports whether the work captured by ev has completed; an
// event never recorded has.
func (e *Emulator) EventQuery(id backend.Event) (bool, error) {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpEventQuery
	if err := e.begin(op); err != nil {
		return false, err
	}
	ev, err := e.event(op, id)
	if err != nil {
		return false, err
	}
	e.charge(op, 0)
	return ev.s == nil || ev.s.completed >= ev.seq, nil
}

// EventSynchronize completes the work captured by ev.
func (e *Emulator) EventSynchronize(id backend.Event) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpEventSync
	if err := e.begin(op); err != nil {
		return err
	}
	ev, err := e.event(op, id)
	if err != nil {
		return err
	}
	if ev.s != nil {
		w.completeTo(ev.s, ev.seq)
	}
	e.charge(op, 0)
	return nil
}

// harnessStream finds a stream of this process for a test-harness method;
// destroyed streams with pending work are found too.
func (e *Emulator) harnessStream(what string, id backend.Stream) (*stream, error) {
	if e.p.closed {
		return nil, fmt.Errorf("emulated: %s: process %d is closed: %w", what, e.p.pid, backend.ErrUnavailable)
	}
	s, ok := e.p.streams[id]
	if !ok {
		return nil, fmt.Errorf("emulated: %s: unknown stream %d: %w", what, id, backend.ErrInvalidArgument)
	}
	return s, nil
}

// Launch queues a kernel on s that touches [va, va+size) (size 0: touches
// nothing). The range must be mapped with read-write access for the
// stream's device, or lie in MallocHost memory or in the device range of
// registered host memory; otherwise an illegal-access Violation is
// recorded (the work is still queued). Work on a stream that is not held
// completes at once. Launch is test harness, not a driver primitive, and
// is not counted.
func (e *Emulator) Launch(id backend.Stream, va uintptr, size uint64) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	s, err := e.harnessStream("Launch", id)
	if err != nil {
		return err
	}
	if s.destroyed {
		return fmt.Errorf("emulated: Launch: stream %d is destroyed: %w", id, backend.ErrInvalidArgument)
	}
	s.submitted++
	it := work{seq: s.submitted, va: uint64(va), size: size}
	e.resolve(s, &it, s.held)
	if !s.held {
		s.completed++
		return nil
	}
	s.queue = append(s.queue, it)
	w.busy[s] = struct{}{}
	return nil
}

// resolve checks that work it may touch its range, recording an illegal
// access otherwise, and, if keep, notes the memory it touches.
func (e *Emulator) resolve(s *stream, it *work, keep bool) {
	p := e.p
	if it.size == 0 {
		return
	}
	end := it.va + it.size
	if end < it.va {
		e.w.violate(ViolationIllegalAccess, s, it, "range wraps around the address space")
		return
	}
	if x, ok := p.hosts.containing(it.va); ok && end <= x.end {
		if keep {
			it.host = x.v
		}
		return
	}
	if x, ok := p.devRegs.containing(it.va); ok && end <= x.end {
		return
	}
	dev := backend.Location{Type: backend.LocationDevice, ID: int(s.dev)}
	for a := it.va; a < end; {
		x, ok := p.maps.containing(a)
		if !ok {
			e.w.violate(ViolationIllegalAccess, s, it, "%#x is not mapped", a)
			return
		}
		if keep {
			it.mems = append(it.mems, x.v.h.mem)
		}
		if accessOf(x.v.access, dev) != backend.AccessReadWrite {
			e.w.violate(ViolationIllegalAccess, s, it, "mapping at %#x is not read-write for device %d", x.start, s.dev)
			return
		}
		a = x.end
	}
}

// Hold makes work on s stay pending until the test completes it.
func (e *Emulator) Hold(id backend.Stream) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	s, err := e.harnessStream("Hold", id)
	if err != nil {
		return err
	}
	s.held = true
	return nil
}

// Resume completes the pending work of s and makes later work complete at
// once again.
func (e *Emulator) Resume(id backend.Stream) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	s, err := e.harnessStream("Resume", id)
	if err != nil {
		return err
	}
	s.held = false
	e.w.complete(s, len(s.queue))
	return nil
}

// Complete completes all pending work of s.
func (e *Emulator) Complete(id backend.Stream) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	s, err := e.harnessStream("Complete", id)
	if err != nil {
		return err
	}
	e.w.complete(s, len(s.queue))
	return nil
}

// CompleteN completes the oldest n pending work items of s; n must not
// exceed Pending(s).
func (e *Emulator) CompleteN(id backend.Stream, n int) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	s, err := e.harnessStream("CompleteN", id)
	if err != nil {
		return err
	}
	if n < 0 || n > len(s.queue) {
		return fmt.Errorf("emulated: CompleteN(%d, %d): %d item(s) pending: %w", id, n, len(s.queue), backend.ErrInvalidArgument)
	}
	e.w.complete(s, n)
	return nil
}

// CompleteAll completes the pending work of every stream of this process.
func (e *Emulator) CompleteAll() error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	if e.p.closed {
		return fmt.Errorf("emulated: CompleteAll: process %d is closed: %w", e.p.pid, backend.ErrUnavailable)
	}
	for _, s := range e.w.busyStreams() {
		if s.proc == e.p {
			e.w.complete(s, len(s.queue))
		}
	}
	return nil
}

// Pending returns the number of incomplete work items on s.
func (e *Emulator) Pending(id backend.Stream) (int, error) {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	s, err := e.harnessStream("Pending", id)
	if err != nil {
		return 0, err
	}
	return len(s.queue), nil
}

// Violations returns every violation recorded so far by any process, in
// the order they happened.
func (e *Emulator) Violations() []Violation {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	return append([]Violation(nil), e.w.viols...)
}

// ClearViolations forgets the recorded violations.
func (e *Emulator) ClearViolations() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.w.viols = nil
}
