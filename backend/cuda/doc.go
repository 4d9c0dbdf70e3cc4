//go:build unix

// Package cuda is a backend.Driver over the NVIDIA CUDA driver library
// (libcuda.so.1), loaded at run time: no CUDA header, no link-time
// dependency, and no cgo, so `CGO_ENABLED=0 go build ./...` works on
// machines with no GPU and no toolkit. Open dlopens the library with
// github.com/ebitengine/purego, resolves every symbol up front (the _v2
// exports where cuda.h #defines one), and fails with one error naming what
// is missing; calls go through purego.SyscallN over a hand-written symbol
// table (abi.go holds the struct mirrors, with compile-time size checks).
//
// Besides backend.Driver, a *Driver implements backend.IPC (POSIX file
// descriptors), backend.HostMemory, backend.Copier (cuMemcpy*Async_v2,
// cuMemsetD8Async), backend.DeviceSynchronizer (cuCtxSynchronize) and
// backend.Introspector. AdoptStream lets it use streams it did not create
// (the CUDA runtime's, a framework's) and the default streams, through
// per-device stand-ins (adopt.go).
//
// # Contexts and threads
//
// A CUDA context is current per OS thread, and goroutines move between
// threads. Open retains each visible device's primary context; every call
// that needs a context locks the goroutine to its thread, makes the
// device's primary context current (cuCtxSetCurrent) and calls the driver,
// all before unlocking. So every method is correct from any goroutine, even
// if other code on the thread changed or cleared its current context. The
// cost is one LockOSThread/UnlockOSThread pair (a few ns) plus one extra
// driver call per method (BenchmarkCallOverhead).
//
// # Bookkeeping
//
// The binding keeps what the driver does not report and enforces the
// backend contract where CUDA is laxer (the seed rules R1-R19 of the
// backend package): under Driver.mu it records each reservation, each
// mapping (always a whole handle at offset 0, R6; one device per
// reservation, R7; the access last set per device), and each handle (its
// size, which cuMemGetAllocationPropertiesFromHandle does not return; the
// backend prop it was made with; the caller's references, R12; its export
// fd). A call that breaks the contract fails with backend.ErrInvalidArgument
// before the driver sees it; a call the driver rejects changes no record.
// Copies are checked against the records too, because a copy to an
// unmapped address fails asynchronously on a device and poisons the
// context.
//
// A handle's life, as the binding tracks it:
//
//	CreatePhysical/Import ──▶ live (refs ≥ 1) ──Map──▶ live and mapped
//	RetainHandle: refs+1        FreePhysical: refs−1; at 0 the handle leaves
//	                            the table (its export fd is closed) but the
//	                            driver keeps the memory until the last Unmap (R3)
//
// # Errors
//
// Every error is a *backend.Error. Driver failures keep the CUresult in
// Code and name the symbol in Msg; the kind is ErrOutOfMemory for 2,
// ErrInvalidArgument for 1, 101, 201, 208, 211, 400, 500, 712, 713,
// ErrNotSupported for 801, ErrNotPermitted for 800, and ErrUnavailable for
// everything else (3, 4, 100, 401, 700, 999: the device, not the call, is
// the problem).
//
// # IPC
//
// Export returns a shareable handle that carries the exported POSIX fd in
// its low 32 bits and the handle's size in ShareUnit units in its high 32
// bits; see Shareable. The fd is the exporter's: another process imports
// after receiving it (SCM_RIGHTS, pidfd_getfd, inheritance) by rebuilding
// the shareable around its own fd number. The exported fd stays the
// Driver's, which closes it when the handle is freed: BorrowedFD reads its
// number (never to be closed or wrapped in an *os.File), ShareableFile
// gives the caller a duplicate it owns. SetPids has no CUDA equivalent
// and only validates; Import refuses the exporter's own fds (R17) and a
// second import of the same file (R15).
//
// # Testing without a GPU
//
// Package cudatest embeds a C test double of libcuda.so.1 over real host
// memory (memfds, PROT_NONE reservations, mprotect for access) that the
// tests compile with the system C compiler; the conformance suite, the
// allocator's integrity test and the binding's own tests run through the
// real binding against it, in the double's strict-context mode.
// gpucheck.sh runs the same checks against the real driver on a GPU.
package cuda
