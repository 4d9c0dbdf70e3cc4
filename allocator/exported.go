package allocator

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Exported handles
//
// A physical handle an exporter shares with other processes (allocator/ipc)
// must outlive the allocator's own use of it while an export names it, and
// must never serve another allocation while a peer may map it. The
// allocator keeps a registry of such handles, keyed by handle, which
// ShareSpans fills: from then on, when the allocator unmaps the handle
// (a release, EmptyCache, the OOM ladder, Close), the segment keeps it
// out of the HandleCache and frees the allocator's reference, and the
// allocator tells the handle's ShareHolder, which frees its own reference
// unless an open export still needs it. A handle a holder still holds
// after the allocator unmapped it is "held by exporters": device memory
// in use that ReservedBytes no longer counts (DeviceStats.ExporterHeld*,
// OutOfMemoryError.ExporterHeld, Summary). The holder hands it back through
// ReleaseShared once its last export closes, and the release paths
// (EmptyCache, the OOM ladder) ask again for any it kept after a failed
// free. A handle leaves the registry when the allocator has unmapped it and
// its holder holds it no more.
//
//	ShareSpans ──▶ mapped+shared ──allocator unmaps──▶ holder asked (ReleaseUnmapped)
//	                    │                                   │ still held: held by exporters
//	                    │ (never cached)                     ▼
//	                    │                      ReleaseShared / EmptyCache / OOM ladder ask again
//	                    ▼                                   │ released
//	               (stays while mapped,                      ▼
//	                even if the holder let go)          forgotten
//
// Lock order: mu, then the holder's lock. The allocator calls
// ReleaseUnmapped with mu held; a holder therefore never calls the
// Allocator while holding its own lock, and calls ShareSpans and
// ReleaseShared without it.

// ShareHolder holds driver references to physical handles of an Allocator
// that it shares with other processes, registered with ShareSpans
// (allocator/ipc's Exporter is one; most programs never implement it).
type ShareHolder interface {
	// ReleaseUnmapped is called, with the allocator's lock held, once the
	// allocator no longer maps handle h (its own reference is freed or
	// about to be), and again by ReleaseShared and the release paths
	// while the holder keeps h. The holder frees its reference unless it
	// still needs it (an open export), and reports whether it still holds
	// one: held is true while it needs h or its free failed (err). It must
	// not call the Allocator.
	ReleaseUnmapped(h backend.Handle) (held bool, err error)
}

// exportedHandle is one physical handle of the allocator registered by
// ShareSpans. mu guards every field.
type exportedHandle struct {
	holder ShareHolder
	size   uint64 // nbytes
	// mapped: a segment of the allocator maps the handle; false once the
	// allocator has unmapped it and the holder still held it.
	mapped bool
}

// ShareSpans is Spans for sharing the allocation at ptr with other
// processes: it also registers every handle under ptr as shared by holder
// (see ShareHolder), atomically with the lookup. From then on the
// allocator never caches those handles for reuse, and tells holder when it
// unmaps each. A handle already registered by another holder is an error
// wrapping backend.ErrInvalidArgument (a driver exports a handle at most
// once, R15), and nothing is registered. A handle stays registered while
// the allocator maps it, even if its export fails or its holder lets go
// (the allocator cannot tell whether the driver made it shareable).
func (a *Allocator) ShareSpans(ptr uintptr, holder ShareHolder) (size uint64, spans []HandleSpan, err error) {
	if holder == nil {
		return 0, nil, fmt.Errorf("vmmalloc: ShareSpans: nil holder: %w", backend.ErrInvalidArgument)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if size, spans, err = a.spans(ptr); err != nil {
		return 0, nil, err
	}
	for _, sp := range spans {
		x := a.exported[sp.Handle]
		switch {
		case x == nil:
		case x.holder != holder:
			return 0, nil, fmt.Errorf("vmmalloc: the handle at %#x is shared by another exporter; a driver exports a handle once (R15): %w", sp.VA, backend.ErrInvalidArgument)
		case !x.mapped:
			return 0, nil, corrupt("handle %#x at %#x is mapped, but registered as unmapped", uint64(sp.Handle), sp.VA)
		}
	}
	if a.exported == nil {
		a.exported = make(map[backend.Handle]*exportedHandle)
	}
	for _, sp := range spans {
		if a.exported[sp.Handle] == nil {
			a.exported[sp.Handle] = &exportedHandle{holder: holder, size: sp.Size, mapped: true}
		}
	}
	return size, spans, nil
}

// ReleaseShared tells the allocator that holder may no longer need the
// handles hs (its last export of them closed): for each that the
// allocator has unmapped already, it asks holder again (ReleaseUnmapped,
// with the allocator's lock held) and forgets those it released. Handles
// still mapped, or not registered by holder, are left alone. It works
// after Close too, so that what exporters hold always goes back. The
// error joins the holder's failed frees; those handles stay held and
// EmptyCache and the OOM ladder retry them.
func (a *Allocator) ReleaseShared(holder ShareHolder, hs ...backend.Handle) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for _, h := range hs {
		if x := a.exported[h]; x != nil && x.holder == holder && !x.mapped {
			errs = append(errs, a.askHolder(h, x))
		}
	}
	return errors.Join(errs...)
}

// askHolder asks x's holder to let go of unmapped handle h and forgets h
// if it did. mu held.
func (a *Allocator) askHolder(h backend.Handle, x *exportedHandle) error {
	held, err := x.holder.ReleaseUnmapped(h)
	if !held {
		delete(a.exported, h)
	}
	return err
}

// handleUnmapped is every segment's Config.Unmapped: it reports whether h,
// just unmapped, is shared, and tells its holder. mu held.
func (a *Allocator) handleUnmapped(h backend.Handle, _ uint64) bool {
	x := a.exported[h]
	if x == nil {
		return false
	}
	x.mapped = false
	_ = a.askHolder(h, x) // a failed free keeps h held; the release paths retry
	return true
}

// releaseExported asks the holders of every handle the allocator has
// unmapped and they still hold to let go of what they no longer need
// (EmptyCache and the OOM ladder). mu held.
func (a *Allocator) releaseExported() error {
	if len(a.exported) == 0 {
		return nil
	}
	var hs []backend.Handle
	for h, x := range a.exported {
		if !x.mapped {
			hs = append(hs, h)
		}
	}
	slices.Sort(hs)
	var errs []error
	for _, h := range hs {
		if x := a.exported[h]; x != nil && !x.mapped {
			errs = append(errs, a.askHolder(h, x))
		}
	}
	return errors.Join(errs...)
}

// exportedTotals counts the registry: every shared handle and its bytes,
// and of them those held by exporters only (unmapped by the allocator).
// mu held.
func (a *Allocator) exportedTotals() (handles, bytes, heldHandles, heldBytes int64) {
	for _, x := range a.exported {
		handles++
		bytes += int64(x.size)
		if !x.mapped {
			heldHandles++
			heldBytes += int64(x.size)
		}
	}
	return handles, bytes, heldHandles, heldBytes
}

// checkExported verifies the registry against the segments: a handle
// registered as mapped is mapped, whole and at its size, by a segment (or
// a zombie), and one registered as unmapped is mapped by none. mu held.
func (a *Allocator) checkExported() error {
	if len(a.exported) == 0 {
		return nil
	}
	mapped := map[backend.Handle]uint64{}
	for _, sg := range a.segs {
		for _, r := range sg.s.Handles() {
			h, _, n, _ := sg.s.HandleAt(r.Off)
			mapped[h] = n
		}
	}
	for _, z := range a.zombies {
		for _, r := range z.s.Handles() {
			h, _, n, _ := z.s.HandleAt(r.Off)
			mapped[h] = n
		}
	}
	for h, x := range a.exported {
		n, ok := mapped[h]
		switch {
		case x.holder == nil:
			return corrupt("exported handle %#x has no holder", uint64(h))
		case x.mapped && !ok:
			return corrupt("exported handle %#x is registered as mapped, but no segment maps it", uint64(h))
		case x.mapped && n != x.size:
			return corrupt("exported handle %#x is registered with %d bytes, mapped with %d", uint64(h), x.size, n)
		case !x.mapped && ok:
			return corrupt("exported handle %#x is registered as held by its exporter, but a segment maps it", uint64(h))
		}
	}
	return nil
}
