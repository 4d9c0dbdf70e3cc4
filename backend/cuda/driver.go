//go:build unix

package cuda

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// EnvLibrary names the environment variable that overrides the driver
// library's path when WithLibrary is not given.
const EnvLibrary = "VMMALLOC_LIBCUDA"

// DefaultLibrary is the soname of the CUDA driver library.
const DefaultLibrary = "libcuda.so.1"

// Option configures Open.
type Option func(*config) error

type config struct {
	path    string
	devices []int // physical ordinals made visible, in order; nil: all
}

// WithLibrary loads the driver library from path instead of
// $VMMALLOC_LIBCUDA or libcuda.so.1 (a test double, a driver outside the
// loader path).
func WithLibrary(path string) Option {
	return func(c *config) error {
		if path == "" {
			return fmt.Errorf("cuda: WithLibrary: empty path: %w", backend.ErrInvalidArgument)
		}
		c.path = path
		return nil
	}
}

// WithDevices makes only the given physical device ordinals visible, in that
// order: the Driver's device i is physical device ordinals[i]. It composes
// with CUDA_VISIBLE_DEVICES, which the driver library applies first.
func WithDevices(ordinals ...int) Option {
	return func(c *config) error {
		if len(ordinals) == 0 {
			return fmt.Errorf("cuda: WithDevices: no device: %w", backend.ErrInvalidArgument)
		}
		seen := map[int]bool{}
		for _, o := range ordinals {
			if o < 0 || seen[o] {
				return fmt.Errorf("cuda: WithDevices: bad or repeated ordinal %d: %w", o, backend.ErrInvalidArgument)
			}
			seen[o] = true
		}
		c.devices = append([]int(nil), ordinals...)
		return nil
	}
}

// device is one visible device.
type device struct {
	ordinal  int     // physical CUdevice
	ctx      uintptr // retained primary context
	gran     uint64  // minimum granularity, nbytes
	posixFDs bool    // POSIX-fd shareable handles supported (attribute 103)
}

// Driver is a backend.Driver over the CUDA driver library. It also
// implements backend.IPC, backend.HostMemory, backend.Copier and
// backend.DeviceSynchronizer. All methods are safe for concurrent use.
type Driver struct {
	lib  *lib
	devs []device // immutable after Open

	// mu guards the bookkeeping below, and is held across the driver calls
	// that change it, so that a call and its record are one step.
	mu      sync.Mutex
	closed  bool
	res     []*reservation             // sorted by va
	maps    []*mapping                 // sorted by va
	handles map[backend.Handle]*handle // live (referenced) handles
	streams map[backend.Stream]int     // stream → device (created or adopted)
	adopted map[backend.Stream]bool    // streams adopted (adopt.go); nil until one is
	events  map[backend.Event]int      // event → device
	exports map[uint64]backend.Handle  // exported fd → handle
	imports map[fileID]backend.Handle  // imported file → handle
	hosts   map[uintptr]uint64         // MallocHost blocks → nbytes
	regs    map[uintptr]uint64         // HostRegister ranges → nbytes
}

// Open loads the driver library, initialises it, and retains the primary
// context of every visible device. It fails with an error wrapping
// ErrNoLibrary (and backend.ErrUnavailable) when the library or one of its
// symbols is missing, naming what is missing.
func Open(opts ...Option) (*Driver, error) {
	c := config{path: os.Getenv(EnvLibrary)}
	if c.path == "" {
		c.path = DefaultLibrary
	}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	l, err := loadLib(c.path)
	if err != nil {
		return nil, err
	}
	d := &Driver{
		lib:     l,
		handles: map[backend.Handle]*handle{},
		streams: map[backend.Stream]int{},
		events:  map[backend.Event]int{},
		exports: map[uint64]backend.Handle{},
		imports: map[fileID]backend.Handle{},
		hosts:   map[uintptr]uint64{},
		regs:    map[uintptr]uint64{},
	}
	if rc := l.call(symInit, 0); rc != cuSuccess {
		return nil, fmt.Errorf("cuda: cuInit: %s: %w", cuErrorName(rc), kindOf(rc))
	}
	var n int32
	if rc := l.call(symDeviceGetCount, uintptr(unsafe.Pointer(&n))); rc != cuSuccess {
		return nil, fmt.Errorf("cuda: cuDeviceGetCount: %s: %w", cuErrorName(rc), kindOf(rc))
	}
	ordinals := c.devices
	if ordinals == nil {
		for i := 0; i < int(n); i++ {
			ordinals = append(ordinals, i)
		}
	}
	if len(ordinals) == 0 {
		return nil, fmt.Errorf("cuda: no CUDA device: %w", backend.ErrUnavailable)
	}
	for _, o := range ordinals {
		dv, err := d.openDevice(o, int(n))
		if err != nil {
			d.releaseContexts()
			return nil, err
		}
		d.devs = append(d.devs, dv)
	}
	return d, nil
}

// openDevice checks device o and retains its primary context.
func (d *Driver) openDevice(o, count int) (device, error) {
	if o >= count {
		return device{}, fmt.Errorf("cuda: device %d not present (%d devices): %w", o, count, backend.ErrInvalidArgument)
	}
	l := d.lib
	var cu int32
	if rc := l.call(symDeviceGet, uintptr(unsafe.Pointer(&cu)), uintptr(o)); rc != cuSuccess {
		return device{}, fmt.Errorf("cuda: cuDeviceGet(%d): %s: %w", o, cuErrorName(rc), kindOf(rc))
	}
	attr := func(a int) (int32, error) {
		var v int32
		if rc := l.call(symDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(cu)); rc != cuSuccess {
			return 0, fmt.Errorf("cuda: cuDeviceGetAttribute(%d, device %d): %s: %w", a, o, cuErrorName(rc), kindOf(rc))
		}
		return v, nil
	}
	vmm, err := attr(cuAttrVMMSupported)
	if err != nil {
		return device{}, err
	}
	if vmm == 0 {
		return device{}, fmt.Errorf("cuda: device %d does not support virtual memory management: %w", o, backend.ErrNotSupported)
	}
	fds, err := attr(cuAttrPosixFDSupported)
	if err != nil {
		return device{}, err
	}
	dv := device{ordinal: int(cu), posixFDs: fds != 0}
	if rc := l.call(symPrimaryCtxRetain, uintptr(unsafe.Pointer(&dv.ctx)), uintptr(cu)); rc != cuSuccess {
		return device{}, fmt.Errorf("cuda: cuDevicePrimaryCtxRetain(%d): %s: %w", o, cuErrorName(rc), kindOf(rc))
	}
	prop := dv.allocProp()
	rc := d.onContext(dv.ctx, func() cuResult {
		return l.call(symMemGetAllocationGranularity, uintptr(unsafe.Pointer(&dv.gran)), uintptr(unsafe.Pointer(&prop)), cuGranularityMinimum)
	})
	if rc != cuSuccess || dv.gran == 0 || dv.gran&(dv.gran-1) != 0 {
		l.call(symPrimaryCtxRelease, uintptr(cu))
		return device{}, fmt.Errorf("cuda: cuMemGetAllocationGranularity(device %d): %s, granularity %d: %w", o, cuErrorName(rc), dv.gran, backend.ErrUnavailable)
	}
	return dv, nil
}

// allocProp is the CUmemAllocationProp of pinned memory on the device,
// shareable as a POSIX fd where the device supports it.
func (dv *device) allocProp() cuMemAllocationProp {
	p := cuMemAllocationProp{Type: cuMemAllocationTypePinned,
		Location: cuMemLocation{Type: cuMemLocationTypeDevice, ID: int32(dv.ordinal)}}
	if dv.posixFDs {
		p.RequestedHandleTypes = cuMemHandleTypePosixFD
	}
	return p
}

// releaseContexts releases the primary contexts retained by Open. d.devs
// stays: a closed Driver still answers DeviceCount and validates arguments.
func (d *Driver) releaseContexts() {
	for _, dv := range d.devs {
		d.lib.call(symPrimaryCtxRelease, uintptr(dv.ordinal))
	}
}

// onContext runs f on a locked OS thread whose current context is ctx.
//
// A CUDA context is current per OS thread and goroutines move between
// threads, so every call that needs one pins the goroutine to its thread
// for the call and sets the context first. The context is left current: the
// next call on that thread sets its own anyway. Cost: one LockOSThread pair
// and one cuCtxSetCurrent (see BenchmarkCallOverhead).
func (d *Driver) onContext(ctx uintptr, f func() cuResult) cuResult {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := d.lib.call(symCtxSetCurrent, ctx); rc != cuSuccess {
		return rc
	}
	return f()
}

// onDevice runs f with device dev's primary context current.
func (d *Driver) onDevice(dev int, f func() cuResult) cuResult {
	return d.onContext(d.devs[dev].ctx, f)
}

// validDevice reports whether dev names a visible device.
func (d *Driver) validDevice(dev int) bool { return dev >= 0 && dev < len(d.devs) }

// Close releases the primary contexts the Driver retained. It does not free
// what the caller still holds (the driver frees it at process exit); every
// later call fails with backend.ErrUnavailable. Close is idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	for fd := range d.exports {
		_ = closeFD(int(fd))
	}
	d.releaseContexts()
	return nil
}

// lockOpen takes mu and fails when the Driver is closed. On success the
// caller must unlock.
func (d *Driver) lockOpen(op backend.Op) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return backend.Errorf(op, backend.ErrUnavailable, "", "%v", errClosed)
	}
	return nil
}

// Name implements backend.Driver.
func (d *Driver) Name() string { return "cuda" }

// DeviceCount implements backend.Driver: the visible devices.
func (d *Driver) DeviceCount() int { return len(d.devs) }

// Library is the path the driver library was loaded from.
func (d *Driver) Library() string { return d.lib.path }

// MemGetInfo implements backend.Driver (cuMemGetInfo_v2 in the device's
// primary context).
func (d *Driver) MemGetInfo(dev int) (free, total uint64, err error) {
	const op = backend.OpMemGetInfo
	if !d.validDevice(dev) {
		return 0, 0, invalid(op, "", "device %d out of range [0,%d)", dev, len(d.devs))
	}
	if d.isClosed() {
		return 0, 0, backend.Errorf(op, backend.ErrUnavailable, "", "%v", errClosed)
	}
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symMemGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	})
	if rc != cuSuccess {
		return 0, 0, driverError(op, symMemGetInfo, rc)
	}
	return free, total, nil
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Granularity implements backend.Driver. CUDA has one page size for device
// memory, so PageNormal and PageHuge both give the driver's granularity;
// PageHuge1G and host locations are not supported.
func (d *Driver) Granularity(prop backend.PhysicalProp, opt backend.GranularityOption) (uint64, error) {
	const op = backend.OpGranularity
	dev, err := d.checkProp(op, prop)
	if err != nil {
		return 0, err
	}
	var cuOpt int
	switch opt {
	case backend.GranularityMinimum:
		cuOpt = cuGranularityMinimum
	case backend.GranularityRecommended:
		cuOpt = cuGranularityRecommended
	default:
		return 0, invalid(op, "R11", "unknown granularity option %d", int(opt))
	}
	if d.isClosed() {
		return 0, backend.Errorf(op, backend.ErrUnavailable, "", "%v", errClosed)
	}
	p := d.devs[dev].allocProp()
	var g uint64
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symMemGetAllocationGranularity, uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&p)), uintptr(cuOpt))
	})
	if rc != cuSuccess {
		return 0, driverError(op, symMemGetAllocationGranularity, rc)
	}
	return g, nil
}

// checkProp validates a physical prop and returns its device.
func (d *Driver) checkProp(op backend.Op, prop backend.PhysicalProp) (int, error) {
	switch prop.Attr {
	case backend.PageNormal, backend.PageHuge:
	case backend.PageHuge1G:
		return 0, backend.Errorf(op, backend.ErrNotSupported, "R2", "CUDA has no 1 GiB page attribute")
	default:
		return 0, invalid(op, "R2", "unknown page attribute %v", prop.Attr)
	}
	switch prop.Location.Type {
	case backend.LocationDevice:
	case backend.LocationHost:
		return 0, backend.Errorf(op, backend.ErrNotSupported, "R2", "host-located VMM memory is not supported by this binding")
	default:
		return 0, invalid(op, "R2", "unknown location type %v", prop.Location.Type)
	}
	if !d.validDevice(prop.Location.ID) {
		return 0, invalid(op, "R2", "device %d out of range [0,%d)", prop.Location.ID, len(d.devs))
	}
	return prop.Location.ID, nil
}

var (
	_ backend.Driver             = (*Driver)(nil)
	_ backend.IPC                = (*Driver)(nil)
	_ backend.HostMemory         = (*Driver)(nil)
	_ backend.Copier             = (*Driver)(nil)
	_ backend.DeviceSynchronizer = (*Driver)(nil)
	_ backend.Introspector       = (*Driver)(nil)
)
