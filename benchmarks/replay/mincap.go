package replay

import (
	"context"
	"fmt"
	"runtime"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"golang.org/x/sync/errgroup"
)

// MaxSearchCapacity is the largest device capacity the search tries
// (4 TiB). Above it the allocator's address-space budget (4.5× capacity
// per device) would not fit the emulator's 64 TiB of address space.
const MaxSearchCapacity uint64 = 4 << 40

// CapacityResult is the outcome of SearchMinCapacity.
type CapacityResult struct {
	// Capacity is the smallest capacity found at which the whole trace
	// replays without an out-of-memory error: a multiple of Resolution.
	Capacity uint64 `json:"min_capacity_bytes"`
	// Failing is the largest capacity tried below Capacity that ran out of
	// memory (or the largest known to, from peak live): the answer lies in
	// (Failing, Capacity], and Capacity-Failing ≤ Resolution.
	Failing uint64 `json:"failing_capacity_bytes"`
	// PeakLive is the trace's peak demand in bytes.
	PeakLive uint64 `json:"peak_live_bytes"`
	// OverLive is Capacity / PeakLive.
	OverLive float64 `json:"min_capacity_over_live"`
	// Replays is how many replays the search ran.
	Replays int `json:"replays"`
}

// MinCapacity returns the smallest device capacity (a multiple of
// Resolution) at which events replay under cfg without an out-of-memory
// error. See SearchMinCapacity.
func MinCapacity(events []trace.Event, cfg allocator.Config, opts Options) (uint64, error) {
	res, err := SearchMinCapacity(events, cfg, opts)
	if err != nil {
		return 0, err
	}
	return res.Capacity, nil
}

// SearchMinCapacity searches the smallest device capacity at which events
// replay under cfg (which overrides opts.Config) without an out-of-memory
// error.
//
// A first replay at opts.Capacity (default DefaultCapacity; doubled until
// the trace fits, up to MaxSearchCapacity, else ErrNoFit) gives the peak
// live and peak reserved bytes. Any capacity below peak live must fail;
// the capacity equal to that replay's peak reserved (rounded up) is tried
// first, and the interval is then narrowed by k-section: each round
// replays opts.Parallel (default GOMAXPROCS) evenly spaced capacities at
// once, each stopping at its first OOM, until the bounds are Resolution
// apart. If the allocator is not monotone in capacity (a larger device may
// change its layout), the result is still a capacity that works whose
// next-lower step failed.
func SearchMinCapacity(events []trace.Event, cfg allocator.Config, opts Options) (*CapacityResult, error) {
	return SearchMinCapacityContext(context.Background(), events, cfg, opts)
}

// SearchMinCapacityContext is SearchMinCapacity under ctx: the replays of
// a round run in an errgroup, so the first one to fail (or ctx ending)
// cancels the others, and the search returns that error.
func SearchMinCapacityContext(ctx context.Context, events []trace.Event, cfg allocator.Config, opts Options) (*CapacityResult, error) {
	opts.Config = resolveConfig(cfg)
	opts.Progress = nil
	opts.Check = false
	opts.MaxSamples = -1
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	k := opts.Parallel
	if k <= 0 {
		k = runtime.GOMAXPROCS(0)
	}
	res := &CapacityResult{}

	probe := opts.Capacity
	if probe == 0 {
		probe = DefaultCapacity
	}
	probe = roundUpRes(probe)
	var first *Report
	for {
		o := opts
		o.Capacity = probe
		o.StopOnOOM = false
		rep, err := RunContext(ctx, trace.NewSliceReader(events), o)
		if err != nil {
			return nil, err
		}
		res.Replays++
		first = rep
		if rep.OOMs == 0 {
			break
		}
		next := max(2*probe, roundUpRes(2*rep.PeakLive))
		if next > MaxSearchCapacity || probe == MaxSearchCapacity {
			if probe < MaxSearchCapacity {
				next = MaxSearchCapacity
			} else {
				return nil, fmt.Errorf("%w: out of memory at %d bytes (peak live %d bytes)", ErrNoFit, probe, rep.PeakLive)
			}
		}
		probe = next
	}
	res.PeakLive = first.PeakLive
	if res.PeakLive == 0 {
		// Nothing is ever live: any device will do.
		return res, nil
	}
	lo := roundDownRes(res.PeakLive - 1) // below peak live: must fail
	hi := probe                          // known to fit

	// fits replays at each capacity at once; ok[i] reports whether caps[i]
	// replayed without OOM.
	fits := func(caps []uint64) ([]bool, error) {
		ok := make([]bool, len(caps))
		g, gctx := errgroup.WithContext(ctx)
		for i, c := range caps {
			g.Go(func() error {
				o := opts
				o.Capacity = c
				o.StopOnOOM = true
				rep, err := RunContext(gctx, trace.NewSliceReader(events), o)
				if err != nil {
					return err
				}
				ok[i] = rep.OOMs == 0
				return nil
			})
		}
		err := g.Wait()
		res.Replays += len(caps)
		if err != nil {
			return nil, err
		}
		return ok, nil
	}

	// Round 0: the first replay's peak reserved, plus k-1 points below it.
	var caps []uint64
	if guess := roundUpRes(first.PeakReserved); guess > lo && guess < hi {
		caps = append(caps, guess)
		caps = append(caps, points(lo, guess, k-1)...)
	} else {
		caps = points(lo, hi, k)
	}
	for len(caps) > 0 {
		ok, err := fits(caps)
		if err != nil {
			return nil, err
		}
		for i, c := range caps {
			if ok[i] && c < hi {
				hi = c
			}
		}
		for i, c := range caps {
			if !ok[i] && c < hi && c > lo {
				lo = c
			}
		}
		caps = points(lo, hi, k)
	}
	res.Capacity = hi
	res.Failing = lo
	res.OverLive = ratio(hi, res.PeakLive)
	return res, nil
}

// points returns up to k distinct multiples of Resolution strictly between
// lo and hi, evenly spaced.
func points(lo, hi uint64, k int) []uint64 {
	if k <= 0 || hi <= lo+Resolution {
		return nil
	}
	steps := (hi - lo) / Resolution // ≥ 2
	var out []uint64
	for i := 1; i <= k; i++ {
		c := lo + steps*uint64(i)/uint64(k+1)*Resolution
		if c <= lo || c >= hi || (len(out) > 0 && out[len(out)-1] == c) {
			continue
		}
		out = append(out, c)
	}
	return out
}

func roundUpRes(n uint64) uint64   { return (n + Resolution - 1) / Resolution * Resolution }
func roundDownRes(n uint64) uint64 { return n / Resolution * Resolution }
