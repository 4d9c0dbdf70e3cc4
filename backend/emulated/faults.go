package emulated

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vmmalloc/vmmalloc/backend"
)

// faults are the injected failures of one process. The world's lock
// guards them.
type faults struct {
	active bool                         // any fault armed
	nth    [backend.NumOps][]nthFault   // per op: call numbers that fail
	rnd    [backend.NumOps]*randomFault // per op: random failure, nil if none
}

type nthFault struct {
	call int64 // the op's call count that fails
	kind error
}

type randomFault struct {
	p    float64
	rng  *rand.Rand
	kind error
}

// hit reports whether call number n of op fails, and how.
func (f *faults) hit(op backend.Op, n int64) (error, bool) {
	for i, x := range f.nth[op] {
		if x.call == n {
			f.nth[op] = append(f.nth[op][:i], f.nth[op][i+1:]...)
			return x.kind, true
		}
	}
	if r := f.rnd[op]; r != nil && r.rng.Float64() < r.p {
		return r.kind, true
	}
	return nil, false
}

func (f *faults) refresh() {
	f.active = false
	for op := range f.nth {
		if len(f.nth[op]) > 0 || f.rnd[op] != nil {
			f.active = true
			return
		}
	}
}

func checkKind(kind error) error {
	switch kind {
	case backend.ErrOutOfMemory, backend.ErrInvalidArgument, backend.ErrNotSupported,
		backend.ErrNotPermitted, backend.ErrUnavailable:
		return nil
	}
	return fmt.Errorf("emulated: fault kind %v is not a backend sentinel: %w", kind, backend.ErrInvalidArgument)
}

func checkOp(op backend.Op) error {
	if op < 0 || op >= backend.NumOps {
		return fmt.Errorf("emulated: unknown op %d: %w", int(op), backend.ErrInvalidArgument)
	}
	return nil
}

// FailNth makes the n-th call of op from now on (n = 1: the next call) fail
// with kind, one of the backend sentinels. The failed call changes nothing.
// Several FailNth of one op add up.
func (e *Emulator) FailNth(op backend.Op, n int, kind error) error {
	if err := checkOp(op); err != nil {
		return err
	}
	if err := checkKind(kind); err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("emulated: FailNth(%v, %d): n must be ≥ 1: %w", op, n, backend.ErrInvalidArgument)
	}
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	f := &e.p.faults
	f.nth[op] = append(f.nth[op], nthFault{call: e.p.calls[op].Load() + int64(n), kind: kind})
	f.active = true
	return nil
}

// FailRandom makes each later call of op fail with kind with probability p,
// drawn from a generator seeded with seed, so runs repeat exactly. It
// replaces an earlier FailRandom of op; p = 0 removes it.
func (e *Emulator) FailRandom(op backend.Op, p float64, seed uint64, kind error) error {
	if err := checkOp(op); err != nil {
		return err
	}
	if err := checkKind(kind); err != nil {
		return err
	}
	if !(p >= 0 && p <= 1) {
		return fmt.Errorf("emulated: FailRandom(%v, %v): p must be in [0,1]: %w", op, p, backend.ErrInvalidArgument)
	}
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	f := &e.p.faults
	f.rnd[op] = nil
	if p > 0 {
		f.rnd[op] = &randomFault{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), kind: kind}
	}
	f.refresh()
	return nil
}

// ClearFaults disarms every injected fault of this process.
func (e *Emulator) ClearFaults() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.p.faults = faults{}
}

// CostModel is the simulated time of each primitive: PerCall[op] for every
// successful call plus PerGiB[op] for each GiB the call handles (the size
// created, freed, mapped, unmapped, given access, allocated or registered).
// Failed calls cost nothing. The named profiles (CostProfileNames) are
// CostModels with their sources; DefaultCostModel is the "a100" one.
type CostModel struct {
	PerCall [backend.NumOps]time.Duration
	PerGiB  [backend.NumOps]time.Duration
}

// DefaultCostModel returns the model of the default cost profile,
// DefaultCostProfile ("a100": creating a handle costs about 130 times
// mapping it).
func DefaultCostModel() CostModel {
	p, _ := NamedCostProfile(DefaultCostProfile)
	return p.Model
}

// LegacyCostModel returns the guessed costs the emulator charged before it
// had measured profiles (the "legacy" profile): tens of microseconds for
// the creating and mapping primitives, with a small per-GiB term, and about
// a microsecond for queries. Kept to compare figures with older ones.
func LegacyCostModel() CostModel {
	var m CostModel
	us := time.Microsecond
	for op, c := range map[backend.Op]time.Duration{
		backend.OpGranularity:       us,
		backend.OpReserve:           10 * us,
		backend.OpRelease:           10 * us,
		backend.OpCreate:            20 * us,
		backend.OpFree:              10 * us,
		backend.OpMap:               10 * us,
		backend.OpUnmap:             15 * us,
		backend.OpSetAccess:         5 * us,
		backend.OpGetAccess:         us,
		backend.OpAddressRange:      us,
		backend.OpRetain:            2 * us,
		backend.OpHandleProps:       us,
		backend.OpMemGetInfo:        2 * us,
		backend.OpStreamCreate:      10 * us,
		backend.OpStreamDestroy:     10 * us,
		backend.OpStreamSync:        5 * us,
		backend.OpDeviceSync:        10 * us,
		backend.OpEventCreate:       2 * us,
		backend.OpEventDestroy:      2 * us,
		backend.OpEventRecord:       us,
		backend.OpEventQuery:        us / 2,
		backend.OpEventSync:         5 * us,
		backend.OpExport:            20 * us,
		backend.OpSetPids:           5 * us,
		backend.OpImport:            30 * us,
		backend.OpMallocHost:        50 * us,
		backend.OpFreeHost:          20 * us,
		backend.OpHostRegister:      30 * us,
		backend.OpHostUnregister:    20 * us,
		backend.OpHostDevicePointer: us,
		backend.OpMemcpy:            5 * us, // launch; the bytes cost PerGiB
		backend.OpMemset:            3 * us,
	} {
		m.PerCall[op] = c
	}
	m.PerGiB[backend.OpCreate] = 40 * us
	m.PerGiB[backend.OpFree] = 20 * us
	m.PerGiB[backend.OpMap] = 20 * us
	m.PerGiB[backend.OpUnmap] = 20 * us
	m.PerGiB[backend.OpSetAccess] = 10 * us
	m.PerGiB[backend.OpMallocHost] = 250 * us
	m.PerGiB[backend.OpFreeHost] = 50 * us
	m.PerGiB[backend.OpHostRegister] = 200 * us
	m.PerGiB[backend.OpMemcpy] = 40 * time.Millisecond // a host link (~25 GB/s); device copies are faster
	m.PerGiB[backend.OpMemset] = 400 * us              // device bandwidth (~2.5 TB/s)
	return m
}

// cost is the simulated time of a successful call of op on nbytes, in ns.
func (m *CostModel) cost(op backend.Op, nbytes uint64) int64 {
	c := int64(m.PerCall[op])
	if g := m.PerGiB[op]; g != 0 && nbytes != 0 {
		c += int64(float64(g) * float64(nbytes) / float64(GiB))
	}
	return c
}

// SimulatedTime is the simulated time charged to this process so far.
func (e *Emulator) SimulatedTime() time.Duration { return time.Duration(e.p.simNanos.Load()) }

// OpTimes is a simulated duration per primitive, indexed by backend.Op.
type OpTimes [backend.NumOps]time.Duration

// SimulatedTimes returns SimulatedTime split by primitive.
func (e *Emulator) SimulatedTimes() OpTimes {
	var t OpTimes
	for op := range t {
		t[op] = time.Duration(e.p.simByOp[op].Load())
	}
	return t
}

// Calls returns how many times this process called op, failed calls
// included.
func (e *Emulator) Calls(op backend.Op) int64 {
	if checkOp(op) != nil {
		return 0
	}
	return e.p.calls[op].Load()
}

// Failures returns how many calls of op by this process returned an error.
func (e *Emulator) Failures(op backend.Op) int64 {
	if checkOp(op) != nil {
		return 0
	}
	return e.p.failed[op].Load()
}

// CallCounts is a count per primitive, indexed by backend.Op.
type CallCounts [backend.NumOps]int64

// CallCounts returns a snapshot of Calls for every primitive.
func (e *Emulator) CallCounts() CallCounts {
	var c CallCounts
	for op := range c {
		c[op] = e.p.calls[op].Load()
	}
	return c
}

// ResetCounters zeroes the call and failure counts and the simulated time
// of this process. Armed FailNth faults keep their place relative to now.
func (e *Emulator) ResetCounters() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	for op := range e.p.calls {
		n := e.p.calls[op].Swap(0)
		for i := range e.p.faults.nth[op] {
			e.p.faults.nth[op][i].call -= n
		}
		e.p.failed[op].Store(0)
	}
	e.p.simNanos.Store(0)
	for op := range e.p.simByOp {
		e.p.simByOp[op].Store(0)
	}
}
