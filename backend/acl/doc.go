// Package acl is the backend.Driver for Huawei Ascend NPUs: a binding of the
// ACL runtime (libascendcl.so, from the CANN toolkit) loaded at run time.
//
// # Loading
//
// Open dlopens the library (WithLibrary, else $VMMALLOC_LIBASCENDCL, else
// "libascendcl.so" on the loader's search path) with purego, so the package
// needs no CANN headers, links nothing, and builds with CGO_ENABLED=0. Every
// symbol is resolved up front; a missing library or symbol fails Open with
// one error naming all of it. The library is initialised once per process
// (aclInit; ACL_ERROR_REPEAT_INITIALIZE from an earlier Open or from the
// framework is fine) and never finalised or unloaded: aclFinalize and
// dlclose under a framework that shares the runtime are unsafe, and a
// process initialises ACL for its lifetime.
//
// # Threads
//
// ACL's current device (its context) belongs to the calling OS thread, while
// a goroutine may move between threads at any point. Open takes each visible
// device's default context once (aclrtSetDevice, aclrtGetCurrentContext).
// Every call then runs with the goroutine locked to its thread and that
// device's context made current first (aclrtSetCurrentContext, a
// thread-local store that, unlike aclrtSetDevice, takes no device
// reference), so it is correct from any goroutine. The device of a call is
// the one named by the argument, or the device of the object it acts on
// (handle, mapping, stream, event), which the binding remembers; calls that
// name no device (address reservations, host memory) use the first visible
// device. BenchmarkCall measures what this costs per call. Streams made by
// someone else (torch_npu's) are used after AdoptStream, which takes their
// device on trust (ACL cannot be asked) and never destroys them.
//
// # Bookkeeping
//
// The binding keeps, under Driver.mu, what ACL does not report or does not
// check the way backend.Driver promises:
//
//   - handles: size, properties, device and reference count of every live
//     handle. ACL's handles are pointers, so an unknown Handle is rejected
//     before it reaches the library, and HandleProperties reports the size,
//     which aclrtMemGetAllocationPropertiesFromHandle does not.
//   - reservations (base → size): aclrtReleaseMemAddress takes no size, so
//     the binding checks it.
//   - mappings (address-ordered): aclrtUnmapMem takes no size, and
//     aclrtMemGetAccess wants the mapping's own address, while the backend
//     contract accepts any address inside it.
//   - streams and events → device, for StreamDevice and for the context of
//     each call.
//   - exported shareable handles → size, so an exporter can tell importers
//     the size (ExportedSize), which ACL cannot report for an imported
//     handle; ImportSized records it on the importer's side.
//
// LiveRanges (backend.Introspector) reports these tables, so that an
// allocator's Check compares its view with the driver's.
//
// A handle's life: created (or imported) with one reference, +1 per
// RetainHandle, −1 per FreePhysical; mapped any number of times. It leaves
// the table when it has no reference and no mapping left, which is when ACL
// releases the memory too (a free while mapped is deferred to the unmap).
//
// # Errors
//
// Every failure is a *backend.Error. A failed ACL call keeps the aclError in
// Error.Code and its kind comes from Kind (207001 ACL_ERROR_RT_MEMORY_ALLOCATION
// is ErrOutOfMemory, 100000 ACL_ERROR_INVALID_PARAM is ErrInvalidArgument,
// 207006 ACL_ERROR_RT_NO_PERMISSION is ErrNotPermitted, ...). A request the
// binding rejects itself (unknown handle, size mismatch) has Code 0 and names
// the seed rule. A rejected call changes nothing.
//
// # Data
//
// Device memory is not host-addressable, so the driver implements
// backend.Copier over aclrtMemcpyAsync / aclrtMemsetAsync, and
// backend.DeviceSynchronizer over aclrtSynchronizeDevice. Host↔device
// copies are followed by aclrtSynchronizeStream, because the host side is Go
// memory the runtime must not touch after the call returns. Some CANN
// versions want the host side of an asynchronous copy to be pinned
// (MallocHost); that is unverified here, for want of a device.
//
// # Test double
//
// testdata/fakeacl.c is a libascendcl.so over real host memory that
// enforces ACL's rules and has control entry points (capacity, fault
// injection, live-object counts, a strict mode that fails calls made
// without a current device). The tests compile it with the system C
// compiler and run backend/conformance against this binding over it.
package acl
