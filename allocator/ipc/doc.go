// Package ipc shares device memory of an allocator with other processes,
// over the driver's IPC capability (backend.IPC: seeds 000 and 004,
// aclrtMemExportToShareableHandle / cuMemExportToShareableHandle).
//
// # Design
//
// An allocation lies in one or more physical handles of a segment
// (allocator.Allocator.Spans says which, and where). The exporting side
// (Exporter) retains a driver reference to each handle (RetainHandle) and
// exports it to a shareable handle once: a driver exports a handle at most
// once (R15), so the Exporter caches the shareable per handle and reuses it
// for every allocation that lies in the same handle. It keeps the
// reference until its own Close, so the physical memory outlives the
// allocator's use of it while importers may still come. An Export carries a
// Descriptor: the device, the exporter's pid, the exported size, the offset
// of the allocation in the first handle, and per handle its shareable,
// size and offset in the layout. Descriptors encode to JSON and to a
// compact binary form; decoding validates, so hostile bytes give an error
// wrapping ErrBadDescriptor.
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
// expandable_handle_mb (64 MiB) for large growths; expandable_handle_mb:0
// keeps them at a page where the exposure matters.
// Whitelists only grow: a failing Export may have whitelisted its pids on
// some handles already.
//
// On fd-based drivers (CUDA's POSIX fd handles, backend/cuda) holding the
// fd is the access: Server hands descriptors out over a Unix socket
// (SOCK_SEQPACKET), passing the fds with SCM_RIGHTS only to peers whose
// kernel-reported credentials (SO_PEERCRED) its Allow admits. A refused
// peer gets no fd and an error wrapping backend.ErrNotPermitted (Receive,
// ImportFrom); the exporter's Send reports the refusal the same way.
//
// # Lifecycle
//
// A handle on the exporting side:
//
//	mapped by the allocator ──Export──▶ retained+exported (cached shareable)
//	      ▲                                  │ more Exports reuse it
//	      │                                  ▼
//	      └────────── Exporter.Close ◀── no open Export names it
//
// An Export is open from Exporter.Export until Export.Close; an Exporter
// refuses to close while Exports are open. A failing Export leaves no
// Export and no extra reference (handles the driver did export stay cached
// until Exporter.Close, since they cannot be exported again).
//
// An import:
//
//	Descriptor ──Import──▶ reserved ─▶ imported(i) ─▶ mapped(i) ─▶ ... ─▶ accessible = Mapping
//	                          any failure: undo in reverse ─▶ nothing held
//	Mapping ──Close──▶ unmapped, handles freed, reservation released
//
// Use one Exporter per allocator for the allocator's lifetime: a handle
// stays exported while the allocator maps it, so after an Exporter's Close
// another Exporter cannot export the same handle again (the driver refuses,
// R15, and the error wraps backend.ErrInvalidArgument).
//
// The exporter must keep an allocation live while it is exported: the
// allocator would hand freed memory out again, and importers would see it
// (PyTorch's CUDA IPC has the same contract).
package ipc
