package ipc

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
)

// ErrClosed is returned by calls on a closed Exporter or Export.
var ErrClosed = errors.New("ipc: closed")

// ExportOptions control who may import an export.
type ExportOptions struct {
	// Pids are added to the driver's whitelist of every handle exported
	// (backend.IPC.SetPids). With pid validation on (the default) an
	// export with no pids can be imported by nobody on a driver that
	// checks pids (ACL); fd-based drivers (CUDA) check nothing, the
	// transport does (Server).
	Pids []int32
	// DisablePidValidation lets any process import
	// (backend.ShareDisablePidValidation). A handle keeps the flag of its
	// first export: exporting it again with the other flag is an error.
	DisablePidValidation bool
}

// Exporter shares allocations of one allocator with other processes. It
// caches the shareable handle of every physical handle it exported (a
// driver exports a handle once) and holds a driver reference
// (RetainHandle) to each until Close, so that the memory outlives the
// allocator's own use of it for as long as importers may need it.
type Exporter struct {
	a   *allocator.Allocator
	drv backend.Driver
	ipc backend.IPC

	mu     sync.Mutex
	shared map[backend.Handle]*sharedHandle // exported handles; mu
	closed bool                             // mu
}

// sharedHandle is one exported physical handle. The Exporter's mu guards
// every field.
type sharedHandle struct {
	h         backend.Handle // the Exporter's retained reference
	shareable uint64
	size      uint64 // nbytes
	flags     backend.ShareFlags
	exports   int  // live Exports that name it
	exported  bool // the driver made shareable
}

// NewExporter returns an Exporter for a. The driver must implement
// backend.IPC; otherwise the error wraps backend.ErrNotSupported.
func NewExporter(a *allocator.Allocator) (*Exporter, error) {
	drv := a.Driver()
	x, ok := drv.(backend.IPC)
	if !ok {
		return nil, fmt.Errorf("ipc: driver %q cannot share memory: %w", drv.Name(), backend.ErrNotSupported)
	}
	return &Exporter{a: a, drv: drv, ipc: x, shared: map[backend.Handle]*sharedHandle{}}, nil
}

// Export is one exported allocation. Its Descriptor is what an importer
// needs; Close ends the export on this side (importers keep their maps).
type Export struct {
	Descriptor
	e  *Exporter
	hs []*sharedHandle // one per handle of the descriptor; nil once closed
}

// Export shares the live allocation at ptr. It retains and exports every
// handle the allocation spans that this Exporter has not exported yet and
// whitelists opts.Pids on all of them. The caller keeps the allocation
// live while it is exported (as PyTorch's CUDA IPC requires: the allocator
// may hand freed memory out again). On error no Export exists and no
// reference leaks: handles this call retained but could not export are
// freed again; handles the driver did export stay cached (retained) until
// the Exporter's Close, because a driver exports a handle only once.
func (e *Exporter) Export(ptr uintptr, opts ExportOptions) (*Export, error) {
	flags := backend.ShareDefault
	if opts.DisablePidValidation {
		flags = backend.ShareDisablePidValidation
	}
	for _, p := range opts.Pids {
		if p <= 0 {
			return nil, fmt.Errorf("ipc: pid %d: %w", p, backend.ErrInvalidArgument)
		}
	}
	size, spans, err := e.a.Spans(ptr)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	d := Descriptor{Device: e.a.Device(), Pid: e.ipc.Pid(), Size: size, Offset: uint64(ptr - spans[0].VA)}
	hs := make([]*sharedHandle, 0, len(spans))
	var fresh []*sharedHandle // retained by this call
	fail := func(err error) (*Export, error) {
		var errs []error
		for _, s := range fresh {
			if s.exported {
				continue // the driver keeps the shareable: keep it cached
			}
			if ferr := e.drv.FreePhysical(s.h); ferr != nil {
				errs = append(errs, ferr)
			}
			delete(e.shared, s.h)
		}
		return nil, errors.Join(append([]error{err}, errs...)...)
	}
	var at uint64
	for _, sp := range spans {
		h, err := e.drv.RetainHandle(sp.VA)
		if err != nil {
			return fail(fmt.Errorf("ipc: retain handle at %#x: %w", sp.VA, err))
		}
		s := e.shared[h]
		if s != nil {
			// Already exported and retained: drop the reference just taken.
			if err := e.drv.FreePhysical(h); err != nil {
				return fail(fmt.Errorf("ipc: release handle at %#x: %w", sp.VA, err))
			}
			if s.flags != flags {
				return fail(fmt.Errorf("ipc: handle at %#x was exported with flags %d, not %d: %w", sp.VA, s.flags, flags, backend.ErrInvalidArgument))
			}
		} else {
			s = &sharedHandle{h: h, size: sp.Size, flags: flags}
			e.shared[h] = s
			fresh = append(fresh, s)
			if s.shareable, err = e.ipc.Export(h, flags); err != nil {
				return fail(fmt.Errorf("ipc: export handle at %#x: %w", sp.VA, err))
			}
			s.exported = true
		}
		hs = append(hs, s)
		d.Handles = append(d.Handles, HandleDesc{Shareable: s.shareable, Size: s.size, Offset: at})
		at += sp.Size
	}
	if len(opts.Pids) > 0 && flags == backend.ShareDefault {
		for _, s := range hs {
			if err := e.ipc.SetPids(s.shareable, opts.Pids); err != nil {
				return fail(fmt.Errorf("ipc: whitelist pids: %w", err))
			}
		}
	}
	for _, s := range hs {
		s.exports++
	}
	return &Export{Descriptor: d, e: e, hs: hs}, nil
}

// Allow whitelists more pids on every handle of x (backend.IPC.SetPids).
func (x *Export) Allow(pids ...int32) error {
	x.e.mu.Lock()
	defer x.e.mu.Unlock()
	if x.hs == nil || x.e.closed {
		return ErrClosed
	}
	for _, s := range x.hs {
		if err := x.e.ipc.SetPids(s.shareable, pids); err != nil {
			return fmt.Errorf("ipc: whitelist pids: %w", err)
		}
	}
	return nil
}

// Close ends the export on this side. The handles stay retained by the
// Exporter until its Close. Close is idempotent.
func (x *Export) Close() error {
	x.e.mu.Lock()
	defer x.e.mu.Unlock()
	for _, s := range x.hs {
		s.exports--
	}
	x.hs = nil
	return nil
}

// Exported is the number of physical handles the Exporter holds.
func (e *Exporter) Exported() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.shared)
}

// Close frees the Exporter's references to every handle it exported;
// memory that importers still map lives until they let go (the driver
// defers the release). Exports must have been closed (an open one is an
// error wrapping backend.ErrInvalidArgument, and nothing changes). Close is
// idempotent.
func (e *Exporter) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	open := 0
	for _, s := range e.shared {
		if s.exports > 0 {
			open++
		}
	}
	if open > 0 {
		return fmt.Errorf("ipc: %d handles still exported by open Exports: %w", open, backend.ErrInvalidArgument)
	}
	hs := make([]backend.Handle, 0, len(e.shared))
	for h := range e.shared {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	var errs []error
	for _, h := range hs {
		if err := e.drv.FreePhysical(h); err != nil {
			errs = append(errs, err)
			continue // kept: Close may be called again
		}
		delete(e.shared, h)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	e.closed = true
	return nil
}
