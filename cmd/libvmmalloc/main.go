// Command libvmmalloc is vmmalloc as a C shared library, libvmmalloc.so,
// with the pluggable-allocator ABI of PyTorch (CUDAPluggableAllocator) and
// torch_npu (NPUPluggableAllocator). Build it with
//
//	cmd/libvmmalloc/build.sh [outdir]   # default outdir: build/
//
// which runs go build -buildmode=c-shared and puts libvmmalloc.so and its
// header, vmmalloc.h, in outdir. vmmalloc.h documents every entry point.
//
// # Layers
//
// shim.c defines the public C functions of vmmalloc.h; each calls one Go
// function exported here (vmmgo_*, internal names), which calls the
// process's pluggable.Library (package allocator/pluggable, configured by
// VMMALLOC_CONF on the first call). The C side keeps, per thread, the
// stack of pools that thread allocates to, so vmmalloc_alloc makes a
// single call into Go. Every exported Go function recovers a panic into an
// error return and a last error: nothing unwinds across the C boundary.
//
// # The Go runtime in a foreign process
//
// Loading the library starts the Go runtime in the host process (Python,
// a C++ program):
//
//   - Signals. As for any c-shared library (os/signal, "Go programs that
//     use cgo or SWIG" and "Non-Go programs that call Go code"), the
//     runtime installs handlers for the synchronous signals SIGSEGV,
//     SIGBUS and SIGFPE, which forward a fault outside Go code to the
//     handler installed before the library was loaded, and for SIGPIPE and
//     SIGURG (the preemption signal); it adds SA_ONSTACK to handlers it
//     finds installed and leaves every other signal (SIGINT, SIGTERM,
//     SIGUSR1, ...) to the program. The tests load the library into a C
//     program that installed SIGSEGV and SIGUSR1 handlers before and check
//     that both still run (a fault in C code reaches the program's own
//     SIGSEGV handler through the runtime's forwarding).
//   - Threads. The runtime starts a few threads of its own; GOMAXPROCS
//     bounds those running Go code at once. A foreign thread that calls in
//     is bound to a Go M for its lifetime, so later calls from it are
//     cheap (the measured cost of a call is in the README).
//   - Environment. GODEBUG, GOMAXPROCS, GOGC and GOTRACEBACK are read at
//     load. GODEBUG=asyncpreemptoff=1 turns the SIGURG preemption off for
//     programs that cannot tolerate EINTR from slow system calls.
//   - One Go runtime per process: a second Go c-shared library in the same
//     process is unsupported by Go. fork without exec: a child must not
//     call into the library; use multiprocessing's spawn. Never dlclose.
//   - Race detector: the library is built without -race (a c-shared
//     library with the race runtime needs the race runtime loaded first);
//     the Go code behind it, package allocator/pluggable, is tested under
//     -race directly.
package main

/*
#include <stdint.h>
#include <stddef.h>
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/pluggable"
)

func main() {} // required by -buildmode=c-shared; never runs

var (
	libOnce sync.Once
	lib     *pluggable.Library
	// confErr is VMMALLOC_CONF's error, when it has one: every call
	// fails with it.
	confErr error
	// fallback is the last error while there is no Library (confErr).
	fallbackMu sync.Mutex
	fallback   string
)

// library is the process's Library, made from VMMALLOC_CONF on first use;
// nil when the configuration is bad (the error is then recorded).
func library() *pluggable.Library {
	libOnce.Do(func() {
		lib, confErr = pluggable.FromEnv()
		if confErr != nil {
			confErr = fmt.Errorf("VMMALLOC_CONF: %w", confErr)
		}
	})
	if lib == nil {
		setError(confErr.Error())
	}
	return lib
}

// setError records msg as the last error.
func setError(msg string) {
	if lib != nil {
		lib.SetLastError(msg)
		return
	}
	fallbackMu.Lock()
	fallback = msg
	fallbackMu.Unlock()
}

// recovered turns a panic of the calling export into a last error and
// reports whether there was one. Call as: defer func() { if recovered(recover(), name) { rc = -1 } }().
func recovered(r any, name string) bool {
	if r == nil {
		return false
	}
	setError(fmt.Sprintf("%s: internal error (recovered panic): %v", name, r))
	return true
}

func rc(err error) C.int {
	if err != nil {
		return -1
	}
	return 0
}

//export vmmgo_alloc
func vmmgo_alloc(size C.size_t, dev C.int, stream C.uintptr_t, id0, id1 C.uint64_t) (p C.uintptr_t) {
	defer func() {
		if recovered(recover(), "vmmalloc_alloc") {
			p = 0
		}
	}()
	l := library()
	if l == nil {
		return 0
	}
	ptr, err := l.Alloc(uint64(size), int(dev), uintptr(stream), allocator.PoolID{uint64(id0), uint64(id1)})
	if err != nil {
		return 0
	}
	return C.uintptr_t(ptr)
}

//export vmmgo_free
func vmmgo_free(ptr C.uintptr_t, dev C.int) {
	defer func() { recovered(recover(), "vmmalloc_free") }()
	if l := library(); l != nil {
		_ = l.Free(uintptr(ptr), int(dev))
	}
}

//export vmmgo_init
func vmmgo_init(n C.int) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_init") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.Init(int(n)))
}

//export vmmgo_empty_cache
func vmmgo_empty_cache(dev C.int) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_empty_cache") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.EmptyCache(int(dev)))
}

//export vmmgo_set_memory_fraction
func vmmgo_set_memory_fraction(f C.double, dev C.int) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_set_memory_fraction") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.SetMemoryFraction(float64(f), int(dev)))
}

//export vmmgo_record_stream
func vmmgo_record_stream(ptr, stream C.uintptr_t) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_record_stream") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.RecordStream(uintptr(ptr), uintptr(stream)))
}

//export vmmgo_begin_pool
func vmmgo_begin_pool(dev C.int, id0, id1 C.uint64_t) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_begin_allocate_to_pool") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.BeginPool(int(dev), allocator.PoolID{uint64(id0), uint64(id1)}))
}

// vmmgo_set_error records the failures shim.c detects: why 1, too many
// nested pool scopes; 2, an end of a scope that is not this thread's
// innermost one on the device.
//
//export vmmgo_set_error
func vmmgo_set_error(dev C.int, id0, id1 C.uint64_t, why C.int) {
	defer func() { recovered(recover(), "vmmalloc pool scope") }()
	if library() == nil {
		return
	}
	switch why {
	case 1:
		setError(fmt.Sprintf("begin_allocate_to_pool(device %d, pool (%d, %d)): %v: more than 16 nested pool scopes on this thread", dev, id0, id1, allocator.ErrInvalidPool))
	default:
		setError(fmt.Sprintf("end_allocate_to_pool(device %d, pool (%d, %d)): %v: not this thread's innermost pool scope on the device", dev, id0, id1, allocator.ErrInvalidPool))
	}
}

//export vmmgo_release_pool
func vmmgo_release_pool(dev C.int, id0, id1 C.uint64_t) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_release_pool") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.ReleasePool(int(dev), allocator.PoolID{uint64(id0), uint64(id1)}))
}

//export vmmgo_sleep
func vmmgo_sleep(dev C.int, id0, id1 C.uint64_t, mode, keep C.int) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_sleep") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	if mode != 0 && mode != 1 {
		setError(fmt.Sprintf("sleep(device %d, pool (%d, %d)): mode %d: want VMMALLOC_DISCARD (0) or VMMALLOC_OFFLOAD (1)", dev, id0, id1, mode))
		return -1
	}
	return rc(l.SleepPool(int(dev), allocator.PoolID{uint64(id0), uint64(id1)}, mode == 1, keep != 0))
}

//export vmmgo_wake
func vmmgo_wake(dev C.int, id0, id1 C.uint64_t) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_wake") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	return rc(l.WakePool(int(dev), allocator.PoolID{uint64(id0), uint64(id1)}))
}

//export vmmgo_record_history
func vmmgo_record_history(dev C.int, n C.size_t) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_record_history") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	if uint64(n) > 1<<31 {
		setError(fmt.Sprintf("record_history(device %d, %d): too many entries", dev, uint64(n)))
		return -1
	}
	return rc(l.RecordHistory(int(dev), int(n)))
}

//export vmmgo_snapshot
func vmmgo_snapshot(path *C.char) (r C.int) {
	defer func() {
		if recovered(recover(), "vmmalloc_snapshot") {
			r = -1
		}
	}()
	l := library()
	if l == nil {
		return -1
	}
	if path == nil {
		setError("snapshot: NULL path")
		return -1
	}
	return rc(l.WriteSnapshot(C.GoString(path)))
}

//export vmmgo_stats_json
func vmmgo_stats_json(dev C.int, buf *C.char, n C.size_t) (r C.size_t) {
	defer func() {
		if recovered(recover(), "vmmalloc_stats_json") {
			r = 0
		}
	}()
	l := library()
	if l == nil {
		return 0
	}
	b, err := l.StatsJSON(int(dev))
	if err != nil {
		return 0
	}
	return copyOut(b, buf, n)
}

//export vmmgo_last_error
func vmmgo_last_error(buf *C.char, n C.size_t) (r C.size_t) {
	defer func() {
		if recovered(recover(), "vmmalloc_last_error") {
			r = 0
		}
	}()
	var msg string
	if l := library(); l != nil {
		msg = l.LastError()
	} else {
		fallbackMu.Lock()
		msg = fallback
		fallbackMu.Unlock()
	}
	return copyOut([]byte(msg), buf, n)
}

// copyOut writes b and a NUL into the caller's buffer of n bytes, as much
// as fits (snprintf's contract), and returns len(b).
func copyOut(b []byte, buf *C.char, n C.size_t) C.size_t {
	if buf != nil && n > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
		k := copy(dst[:n-1], b)
		dst[k] = 0
	}
	return C.size_t(len(b))
}
