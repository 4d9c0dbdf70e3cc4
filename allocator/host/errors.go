package host

import "errors"

// Sentinel errors. Every error the host allocator returns wraps one of these
// or a backend error kind (a driver failure, *backend.Error), so callers
// test it with errors.Is. A call that returns one of the sentinels below
// for bad input has changed nothing.
var (
	ErrInvalidSize     = errors.New("vmmalloc/host: invalid size")
	ErrUnknownPointer  = errors.New("vmmalloc/host: pointer is not a live allocation or registration of this allocator")
	ErrInteriorPointer = errors.New("vmmalloc/host: pointer is inside an allocation or registration, not at its start")
	ErrDoubleFree      = errors.New("vmmalloc/host: pointer already freed")
	ErrInvalidStream   = errors.New("vmmalloc/host: invalid stream")
	ErrMisaligned      = errors.New("vmmalloc/host: address is not 4 KiB aligned")
	ErrInvalidFlags    = errors.New("vmmalloc/host: invalid registration flags")
	ErrOverlap         = errors.New("vmmalloc/host: range overlaps memory this allocator already holds")
	ErrNotRegistered   = errors.New("vmmalloc/host: pointer is not the start of a registered range")
	ErrNotMapped       = errors.New("vmmalloc/host: range was registered pin-only and has no device address")
	ErrClosed          = errors.New("vmmalloc/host: allocator is closed")
	ErrInvalidConfig   = errors.New("vmmalloc/host: invalid config")
	ErrOutOfMemory     = errors.New("vmmalloc/host: out of pinned memory")
	ErrNoHostMemory    = errors.New("vmmalloc/host: driver has no host-memory capability (backend.HostMemory)")
	ErrCorrupt         = errors.New("vmmalloc/host: invariant violated")
	// ErrBudget is wrapped by a *BudgetError: the process's pin budget
	// (pinned_budget_mb) refused a pin.
	ErrBudget = errors.New("vmmalloc/host: pinned memory budget exhausted")
)
