// Package ipc shares device memory of an allocator with other processes,
// over the driver's IPC capability (backend.IPC: seeds 000 and 004,
// aclrtMemExportToShareableHandle / cuMemExportToShareableHandle).
//
// # Design
//
// An allocation lies in one or more physical handles of a segment
// (allocator.Allocator.Spans says which, and where). The exporting side
// (Exporter) registers the handles with the allocator
// (allocator.Allocator.ShareSpans), retains a driver reference to each
// (RetainHandle) and exports it to a shareable handle once: a driver
// exports a handle at most once (R15), so the Exporter caches the
// shareable per handle and reuses it for every allocation that lies in the
// same handle. An Export carries a Descriptor: the device, the exporter's
// pid, the exported size, the offset of the allocation in the first
// handle, and per handle its shareable, size and offset in the layout.
// Descriptors encode to JSON and to a compact binary form; decoding
// validates, so hostile bytes give an error wrapping ErrBadDescriptor.
//
// The importing side (Import) reserves a fresh address range as large as
// the handles, imports every shareable handle, maps each in order and sets
// read-write access, and returns a Mapping: the device pointer of the
// first exported byte and Close. Any failing driver call rolls back every
// step before it, in reverse. Memory freed by one side while the other
// maps it is released only when the last holder lets go (the driver
// defers it: R3).
//
// # Access control
//
// On drivers with a pid whitelist (ACL), exports validate importers by
// default (backend.ShareDefault): ExportOptions.Pids and Export.Allow
// whitelist pids (SetPids, R16), and ExportOptions.DisablePidValidation
// lets any process import. An importer not whitelisted gets an error
// wrapping backend.ErrNotPermitted from Import and holds nothing.
//
// Access is granted per physical handle, the driver's unit of sharing: a
// peer admitted to one allocation can reach every allocation that lies in
// the same handles (PyTorch shares whole segments for the same reason).
// The large pool's handles are its pages (20 MiB by default), or
// expandable_handle_mb (64 MiB) for large growths. To share an allocation
// and nothing else, allocate it from an isolated pool
// (allocator.PoolOptions.Isolated): each of its allocations lies in
// physical handles of its own, its size rounded up to the granularity.
// Whitelists only grow: a failing Export may have whitelisted its pids on
// some handles already.
//
// On fd-based drivers (CUDA's POSIX fd handles, backend/cuda) holding the
// fd is the access: Server hands descriptors out over a Unix socket
// (SOCK_SEQPACKET), passing the fds with SCM_RIGHTS only to peers whose
// kernel-reported credentials (SO_PEERCRED) its Allow admits. A refused
// peer gets no fd and an error wrapping backend.ErrNotPermitted (Receive,
// ImportFrom); the exporter's Send reports the refusal the same way.
// The fds inside a CUDA shareable are the exporting Driver's, closed when
// the Exporter lets go of the handles (cuda.BorrowedFD): SendExport sends
// duplicates taken while the Export is open and refuses a closed one; Send
// and Serve send the Driver's own fd numbers, so their Export must stay
// open meanwhile. Receive hands the importer files of its own to close.
//
// # Lifecycle
//
// Three parties hold references to an exported handle: the allocator
// (while a segment maps it), the Exporter (while it may be exported
// again or is named by an open Export), and each importer (while its
// Mapping is open). The driver frees the memory when the last lets go
// (R3, R17). A handle's life on the exporting side:
//
//	             allocator maps h (created, or taken from its HandleCache)
//	                              │ Exporter.Export (ShareSpans registers h:
//	                              │ never cached again; RetainHandle; driver Export)
//	                              ▼
//	    ┌──────────── mapped, exported; Exporter holds h + shareable ◀──┐
//	    │ allocator unmaps h        │ Export.Close          another Export of
//	    │ (Free, then EmptyCache,   │ (exports → 0)         memory in h reuses
//	    │ a release, the OOM        ▼                       the shareable (R15)
//	    │ ladder, Close)      mapped, exported, no open Export ───────────┘
//	    │                           │ allocator unmaps h: ReleaseUnmapped
//	    ▼                           ▼
//	held by the exporter     Exporter frees its reference at once
//	(exports > 0: counted    (FreePhysical); the allocator frees its own,
//	in ExporterHeldBytes,    never caches h ─────────────┐
//	OutOfMemoryError)                                    ▼
//	    │ last Export.Close (ReleaseShared)     no reference on this side:
//	    └──────────────────────────────────────▶ the driver frees the memory
//	                                             once no importer maps it (R3)
//
// So the memory of an allocation goes back to the driver once no open
// Export names its handles, the allocator has unmapped them and no
// importer maps them; one Exporter can serve the allocator's whole life
// (the weight-sync pattern of RL frameworks: each step Malloc, Export, the
// peer imports, reads and closes its Mapping, then Export.Close, Free,
// EmptyCache: device memory stays at one copy). While the allocator maps a
// handle the Exporter keeps its reference and shareable even with no open
// Export, because the driver would refuse to export it again (R15) for a
// neighbour allocation in the same handle. An exported handle never goes
// back to the allocator's HandleCache, since a peer may still map it:
// reusing it would show the peer another allocation's data.
//
// Only the allocator's lock frees the Exporter's reference to a handle the
// allocator has unmapped (the allocator calls ReleaseUnmapped, with its
// lock held, when it unmaps the handle, and again from Export.Close's
// ReleaseShared, EmptyCache and the OOM ladder while the Exporter keeps
// it), so the driver cannot reuse the handle's value while the allocator
// still has it registered. Lock order: the allocator's lock, then the
// Exporter's; the Exporter calls the allocator (ShareSpans,
// ReleaseShared) only without its own lock.
//
// An Export is open from Exporter.Export until Export.Close; an Exporter
// refuses to close while Exports are open. A failing Export leaves no
// Export and no extra reference (handles the driver did export stay
// cached while the allocator maps them, since they cannot be exported
// again; a reference whose free failed is kept and freed later). Exporter
// Close frees every reference it holds; the handles the allocator still
// maps stay exported by the driver until the allocator unmaps them.
//
// After Close, every call on an Exporter, Export or Server other than
// Close returns an error wrapping ErrClosed (Exported reads 0); Close is
// idempotent on them and on Mapping.
//
// An import:
//
//	Descriptor ──Import──▶ reserved ─▶ imported(i) ─▶ mapped(i) ─▶ ... ─▶ accessible = Mapping
//	                          any failure: undo in reverse ─▶ nothing held
//	Mapping ──Close──▶ unmapped, handles freed, reservation released
//
// Use one Exporter per allocator for the allocator's lifetime: a handle
// stays exported while the allocator maps it, so after an Exporter's Close
// another Exporter cannot export the same handle until the allocator has
// unmapped it (the allocator refuses, as the driver would, R15, with an
// error wrapping backend.ErrInvalidArgument).
//
// The exporter must keep an allocation live while it is exported: the
// allocator would hand freed memory out again, and importers would see it
// (PyTorch's CUDA IPC has the same contract).
package ipc
