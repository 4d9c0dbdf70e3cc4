package emulated

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Emulator is one process's view of an emulated driver. It implements
// backend.Driver, backend.IPC and backend.HostMemory. All views made by
// Process from one New share devices, physical memory and one lock.
type Emulator struct {
	w *world
	p *process
}

var (
	_ backend.Driver     = (*Emulator)(nil)
	_ backend.IPC        = (*Emulator)(nil)
	_ backend.HostMemory = (*Emulator)(nil)
)

// world is the state shared by every process view.
type world struct {
	mu  sync.Mutex
	cfg config // immutable after New

	back      backing              // guarded by mu
	devs      []device             // guarded by mu; indexed by device ordinal
	hostBytes uint64               // guarded by mu; nbytes of pinned host memory in use
	devPtrs   *vaSpace             // guarded by mu; device addresses of registered host memory
	procs     map[int32]*process   // guarded by mu; live processes by pid
	exports   map[uint64]*export   // guarded by mu; live shareable handles
	tenants   map[TenantID]tenant  // guarded by mu
	busy      map[*stream]struct{} // guarded by mu; streams with pending work
	viols     []Violation          // guarded by mu
	next      struct {             // guarded by mu; id counters (last id given)
		handle, stream, event, shareable, mem, tenant uint64
	}
}

// device is the accounting of one device.
type device struct {
	capacity uint64 // nbytes
	physical uint64 // nbytes of physical memory that exists on it (freed-pending included)
	tenants  uint64 // nbytes taken by Occupy
}

func (d *device) free() uint64 { return d.capacity - d.physical - d.tenants }

// tenant is memory another tenant holds (Occupy).
type tenant struct {
	dev    int
	nbytes uint64
}

// physMem is physical memory, shared by every process that holds a handle.
type physMem struct {
	id      uint64
	loc     backend.Location // where it lives (the creator's location)
	size    uint64           // nbytes
	holders int              // process handles that refer to it
	fd      int              // backing id (memfd), -1 if none
	exp     *export          // live export, nil if none
}

// export is a shareable handle (R15–R17).
type export struct {
	id      uint64
	mem     *physMem
	owner   *process
	h       *handle
	flags   backend.ShareFlags
	allowed map[int32]bool // whitelisted importer pids (R16)
}

// handle is a process's handle to physical memory.
type handle struct {
	id        backend.Handle
	mem       *physMem
	prop      backend.PhysicalProp // as this process sees it (Import may name another device)
	size      uint64               // nbytes
	refs      int                  // 1 + retains − frees; 0 = freed (pending while mapped > 0)
	mapped    int                  // live mappings of this handle
	imported  bool
	shareable uint64 // shareable handle it was exported as or imported from; 0 if none
}

// reservation is reserved virtual address space.
type reservation struct {
	va, size, extent uint64 // start, size as reserved, size as rounded (nbytes)
	nmaps            int    // live mappings in it
	boundLoc         backend.Location
	boundImported    bool // valid while nmaps > 0 (R7)
}

// mapping maps one whole handle at va.
type mapping struct {
	va, size uint64
	h        *handle
	res      *reservation
	access   []backend.AccessDesc // sorted by location; absent = AccessNone (R8)
}

// hostAlloc is pinned host memory from MallocHost.
type hostAlloc struct {
	p, size, extent uint64 // start, size asked, size rounded (nbytes)
	regs            int    // registrations inside it
}

// hostReg is a registered host range (HostRegister).
type hostReg struct {
	p, size, dev uint64 // host start, nbytes, device address (0 if pin only)
	flags        backend.HostRegisterFlags
	alloc        *hostAlloc // the MallocHost block it lies in, if any
}

// process is one process's tables. The world's lock guards every field but
// the atomic counters.
type process struct {
	pid     int32
	view    *Emulator
	closed  bool
	handles map[backend.Handle]*handle
	maps    index[*mapping]
	res     index[*reservation]
	streams map[backend.Stream]*stream // destroyed streams stay while work is pending
	events  map[backend.Event]*event
	hosts   index[*hostAlloc]
	regs    index[*hostReg]    // by host address
	devRegs index[*hostReg]    // by device address
	imports map[uint64]*handle // shareable → the handle imported from it (1:1, R15)
	faults  faults

	calls    [backend.NumOps]atomic.Int64 // calls made, failed ones included
	failed   [backend.NumOps]atomic.Int64 // calls that returned an error
	simNanos atomic.Int64                 // simulated time charged, ns
	simByOp  [backend.NumOps]atomic.Int64 // simNanos by primitive, ns
}

// New creates an emulated driver and returns the view of its first process.
func New(opts ...Option) (*Emulator, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	w := &world{
		cfg:     cfg,
		devs:    make([]device, cfg.devices),
		devPtrs: newVASpace(devPtrBase, devPtrLimit),
		procs:   map[int32]*process{},
		exports: map[uint64]*export{},
		tenants: map[TenantID]tenant{},
		busy:    map[*stream]struct{}{},
	}
	for i := range w.devs {
		w.devs[i].capacity = cfg.capacity
	}
	if cfg.real {
		b, err := newReal(&cfg)
		if err != nil {
			var be *backingError
			if errors.As(err, &be) {
				return nil, fmt.Errorf("emulated: %s: %w", be.msg, be.kind)
			}
			return nil, err
		}
		w.back = b
	} else {
		w.back = newAccounting(&cfg)
	}
	return w.newProcess(cfg.pid), nil
}

func (w *world) newProcess(pid int32) *Emulator {
	p := &process{
		pid:     pid,
		handles: map[backend.Handle]*handle{},
		maps:    newIndex[*mapping](),
		res:     newIndex[*reservation](),
		streams: map[backend.Stream]*stream{},
		events:  map[backend.Event]*event{},
		hosts:   newIndex[*hostAlloc](),
		regs:    newIndex[*hostReg](),
		devRegs: newIndex[*hostReg](),
		imports: map[uint64]*handle{},
	}
	p.view = &Emulator{w: w, p: p}
	w.procs[pid] = p
	return p.view
}

// Process returns the view of process pid, which shares this emulator's
// devices and physical memory. A live process's view is returned as is; a
// pid whose process was closed (or never existed) gets a fresh process.
func (e *Emulator) Process(pid int32) (*Emulator, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("emulated: Process(%d): pid must be > 0: %w", pid, backend.ErrInvalidArgument)
	}
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	if p, ok := e.w.procs[pid]; ok {
		return p.view, nil
	}
	return e.w.newProcess(pid), nil
}

// Close ends this process as exit would: its mappings, reservations,
// handles, host memory, streams (with their pending work) and events go
// away, and physical memory no other process holds is released. Later
// calls on this view return ErrUnavailable. Close is idempotent.
func (e *Emulator) Close() error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.closed {
		return nil
	}
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	for s := range p.streams {
		delete(w.busy, p.streams[s])
	}
	p.streams = map[backend.Stream]*stream{}
	p.events = map[backend.Event]*event{}
	var maps []*mapping
	p.maps.each(func(x entry[*mapping]) bool { maps = append(maps, x.v); return true })
	for _, m := range maps {
		keep(w.back.unmap(m.va, m.size))
		p.maps.del(m.va)
		m.h.mapped--
	}
	var res []*reservation
	p.res.each(func(x entry[*reservation]) bool { res = append(res, x.v); return true })
	for _, r := range res {
		keep(w.back.release(r.va, r.extent))
		p.res.del(r.va)
	}
	for _, h := range sortedHandles(p) {
		h.refs = 0
		w.dropHandle(p, h, false)
	}
	var regs []*hostReg
	p.regs.each(func(x entry[*hostReg]) bool { regs = append(regs, x.v); return true })
	for _, r := range regs {
		w.unregister(p, r)
	}
	var hosts []*hostAlloc
	p.hosts.each(func(x entry[*hostAlloc]) bool { hosts = append(hosts, x.v); return true })
	for _, a := range hosts {
		keep(w.back.freeHost(a.p, a.extent))
		p.hosts.del(a.p)
		w.hostBytes -= a.extent
	}
	p.closed = true
	delete(w.procs, p.pid)
	if len(errs) > 0 {
		return fmt.Errorf("emulated: Close: %w", errors.Join(errs...))
	}
	return nil
}

func sortedHandles(p *process) []*handle {
	hs := make([]*handle, 0, len(p.handles))
	for _, h := range p.handles {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].id < hs[j].id })
	return hs
}

// Name returns "emulated".
func (e *Emulator) Name() string { return "emulated" }

// DeviceCount returns the number of devices.
func (e *Emulator) DeviceCount() int { return len(e.w.devs) }

// Pid returns this view's process id (aclrtDeviceGetBareTgid).
func (e *Emulator) Pid() int32 { return e.p.pid }

// aclCode is the ACL error code reported for each kind.
func aclCode(kind error) int {
	switch kind {
	case backend.ErrOutOfMemory:
		return 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION
	case backend.ErrInvalidArgument:
		return 100000 // ACL_ERROR_INVALID_PARAM
	case backend.ErrNotSupported:
		return 207000 // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
	case backend.ErrNotPermitted:
		return 207006 // ACL_ERROR_RT_NO_PERMISSION
	}
	return 507899 // ACL_ERROR_RT_DRV_INTERNAL_ERROR
}

// newErr builds a *backend.Error with the ACL code of its kind.
func newErr(op backend.Op, kind error, rule, format string, args ...any) *backend.Error {
	err := backend.Errorf(op, kind, rule, format, args...)
	err.Code = aclCode(kind)
	return err
}

// fail builds the *backend.Error of a failed call and counts it.
func (e *Emulator) fail(op backend.Op, kind error, rule, format string, args ...any) error {
	e.p.failed[op].Add(1)
	return newErr(op, kind, rule, format, args...)
}

// failCode is fail with an explicit driver code.
func (e *Emulator) failCode(op backend.Op, kind error, code int, rule, format string, args ...any) error {
	err := e.fail(op, kind, rule, format, args...)
	err.(*backend.Error).Code = code
	return err
}

// failBacking reports a backing failure.
func (e *Emulator) failBacking(op backend.Op, err error) error {
	var be *backingError
	if errors.As(err, &be) {
		return e.fail(op, be.kind, "", "%s", be.msg)
	}
	return e.fail(op, backend.ErrUnavailable, "", "%v", err)
}

// begin counts a call of op and applies Close and injected faults. The
// world's lock is held.
func (e *Emulator) begin(op backend.Op) error {
	p := e.p
	n := p.calls[op].Add(1)
	if p.closed {
		return e.fail(op, backend.ErrUnavailable, "", "process %d is closed", p.pid)
	}
	if p.faults.active {
		if kind, ok := p.faults.hit(op, n); ok {
			return e.fail(op, kind, "", "injected fault (call %d)", n)
		}
	}
	return nil
}

// charge adds the simulated cost of a successful call.
func (e *Emulator) charge(op backend.Op, nbytes uint64) {
	if d := e.w.cfg.cost.cost(op, nbytes); d != 0 {
		e.p.simNanos.Add(d)
		e.p.simByOp[op].Add(d)
	}
}

// checkDevice reports whether dev names a device.
func (w *world) checkDevice(dev int) bool { return dev >= 0 && dev < len(w.devs) }
