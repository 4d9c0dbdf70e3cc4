package host

import (
	"fmt"
	"sync"
)

// PinBudget is a limit on the bytes of host memory pinned through it: every
// allocator that uses one asks it before it asks the driver to pin, and
// tells it when the driver has unpinned. Pinned memory cannot be swapped, so
// a process that pins without bound starves the rest of the machine; the
// budget turns that into a refusal the caller can act on (BudgetError), or
// a pageable fallback where the caller allows one (MallocWith).
//
// Every allocator made with Config.Budget nil shares the one returned by
// ProcessPinBudget. All methods are safe for concurrent use.
type PinBudget struct {
	mu      sync.Mutex
	limit   uint64 // nbytes; 0 = unlimited; mu
	pinned  uint64 // nbytes reserved by Reserve and not yet Released; mu
	denials int64  // Reserve calls refused; mu
}

// NewPinBudget returns a budget of limit bytes (0: unlimited).
func NewPinBudget(limit uint64) *PinBudget { return &PinBudget{limit: limit} }

var (
	processBudget     *PinBudget
	processBudgetOnce sync.Once
)

// ProcessPinBudget is the budget every allocator of the process shares
// unless its Config names another. Its limit starts at
// DefaultPinnedBudgetMB; New sets it from Config.PinnedBudgetMB.
func ProcessPinBudget() *PinBudget {
	processBudgetOnce.Do(func() {
		processBudget = NewPinBudget(uint64(DefaultPinnedBudgetMB()) << 20)
	})
	return processBudget
}

// DefaultPinnedBudgetMB is the default of pinned_budget_mb: half of the
// machine's physical memory, in MiB, or 0 (unlimited) where it cannot be
// read. Half leaves the page cache and the pageable memory of the process
// and its neighbours room, while still letting one process stage or offload
// most of a model.
func DefaultPinnedBudgetMB() int64 {
	total := physicalMemory()
	return int64(total / 2 >> 20)
}

// BudgetError is the refusal of a pin that would take a PinBudget past its
// limit. It wraps ErrBudget and ErrOutOfMemory.
type BudgetError struct {
	Requested uint64 // nbytes the refused pin asked for
	Pinned    uint64 // nbytes pinned through the budget when it refused
	Limit     uint64 // the budget's limit, nbytes (pinned_budget_mb)
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("vmmalloc/host: pinned_budget_mb: pinning %d more bytes would take the pinned host memory budget to %d of its %d bytes (%d MiB)",
		e.Requested, e.Pinned+e.Requested, e.Limit, e.Limit>>20)
}

// Is makes errors.Is(err, ErrBudget) and errors.Is(err, ErrOutOfMemory) hold.
func (e *BudgetError) Is(target error) bool { return target == ErrBudget || target == ErrOutOfMemory }

// Reserve takes n bytes of the budget before they are pinned, or refuses
// with a *BudgetError and takes nothing.
func (b *PinBudget) Reserve(n uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit != 0 && (b.pinned+n > b.limit || b.pinned+n < b.pinned) {
		b.denials++
		return &BudgetError{Requested: n, Pinned: b.pinned, Limit: b.limit}
	}
	b.pinned += n
	return nil
}

// Release gives back n bytes that Reserve took, once they are unpinned.
func (b *PinBudget) Release(n uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pinned -= min(n, b.pinned)
}

// SetLimit changes the limit (0: unlimited). Memory pinned already stays
// pinned; later Reserve calls see the new limit.
func (b *PinBudget) SetLimit(limit uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.limit = limit
}

// BudgetStats is a snapshot of a PinBudget.
type BudgetStats struct {
	Limit   uint64 // nbytes; 0 = unlimited
	Pinned  uint64 // nbytes pinned through it now
	Denials int64  // pins refused
}

// Stats returns a snapshot.
func (b *PinBudget) Stats() BudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetStats{Limit: b.limit, Pinned: b.pinned, Denials: b.denials}
}
