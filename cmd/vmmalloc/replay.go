package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/drivers"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
	"github.com/vmmalloc/vmmalloc/stats"
)

// replayFlags are the flags of "vmmalloc replay".
type replayFlags struct {
	config   string
	capacity string
	compare  bool
	minCap   bool
	asJSON   bool
	samples  bool
	svg      string
	format   string
	device   int
	check    bool
	allowOOM bool
	strict   bool
	releases bool
	backend  string
	snapshot string // PyTorch memory snapshot output file
	entries  int    // history entries the snapshot keeps
	passes   int    // warm passes with MarkStep after each (planned steps); 0: one replay
	cost     string // cost profile name or file
}

// costProfileChoices lists the built-in cost profiles for flag help.
var costProfileChoices = strings.Join(emulated.CostProfileNames(), ", ")

// setCostProfile sets opts' cost model to the built-in profile or the
// profile file nameOrPath.
func setCostProfile(opts *replay.Options, nameOrPath string) error {
	p, err := emulated.LoadCostProfile(nameOrPath)
	if err != nil {
		return usagef("--cost-profile: %v", err)
	}
	opts.CostModel, opts.CostProfile = &p.Model, p.Name
	if opts.CostProfile == "" {
		opts.CostProfile = nameOrPath
	}
	return nil
}

// jsonReport is the --json output: the report's fields at the top level,
// plus the input, the PyTorch figures for snapshots, flattened statistics
// and, with --compare, every policy's report.
type jsonReport struct {
	*replay.Report
	Input  string `json:"input"`
	Format string `json:"format"`
	Name   string `json:"name,omitempty"`
	// MinCapacity shadows Report.MinCapacity so that it is present exactly
	// when the search was asked for.
	MinCapacity *uint64 `json:"min_capacity_bytes,omitempty"`
	// PyTorch's own figures, for PyTorch snapshots. The reserved peak and
	// its ratio are present only when the file lets them be known.
	PyTorchPeakReservedKnown *bool    `json:"pytorch_peak_reserved_known,omitempty"`
	PyTorchPeakReserved      *uint64  `json:"pytorch_peak_reserved_bytes,omitempty"`
	PyTorchPeakLive          *uint64  `json:"pytorch_peak_live_bytes,omitempty"`
	PyTorchReservedOverLive  *float64 `json:"pytorch_reserved_over_live,omitempty"`
	// The snapshot's private pools (CUDA graphs, MemPools), present only
	// when it has some: its segments in them and the allocs of each.
	PyTorchPrivateSegments *int             `json:"pytorch_private_segments,omitempty"`
	PyTorchPoolAllocs      map[string]int   `json:"pytorch_pool_allocs,omitempty"`
	Stats                  map[string]int64 `json:"stats"`
	Compare                []*replay.Report `json:"compare,omitempty"`
}

func cmdReplay(args []string, stdout, stderr io.Writer) error {
	var f replayFlags
	fs := newFlagSet("replay", "[flags] [trace]", stdout)
	fs.StringVar(&f.config, "config", "", "allocator `config` string, e.g. expandable_segments:False,max_split_size_mb:128")
	fs.StringVar(&f.capacity, "capacity", "", "emulated device memory `size`, e.g. 40GiB or 42949672960 (default 80GiB)")
	fs.BoolVar(&f.compare, "compare", false, "replay the default policy set (and search each one's minimum capacity) and print a table")
	fs.BoolVar(&f.minCap, "min-capacity", false, "search the smallest device capacity at which the trace replays without OOM")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&f.samples, "samples", false, "with --json, include the sampled time series")
	fs.StringVar(&f.svg, "svg", "", "write a plot of allocated and reserved memory over time to `file`")
	fs.StringVar(&f.format, "format", fmtAuto, "input format: auto, binary, text, pytorch or rmm")
	fs.IntVar(&f.device, "device", 0, "device index of a PyTorch snapshot")
	fs.BoolVar(&f.check, "check", false, "check the allocator's invariants after the replay")
	fs.BoolVar(&f.allowOOM, "allow-oom", false, "exit 0 even when the replay runs out of device memory (exit status 4 otherwise)")
	fs.BoolVar(&f.strict, "strict", false, "fail when the trace frees unknown blocks or allocates blocks already live")
	fs.BoolVar(&f.releases, "releases", true, "apply the cache releases the trace records (empty_cache events; a PyTorch snapshot's segment frees); --releases=false ignores them")
	fs.StringVar(&f.backend, "backend", "", "`driver` to replay on: "+backendChoices+" (default: the config's backend key, else emulated)")
	fs.StringVar(&f.snapshot, "snapshot", "", "write a PyTorch memory snapshot of the replay (for pytorch.org/memory_viz) to `file`; a .html file opens the viewer")
	fs.IntVar(&f.entries, "snapshot-entries", replay.DefaultSnapshotEntries, "newest history entries the --snapshot keeps")
	fs.IntVar(&f.passes, "passes", 0, "replay the trace's Mallocs and Frees `N` times warm on one allocator, MarkStep after each, with planned steps on and off (the baseline), and report each pass")
	fs.StringVar(&f.cost, "cost-profile", emulated.DefaultCostProfile, "driver cost profile of the simulated driver time: "+costProfileChoices+", or a profile `file` (backend/cuda/gpucheck.sh --profile writes one)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef("want at most one trace, got %d arguments", len(pos))
	}
	format, err := parseFormat(f.format)
	if err != nil {
		return usageError{err}
	}
	if f.device < 0 {
		return usagef("--device %d: want ≥ 0", f.device)
	}
	if f.samples && !f.asJSON {
		return usagef("--samples needs --json (the time series is part of the JSON report; --svg plots it)")
	}
	if f.passes < 0 || f.passes > maxPasses {
		return usagef("--passes %d: want 1 to %d", f.passes, maxPasses)
	}
	if f.passes > 0 && (f.compare || f.minCap || f.snapshot != "" || f.svg != "" || f.samples || f.backend != "") {
		return usagef("--passes replays warm on the emulator; it cannot be combined with --compare, --min-capacity, --snapshot, --svg, --samples or --backend")
	}
	if f.snapshot != "" && f.compare {
		return usagef("--snapshot records one replay; it cannot be combined with --compare")
	}
	cfg, given, err := cliConfig(f.config)
	if err != nil {
		return err
	}
	backendName, err := pickBackend(f, cfg)
	if err != nil {
		return err
	}
	opts := replay.Options{Name: policyLabel(given, cfg), Config: cfg, Check: f.check, IgnoreReleases: !f.releases}
	if err := setCostProfile(&opts, f.cost); err != nil {
		return err
	}
	if f.capacity != "" {
		c, err := humanize.ParseBytes(f.capacity)
		if err != nil || c == 0 {
			return usagef("--capacity %q: want a positive size such as 80GiB", f.capacity)
		}
		if c > replay.MaxSearchCapacity {
			return usagef("--capacity %q: at most %s", f.capacity, humanize.IBytes(replay.MaxSearchCapacity))
		}
		opts.Capacity = c
	}

	var in *input
	if len(pos) == 0 {
		ev, err := workload.Default()
		if err != nil {
			return err
		}
		in = &input{name: "built-in training workload", format: "generated", events: ev,
			info: trace.Info{Name: "default", Source: fmt.Sprintf("workload.Default (seed %d)", workload.DefaultSeed)}}
	} else {
		if in, err = openInput(pos[0], format, f.device, os.Stdin); err != nil {
			return err
		}
		defer in.Close()
	}

	label := "replay"
	if in.info.Name != "" {
		label = in.info.Name
	}
	if f.passes > 0 {
		return replayPasses(stdout, in, cfg, opts.Capacity, opts, f)
	}
	if backendName != drivers.DefaultName {
		return replayOnBackend(backendName, cfg, in, f.asJSON, stdout)
	}
	var (
		reports  []*replay.Report
		policies []replay.Policy
		rep      *replay.Report
	)
	if f.compare {
		events, err := in.all()
		if err != nil {
			return err
		}
		policies = replay.DefaultPolicies()
		if given != "" {
			policies = append([]replay.Policy{{Name: "custom", Config: given}}, policies...)
		}
		if reports, err = comparePolicies(events, policies, opts, label, in, stderr); err != nil {
			return err
		}
		rep = reports[0]
	} else {
		pb := newProgress(stderr, label, in.fraction)
		if pb != nil {
			opts.Progress = pb.update
		}
		var events []trace.Event
		if f.minCap {
			if events, err = in.all(); err != nil {
				return err
			}
		}
		var sf *snapshotFile
		if f.snapshot != "" {
			if sf, err = createSnapshot(f.snapshot, f.entries); err != nil {
				return err
			}
		}
		ropts := opts
		ropts.Snapshot, ropts.SnapshotEntries = sf.writer(), f.entries
		rep, err = replay.Run(in.reader(), ropts)
		pb.done()
		if err = sf.finish(err); err != nil {
			return err
		}
		if f.minCap {
			res, err := replay.SearchMinCapacity(events, cfg, opts)
			if err != nil {
				return err
			}
			rep.MinCapacity, rep.MinCapacityOverLive = res.Capacity, res.OverLive
		}
	}

	if f.svg != "" {
		var ref []trace.Point
		if in.pytorch != nil {
			ref = in.pytorch.ReservedCurve
		}
		p := replay.ReportPlot(plotTitle(in, rep), rep, ref)
		if len(reports) > 0 {
			p = replay.ComparePlot(compareTitle(in, reports), reports, ref)
		}
		if err := writeSVG(f.svg, p); err != nil {
			return err
		}
	}
	if f.asJSON {
		err = writeJSON(stdout, in, rep, reports, f)
	} else {
		err = writeTextReport(stdout, in, rep, reports, policies)
	}
	if err != nil {
		return err
	}
	return replayOutcome(stderr, in, rep, reports, f)
}

// replayOutcome warns on stderr about what the replay skipped and returns
// the error that sets the exit status: a --strict violation, or an
// incompleteError when a replay ran out of memory and the user did not
// ask for that (--allow-oom, --min-capacity, --compare).
func replayOutcome(stderr io.Writer, in *input, rep *replay.Report, reports []*replay.Report, f replayFlags) error {
	const cmd = "vmmalloc replay"
	issues := issuesOf(rep, in)
	if f.strict {
		if err := issues.check(); err != nil {
			return err
		}
	}
	issues.warn(stderr, cmd)
	if len(reports) == 0 {
		reports = []*replay.Report{rep}
	}
	allowed := f.allowOOM || f.minCap || f.compare
	for _, r := range reports {
		if r.OOMs == 0 {
			continue
		}
		if !allowed {
			return incompleteError{fmt.Errorf("%s: the replay did not complete (--capacity to give it more, --min-capacity to find how much it needs, --allow-oom to accept this)", oomMessage(r))}
		}
		fmt.Fprintf(stderr, "%s: warning: %s\n", cmd, oomMessage(r))
	}
	return nil
}

// comparePolicies replays events under each policy (a one-trace sweep,
// one policy at a time, each with its capacity search), with a progress
// bar per policy on a terminal.
func comparePolicies(events []trace.Event, policies []replay.Policy, opts replay.Options, label string, in *input, stderr io.Writer) ([]*replay.Report, error) {
	copts := opts
	copts.MinCapacity = true
	var reports []*replay.Report
	for i, p := range policies {
		pb := newProgress(stderr, fmt.Sprintf("%s %d/%d %s", label, i+1, len(policies), p.Name), in.fraction)
		copts.Progress = nil
		if pb != nil {
			copts.Progress = pb.update
		}
		rs, err := replay.Compare(events, policies[i:i+1], copts)
		pb.done()
		if err != nil {
			return nil, err
		}
		reports = append(reports, rs...)
	}
	return reports, nil
}

func compareTitle(in *input, reports []*replay.Report) string {
	name := in.info.Name
	if name == "" {
		name = in.name
	}
	return fmt.Sprintf("%s — reserved memory of %d policies, %s peak live", name, len(reports), replay.FormatBytes(reports[0].PeakLive))
}

func plotTitle(in *input, rep *replay.Report) string {
	name := in.info.Name
	if name == "" {
		name = in.name
	}
	pol := rep.Policy
	if pol == "" {
		pol = rep.Config
	}
	return fmt.Sprintf("%s — %s: peak reserved %s for %s live (%.3f×)", name, pol,
		replay.FormatBytes(rep.PeakReserved), replay.FormatBytes(rep.PeakLive), rep.ReservedOverLive)
}

// writeSVG writes the plot to path, removing a partial file on error.
func writeSVG(path string, p replay.Plot) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := p.WriteSVG(f); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

func writeJSON(w io.Writer, in *input, rep *replay.Report, reports []*replay.Report, f replayFlags) error {
	strip := func(r *replay.Report) *replay.Report {
		if f.samples {
			return r
		}
		c := *r
		c.Samples = nil
		return &c
	}
	out := jsonReport{Report: strip(rep), Input: in.name, Format: in.format, Name: in.info.Name}
	st := rep.Stats
	out.Stats = stats.Flatten(&st)
	if f.minCap || f.compare {
		mc := rep.MinCapacity
		out.MinCapacity = &mc
	}
	if pt := in.pytorch; pt != nil {
		pr, pl, known := pt.PeakReserved, pt.PeakLive, pt.PeakReservedKnown
		out.PyTorchPeakLive, out.PyTorchPeakReservedKnown = &pl, &known
		if known {
			out.PyTorchPeakReserved = &pr
		}
		if known && pl > 0 {
			r := float64(pr) / float64(pl)
			out.PyTorchReservedOverLive = &r
		}
		if n := pt.PrivateSegments; n > 0 || pt.PoolAllocs != nil {
			out.PyTorchPrivateSegments = &n
			out.PyTorchPoolAllocs = make(map[string]int, len(pt.PoolAllocs))
			for id, c := range pt.PoolAllocs {
				out.PyTorchPoolAllocs[id.String()] = c
			}
		}
	}
	for _, r := range reports {
		out.Compare = append(out.Compare, strip(r))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeTextReport(w io.Writer, in *input, rep *replay.Report, reports []*replay.Report, policies []replay.Policy) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "trace   %s (%s", in.name, in.format)
	if in.info.Source != "" {
		fmt.Fprintf(b, ", %s", in.info.Source)
	}
	fmt.Fprintf(b, ")\n")
	if pt := in.pytorch; pt != nil {
		if pt.PeakReservedKnown {
			fmt.Fprintf(b, "PyTorch recorded: peak reserved %s for %s peak live (%.4f×), %s segment allocs",
				replay.FormatBytes(pt.PeakReserved), replay.FormatBytes(pt.PeakLive),
				ratioOf(pt.PeakReserved, pt.PeakLive), replay.FormatCount(int64(pt.SegmentAllocs)))
		} else {
			fmt.Fprintf(b, "PyTorch recorded: peak reserved unknown (the file starts mid-run or lacks segment events) for %s peak live, %s segment allocs",
				replay.FormatBytes(pt.PeakLive), replay.FormatCount(int64(pt.SegmentAllocs)))
		}
		// Only scalars are printed: a decoded value may be cyclic, or
		// shared so deeply that printing it would never end.
		if v, ok := pt.Settings["PYTORCH_CUDA_ALLOC_CONF"].(string); ok {
			fmt.Fprintf(b, ", PYTORCH_CUDA_ALLOC_CONF=%q", v)
		}
		if es, ok := pt.Settings["expandable_segments"].(bool); ok {
			fmt.Fprintf(b, ", expandable_segments=%v", es)
		}
		fmt.Fprintf(b, "\n")
		if pt.Releases > 0 {
			fmt.Fprintf(b, "        %d cache releases inferred from %d segment frees/unmaps (%d applied)\n",
				pt.Releases, pt.SegmentFrees+pt.SegmentUnmaps, rep.ReleasesApplied)
		}
		if pt.PrivateSegments > 0 || pt.PoolAllocs != nil {
			fmt.Fprintf(b, "        private pools (CUDA graphs, MemPools): %s segments at the dump; allocs:", replay.FormatCount(int64(pt.PrivateSegments)))
			ids := make([]trace.PoolID, 0, len(pt.PoolAllocs))
			for id := range pt.PoolAllocs {
				ids = append(ids, id)
			}
			slices.SortFunc(ids, func(x, y trace.PoolID) int {
				if c := cmp.Compare(x[0], y[0]); c != 0 {
					return c
				}
				return cmp.Compare(x[1], y[1])
			})
			for _, id := range ids {
				fmt.Fprintf(b, " %s %s", id, replay.FormatCount(int64(pt.PoolAllocs[id])))
			}
			if len(ids) == 0 {
				fmt.Fprintf(b, " none")
			}
			fmt.Fprintf(b, "\n")
		}
		if pt.UnmatchedFrees > 0 {
			fmt.Fprintf(b, "        %s frees of blocks allocated before the trace began were skipped\n", replay.FormatCount(int64(pt.UnmatchedFrees)))
		}
	}
	if rt := in.rmm; rt != nil && rt.Failures > 0 {
		fmt.Fprintf(b, "RMM log: %s allocation failures recorded (not replayed)\n", replay.FormatCount(int64(rt.Failures)))
	}
	fmt.Fprintln(b)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(reports) > 0 {
		if err := replay.WriteTable(w, reports); err != nil {
			return err
		}
		if _, err := io.WriteString(w, "\npolicies (config over the defaults):\n"); err != nil {
			return err
		}
		return replay.WritePolicies(w, policies)
	}
	return replay.WriteText(w, rep)
}

// policyLabel names the policy of a single replay: the config string as
// given, or "expandable (default)".
func policyLabel(given string, cfg allocator.Config) string {
	if s := strings.TrimSpace(given); s != "" {
		return s
	}
	if cfg.ExpandableSegments {
		return "expandable (default)"
	}
	return "classic"
}

func ratioOf(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// simDur formats simulated nanoseconds for the passes table.
func simDur(ns int64) string { return time.Duration(ns).Round(time.Microsecond).String() }

// costName names the cost profile opts price driver calls with.
func costName(opts replay.Options) string {
	if opts.CostProfile != "" {
		return opts.CostProfile
	}
	return emulated.DefaultCostProfile
}

// maxPasses bounds --passes.
const maxPasses = 1000

// passesJSON is the --passes --json output.
type passesJSON struct {
	Input    string               `json:"input"`
	Passes   int                  `json:"passes"`
	Planned  *replay.PassesReport `json:"planned"`
	Baseline *replay.PassesReport `json:"baseline"`
}

// replayPasses is replay --passes: the warm passes with planned steps on,
// then off as the baseline.
func replayPasses(w io.Writer, in *input, cfg allocator.Config, capacity uint64, opts replay.Options, f replayFlags) error {
	events, err := in.all()
	if err != nil {
		return err
	}
	on, off := cfg, cfg
	on.PlannedSteps, off.PlannedSteps = true, false
	var eopts []emulated.Option
	if opts.CostModel != nil {
		eopts = append(eopts, emulated.WithCostModel(*opts.CostModel))
	}
	planned, err := replay.WarmPasses(events, on, capacity, f.passes, eopts...)
	if err != nil {
		return fmt.Errorf("planned steps on: %w", err)
	}
	base, err := replay.WarmPasses(events, off, capacity, f.passes, eopts...)
	if err != nil {
		return fmt.Errorf("planned steps off: %w", err)
	}
	if f.asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(passesJSON{Input: in.name, Passes: f.passes, Planned: planned, Baseline: base})
	}
	fmt.Fprintf(w, "%s: %d warm passes, MarkStep after each\n\n", in.name, f.passes)
	fmt.Fprintf(w, "%-5s  %-9s  %14s  %14s  %9s  %8s  %10s  %9s  |  %14s  %9s  %8s  %10s  %9s\n",
		"pass", "state", "live peak", "reserved peak", "res/live", "drv", "drv time", "ns/call", "base reserved", "res/live", "drv", "drv time", "ns/call")
	for i, p := range planned.Passes {
		b := base.Passes[i]
		fmt.Fprintf(w, "%-5d  %-9s  %14d  %14d  %9.4f  %8d  %10s  %9.1f  |  %14d  %9.4f  %8d  %10s  %9.1f\n",
			p.Pass, p.State, p.PeakLiveBytes, p.PeakReservedBytes, ratioOf(p.PeakReservedBytes, p.PeakLiveBytes), p.DriverCalls, simDur(p.SimDriverNs), p.NsPerCall,
			b.PeakReservedBytes, ratioOf(b.PeakReservedBytes, b.PeakLiveBytes), b.DriverCalls, simDur(b.SimDriverNs), b.NsPerCall)
	}
	fmt.Fprintf(w, "\nsteady (last pass)     planned: reserved %d (%.4f × live), %d driver calls (%s simulated), %.1f ns/call\n",
		planned.SteadyPeakReservedBytes, planned.SteadyReservedOverLive, planned.SteadyDriverCalls, simDur(planned.SteadySimDriverNs), planned.SteadyNsPerCall)
	fmt.Fprintf(w, "                       baseline: reserved %d (%.4f × live), %d driver calls (%s simulated), %.1f ns/call\n",
		base.SteadyPeakReservedBytes, base.SteadyReservedOverLive, base.SteadyDriverCalls, simDur(base.SteadySimDriverNs), base.SteadyNsPerCall)
	fmt.Fprintf(w, "simulated driver time: cost profile %s\n", costName(opts))
	if planned.PlanBytes > 0 {
		fmt.Fprintf(w, "plan: %d blocks, %d bytes (region %d) for %d bytes of peak live planned blocks (%.4f×), %d divergences\n",
			planned.PlannedBlocks, planned.PlanBytes, planned.RegionBytes, planned.PlanPeakLiveBytes, planned.PlanOverPeakLive, planned.Divergences)
	} else {
		fmt.Fprintf(w, "plan: none (%d divergences)\n", planned.Divergences)
	}
	return nil
}
