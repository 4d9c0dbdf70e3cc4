package replay

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"golang.org/x/sync/errgroup"
)

// SweepTrace is one trace of a sweep: a name for the tables and its
// events, held whole (every run of the sweep replays them again).
type SweepTrace struct {
	Name   string
	Events []trace.Event
}

// SweepOptions configures Sweep.
type SweepOptions struct {
	// Options are the replay options of every run (Capacity, CostModel,
	// MaxSamples, Check, SteadyFromMark, MinCapacity). Name and Config
	// come from each policy; Progress is not used (see OnProgress).
	// Options.Parallel is the parallelism of each run's capacity search;
	// 0 means 1 when runs go in parallel (Parallel ≠ 1), else GOMAXPROCS.
	Options
	// Parallel is how many runs go at once; 0 means GOMAXPROCS.
	Parallel int
	// OnDone, if set, is called once per finished run, one call at a
	// time, in the order runs finish. It must be quick.
	OnDone func(SweepRun)
	// OnProgress, if set, is called as each run moves on: once when it
	// starts, every 65536 events of its plain replay and at the end of
	// it, and once when its capacity search starts. Calls are never
	// concurrent: they are serialised with each other and with OnDone
	// through one mutex of the sweep, so a run's last OnProgress comes
	// before its OnDone. It must be quick (it holds up every run that
	// reports meanwhile).
	OnProgress func(SweepProgress)
}

// SweepStage is where a run of a sweep is.
type SweepStage int

const (
	// SweepReplaying: the plain replay at Options.Capacity;
	// SweepProgress.Events counts its events.
	SweepReplaying SweepStage = iota
	// SweepSearching: the minimum-capacity search (Options.MinCapacity),
	// which replays the trace several times, some at once; its events are
	// not counted.
	SweepSearching
)

// String names the stage for people.
func (s SweepStage) String() string {
	switch s {
	case SweepReplaying:
		return "replay"
	case SweepSearching:
		return "min-capacity search"
	}
	return fmt.Sprintf("SweepStage(%d)", int(s))
}

// SweepProgress is the state of one run in flight, as OnProgress sees it.
type SweepProgress struct {
	Trace       string     // SweepTrace.Name
	Policy      string     // Policy.Name
	Index       int        // position in the grid: trace-major, policy-minor
	Total       int        // cells in the grid
	Stage       SweepStage // what the run is doing
	Events      int64      // events the plain replay has applied (all of them once it is over)
	EventsTotal int64      // events in the trace
}

// SweepRun is the outcome of one (trace, policy) cell of a sweep.
type SweepRun struct {
	Trace  string  // SweepTrace.Name
	Policy Policy  // the policy replayed
	Report *Report // its report; MinCapacity is set when Options.MinCapacity was
	Index  int     // position in the grid: trace-major, policy-minor
	Total  int     // cells in the grid
	Wall   time.Duration
}

// Sweep replays every trace under every policy (a grid of
// len(traces)×len(policies) runs) and returns the runs in grid order,
// trace-major. Runs go in parallel, at most opts.Parallel at once, in an
// errgroup: the first run that fails cancels the context of the others
// (threaded into each replay through RunContext), and Sweep returns that
// first error naming its cell, with no runs. Cancelling ctx does the same.
//
// Every policy config is parsed before anything is replayed: a bad one is
// an ErrInvalidOptions naming the policy, as are two traces or two policies
// of one name (tables and plots tell runs apart by name).
func Sweep(ctx context.Context, traces []SweepTrace, policies []Policy, opts SweepOptions) ([]SweepRun, error) {
	if len(traces) == 0 {
		return nil, fmt.Errorf("%w: no traces", ErrInvalidOptions)
	}
	if len(policies) == 0 {
		return nil, fmt.Errorf("%w: no policies", ErrInvalidOptions)
	}
	names := make(map[string]bool, len(traces))
	for _, tr := range traces {
		if names[tr.Name] {
			return nil, fmt.Errorf("%w: trace %q given twice (its rows and plot points would be merged)", ErrInvalidOptions, tr.Name)
		}
		names[tr.Name] = true
	}
	cfgs, err := parsePolicies(policies)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("replay: sweep not started: %w", context.Cause(ctx))
	}
	limit := opts.Parallel
	if limit <= 0 {
		limit = runtime.GOMAXPROCS(0)
	}
	base := opts.Options
	base.Progress = nil
	if base.Parallel <= 0 && limit > 1 {
		base.Parallel = 1 // the runs already fill the cores
	}

	total := len(traces) * len(policies)
	runs := make([]SweepRun, total)
	var mu sync.Mutex // serialises OnDone and OnProgress
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for ti, tr := range traces {
		for pi, p := range policies {
			idx := ti*len(policies) + pi
			o := base
			o.Name, o.Config = p.Name, cfgs[pi]
			g.Go(func() error {
				if err := gctx.Err(); err != nil {
					return context.Cause(gctx)
				}
				start := time.Now()
				var report func(SweepStage, int64)
				if opts.OnProgress != nil {
					sp := SweepProgress{Trace: tr.Name, Policy: p.Name, Index: idx, Total: total, EventsTotal: int64(len(tr.Events))}
					report = func(st SweepStage, n int64) {
						mu.Lock()
						defer mu.Unlock()
						sp.Stage, sp.Events = st, n
						opts.OnProgress(sp)
					}
				}
				rep, err := runCell(gctx, tr.Events, o, report)
				if err != nil {
					return fmt.Errorf("%s: %w", cellName(tr.Name, p.Name), err)
				}
				run := SweepRun{Trace: tr.Name, Policy: p, Report: rep, Index: idx, Total: total, Wall: time.Since(start)}
				runs[idx] = run
				if opts.OnDone != nil {
					mu.Lock()
					opts.OnDone(run)
					mu.Unlock()
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return runs, nil
}

// cellName names a cell of the grid in errors.
func cellName(traceName, policy string) string {
	if traceName == "" {
		return fmt.Sprintf("policy %q", policy)
	}
	return fmt.Sprintf("trace %q, policy %q", traceName, policy)
}

// runCell is one run of a sweep: a replay at o.Capacity and, with
// o.MinCapacity, the capacity search. report, if not nil, hears each stage
// and the replay's events.
func runCell(ctx context.Context, events []trace.Event, o Options, report func(SweepStage, int64)) (*Report, error) {
	if report != nil {
		report(SweepReplaying, 0)
		o.Progress = func(n int64) { report(SweepReplaying, n) }
	}
	rep, err := RunContext(ctx, trace.NewSliceReader(events), o)
	if err != nil {
		return nil, err
	}
	if o.MinCapacity {
		if report != nil {
			report(SweepSearching, int64(len(events)))
		}
		res, err := SearchMinCapacityContext(ctx, events, o.Config, o)
		if err != nil {
			return nil, err
		}
		rep.MinCapacity, rep.MinCapacityOverLive = res.Capacity, res.OverLive
	}
	return rep, nil
}

// parsePolicies parses every policy's config, naming the first bad one.
func parsePolicies(policies []Policy) ([]allocator.Config, error) {
	cfgs := make([]allocator.Config, len(policies))
	seen := make(map[string]bool, len(policies))
	for i, p := range policies {
		if seen[p.Name] {
			return nil, fmt.Errorf("%w: policy %q given twice (its rows and plot points would be merged)", ErrInvalidOptions, p.Name)
		}
		seen[p.Name] = true
		cfg, err := allocator.ParseConfig(p.Config)
		if err != nil {
			return nil, fmt.Errorf("%w: policy %q: %w", ErrInvalidOptions, p.Name, err)
		}
		cfgs[i] = cfg
	}
	return cfgs, nil
}

// PolicyConfig is the config a policy stands for, for people: its config
// string, or "defaults" when it is empty.
func PolicyConfig(p Policy) string {
	if s := strings.TrimSpace(p.Config); s != "" {
		return s
	}
	return "defaults"
}

// sweepColumns are the columns of the sweep tables.
var sweepColumns = []string{"trace", "policy", "config", "peak live", "peak reserved", "reserved/live",
	"min capacity", "mincap/live", "OOMs", "driver calls", "sim driver time"}

// WriteSweepMarkdown writes runs as a Markdown table, one row per run,
// sizes in binary units and counts with thousands separators.
func WriteSweepMarkdown(w io.Writer, runs []SweepRun) error {
	b := &strings.Builder{}
	b.WriteString("| " + strings.Join(sweepColumns, " | ") + " |\n|")
	for i := range sweepColumns {
		if i < 3 {
			b.WriteString("---|")
		} else {
			b.WriteString("--:|")
		}
	}
	b.WriteString("\n")
	for _, r := range runs {
		rep := r.Report
		mc, mcr := "–", "–"
		if rep.MinCapacity != 0 {
			mc, mcr = FormatBytes(rep.MinCapacity), fmt.Sprintf("%.4f", rep.MinCapacityOverLive)
		}
		cells := []string{mdCell(r.Trace), mdCell(r.Policy.Name), "`" + strings.ReplaceAll(PolicyConfig(r.Policy), "`", "'") + "`",
			FormatBytes(rep.PeakLive), FormatBytes(rep.PeakReserved), fmt.Sprintf("%.4f", rep.ReservedOverLive),
			mc, mcr, FormatCount(rep.OOMs), FormatCount(rep.DriverCallsTotal), rep.SimDriverTime.Round(time.Microsecond).String()}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mdCell escapes the characters that would break a Markdown table cell.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// WriteSweepCSV writes runs as CSV with a header row; sizes are in bytes
// and counts plain, for programs.
func WriteSweepCSV(w io.Writer, runs []SweepRun) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"trace", "policy", "config", "peak_live_bytes", "peak_reserved_bytes", "reserved_over_live",
		"min_capacity_bytes", "min_capacity_over_live", "ooms", "driver_calls", "sim_driver_time_ns", "wall_ns"})
	for _, r := range runs {
		rep := r.Report
		_ = cw.Write([]string{r.Trace, r.Policy.Name, r.Policy.Config,
			strconv.FormatUint(rep.PeakLive, 10), strconv.FormatUint(rep.PeakReserved, 10),
			strconv.FormatFloat(rep.ReservedOverLive, 'f', 6, 64),
			strconv.FormatUint(rep.MinCapacity, 10), strconv.FormatFloat(rep.MinCapacityOverLive, 'f', 6, 64),
			strconv.FormatInt(rep.OOMs, 10), strconv.FormatInt(rep.DriverCallsTotal, 10),
			strconv.FormatInt(int64(rep.SimDriverTime), 10), strconv.FormatInt(int64(r.Wall), 10)})
	}
	cw.Flush()
	return cw.Error()
}

// SweepPlot is the scatter plot of a sweep: one point per run, minimum
// capacity over peak live (or, for runs without a capacity search, peak
// reserved over peak live) against driver calls, on a log scale when they
// span decades. Each policy has its colour and each trace its marker
// shape; later policies draw smaller markers so that coinciding points
// stay visible as rings.
func SweepPlot(title string, runs []SweepRun) Plot {
	p := Plot{Title: title, XLabel: "driver calls", YLabel: "min capacity / peak live"}
	policyIdx := map[string]int{}
	traceIdx := map[string]int{}
	for _, r := range runs {
		if _, ok := policyIdx[r.Policy.Name]; !ok {
			policyIdx[r.Policy.Name] = len(policyIdx)
		}
		if _, ok := traceIdx[r.Trace]; !ok {
			traceIdx[r.Trace] = len(traceIdx)
		}
		if r.Report.MinCapacity == 0 {
			p.YLabel = "min capacity (or peak reserved) / peak live"
		}
	}
	lo, hi := math.Inf(1), 0.0
	for _, r := range runs {
		x := float64(r.Report.DriverCallsTotal)
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	p.LogX = lo > 0 && hi/lo >= 20 // counts spanning decades
	for _, r := range runs {
		y := r.Report.MinCapacityOverLive
		if r.Report.MinCapacity == 0 {
			y = r.Report.ReservedOverLive
		}
		name := r.Policy.Name
		if len(traceIdx) > 1 {
			name += " · " + r.Trace
		}
		p.Curves = append(p.Curves, Curve{
			Name:   name,
			X:      []float64{float64(r.Report.DriverCallsTotal)},
			Y:      []float64{y},
			Color:  palette[policyIdx[r.Policy.Name]%len(palette)],
			Marker: Marker(1 + traceIdx[r.Trace]%numMarkers),
			// Later policies draw smaller markers, so coinciding points
			// show as rings.
			Width: 1.2 * markerSize * max(0.5, 1-0.09*float64(policyIdx[r.Policy.Name])),
		})
	}
	return p
}
