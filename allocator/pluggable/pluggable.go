// Package pluggable is vmmalloc as a framework's pluggable allocator: the
// state and rules behind the C entry points of cmd/libvmmalloc, which
// PyTorch (torch.cuda.memory.CUDAPluggableAllocator) and torch_npu
// (NPUPluggableAllocator) load by name. It is a thin layer over the public
// API of package allocator; it adds only what a framework's calls need and
// the allocator does not keep:
//
//   - one Allocator per device, made on the device's first use with the
//     Library's configuration (VMMALLOC_CONF) and Device set, over one
//     driver opened on the first call of all (backend/drivers: the
//     configuration's backend key; "native" means cuda here, the driver
//     PyTorch runs on). The CUDA binding retains each device's primary
//     context, the one the CUDA runtime (and so PyTorch) uses, so the
//     framework's device pointers and streams are valid for it;
//   - the framework's streams, adopted into the driver on first sight
//     (cuda.Driver.AdoptStream: checked to be of the device's context; the
//     default stream is the driver's stand-in for it), and remembered per
//     device, so that the hot path asks the driver nothing;
//   - private pools by PyTorch's MempoolId_t (allocator.PoolID), made on
//     first use;
//   - the last error, for a caller that got NULL or -1 back.
//
// # State
//
// Library.mu guards opening the driver, making devices and pools, and the
// settings kept for devices not made yet (memory fraction, history). A
// device, once made, is published through an atomic pointer: Alloc and
// Free of a made device take no lock of the Library, only the allocator's.
// Every method is safe for concurrent use, and none panics on bad input:
// a bad device, pointer, stream or pool is an error that changes nothing,
// and is logged.
//
// # Limits
//
// Free ignores the size and stream PyTorch passes back (the allocator
// knows the allocation's). An adopted stream stays adopted: one the
// framework destroys, and whose handle the driver reuses for a new stream
// of the same device, is taken for the new one; PyTorch's streams come from
// pools it never destroys. On ACL the NULL stream is served by the
// allocator's own default stream (ACL has no handle that names a device's
// default stream; torch_npu's default stream is a created one).
package pluggable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/drivers"
	"github.com/vmmalloc/vmmalloc/stats"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// Errors the Library's methods wrap (besides the allocator's own).
var (
	// ErrInvalidDevice: a device ordinal the driver does not have.
	ErrInvalidDevice = errors.New("vmmalloc: invalid device")
	// ErrWrongDevice: a pointer of one device given with another.
	ErrWrongDevice = errors.New("vmmalloc: pointer is of another device")
	// ErrUnavailable: the driver could not be opened; every call fails
	// with this until the process restarts.
	ErrUnavailable = errors.New("vmmalloc: no driver")
)

// Options configure a Library.
type Options struct {
	// Config is every device's allocator configuration (Device aside).
	// The zero value is allocator.DefaultConfig().
	Config allocator.Config
	// Driver, when not nil, is used instead of opening Config.Backend
	// (tests: the emulator). The Library never closes it.
	Driver backend.Driver
	// Log receives one line per refused call and failure; nil logs to
	// standard error. io.Discard silences it.
	Log io.Writer
}

// Library is vmmalloc serving a framework: the devices' allocators and
// what the framework's calls need besides. The zero value is not usable;
// call New.
type Library struct {
	cfg     allocator.Config
	log     *log.Logger
	ownsDrv bool // Close closes the driver

	// ready is the opened driver and its devices, published once.
	ready atomic.Pointer[state]

	// mu guards opening the driver and making devices and pools, and the
	// fields below.
	mu       sync.Mutex
	openErr  error                     // the driver's open failure, kept
	fraction map[int]float64           // memory fractions set before the device was made
	history  *allocator.HistoryOptions // recording for devices made later; nil: off
	hostA    *host.Allocator           // pinned backups of Offload sleeps; nil until the first
	closed   bool

	errMu   sync.Mutex
	lastErr string // the most recent error message; errMu
}

// state is the opened driver and one slot per device.
type state struct {
	drv   backend.Driver
	adopt streamAdopter // nil: the driver takes callers' streams as they are
	devs  []atomic.Pointer[device]
}

// streamAdopter is a driver that can use streams it did not create
// (cuda.Driver, acl.Driver).
type streamAdopter interface {
	AdoptStream(dev int, s uintptr) (backend.Stream, error)
}

// device is one made device.
type device struct {
	ord int
	a   *allocator.Allocator
	// streams maps a caller's stream handle to the driver's
	// backend.Stream for it. Copied on write under Library.mu, so the hot
	// path reads it with one atomic load, no lock and no allocation.
	streams atomic.Pointer[map[uintptr]backend.Stream]
	// pools are the private pools by ID. Copied on write under
	// Library.mu, read with one atomic load (allocations from a pool).
	pools atomic.Pointer[map[allocator.PoolID]*allocator.Pool]
}

// New returns a Library; it opens nothing until the first call that needs
// the driver.
func New(o Options) *Library {
	cfg := o.Config
	if cfg == (allocator.Config{}) {
		cfg = allocator.DefaultConfig()
	}
	w := o.Log
	if w == nil {
		w = os.Stderr
	}
	l := &Library{cfg: cfg, log: log.New(w, "vmmalloc: ", 0), fraction: map[int]float64{}}
	if o.Driver != nil {
		st := &state{drv: o.Driver, devs: make([]atomic.Pointer[device], o.Driver.DeviceCount())}
		st.adopt, _ = o.Driver.(streamAdopter)
		l.ready.Store(st)
	}
	return l
}

// FromEnv returns a Library configured by $VMMALLOC_CONF; a bad
// configuration is an error.
func FromEnv() (*Library, error) {
	cfg, err := allocator.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return New(Options{Config: cfg}), nil
}

// fail records err as the last error, logs it, and returns it.
func (l *Library) fail(err error) error {
	msg := err.Error()
	l.errMu.Lock()
	l.lastErr = msg
	l.errMu.Unlock()
	l.log.Print(msg)
	return err
}

// LastError is the message of the most recent failed call of any thread,
// "" if none failed.
func (l *Library) LastError() string {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	return l.lastErr
}

// SetLastError records msg as the last error (for failures the caller
// detects itself, a recovered panic say) and logs it.
func (l *Library) SetLastError(msg string) { _ = l.fail(errors.New(msg)) }

// open returns the driver's state, opening it on first use.
func (l *Library) open() (*state, error) {
	if st := l.ready.Load(); st != nil {
		return st, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.ready.Load(); st != nil {
		return st, nil
	}
	if l.openErr != nil {
		return nil, l.openErr
	}
	name := l.cfg.Backend
	if name == "" || name == "native" {
		name = "cuda"
	}
	drv, err := drivers.Open(name, drivers.Options{})
	if err != nil {
		l.openErr = fmt.Errorf("%w: backend %s: %w", ErrUnavailable, name, err)
		return nil, l.openErr
	}
	st := &state{drv: drv, devs: make([]atomic.Pointer[device], drv.DeviceCount())}
	st.adopt, _ = drv.(streamAdopter)
	l.ownsDrv = true
	l.ready.Store(st)
	return st, nil
}

// device returns device dev, making its allocator on first use.
func (l *Library) device(dev int) (*device, error) {
	st, err := l.open()
	if err != nil {
		return nil, err
	}
	if dev < 0 || dev >= len(st.devs) {
		return nil, fmt.Errorf("%w: device %d of %d", ErrInvalidDevice, dev, len(st.devs))
	}
	if d := st.devs[dev].Load(); d != nil {
		return d, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := st.devs[dev].Load(); d != nil {
		return d, nil
	}
	if l.closed {
		return nil, allocator.ErrClosed
	}
	cfg := l.cfg
	cfg.Device = dev
	if f, ok := l.fraction[dev]; ok {
		cfg.PerProcessMemoryFraction = f
	}
	a, err := allocator.New(st.drv, cfg)
	if err != nil {
		return nil, fmt.Errorf("vmmalloc: device %d: %w", dev, err)
	}
	if l.history != nil {
		if err := a.RecordHistory(*l.history); err != nil {
			_ = a.Close()
			return nil, err
		}
	}
	d := &device{ord: dev, a: a}
	d.pools.Store(&map[allocator.PoolID]*allocator.Pool{})
	st.devs[dev].Store(d)
	return d, nil
}

// made lists the devices made so far, by ordinal.
func (l *Library) made() []*device {
	st := l.ready.Load()
	if st == nil {
		return nil
	}
	var out []*device
	for i := range st.devs {
		if d := st.devs[i].Load(); d != nil {
			out = append(out, d)
		}
	}
	return out
}

// stream returns the driver's stream for the caller's handle s on d.
func (l *Library) stream(d *device, s uintptr) (backend.Stream, error) {
	if m := d.streams.Load(); m != nil {
		if bs, ok := (*m)[s]; ok {
			return bs, nil
		}
	}
	st := l.ready.Load()
	if st.adopt == nil {
		return backend.Stream(s), nil
	}
	bs, err := st.adopt.AdoptStream(d.ord, s)
	if err != nil {
		if s == 0 {
			// A driver without a handle for the default stream (ACL):
			// the allocator's own default stream serves it.
			bs, err = 0, nil
		} else {
			return 0, fmt.Errorf("%w: device %d: %w", allocator.ErrInvalidStream, d.ord, err)
		}
	}
	l.mu.Lock()
	m := map[uintptr]backend.Stream{s: bs}
	if old := d.streams.Load(); old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	d.streams.Store(&m)
	l.mu.Unlock()
	return bs, nil
}

// poolLocked returns d's pool id, making it if create. (0, 0) is the
// default pool. Library.mu held.
func (l *Library) poolLocked(d *device, id allocator.PoolID, create bool) (*allocator.Pool, error) {
	if id == (allocator.PoolID{}) {
		return d.a.DefaultPool(), nil
	}
	if p, ok := (*d.pools.Load())[id]; ok {
		return p, nil
	}
	if !create {
		return nil, fmt.Errorf("%w: no pool (%d, %d) on device %d", allocator.ErrInvalidPool, id[0], id[1], d.ord)
	}
	p, err := d.a.NewPool(allocator.PoolOptions{ID: id, Name: fmt.Sprintf("(%d,%d)", id[0], id[1])})
	if err != nil {
		return nil, err
	}
	d.setPool(id, p)
	return p, nil
}

// setPool makes the pools map hold p under id (p nil: none). Library.mu
// held.
func (d *device) setPool(id allocator.PoolID, p *allocator.Pool) {
	old := *d.pools.Load()
	m := make(map[allocator.PoolID]*allocator.Pool, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if p != nil {
		m[id] = p
	} else {
		delete(m, id)
	}
	d.pools.Store(&m)
}

// pool returns d's pool id, making it if create; a known pool is found
// without the lock.
func (l *Library) pool(d *device, id allocator.PoolID, create bool) (*allocator.Pool, error) {
	if id == (allocator.PoolID{}) {
		return d.a.DefaultPool(), nil
	}
	if p, ok := (*d.pools.Load())[id]; ok {
		return p, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.poolLocked(d, id, create)
}

// Alloc allocates size bytes on device dev for work on stream s (the
// caller's handle: a cudaStream_t, an aclrtStream; 0 the default stream)
// from pool (the zero PoolID: the default pool; another is made on first
// use). Size 0 returns 0 and no error, and allocates nothing. An
// allocation that does not fit is an *allocator.OutOfMemoryError.
func (l *Library) Alloc(size uint64, dev int, s uintptr, pool allocator.PoolID) (uintptr, error) {
	if size == 0 {
		return 0, nil
	}
	d, err := l.device(dev)
	if err != nil {
		return 0, l.fail(fmt.Errorf("alloc(%d, device %d): %w", size, dev, err))
	}
	bs, err := l.stream(d, s)
	if err != nil {
		return 0, l.fail(fmt.Errorf("alloc(%d, device %d, stream %#x): %w", size, dev, s, err))
	}
	var p uintptr
	if pool == (allocator.PoolID{}) {
		p, err = d.a.Malloc(size, bs)
	} else {
		var pl *allocator.Pool
		if pl, err = l.pool(d, pool, true); err == nil {
			p, err = pl.Malloc(size, bs)
		}
	}
	if err != nil {
		return 0, l.fail(fmt.Errorf("alloc(%d, device %d, stream %#x, pool (%d, %d)): %w", size, dev, s, pool[0], pool[1], err))
	}
	return p, nil
}

// Free frees ptr, allocated on device dev. The size and stream PyTorch
// passes back are those of the allocation, which the allocator knows; they
// are not needed. Freeing 0 does nothing. A pointer the device did not
// allocate is refused (naming its device when another made device has
// it) and changes nothing.
func (l *Library) Free(ptr uintptr, dev int) error {
	if ptr == 0 {
		return nil
	}
	d, err := l.device(dev)
	if err != nil {
		return l.fail(fmt.Errorf("free(%#x, device %d): %w", ptr, dev, err))
	}
	err = d.a.Free(ptr)
	if err == nil {
		return nil
	}
	if errors.Is(err, allocator.ErrUnknownPointer) {
		for _, o := range l.made() {
			if o != d && owns(o.a, ptr) {
				err = fmt.Errorf("%w: %#x is of device %d", ErrWrongDevice, ptr, o.ord)
				break
			}
		}
	}
	return l.fail(fmt.Errorf("free(%#x, device %d): %w", ptr, dev, err))
}

// owns reports whether a allocated ptr (and has not freed it).
func owns(a *allocator.Allocator, ptr uintptr) bool {
	_, _, err := a.Spans(ptr)
	return err == nil
}

// RecordStream marks ptr as used by work queued on stream s
// (Tensor.record_stream): its memory is not reused before that work is
// done. The pointer's device is found among the made devices, and s must
// be a stream of it.
func (l *Library) RecordStream(ptr uintptr, s uintptr) error {
	for _, d := range l.made() {
		if !owns(d.a, ptr) {
			continue
		}
		bs, err := l.stream(d, s)
		if err == nil {
			err = d.a.RecordStream(ptr, bs)
		}
		if err != nil {
			return l.fail(fmt.Errorf("record_stream(%#x, stream %#x): %w", ptr, s, err))
		}
		return nil
	}
	return l.fail(fmt.Errorf("record_stream(%#x, stream %#x): %w", ptr, s, allocator.ErrUnknownPointer))
}

// Init opens the driver (PyTorch's init hook passes its device count,
// which must not exceed the driver's).
func (l *Library) Init(deviceCount int) error {
	st, err := l.open()
	if err != nil {
		return l.fail(fmt.Errorf("init(%d): %w", deviceCount, err))
	}
	if deviceCount < 0 || deviceCount > len(st.devs) {
		return l.fail(fmt.Errorf("init(%d): %w: the driver has %d", deviceCount, ErrInvalidDevice, len(st.devs)))
	}
	return nil
}

// EmptyCache releases the cached memory of device dev, or of every made
// device when dev is -1 (torch.cuda.empty_cache, PyTorch's reset hook).
func (l *Library) EmptyCache(dev int) error {
	ds, err := l.devices(dev)
	if err != nil {
		return l.fail(fmt.Errorf("empty_cache(device %d): %w", dev, err))
	}
	var errs []error
	for _, d := range ds {
		errs = append(errs, d.a.EmptyCache())
	}
	if err := errors.Join(errs...); err != nil {
		return l.fail(fmt.Errorf("empty_cache(device %d): %w", dev, err))
	}
	return nil
}

// MarkStep marks the end of a step on device dev's default pool
// (Allocator.MarkStep: planned steps), or on every device used so far for
// -1.
func (l *Library) MarkStep(dev int) error {
	ds, err := l.devices(dev)
	if err != nil {
		return l.fail(fmt.Errorf("mark_step(device %d): %w", dev, err))
	}
	var errs []error
	for _, d := range ds {
		errs = append(errs, d.a.MarkStep())
	}
	if err := errors.Join(errs...); err != nil {
		return l.fail(fmt.Errorf("mark_step(device %d): %w", dev, err))
	}
	return nil
}

// devices is device dev (made now if needed), or every made device for -1.
func (l *Library) devices(dev int) ([]*device, error) {
	if dev == -1 {
		if _, err := l.open(); err != nil {
			return nil, err
		}
		return l.made(), nil
	}
	d, err := l.device(dev)
	if err != nil {
		return nil, err
	}
	return []*device{d}, nil
}

// SetMemoryFraction caps device dev's mapped memory at fraction of its
// total (torch.cuda.set_per_process_memory_fraction). For a device not
// made yet it is kept for its making.
func (l *Library) SetMemoryFraction(fraction float64, dev int) error {
	st, err := l.open()
	if err == nil && (dev < 0 || dev >= len(st.devs)) {
		err = fmt.Errorf("%w: device %d of %d", ErrInvalidDevice, dev, len(st.devs))
	}
	if err == nil && !(fraction > 0 && fraction <= 1) {
		err = fmt.Errorf("%w: memory fraction %v outside (0,1]", allocator.ErrInvalidConfig, fraction)
	}
	if err == nil {
		l.mu.Lock()
		if d := st.devs[dev].Load(); d != nil {
			err = d.a.SetMemoryFraction(fraction)
		} else {
			l.fraction[dev] = fraction
		}
		l.mu.Unlock()
	}
	if err != nil {
		return l.fail(fmt.Errorf("set_memory_fraction(%v, device %d): %w", fraction, dev, err))
	}
	return nil
}

// BeginPool makes pool id of device dev if it does not exist, so that a
// scope of allocations from it (the caller keeps which pool is current,
// per thread) fails at its start rather than at its first allocation.
func (l *Library) BeginPool(dev int, id allocator.PoolID) error {
	d, err := l.device(dev)
	if err == nil {
		_, err = l.pool(d, id, true)
	}
	if err != nil {
		return l.fail(fmt.Errorf("begin_allocate_to_pool(device %d, pool (%d, %d)): %w", dev, id[0], id[1], err))
	}
	return nil
}

// ReleasePool closes pool id of device dev (PyTorch's release_pool, when
// its MemPool goes away): its cached memory is released. A pool with live
// allocations is refused (allocator.ErrPoolBusy) and stays.
func (l *Library) ReleasePool(dev int, id allocator.PoolID) error {
	d, err := l.device(dev)
	if err == nil && id == (allocator.PoolID{}) {
		err = fmt.Errorf("%w: the default pool cannot be released", allocator.ErrInvalidPool)
	}
	if err == nil {
		l.mu.Lock()
		var p *allocator.Pool
		if p, err = l.poolLocked(d, id, false); err == nil {
			if err = p.Close(); err == nil {
				d.setPool(id, nil)
			}
		}
		l.mu.Unlock()
	}
	if err != nil {
		return l.fail(fmt.Errorf("release_pool(device %d, pool (%d, %d)): %w", dev, id[0], id[1], err))
	}
	return nil
}

// SleepPool puts pool id of device dev to sleep (allocator.Pool.Sleep):
// its physical memory goes back to the driver, its addresses stay. With
// offload its allocated bytes are copied to pinned host memory first
// (allocator/host, where the driver has host memory; Go memory where not)
// and restored by WakePool; keepHost keeps those buffers after the wake
// for the next sleep. It is SleepPoolMode with Offload or Discard.
func (l *Library) SleepPool(dev int, id allocator.PoolID, offload, keepHost bool) error {
	mode := allocator.Discard
	if offload {
		mode = allocator.Offload
	}
	return l.SleepPoolMode(dev, id, mode, keepHost)
}

// SleepPoolMode is SleepPool with the mode named: allocator.Discard,
// Offload (backups in pinned host memory) or Memset (the pool's memory
// zero-filled at wake).
func (l *Library) SleepPoolMode(dev int, id allocator.PoolID, mode allocator.SleepMode, keepHost bool) error {
	d, err := l.device(dev)
	var p *allocator.Pool
	if err == nil {
		p, err = l.pool(d, id, false)
	}
	if err == nil {
		o := allocator.SleepOptions{Mode: mode, KeepHostBuffers: keepHost}
		if mode == allocator.Offload {
			if h := l.hostAllocator(); h != nil {
				o.Host = h
			}
		}
		err = p.Sleep(o)
	}
	if err != nil {
		return l.fail(fmt.Errorf("sleep(device %d, pool (%d, %d)): %w", dev, id[0], id[1], err))
	}
	return nil
}

// hostAllocator is the pinned host allocator of backups, made on first use;
// nil where the driver has no host memory.
func (l *Library) hostAllocator() *host.Allocator {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hostA != nil {
		return l.hostA
	}
	st := l.ready.Load()
	if _, ok := st.drv.(backend.HostMemory); !ok {
		return nil
	}
	h, err := host.New(st.drv, host.DefaultConfig())
	if err != nil {
		l.log.Printf("pinned host allocator: %v (backups in pageable memory)", err)
		return nil
	}
	l.hostA = h
	return h
}

// WakePool wakes pool id of device dev (allocator.Pool.Wake).
func (l *Library) WakePool(dev int, id allocator.PoolID) error {
	d, err := l.device(dev)
	var p *allocator.Pool
	if err == nil {
		p, err = l.pool(d, id, false)
	}
	if err == nil {
		err = p.Wake()
	}
	if err != nil {
		return l.fail(fmt.Errorf("wake(device %d, pool (%d, %d)): %w", dev, id[0], id[1], err))
	}
	return nil
}

// RecordHistory starts (maxEntries > 0) or stops (0) recording the
// allocation history that snapshots carry, on device dev or on every
// device (-1, devices made later included).
func (l *Library) RecordHistory(dev int, maxEntries int) error {
	o := allocator.HistoryOptions{MaxEntries: maxEntries}
	ds, err := l.devices(dev)
	if err == nil && dev == -1 {
		l.mu.Lock()
		if maxEntries > 0 {
			l.history = &o
		} else {
			l.history = nil
		}
		l.mu.Unlock()
	}
	for _, d := range ds {
		if err == nil {
			err = d.a.RecordHistory(o)
		}
	}
	if err != nil {
		return l.fail(fmt.Errorf("record_history(device %d, %d): %w", dev, maxEntries, err))
	}
	return nil
}

// Stats returns device dev's statistics, made now if needed.
func (l *Library) Stats(dev int) (stats.DeviceStats, error) {
	d, err := l.device(dev)
	if err != nil {
		return stats.DeviceStats{}, l.fail(fmt.Errorf("stats(device %d): %w", dev, err))
	}
	return d.a.Stats(), nil
}

// StatsJSON is the statistics of device dev as one JSON object of flat keys
// (stats.Flatten: "allocated_bytes.all.current", ...), or with dev -1 an
// object mapping each made device's ordinal to its object.
func (l *Library) StatsJSON(dev int) ([]byte, error) {
	ds, err := l.devices(dev)
	if err != nil {
		return nil, l.fail(fmt.Errorf("stats_json(device %d): %w", dev, err))
	}
	if dev != -1 {
		st := ds[0].a.Stats()
		var b bytes.Buffer
		if err := stats.WriteJSON(&b, &st); err != nil {
			return nil, l.fail(err)
		}
		return b.Bytes(), nil
	}
	all := map[string]map[string]int64{}
	for _, d := range ds {
		st := d.a.Stats()
		all[strconv.Itoa(d.ord)] = stats.Flatten(&st)
	}
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return nil, l.fail(err)
	}
	return append(b, '\n'), nil
}

// WriteSnapshot writes the made devices' memory snapshots as one PyTorch
// memory snapshot pickle (torch.cuda.memory._dump_snapshot) to path, which
// https://pytorch.org/memory_viz opens.
func (l *Library) WriteSnapshot(path string) error {
	if _, err := l.open(); err != nil {
		return l.fail(fmt.Errorf("snapshot(%q): %w", path, err))
	}
	var snap memviz.Snapshot
	for _, d := range l.made() {
		s := d.a.MemorySnapshot()
		if snap.Settings == nil {
			snap.Settings = s.Settings
		}
		snap.Devices = append(snap.Devices, s.Devices...)
	}
	slices.SortFunc(snap.Devices, func(x, y memviz.Device) int { return x.Index - y.Index })
	f, err := os.Create(path)
	if err == nil {
		err = memviz.Write(f, snap)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return l.fail(fmt.Errorf("snapshot(%q): %w", path, err))
	}
	return nil
}

// Allocator is device dev's allocator (made now if needed), for callers
// that use the Go API beside the framework's calls.
func (l *Library) Allocator(dev int) (*allocator.Allocator, error) {
	d, err := l.device(dev)
	if err != nil {
		return nil, err
	}
	return d.a, nil
}

// Close closes every device's allocator (freeing what is still allocated),
// the host allocator, and the driver if the Library opened it. The shared
// library never calls it (a Go library is never unloaded); tests do.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, d := range l.made() {
		errs = append(errs, d.a.Close())
	}
	if l.hostA != nil {
		errs = append(errs, l.hostA.Close())
	}
	if st := l.ready.Load(); st != nil && l.ownsDrv {
		errs = append(errs, drivers.Close(st.drv))
	}
	return errors.Join(errs...)
}
