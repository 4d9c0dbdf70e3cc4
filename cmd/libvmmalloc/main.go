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
//     cheap (the measured cost of a call is in docs/results.md).
//   - Environment. GODEBUG, GOMAXPROCS, GOGC and GOTRACEBACK are read at
//     load. GODEBUG=asyncpreemptoff=1 turns the SIGURG preemption off for
//     programs that cannot tolerate EINTR from slow system calls.
//   - One Go runtime per process: a second Go c-shared library in the same
//     process is unsupported by Go. fork without exec: a child must not
//     call into the library; use multiprocessing's spawn. Never dlclose.
//   - Race detector: the library is built without -race, also by the
//     tests under go test -race. `go build -race -buildmode=c-shared`
//     builds, but the library then aborts at load in a program not started
//     under ThreadSanitizer ("ThreadSanitizer failed to allocate ... errno
//     12": its shadow memory must be mapped first). The Go code behind the
//     entry points, package allocator/pluggable, is tested under -race
//     directly, threads and all.
package main

/*
#include <stdint.h>
#include <stddef.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
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
	fmt.Fprintln(os.Stderr, "vmmalloc: "+msg)
}

// catch, deferred by every entry point, turns a panic into a last error
// and calls fail to set the entry point's error return: nothing unwinds
// into the C caller.
func catch(name string, fail func()) {
	if r := recover(); r != nil {
		setError(fmt.Sprintf("%s: internal error (recovered panic): %v", name, r))
		fail()
	}
}

func rc(err error) int {
	if err != nil {
		return -1
	}
	return 0
}

// The entry points in Go types, each guarded by catch; the exports below
// only convert C types, which cannot panic.

func alloc(size uint64, dev int, stream uintptr, id allocator.PoolID) (p uintptr) {
	defer catch("vmmalloc_alloc", func() { p = 0 })
	l := library()
	if l == nil {
		return 0
	}
	p, _ = l.Alloc(size, dev, stream, id)
	return p
}

func free(ptr uintptr, dev int) {
	defer catch("vmmalloc_free", func() {})
	if l := library(); l != nil {
		_ = l.Free(ptr, dev)
	}
}

// call runs f on the Library, guarded, and returns 0 or -1.
func call(name string, f func(l *pluggable.Library) error) (r int) {
	defer catch(name, func() { r = -1 })
	l := library()
	if l == nil {
		return -1
	}
	return rc(f(l))
}

func statsJSON(dev int) (b []byte) {
	defer catch("vmmalloc_stats_json", func() { b = nil })
	l := library()
	if l == nil {
		return nil
	}
	b, _ = l.StatsJSON(dev)
	return b
}

func lastError() (msg string) {
	defer catch("vmmalloc_last_error", func() { msg = "vmmalloc_last_error: internal error" })
	if l := library(); l != nil {
		return l.LastError()
	}
	fallbackMu.Lock()
	defer fallbackMu.Unlock()
	return fallback
}

func pool(id0, id1 C.uint64_t) allocator.PoolID { return allocator.PoolID{uint64(id0), uint64(id1)} }

//export vmmgo_alloc
func vmmgo_alloc(size C.size_t, dev C.int, stream C.uintptr_t, id0, id1 C.uint64_t) C.uintptr_t {
	return C.uintptr_t(alloc(uint64(size), int(dev), uintptr(stream), pool(id0, id1)))
}

//export vmmgo_free
func vmmgo_free(ptr C.uintptr_t, dev C.int) { free(uintptr(ptr), int(dev)) }

//export vmmgo_init
func vmmgo_init(n C.int) C.int {
	return C.int(call("vmmalloc_init", func(l *pluggable.Library) error { return l.Init(int(n)) }))
}

//export vmmgo_empty_cache
func vmmgo_empty_cache(dev C.int) C.int {
	return C.int(call("vmmalloc_empty_cache", func(l *pluggable.Library) error { return l.EmptyCache(int(dev)) }))
}

//export vmmgo_mark_step
func vmmgo_mark_step(dev C.int) C.int {
	return C.int(call("vmmalloc_mark_step", func(l *pluggable.Library) error { return l.MarkStep(int(dev)) }))
}

//export vmmgo_set_memory_fraction
func vmmgo_set_memory_fraction(f C.double, dev C.int) C.int {
	return C.int(call("vmmalloc_set_memory_fraction", func(l *pluggable.Library) error {
		return l.SetMemoryFraction(float64(f), int(dev))
	}))
}

//export vmmgo_record_stream
func vmmgo_record_stream(ptr, stream C.uintptr_t) C.int {
	return C.int(call("vmmalloc_record_stream", func(l *pluggable.Library) error {
		return l.RecordStream(uintptr(ptr), uintptr(stream))
	}))
}

//export vmmgo_begin_pool
func vmmgo_begin_pool(dev C.int, id0, id1 C.uint64_t) C.int {
	return C.int(call("vmmalloc_begin_allocate_to_pool", func(l *pluggable.Library) error {
		return l.BeginPool(int(dev), pool(id0, id1))
	}))
}

// vmmgo_set_error records the failures shim.c detects: why 1, too many
// nested pool scopes; 2, an end of a scope that is not this thread's
// innermost one on the device.
//
//export vmmgo_set_error
func vmmgo_set_error(dev C.int, id0, id1 C.uint64_t, why C.int) {
	call("vmmalloc pool scope", func(*pluggable.Library) error {
		if why == 1 {
			setError(fmt.Sprintf("begin_allocate_to_pool(device %d, pool (%d, %d)): %v: more than 16 nested pool scopes on this thread", dev, id0, id1, allocator.ErrInvalidPool))
		} else {
			setError(fmt.Sprintf("end_allocate_to_pool(device %d, pool (%d, %d)): %v: not this thread's innermost pool scope on the device", dev, id0, id1, allocator.ErrInvalidPool))
		}
		return nil
	})
}

//export vmmgo_release_pool
func vmmgo_release_pool(dev C.int, id0, id1 C.uint64_t) C.int {
	return C.int(call("vmmalloc_release_pool", func(l *pluggable.Library) error {
		return l.ReleasePool(int(dev), pool(id0, id1))
	}))
}

// errBadMode is vmmalloc_sleep's error for a mode that is not one.
var errBadMode = errors.New("want VMMALLOC_DISCARD (0), VMMALLOC_OFFLOAD (1) or VMMALLOC_MEMSET (2)")

//export vmmgo_sleep
func vmmgo_sleep(dev C.int, id0, id1 C.uint64_t, mode, keep C.int) C.int {
	return C.int(call("vmmalloc_sleep", func(l *pluggable.Library) error {
		if mode < 0 || mode > 2 {
			err := fmt.Errorf("sleep(device %d, pool (%d, %d)): mode %d: %w", dev, id0, id1, mode, errBadMode)
			l.SetLastError(err.Error())
			return err
		}
		return l.SleepPoolMode(int(dev), pool(id0, id1), []allocator.SleepMode{allocator.Discard, allocator.Offload, allocator.Memset}[mode], keep != 0)
	}))
}

//export vmmgo_wake
func vmmgo_wake(dev C.int, id0, id1 C.uint64_t) C.int {
	return C.int(call("vmmalloc_wake", func(l *pluggable.Library) error { return l.WakePool(int(dev), pool(id0, id1)) }))
}

// errTooManyEntries is vmmalloc_record_history's error for a count beyond
// what the history holds.
var errTooManyEntries = errors.New("too many history entries")

//export vmmgo_record_history
func vmmgo_record_history(dev C.int, n C.size_t) C.int {
	return C.int(call("vmmalloc_record_history", func(l *pluggable.Library) error {
		if uint64(n) > 1<<31 {
			err := fmt.Errorf("record_history(device %d, %d): %w", dev, uint64(n), errTooManyEntries)
			l.SetLastError(err.Error())
			return err
		}
		return l.RecordHistory(int(dev), int(n))
	}))
}

// errNilPath is vmmalloc_snapshot's error for a NULL path.
var errNilPath = errors.New("snapshot: NULL path")

//export vmmgo_snapshot
func vmmgo_snapshot(path *C.char) C.int {
	if path == nil {
		return C.int(call("vmmalloc_snapshot", func(l *pluggable.Library) error {
			l.SetLastError(errNilPath.Error())
			return errNilPath
		}))
	}
	p := C.GoString(path)
	return C.int(call("vmmalloc_snapshot", func(l *pluggable.Library) error { return l.WriteSnapshot(p) }))
}

//export vmmgo_stats_json
func vmmgo_stats_json(dev C.int, buf *C.char, n C.size_t) C.size_t {
	b := statsJSON(int(dev))
	if b == nil {
		return 0
	}
	return copyOut(b, buf, n)
}

//export vmmgo_last_error
func vmmgo_last_error(buf *C.char, n C.size_t) C.size_t {
	return copyOut([]byte(lastError()), buf, n)
}

// copyOut writes b and a NUL into the caller's buffer of n bytes, as much
// as fits (snprintf's contract), and returns len(b).
// It touches no byte past the NUL, so any len up to SIZE_MAX is safe.
func copyOut(b []byte, buf *C.char, n C.size_t) C.size_t {
	if buf != nil && n > 0 {
		m := min(uint64(n), uint64(len(b))+1) // bytes written, NUL included
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(m))
		k := copy(dst[:m-1], b)
		dst[k] = 0
	}
	return C.size_t(len(b))
}
