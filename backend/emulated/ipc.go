package emulated

import (
	"github.com/vmmalloc/vmmalloc/backend"
)

// shareableBase offsets shareable handles from other ids, so that mixing
// them up fails loudly.
const shareableBase = 1 << 32

// Export makes a shareable handle for h (R15). Only device memory this
// process created can be exported, once: exporting the same handle twice is
// an error. ShareDefault checks importers against the SetPids whitelist,
// ShareDisablePidValidation does not. The shareable handle dies with the
// exporter's last reference to h.
func (e *Emulator) Export(id backend.Handle, flags backend.ShareFlags) (uint64, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpExport
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if flags != backend.ShareDefault && flags != backend.ShareDisablePidValidation {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R15", "unknown export flags %#x", uint64(flags))
	}
	h, err := e.lookup(op, id)
	if err != nil {
		return 0, err
	}
	if h.imported {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R15", "handle %d was imported; only handles made by CreatePhysical can be exported", id)
	}
	if h.prop.Location.Type != backend.LocationDevice {
		return 0, e.fail(op, backend.ErrNotSupported, "R15", "handle %d is host memory; only device memory can be shared", id)
	}
	if h.mem.exp != nil {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R15", "handle %d is already exported as %#x", id, h.mem.exp.id)
	}
	w.next.shareable++
	x := &export{id: shareableBase + w.next.shareable, mem: h.mem, owner: p, h: h, flags: flags, allowed: map[int32]bool{}}
	h.mem.exp = x
	h.shareable = x.id
	w.exports[x.id] = x
	e.charge(op, 0)
	return x.id, nil
}

// SetPids adds pids to the whitelist of importers of a shareable handle
// this process exported (R16).
func (e *Emulator) SetPids(shareable uint64, pids []int32) error {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpSetPids
	if err := e.begin(op); err != nil {
		return err
	}
	x, ok := w.exports[shareable]
	if !ok {
		return e.fail(op, backend.ErrInvalidArgument, "R16", "unknown shareable handle %#x", shareable)
	}
	if x.owner != p {
		return e.fail(op, backend.ErrNotPermitted, "R16", "shareable handle %#x was exported by process %d, not %d", shareable, x.owner.pid, p.pid)
	}
	if len(pids) == 0 {
		return e.fail(op, backend.ErrInvalidArgument, "R16", "empty pid list")
	}
	for _, pid := range pids {
		if pid <= 0 {
			return e.fail(op, backend.ErrInvalidArgument, "R16", "invalid pid %d", pid)
		}
	}
	for _, pid := range pids {
		x.allowed[pid] = true
	}
	e.charge(op, 0)
	return nil
}

// Import opens a shareable handle another process exported as a handle of
// this process on dev, which may differ from the exporter's device (R17).
// The memory stays accounted on the exporter's device and lives until every
// process has freed its handle. A process imports a shareable handle at
// most once at a time (R15).
func (e *Emulator) Import(shareable uint64, dev int) (backend.Handle, error) {
	w, p := e.w, e.p
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpImport
	if err := e.begin(op); err != nil {
		return 0, err
	}
	if !w.checkDevice(dev) {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R17", "device %d out of range [0,%d)", dev, len(w.devs))
	}
	x, ok := w.exports[shareable]
	if !ok {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R17", "shareable handle %#x does not exist (never exported, or its memory was freed)", shareable)
	}
	if x.owner == p {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R17", "shareable handle %#x was exported by this process; import works only in another process", shareable)
	}
	if x.flags == backend.ShareDefault && !x.allowed[p.pid] {
		return 0, e.fail(op, backend.ErrNotPermitted, "R16", "pid %d is not on the whitelist of shareable handle %#x", p.pid, shareable)
	}
	if prev, ok := p.imports[shareable]; ok {
		return 0, e.fail(op, backend.ErrInvalidArgument, "R15", "shareable handle %#x is already imported as handle %d", shareable, prev.id)
	}
	w.next.handle++
	h := &handle{
		id:        backend.Handle(w.next.handle),
		mem:       x.mem,
		prop:      backend.PhysicalProp{Location: backend.Location{Type: backend.LocationDevice, ID: dev}, Attr: x.h.prop.Attr},
		size:      x.mem.size,
		refs:      1,
		imported:  true,
		shareable: shareable,
	}
	x.mem.holders++
	p.handles[h.id] = h
	p.imports[shareable] = h
	e.charge(op, 0)
	return h.id, nil
}
