package host

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vmmalloc/vmmalloc/allocator"
)

// EnvVar is the environment variable ConfigFromEnv reads.
const EnvVar = "VMMALLOC_HOST_CONF"

// Config is the host allocator's policy. The zero value is not valid; start
// from DefaultConfig or ParseConfig.
type Config struct {
	// ExpandableSegments selects the policy: true (the default where the
	// operating system can reserve address space, Linux) carves blocks
	// out of chunks of one reserved range, mapped and registered on demand
	// and split and coalesced as the device allocator's expandable
	// segments do; false is the size-class policy, one driver allocation
	// per block, never split (the baseline). Key: expandable_segments,
	// True or False.
	ExpandableSegments bool
	// PinnedBudgetMB is the process's pin budget in MiB (0: unlimited):
	// New sets the limit of the budget the allocator shares (Budget, or
	// ProcessPinBudget) to it. Default: DefaultPinnedBudgetMB, half of
	// physical memory. Key: pinned_budget_mb.
	PinnedBudgetMB int64
	// ReleaseOnGrow unmaps the wholly free chunks before a new one is
	// mapped (expandable segments): less pinned memory held on workloads
	// whose large requests grow (held/live 1.30 instead of 1.60 on the
	// llama offload trace), at the cost of some pins and unpins in a
	// steady loop (2 per step on two of the eight shared traces; see the
	// package doc). Key: pinned_release_on_grow, True or False (default).
	ReleaseOnGrow bool
	// Budget is the pin budget to share; nil is the process's
	// (ProcessPinBudget). Not a key: for a framework that keeps separate
	// budgets, and for tests.
	Budget *PinBudget
	// UseHostRegister selects where pinned blocks come from: false (the
	// default) asks the driver for pinned memory (MallocHost / FreeHost);
	// true maps anonymous memory from the operating system and pins it
	// with HostRegister(MAPPED), undone with HostUnregister before it is
	// unmapped, PyTorch's pinned_use_cuda_host_register. The second keeps
	// the driver's pinned-memory allocator (and its lock) out of the way
	// and maps every block for the device when it is made. Key:
	// pinned_use_host_register, True or False.
	UseHostRegister bool
	// RoundupDivisions is how many size classes lie between consecutive
	// powers of two above 4 KiB: 1 (PyTorch's power-of-two classes), 2, 4
	// or 8. More classes waste less memory per block but let fewer freed
	// blocks serve a request. Key: pinned_roundup_power2_divisions.
	RoundupDivisions int
}

// DefaultConfig is the configuration an empty string parses to.
func DefaultConfig() Config {
	return Config{RoundupDivisions: defaultDivisions, ExpandableSegments: canReserve, PinnedBudgetMB: DefaultPinnedBudgetMB()}
}

// defaultDivisions is the measured choice (see the package doc, "Size
// classes").
const defaultDivisions = 8

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	switch c.RoundupDivisions {
	case 1, 2, 4, 8:
	default:
		return fmt.Errorf("%w: RoundupDivisions: %d, want 1, 2, 4 or 8", ErrInvalidConfig, c.RoundupDivisions)
	}
	if c.PinnedBudgetMB < 0 || c.PinnedBudgetMB > MaxSize>>20 {
		return fmt.Errorf("%w: PinnedBudgetMB: %d, want 0 (unlimited) to %d", ErrInvalidConfig, c.PinnedBudgetMB, int64(MaxSize>>20))
	}
	if c.ExpandableSegments && !canReserve {
		return fmt.Errorf("%w: expandable_segments: this operating system cannot reserve address space (Linux only)", ErrInvalidConfig)
	}
	if c.UseHostRegister && !canMapAnonymous {
		return fmt.Errorf("%w: pinned_use_host_register: this operating system has no anonymous mmap", ErrInvalidConfig)
	}
	return nil
}

// String formats c as a string ParseConfig reads back.
func (c Config) String() string {
	reg := "False"
	if c.UseHostRegister {
		reg = "True"
	}
	exp := "False"
	if c.ExpandableSegments {
		exp = "True"
	}
	rog := "False"
	if c.ReleaseOnGrow {
		rog = "True"
	}
	return fmt.Sprintf("expandable_segments:%s,pinned_use_host_register:%s,pinned_roundup_power2_divisions:%d,pinned_budget_mb:%d,pinned_release_on_grow:%s",
		exp, reg, c.RoundupDivisions, c.PinnedBudgetMB, rog)
}

// ConfigFromEnv parses $VMMALLOC_HOST_CONF over DefaultConfig.
func ConfigFromEnv() (Config, error) { return ParseConfig(os.Getenv(EnvVar)) }

// ParseConfig parses comma-separated key:value pairs, the form of
// VMMALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF, over DefaultConfig. An unknown
// key, a bad value or a key set twice is an error wrapping ErrInvalidConfig
// that names it.
func ParseConfig(s string) (Config, error) {
	c := DefaultConfig()
	if err := allocator.ParsePairs(s, ErrInvalidConfig, c.set); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// parseBool reads a True/False value (any case, or 1/0) of key k.
func parseBool(k, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, badValue(k, v, "want True or False")
}

func badValue(k, v, why string) error {
	return fmt.Errorf("%w: %s: bad value %q: %s", ErrInvalidConfig, k, v, why)
}

func (c *Config) set(k, v string) error {
	switch k {
	case "pinned_use_host_register":
		b, err := parseBool(k, v)
		if err != nil {
			return err
		}
		c.UseHostRegister = b
	case "expandable_segments":
		b, err := parseBool(k, v)
		if err != nil {
			return err
		}
		c.ExpandableSegments = b
	case "pinned_release_on_grow":
		b, err := parseBool(k, v)
		if err != nil {
			return err
		}
		c.ReleaseOnGrow = b
	case "pinned_budget_mb":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > MaxSize>>20 {
			return badValue(k, v, "want a whole number of MiB, 0 for unlimited")
		}
		c.PinnedBudgetMB = n
	case "pinned_roundup_power2_divisions":
		n, err := strconv.Atoi(v)
		if err != nil || (n != 1 && n != 2 && n != 4 && n != 8) {
			return badValue(k, v, "want 1, 2, 4 or 8")
		}
		c.RoundupDivisions = n
	case "pinned_num_register_threads":
		return fmt.Errorf("%w: %s: not supported: a block is pinned by one HostRegister call, so that it has one contiguous device address; "+
			"PyTorch's threads only pre-fault the pages of a malloc'd buffer before that call", ErrInvalidConfig, k)
	default:
		return fmt.Errorf("%w: unknown key %q", ErrInvalidConfig, k)
	}
	return nil
}
