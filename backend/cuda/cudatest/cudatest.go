//go:build unix

// Package cudatest builds and controls the C test double of the CUDA driver
// library (fakecuda.c, embedded here), so that the cuda binding, and
// anything above it, can be tested on machines with no GPU.
//
// The double exports the driver symbols the binding resolves, with the same
// ABI, over real host memory: reservations are PROT_NONE anonymous
// mappings, physical handles are memfds, a map is a MAP_FIXED|MAP_SHARED
// mapping of the memfd that stays inaccessible until cuMemSetAccess
// mprotects it, and export hands out a dup of the memfd. It enforces the
// driver's rules (granularity and alignment, maps inside one reservation
// without overlap, unmap of exactly one mapping, address free of a whole
// empty reservation, release deferred while mapped, retain references,
// per-device capacity, exact prop fields, a current context for context
// calls) and has control entry points: capacity, device count, granularity,
// fault injection at the Nth call of a symbol, call counts, live-object
// counts, a strict mode that fails calls made on a thread without a
// current context, and held streams whose work (and so the events recorded
// after it) stays pending until the test completes it.
//
// The double's memfds share the fd table with the code under test, so code
// that closes an fd it does not own can close one, and the next handle
// created reuses the number: a cached handle mapped again would then map
// another handle's memory. The double records each memfd's device and inode
// at create and import and checks them at every map, export and release: a
// handle whose backing changed fails the call with CUDA_ERROR_ILLEGAL_STATE
// (401), a message on stderr says what happened, and BackingError reports
// it until the next Reset.
//
// Build compiles the double with the system C compiler ($CC, else cc) into
// a directory as libcuda.so.1; Open loads its control entry points. The
// double's state is per process: tests that use it share one library, so
// they Reset it and must not run in parallel.
package cudatest

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

//go:embed testdata/fakecuda.c
var source []byte

// Source is the C source of the double.
func Source() []byte { return source }

// ErrNoCompiler is returned by Build when no C compiler is found.
var ErrNoCompiler = errors.New("cudatest: no C compiler ($CC, cc, gcc) to build the CUDA test double")

// Build compiles the double into dir/libcuda.so.1 and returns its path.
func Build(dir string) (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		for _, c := range []string{"cc", "gcc", "clang"} {
			if _, err := exec.LookPath(c); err == nil {
				cc = c
				break
			}
		}
	}
	if cc == "" {
		return "", ErrNoCompiler
	}
	src := filepath.Join(dir, "fakecuda.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libcuda.so.1")
	cmd := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", "-O1", "-o", out, src, "-lpthread")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cudatest: %s: %v\n%s", cc, err, b)
	}
	return out, nil
}

var (
	shared struct {
		path string
		err  error
	}
	sharedOnce sync.Once
)

// Shared builds the double once per process into a temporary directory
// (removed only at exit, since the library stays loaded) and returns its
// path.
func Shared() (string, error) {
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fakecuda")
		if err != nil {
			shared.err = err
			return
		}
		shared.path, shared.err = Build(dir)
	})
	return shared.path, shared.err
}

// Live counts the double's live objects.
type Live struct {
	Reservations  int64
	Mappings      int64
	Handles       int64 // released-but-mapped handles included
	Streams       int64
	Events        int64
	HostBlocks    int64 // cuMemHostAlloc blocks
	Registrations int64 // cuMemHostRegister ranges
	UsedBytes     int64 // device memory charged, all devices
}

// Double is the control interface of a loaded double.
type Double struct {
	reset, setCapacity, setDevices, setGran, requireCtx, fail, calls, live uintptr
	hold, launch, complete, backingErrors                                  uintptr
}

// Open loads the double at path (the library the binding loads too: dlopen
// of the same path yields the same instance) and resolves its controls.
func Open(path string) (*Double, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cudatest: %w", err)
	}
	d := &Double{}
	for _, s := range []struct {
		name string
		p    *uintptr
	}{
		{"fakecu_reset", &d.reset}, {"fakecu_set_capacity", &d.setCapacity},
		{"fakecu_set_device_count", &d.setDevices}, {"fakecu_set_granularity", &d.setGran},
		{"fakecu_require_context", &d.requireCtx}, {"fakecu_fail", &d.fail},
		{"fakecu_calls", &d.calls}, {"fakecu_live", &d.live},
		{"fakecu_hold", &d.hold}, {"fakecu_launch", &d.launch}, {"fakecu_complete", &d.complete},
		{"fakecu_backing_errors", &d.backingErrors},
	} {
		if *s.p, err = purego.Dlsym(h, s.name); err != nil {
			return nil, fmt.Errorf("cudatest: %s is not the test double: %w", path, err)
		}
	}
	return d, nil
}

// Reset drops every object of the double and restores its defaults: two
// devices of 1 GiB, 2 MiB granularity, no faults, lenient contexts.
func (d *Double) Reset() { purego.SyscallN(d.reset) }

// SetCapacity sets device dev's memory (every device if dev < 0).
func (d *Double) SetCapacity(dev int, nbytes uint64) error {
	if r, _, _ := purego.SyscallN(d.setCapacity, uintptr(dev), uintptr(nbytes)); int32(r) != 0 {
		return fmt.Errorf("cudatest: capacity %d below the memory in use", nbytes)
	}
	return nil
}

// SetDeviceCount sets the number of devices (1..8).
func (d *Double) SetDeviceCount(n int) error {
	if r, _, _ := purego.SyscallN(d.setDevices, uintptr(n)); int32(r) != 0 {
		return fmt.Errorf("cudatest: bad device count %d", n)
	}
	return nil
}

// SetGranularity sets the minimum and recommended granularity.
func (d *Double) SetGranularity(minimum, recommended uint64) error {
	if r, _, _ := purego.SyscallN(d.setGran, uintptr(minimum), uintptr(recommended)); int32(r) != 0 {
		return fmt.Errorf("cudatest: bad granularity %d/%d", minimum, recommended)
	}
	return nil
}

// RequireContext turns strict mode on or off: on, every memory, stream and
// event call fails with CUDA_ERROR_INVALID_CONTEXT (201) on a thread without
// a current context.
func (d *Double) RequireContext(on bool) {
	v := uintptr(0)
	if on {
		v = 1
	}
	purego.SyscallN(d.requireCtx, v)
}

// cstr returns a NUL-terminated copy of s.
func cstr(s string) []byte { return append([]byte(s), 0) }

// Fail makes the nth next call (1: the next) of the exported symbol fail
// with the CUresult code.
func (d *Double) Fail(symbol string, nth int, code int) error {
	b := cstr(symbol)
	if r, _, _ := purego.SyscallN(d.fail, uintptr(unsafe.Pointer(&b[0])), uintptr(nth), uintptr(code)); int32(r) != 0 {
		return fmt.Errorf("cudatest: cannot arm a fault on %q (unknown symbol, or too many faults)", symbol)
	}
	return nil
}

// Calls is the number of calls made to the exported symbol.
func (d *Double) Calls(symbol string) int64 {
	b := cstr(symbol)
	r, _, _ := purego.SyscallN(d.calls, uintptr(unsafe.Pointer(&b[0])))
	return int64(r)
}

// Hold makes work on stream s (a CUstream) stay pending until Complete or a
// synchronize call, so that events recorded after it are not complete.
func (d *Double) Hold(s uintptr) error { return d.streamCtl(d.hold, s) }

// Launch queues one work item on stream s.
func (d *Double) Launch(s uintptr) error { return d.streamCtl(d.launch, s) }

// Complete completes the oldest n pending work items of stream s.
func (d *Double) Complete(s uintptr, n int) error { return d.streamCtl(d.complete, s, uintptr(n)) }

func (d *Double) streamCtl(fn uintptr, args ...uintptr) error {
	if r, _, _ := purego.SyscallN(fn, args...); int32(r) != 0 {
		return fmt.Errorf("cudatest: unknown stream %#x", args[0])
	}
	return nil
}

// ErrBackingChanged is what BackingError wraps: a handle of the double
// whose memfd was closed, or closed and its number reused, by code that
// does not own it.
var ErrBackingChanged = errors.New("cudatest: a handle's memfd was closed or replaced behind the double's back (a test closed a file descriptor it does not own)")

// BackingError reports, since the last Reset, the handles the double found
// with a changed backing (at a map, export, release or Reset), naming the
// first; nil if none. Tests check it when they end.
func (d *Double) BackingError() error {
	var why [256]byte
	n, _, _ := purego.SyscallN(d.backingErrors, uintptr(unsafe.Pointer(&why[0])), uintptr(len(why)))
	if int64(n) == 0 {
		return nil
	}
	msg := string(why[:])
	if i := strings.IndexByte(msg, 0); i >= 0 {
		msg = msg[:i]
	}
	return fmt.Errorf("%w: %d found, the first at %s", ErrBackingChanged, int64(n), msg)
}

// Live counts the double's live objects.
func (d *Double) Live() Live {
	var out [8]int64
	purego.SyscallN(d.live, uintptr(unsafe.Pointer(&out[0])))
	return Live{out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]}
}
