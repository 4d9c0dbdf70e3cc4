package ipc

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Mapping is exported memory imported into this process: a fresh
// reservation with every handle of a Descriptor imported and mapped,
// read-write for the device.
type Mapping struct {
	Ptr  uintptr // the first exported byte, in this process
	Size uint64  // nbytes exported

	drv    backend.Driver
	dev    int
	base   uintptr          // the reservation
	span   uint64           // nbytes reserved: the descriptor's Span
	hs     []backend.Handle // imported handles, in layout order
	sizes  []uint64         // nbytes of each handle
	mu     sync.Mutex
	closed bool // mu
}

// sizedImporter is a driver that cannot learn an imported handle's size
// from the driver and takes it from the exporter (backend/acl).
type sizedImporter interface {
	ImportSized(shareable uint64, dev int, size uint64) (backend.Handle, error)
}

// Import maps the memory d names into this process over drv, on device
// dev: reserve the span, import every shareable handle, map each in
// order, set read-write access for dev. Any failing step rolls back every
// earlier one in reverse, and the error wraps the driver's (an importer
// the exporter did not whitelist gets backend.ErrNotPermitted). Over an
// fd-based driver the shareables must carry fds of this process (Client
// does that). Drivers that take the handle's size beside the shareable
// (backend/acl's ImportSized) get it from the descriptor.
func Import(drv backend.Driver, d Descriptor, dev int) (*Mapping, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	x, ok := drv.(backend.IPC)
	if !ok {
		return nil, fmt.Errorf("ipc: driver %q cannot share memory: %w", drv.Name(), backend.ErrNotSupported)
	}
	m := &Mapping{drv: drv, dev: dev, span: d.Span()}
	base, err := drv.ReserveAddress(m.span)
	if err != nil {
		return nil, fmt.Errorf("ipc: reserve %d bytes: %w", m.span, err)
	}
	m.base = base
	mapped := 0
	fail := func(err error) (*Mapping, error) {
		return nil, errors.Join(err, m.undo(mapped))
	}
	for i, hd := range d.Handles {
		var h backend.Handle
		var err error
		if si, ok := drv.(sizedImporter); ok {
			h, err = si.ImportSized(hd.Shareable, dev, hd.Size)
		} else {
			h, err = x.Import(hd.Shareable, dev)
		}
		if err != nil {
			return fail(fmt.Errorf("ipc: import handle %d of %d: %w", i, len(d.Handles), err))
		}
		m.hs = append(m.hs, h)
		m.sizes = append(m.sizes, hd.Size)
		if err := drv.Map(base+uintptr(hd.Offset), hd.Size, h); err != nil {
			return fail(fmt.Errorf("ipc: map handle %d of %d: %w", i, len(d.Handles), err))
		}
		mapped++
	}
	access := []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice, ID: dev}, Flags: backend.AccessReadWrite}}
	for i, hd := range d.Handles {
		if err := drv.SetAccess(base+uintptr(hd.Offset), hd.Size, access); err != nil {
			return fail(fmt.Errorf("ipc: set access on handle %d of %d: %w", i, len(d.Handles), err))
		}
	}
	m.Ptr, m.Size = base+uintptr(d.Offset), d.Size
	return m, nil
}

// undo unmaps the first mapped handles, frees every imported handle and
// releases the reservation, in reverse order, carrying on past failures.
func (m *Mapping) undo(mapped int) error {
	var errs []error
	var at uint64
	offs := make([]uint64, len(m.hs))
	for i := range m.hs {
		offs[i] = at
		at += m.sizes[i]
	}
	for i := len(m.hs) - 1; i >= 0; i-- {
		if i < mapped {
			if err := m.drv.Unmap(m.base+uintptr(offs[i]), m.sizes[i]); err != nil {
				errs = append(errs, fmt.Errorf("ipc: unmap handle %d: %w", i, err))
			}
		}
		if err := m.drv.FreePhysical(m.hs[i]); err != nil {
			errs = append(errs, fmt.Errorf("ipc: free handle %d: %w", i, err))
		}
	}
	if err := m.drv.ReleaseAddress(m.base, m.span); err != nil {
		errs = append(errs, fmt.Errorf("ipc: release reservation: %w", err))
	}
	return errors.Join(errs...)
}

// Close unmaps the memory, frees the imported handles and releases the
// reservation. The memory itself lives on while another process holds it.
// Work on the mapping must have completed. Close is idempotent; after a
// failed Close the failed steps are not retried.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.undo(len(m.hs))
}
