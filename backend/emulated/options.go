package emulated

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Size units, in bytes.
const (
	KiB uint64 = 1 << 10
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
	TiB uint64 = 1 << 40
)

// Defaults of the accounting backing.
const (
	DefaultDevices       = 1         // devices
	DefaultCapacity      = 80 * GiB  // nbytes of device memory per device
	DefaultGranularity   = 2 * MiB   // nbytes; normal and 2 MiB pages
	DefaultGranularity1G = 1 * GiB   // nbytes; 1 GiB pages
	DefaultHostCapacity  = 1 * TiB   // nbytes of pinned host memory
	DefaultPid           = 1000      // pid of the view New returns
	DefaultVASize        = 64 * TiB  // nbytes of reservable virtual address space
	RealGranularity      = 64 * KiB  // default granularity with WithRealMemory
	RealCapacity         = 256 * MiB // default device and host capacity with WithRealMemory
)

// Fixed address windows of the accounting backing.
const (
	vaBase        = 16 * TiB // first reservable address
	fixedVABase   = 16 * TiB // ReserveAddressAt window start (R4)
	fixedVALimit  = 24 * TiB // ReserveAddressAt window end (R4)
	hostBase      = 8 * TiB  // pinned host memory window
	hostLimit     = 16 * TiB //
	devPtrBase    = 4 * TiB  // device addresses of registered host memory
	devPtrLimit   = 8 * TiB  //
	maxVA         = 0x7fff_0000_0000
	hostAlign     = 4 * KiB // alignment of MallocHost and HostRegister (R18, R19)
	maxDevices    = 1024
	minGranuleLog = 12 // granularities are powers of two ≥ 4 KiB
)

// config is what the options set; zero fields take defaults in New.
type config struct {
	devices      int
	capacity     uint64 // nbytes per device
	granularity  uint64 // nbytes
	gran1G       uint64 // nbytes
	no1G         bool
	hostCapacity uint64 // nbytes
	vaSize       uint64 // nbytes
	pid          int32
	manual       bool
	cost         *CostModel
	real         bool
	err          error // first invalid option
}

// Option configures New.
type Option func(*config)

func (c *config) bad(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("emulated: "+format+": %w", append(args, backend.ErrInvalidArgument)...)
	}
}

// WithDevices sets the number of devices (default 1).
func WithDevices(n int) Option {
	return func(c *config) {
		if n < 1 || n > maxDevices {
			c.bad("WithDevices(%d): want 1..%d", n, maxDevices)
			return
		}
		c.devices = n
	}
}

// WithCapacity sets the memory of every device in bytes (default 80 GiB,
// 256 MiB with WithRealMemory).
func WithCapacity(nbytes uint64) Option {
	return func(c *config) {
		if nbytes == 0 {
			c.bad("WithCapacity(0)")
			return
		}
		c.capacity = nbytes
	}
}

// WithGranularity sets the granularity of normal and 2 MiB pages in bytes, a
// power of two of at least 4 KiB (default 2 MiB, 64 KiB with
// WithRealMemory).
func WithGranularity(nbytes uint64) Option {
	return func(c *config) {
		if !validGranule(nbytes) {
			c.bad("WithGranularity(%d): want a power of two ≥ 4 KiB", nbytes)
			return
		}
		c.granularity = nbytes
	}
}

// WithGranularity1G sets the granularity of 1 GiB pages in bytes (default
// 1 GiB); it must be a power of two and a multiple of the granularity.
func WithGranularity1G(nbytes uint64) Option {
	return func(c *config) {
		if !validGranule(nbytes) {
			c.bad("WithGranularity1G(%d): want a power of two ≥ 4 KiB", nbytes)
			return
		}
		c.gran1G = nbytes
	}
}

// WithoutHuge1G makes 1 GiB pages unsupported (ErrNotSupported), as on
// devices that lack them.
func WithoutHuge1G() Option { return func(c *config) { c.no1G = true } }

// WithHostCapacity sets how much pinned host memory (MallocHost and
// host-located physical memory) may exist, in bytes (default 1 TiB, 256 MiB
// with WithRealMemory).
func WithHostCapacity(nbytes uint64) Option {
	return func(c *config) {
		if nbytes == 0 {
			c.bad("WithHostCapacity(0)")
			return
		}
		c.hostCapacity = nbytes
	}
}

// WithVASize sets how much virtual address space ReserveAddress may hand
// out, in bytes (default 64 TiB). Ignored with WithRealMemory, where the
// kernel chooses addresses.
func WithVASize(nbytes uint64) Option {
	return func(c *config) {
		if nbytes == 0 || nbytes > maxVA-vaBase {
			c.bad("WithVASize(%d): want 1..%d", nbytes, uint64(maxVA-vaBase))
			return
		}
		c.vaSize = nbytes
	}
}

// WithPid sets the pid of the process view New returns (default 1000).
func WithPid(pid int32) Option {
	return func(c *config) {
		if pid <= 0 {
			c.bad("WithPid(%d): want > 0", pid)
			return
		}
		c.pid = pid
	}
}

// WithManualCompletion holds every stream from creation: work stays pending
// until the test completes it (see Hold).
func WithManualCompletion() Option { return func(c *config) { c.manual = true } }

// WithCostModel replaces DefaultCostModel; a zero CostModel charges nothing.
func WithCostModel(m CostModel) Option {
	return func(c *config) { c.cost = &m }
}

// WithRealMemory backs the emulation with real memory (Linux, 64-bit only;
// New fails with ErrNotSupported elsewhere). See the package documentation.
func WithRealMemory() Option { return func(c *config) { c.real = true } }

func validGranule(n uint64) bool {
	return n >= 1<<minGranuleLog && n&(n-1) == 0 && n <= 1<<40
}

// resolve fills in defaults and checks the combination.
func (c *config) resolve() error {
	if c.err != nil {
		return c.err
	}
	if c.devices == 0 {
		c.devices = DefaultDevices
	}
	if c.pid == 0 {
		c.pid = DefaultPid
	}
	if c.granularity == 0 {
		c.granularity = DefaultGranularity
		if c.real {
			c.granularity = RealGranularity
		}
	}
	if c.gran1G == 0 {
		c.gran1G = DefaultGranularity1G
	}
	if c.capacity == 0 {
		c.capacity = DefaultCapacity
		if c.real {
			c.capacity = RealCapacity
		}
	}
	if c.hostCapacity == 0 {
		c.hostCapacity = DefaultHostCapacity
		if c.real {
			c.hostCapacity = RealCapacity
		}
	}
	if c.vaSize == 0 {
		c.vaSize = DefaultVASize
	}
	if c.cost == nil {
		m := DefaultCostModel()
		c.cost = &m
	}
	if c.gran1G < c.granularity {
		return fmt.Errorf("emulated: 1 GiB-page granularity %d is below the granularity %d: %w",
			c.gran1G, c.granularity, backend.ErrInvalidArgument)
	}
	if ^uintptr(0)>>32 == 0 {
		return fmt.Errorf("emulated: needs a 64-bit platform: %w", backend.ErrNotSupported)
	}
	return nil
}
