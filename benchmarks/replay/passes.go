package replay

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/stats"
)

// PassStats are the figures of one warm pass (WarmPasses).
type PassStats struct {
	Pass int `json:"pass"` // 1-based
	// PeakReservedBytes is the most memory mapped during the pass,
	// PeakLiveBytes the most bytes allocated (rounded block sizes).
	PeakReservedBytes uint64 `json:"peak_reserved_bytes"`
	PeakLiveBytes     uint64 `json:"peak_live_bytes"`
	// DriverCalls counts the emulated driver's calls of the pass
	// (maps, unmaps, handle creations and frees, synchronisations).
	DriverCalls int64 `json:"driver_calls"`
	// SimDriverNs is the simulated time of those calls under the
	// emulator's cost model.
	SimDriverNs int64 `json:"sim_driver_time_ns"`
	// Calls counts the pass's Malloc and Free calls; NsPerCall is the
	// pass's wall time divided by them.
	Calls     int     `json:"calls"`
	NsPerCall float64 `json:"ns_per_call"`
	// State is the default pool's planned-step state after MarkStep.
	State string `json:"step_state"`
}

// PassesReport is WarmPasses' result for one configuration.
type PassesReport struct {
	Config string      `json:"config"`
	Passes []PassStats `json:"passes"`
	// The last pass's figures: the steady state.
	SteadyPeakReservedBytes uint64  `json:"steady_peak_reserved_bytes"`
	SteadyPeakLiveBytes     uint64  `json:"steady_peak_live_bytes"`
	SteadyDriverCalls       int64   `json:"steady_driver_calls"`
	SteadySimDriverNs       int64   `json:"steady_sim_driver_time_ns"`
	SteadyNsPerCall         float64 `json:"steady_ns_per_call"`
	// SteadyReservedOverLive is SteadyPeakReservedBytes over
	// SteadyPeakLiveBytes.
	SteadyReservedOverLive float64 `json:"steady_reserved_over_live"`
	// The plan, with planned steps on: its region, what the packing
	// needs, and the most bytes its blocks have live at once (no
	// packing is smaller); PlanOverPeakLive is PlanBytes over
	// PlanPeakLiveBytes. Zero without a plan.
	RegionBytes       uint64  `json:"region_bytes,omitempty"`
	PlanBytes         uint64  `json:"plan_bytes,omitempty"`
	PlanPeakLiveBytes uint64  `json:"plan_peak_live_bytes,omitempty"`
	PlanOverPeakLive  float64 `json:"plan_over_peak_live,omitempty"`
	PlannedBlocks     int     `json:"planned_blocks,omitempty"`
	Divergences       uint64  `json:"divergences"`
}

// ErrNoPasses is returned by WarmPasses for fewer than one pass.
var ErrNoPasses = errors.New("replay: want at least one pass")

// WarmPasses replays the Malloc and Free events of events passes times on
// one allocator of config cfg (an emulated device of capacity bytes, 0
// for DefaultCapacity), every call on the default stream, freeing what a
// pass leaves live and calling MarkStep after each pass, so that each
// pass is one step of a training loop. With planned_steps on in cfg, the
// passes after the second are served from a plan. Frees of blocks
// allocated before the trace began are skipped. opts configure the
// emulated device further (a cost model, say), after its capacity.
func WarmPasses(events []trace.Event, cfg allocator.Config, capacity uint64, passes int, opts ...emulated.Option) (*PassesReport, error) {
	if passes < 1 {
		return nil, ErrNoPasses
	}
	if capacity == 0 {
		capacity = DefaultCapacity
	}
	ops, nslots := denseOps(events)
	emu, err := emulated.New(append([]emulated.Option{emulated.WithCapacity(capacity), emulated.WithDevices(cfg.Device + 1)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	defer func() { _ = emu.Close() }()
	a, err := allocator.New(emu, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	defer func() { _ = a.Close() }()
	calls := func() (n int64) {
		for _, c := range emu.CallCounts() {
			n += c
		}
		return n
	}
	ptrs := make([]uintptr, nslots)
	rep := &PassesReport{Config: cfg.String()}
	for i := 1; i <= passes; i++ {
		a.ResetPeakStats()
		before, simBefore := calls(), emu.SimulatedTime()
		n := 0
		start := time.Now()
		for _, o := range ops {
			n++
			if o.size != 0 {
				p, err := a.Malloc(o.size, 0)
				if err != nil {
					return nil, fmt.Errorf("pass %d: %w", i, err)
				}
				ptrs[o.slot] = p
				continue
			}
			if err := a.Free(ptrs[o.slot]); err != nil {
				return nil, fmt.Errorf("pass %d: %w", i, err)
			}
			ptrs[o.slot] = 0
		}
		for s, p := range ptrs {
			if p != 0 {
				n++
				if err := a.Free(p); err != nil {
					return nil, fmt.Errorf("pass %d: %w", i, err)
				}
				ptrs[s] = 0
			}
		}
		el := time.Since(start)
		st := a.Stats()
		ps := PassStats{
			Pass:              i,
			PeakReservedBytes: uint64(st.ReservedBytes[stats.AllPools].Peak),
			PeakLiveBytes:     uint64(st.AllocatedBytes[stats.AllPools].Peak),
			Calls:             n,
			NsPerCall:         float64(el.Nanoseconds()) / float64(max(n, 1)),
		}
		// The step's driver calls, its MarkStep's included (where a
		// plan's region is mapped).
		if err := a.MarkStep(); err != nil {
			return nil, fmt.Errorf("pass %d: MarkStep: %w", i, err)
		}
		ps.DriverCalls = calls() - before
		ps.SimDriverNs = int64(emu.SimulatedTime() - simBefore)
		ps.State = a.StepStats().State
		rep.Passes = append(rep.Passes, ps)
	}
	last := rep.Passes[len(rep.Passes)-1]
	rep.SteadyPeakReservedBytes, rep.SteadyPeakLiveBytes = last.PeakReservedBytes, last.PeakLiveBytes
	rep.SteadyDriverCalls, rep.SteadyNsPerCall = last.DriverCalls, last.NsPerCall
	rep.SteadySimDriverNs = last.SimDriverNs
	rep.SteadyReservedOverLive = ratio(last.PeakReservedBytes, last.PeakLiveBytes)
	ss := a.StepStats()
	rep.RegionBytes, rep.PlanBytes, rep.PlanPeakLiveBytes, rep.PlannedBlocks = ss.RegionBytes, ss.PlanBytes, ss.PeakLiveBytes, ss.PlannedBlocks
	rep.PlanOverPeakLive = ratio(ss.PlanBytes, ss.PeakLiveBytes)
	rep.Divergences = ss.Divergences
	if err := a.Check(); err != nil {
		return nil, err
	}
	return rep, nil
}

// warmOp is one call of a dense warm replay: a Malloc of size bytes whose
// pointer goes to slot, or (size 0) a Free of the pointer in slot.
type warmOp struct {
	size uint64
	slot int32
}

// denseOps resolves the trace ids of events to slots: every allocation
// gets a slot of its own, and a free names the slot of the latest
// allocation of its id that is still live. Frees of ids not live (blocks
// allocated before recording began) are left out.
func denseOps(events []trace.Event) ([]warmOp, int) {
	ops := make([]warmOp, 0, len(events))
	slotOf := make(map[uint64]int32)
	var n int32
	for _, ev := range events {
		switch ev.Kind {
		case trace.Alloc:
			if ev.Size == 0 {
				continue
			}
			slotOf[ev.ID] = n
			ops = append(ops, warmOp{size: ev.Size, slot: n})
			n++
		case trace.Free:
			s, ok := slotOf[ev.ID]
			if !ok {
				continue
			}
			delete(slotOf, ev.ID)
			ops = append(ops, warmOp{slot: s})
		}
	}
	return ops, int(n)
}
