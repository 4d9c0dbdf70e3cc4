// Package emulated is a deterministic, pure-Go implementation of the
// backend.Driver, backend.IPC and backend.HostMemory interfaces. It models
// the Ascend CANN virtual-memory-management API closely enough to test an
// allocator without hardware: every rule R1–R19 of the seed documents
// (shared/reference/seed-rules.md) is enforced, a violation returns a
// *backend.Error whose Rule field names the rule, and a rejected call
// changes nothing.
//
// # Processes
//
// New returns the view of one emulated process (pid 1000 unless WithPid
// says otherwise). Process(pid) returns the view of another process that
// shares the same devices, tenants and physical memory but has its own
// handle table, reservations, mappings, streams, events and host memory,
// which is what IPC needs: a handle exported by one view is imported by
// another (R15–R17). Call counts, the simulated time and injected faults
// belong to a view. Close ends one process as exit would, releasing what it
// still holds; later calls on that view return backend.ErrUnavailable.
//
// # State machine of a physical handle
//
//	CreatePhysical / Import
//	       │
//	       ▼         Map                FreePhysical of the last reference
//	    created ──────────────► mapped ────────────────────────────────► freed-pending
//	       │   ◄──────────────        ◄──────────────────────────────── │
//	       │   Unmap of the          RetainHandle(va) revives it        │ Unmap of the
//	       │   last mapping                                             │ last mapping
//	       │ FreePhysical of the last reference                         ▼
//	       └──────────────────────────────────────────────────────────► freed
//
// RetainHandle adds a reference and every reference needs its own
// FreePhysical (R12); more Maps of a mapped handle at other addresses keep it
// mapped. A freed-pending handle can no longer be mapped, exported, queried
// or freed again, and its memory stays accounted until the last Unmap (R3).
//
// A freed handle leaves this process's table. The physical memory behind it
// is released only when every process that holds a handle to it (the
// exporter and each importer) has freed its handle (R17); only then does
// MemGetInfo's free grow again.
//
// # State machine of a reservation
//
//	ReserveAddress ──► empty ───────Map──────► bound    (more Maps, and Unmaps
//	                     │  ◄──Unmap of the last──        that leave one: bound)
//	                     │      mapping
//	                     │ ReleaseAddress (bound: rejected, R5)
//	                     ▼
//	                  released
//
// An empty reservation can be released (R5) and is not bound to anything.
// The first Map binds it to the handle's location and to "local" or
// "imported"; while it holds a mapping, every further Map must match both
// (R7). Mappings lie wholly inside one reservation, never overlap, and
// start at a multiple of the handle's granularity (R6).
//
// # Addresses, ids and sizes
//
// Every id is drawn from a counter, so a replay of the same calls yields the
// same handles, streams, events and shareable handles. In the default
// (accounting) backing, addresses come from first-fit allocators over fixed
// windows: reservations from 16 TiB upwards (ReserveAddressAt accepts the
// experimental 16–24 TiB window of R4), pinned host memory from 8 TiB, and
// the device addresses of registered host memory from 4 TiB. No host
// memory is touched; device capacity (80 GiB by default) is only counted.
//
// Granularity: MINIMUM and RECOMMENDED are equal. Normal and huge pages
// share one granularity (2 MiB by default, as ACL allocates HBM_NORMAL as
// HUGE); 1 GiB pages (device only) have their own (1 GiB by default).
// Reservations are rounded up to the granularity internally and aligned to
// it, or to the 1 GiB granularity when they are at least that large, but
// ReleaseAddress and the bounds checks of Map use the size as reserved.
//
// # Real memory
//
// WithRealMemory (Linux, 64-bit) backs the same model with real memory:
// a reservation is an mmap(PROT_NONE, MAP_NORESERVE) region, a physical
// handle a memfd of its size, Map an mmap(MAP_FIXED|MAP_SHARED) of the memfd
// that stays PROT_NONE until SetAccess, Unmap puts an anonymous PROT_NONE
// mapping back, ReleaseAddress munmaps and the last free closes the memfd.
// Bytes returns a slice over mapped memory, so tests can check that two
// VAs of one handle (or of an exporter's and an importer's handle) see the
// same bytes. The kernel chooses addresses in this mode, so they are not
// deterministic; the defaults shrink to a 64 KiB granularity and 256 MiB of
// device and host capacity.
//
// # Streams, work and violations
//
// Tests enqueue work with Launch(s, va, size), a kernel that touches
// [va, va+size). Work completes at once unless the stream is held (Hold, or
// WithManualCompletion for every stream); held work stays pending until
// Complete, CompleteN, CompleteAll, StreamSynchronize, EventSynchronize or
// FreeHostWithDevSync completes it. EventRecord captures the work queued so
// far. Unmapping or releasing memory that pending work still touches, and
// launching work on memory that is unmapped or not accessible to the
// stream's device, is recorded as a Violation (PyTorch #196258 is the first
// kind); tests assert that Violations is empty.
//
// # Studies
//
// Every call is counted per primitive, failed ones included (Calls,
// CallCounts, Failures). A CostModel charges simulated time per successful
// call, per call plus per GiB the call handles, counted in total
// (SimulatedTime) and by primitive (SimulatedTimes). The model is the
// default cost profile's ("a100", DefaultCostModel) unless WithCostModel
// says otherwise; CostProfile lists the built-in profiles and their
// sources, ReadCostProfile and WriteCostProfile the JSON file format
// (CostProfileFormat) that backend/cuda/gpucheck.sh writes, and FitCost
// fits per call + per GiB to measured latencies. FailNth and
// FailRandom inject errors deterministically. Occupy takes device memory
// for another tenant. Live, Mappings, Reservations and Handles expose the
// state for invariant checks, sorted.
//
// # Concurrency
//
// One mutex, shared by all views of a world, guards all state; call
// counters and simulated time are atomics. All methods are safe for
// concurrent use.
package emulated
