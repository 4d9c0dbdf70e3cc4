package acl

import "github.com/vmmalloc/vmmalloc/backend"

// AdoptStream makes stream s of device dev, created by someone else
// (torch_npu's aclrtStream), usable with the Driver, and returns the
// backend.Stream that names it. ACL has no query of a stream's device, so
// the binding takes dev on trust; a stream it already knows is checked
// against its record. The NULL stream (the current context's default
// stream) cannot be adopted: ACL has no handle that names it for one
// device. The binding never destroys an adopted stream (StreamDestroy and
// Close leave it); DisownStream forgets it, which its owner must have the
// binding do before destroying it.
func (d *Driver) AdoptStream(dev int, s uintptr) (backend.Stream, error) {
	const op = backend.OpStreamSync
	if !d.validDev(dev) {
		return 0, invalid(op, "", "device %d of %d", dev, len(d.phys))
	}
	if s == 0 {
		return 0, invalid(op, "", "the NULL stream cannot be adopted")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	if known, ok := d.streams[backend.Stream(s)]; ok {
		if known != dev {
			return 0, invalid(op, "", "stream %#x is of device %d, not %d", s, known, dev)
		}
		return backend.Stream(s), nil
	}
	d.streams[backend.Stream(s)] = dev
	if d.adopted == nil {
		d.adopted = map[backend.Stream]bool{}
	}
	d.adopted[backend.Stream(s)] = true
	return backend.Stream(s), nil
}

// DisownStream forgets an adopted stream, before its owner destroys it. A
// stream the Driver created or does not know is refused.
func (d *Driver) DisownStream(s backend.Stream) error {
	const op = backend.OpStreamDestroy
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	if !d.adopted[s] {
		return invalid(op, "", "stream %#x was not adopted", uint64(s))
	}
	delete(d.adopted, s)
	delete(d.streams, s)
	return nil
}
