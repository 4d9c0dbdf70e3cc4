package ipc

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
)

// ErrClosed is wrapped by the error of every call, other than Close, on a
// closed Exporter, Export or Server. Close itself is idempotent on all of
// them and on Mapping.
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

// Exporter shares allocations of one allocator with other processes. For
// every physical handle it exported it caches the shareable handle (a
// driver exports a handle once) and holds a driver reference
// (RetainHandle), for as long as an open Export names the handle or the
// allocator still maps it; then it frees the reference at once (see the
// package doc's Lifecycle).
type Exporter struct {
	a    *allocator.Allocator
	drv  backend.Driver
	ipc  backend.IPC
	hold *holder // e as the allocator's ShareHolder

	mu     sync.Mutex
	shared map[backend.Handle]*sharedHandle // handles holding a reference; mu
	closed bool                             // mu
}

// holder is an Exporter as the allocator sees it (allocator.ShareHolder),
// so that ReleaseUnmapped is not part of the Exporter's API.
type holder Exporter

// sharedHandle is one physical handle the Exporter holds a reference to.
// The Exporter's mu guards every field.
type sharedHandle struct {
	h         backend.Handle // the Exporter's retained reference
	shareable uint64
	size      uint64 // nbytes
	flags     backend.ShareFlags
	exports   int  // open Exports that name it
	exported  bool // the driver made it shareable
	// unmapped: the allocator no longer maps the handle, so the reference
	// goes as soon as exports is 0. Only the allocator's lock frees such
	// a reference (ReleaseUnmapped), so that the handle's value cannot be
	// reused by the driver while the allocator still has it registered.
	unmapped bool
}

// NewExporter returns an Exporter for a. The driver must implement
// backend.IPC; otherwise the error wraps backend.ErrNotSupported.
func NewExporter(a *allocator.Allocator) (*Exporter, error) {
	drv := a.Driver()
	x, ok := drv.(backend.IPC)
	if !ok {
		return nil, fmt.Errorf("ipc: driver %q cannot share memory: %w", drv.Name(), backend.ErrNotSupported)
	}
	e := &Exporter{a: a, drv: drv, ipc: x, shared: map[backend.Handle]*sharedHandle{}}
	e.hold = (*holder)(e)
	return e, nil
}

// Export is one exported allocation. Its Descriptor is what an importer
// needs; Close ends the export on this side (importers keep their maps).
type Export struct {
	Descriptor
	e  *Exporter
	hs []*sharedHandle // one per handle of the descriptor; nil once closed
}

// Export shares the live allocation at ptr. It registers the allocation's
// handles with the allocator (allocator.ShareSpans: they are never cached
// for reuse from now on), retains and exports every one this Exporter
// holds no reference to yet, and whitelists opts.Pids on all of them. The
// caller keeps the allocation live while it is exported (as PyTorch's
// CUDA IPC requires: the allocator may hand freed memory out again). On
// error no Export exists and no reference leaks: handles this call
// retained but could not export are freed again; handles the driver did
// export stay cached (retained) while the allocator maps them, because a
// driver exports a handle only once.
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
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("ipc: export on a closed Exporter: %w", ErrClosed)
	}
	// Registered before any reference is taken, without e.mu (lock order:
	// the allocator's lock, then e.mu).
	size, spans, err := e.a.ShareSpans(ptr, e.hold)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("ipc: export on a closed Exporter: %w", ErrClosed)
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
				continue // kept: freed when the allocator unmaps it, or by Close
			}
			delete(e.shared, s.h)
		}
		return nil, errors.Join(append([]error{err}, errs...)...)
	}
	var at uint64
	for _, sp := range spans {
		s := e.shared[sp.Handle]
		switch {
		case s != nil && s.unmapped:
			return fail(fmt.Errorf("ipc: handle %#x at %#x is mapped by the allocator, but held as unmapped: %w", uint64(sp.Handle), sp.VA, backend.ErrInvalidArgument))
		case s != nil && !s.exported:
			// Retained by an export whose rollback could not free it.
			var err error
			if s.shareable, err = e.ipc.Export(s.h, flags); err != nil {
				return fail(fmt.Errorf("ipc: export handle at %#x: %w", sp.VA, err))
			}
			s.exported, s.flags = true, flags
		case s != nil:
			// Exported and retained already: reuse its shareable (R15).
			if s.flags != flags {
				return fail(fmt.Errorf("ipc: handle at %#x was exported with flags %d, not %d: %w", sp.VA, s.flags, flags, backend.ErrInvalidArgument))
			}
		default:
			h, err := e.drv.RetainHandle(sp.VA)
			if err != nil {
				return fail(fmt.Errorf("ipc: retain handle at %#x: %w", sp.VA, err))
			}
			if h != sp.Handle {
				err := fmt.Errorf("ipc: the driver retained handle %#x at %#x, the allocator maps %#x: %w", uint64(h), sp.VA, uint64(sp.Handle), backend.ErrInvalidArgument)
				return fail(errors.Join(err, e.drv.FreePhysical(h)))
			}
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
// On a closed Export or Exporter it returns an error wrapping ErrClosed.
func (x *Export) Allow(pids ...int32) error {
	x.e.mu.Lock()
	defer x.e.mu.Unlock()
	if x.hs == nil || x.e.closed {
		return fmt.Errorf("ipc: allow on a closed export: %w", ErrClosed)
	}
	for _, s := range x.hs {
		if err := x.e.ipc.SetPids(s.shareable, pids); err != nil {
			return fmt.Errorf("ipc: whitelist pids: %w", err)
		}
	}
	return nil
}

// Close ends the export on this side. Handles the allocator still maps
// stay retained (with their shareables, for the next export of memory in
// them); the Exporter frees its reference to every other handle no open
// Export names, and the driver frees the memory once importers let go
// (R3). Close is idempotent. The error reports a failed free; the handle
// stays held and counted (allocator.DeviceStats.ExporterHeldBytes), and
// EmptyCache, the allocator's OOM ladder or Exporter.Close retry it.
func (x *Export) Close() error {
	e := x.e
	e.mu.Lock()
	var gone []backend.Handle
	for _, s := range x.hs {
		if s.exports--; s.exports == 0 && s.unmapped {
			gone = append(gone, s.h)
		}
	}
	x.hs = nil
	e.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	return e.a.ReleaseShared(e.hold, gone...)
}

// ReleaseUnmapped implements allocator.ShareHolder: the allocator no
// longer maps h. Called with the allocator's lock held; it takes e.mu and
// calls only the driver.
func (e *holder) ReleaseUnmapped(h backend.Handle) (held bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.shared[h]
	if s == nil {
		return false, nil
	}
	s.unmapped = true
	if s.exports > 0 {
		return true, nil
	}
	if err := e.drv.FreePhysical(h); err != nil {
		return true, fmt.Errorf("ipc: free exported handle %#x: %w", uint64(h), err)
	}
	delete(e.shared, h)
	return false, nil
}

// Exported is the number of physical handles the Exporter holds a
// reference to: those an open Export names, and those the allocator still
// maps that it exported. It drops to 0 once every Export is closed and
// the allocator has unmapped the memory (Free, then EmptyCache or any
// release), and is 0 after Close.
func (e *Exporter) Exported() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.shared)
}

// Close frees the Exporter's references to every handle it holds; memory
// that importers still map lives until they let go (the driver defers the
// release). Exports must have been closed (an open one is an error
// wrapping backend.ErrInvalidArgument, and nothing changes). Afterwards
// Export and Export.Allow return errors wrapping ErrClosed. Handles the
// allocator still maps stay exported by the driver until it unmaps them,
// so no other Exporter can export them meanwhile (R15). If a free fails,
// Close returns the error and a later Close retries; a handle the
// allocator no longer maps is freed under the allocator's lock, and one
// whose free fails there stays counted until EmptyCache or the
// allocator's OOM ladder retries it. Close is idempotent.
func (e *Exporter) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	open := 0
	for _, s := range e.shared {
		if s.exports > 0 {
			open++
		}
	}
	if open > 0 {
		e.mu.Unlock()
		return fmt.Errorf("ipc: %d handles still exported by open Exports: %w", open, backend.ErrInvalidArgument)
	}
	hs := make([]backend.Handle, 0, len(e.shared))
	for h := range e.shared {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	var errs []error
	var unmapped []backend.Handle
	for _, h := range hs {
		if e.shared[h].unmapped {
			unmapped = append(unmapped, h) // freed under the allocator's lock, below
			continue
		}
		if err := e.drv.FreePhysical(h); err != nil {
			errs = append(errs, err)
			continue // kept: Close may be called again
		}
		delete(e.shared, h)
	}
	if len(errs) > 0 {
		e.mu.Unlock()
		return errors.Join(errs...)
	}
	e.closed = true
	e.mu.Unlock()
	if len(unmapped) == 0 {
		return nil
	}
	return e.a.ReleaseShared(e.hold, unmapped...)
}
