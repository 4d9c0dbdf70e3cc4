package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/vmmalloc/vmmalloc/allocator"
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
	snapshot string // PyTorch memory snapshot output file
	entries  int    // history entries the snapshot keeps
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
	// PyTorch's own figures, for PyTorch snapshots.
	PyTorchPeakReserved     *uint64          `json:"pytorch_peak_reserved_bytes,omitempty"`
	PyTorchPeakLive         *uint64          `json:"pytorch_peak_live_bytes,omitempty"`
	PyTorchReservedOverLive *float64         `json:"pytorch_reserved_over_live,omitempty"`
	Stats                   map[string]int64 `json:"stats"`
	Compare                 []*replay.Report `json:"compare,omitempty"`
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
	fs.StringVar(&f.snapshot, "snapshot", "", "write a PyTorch memory snapshot of the replay (for pytorch.org/memory_viz) to `file`; a .html file opens the viewer")
	fs.IntVar(&f.entries, "snapshot-entries", replay.DefaultSnapshotEntries, "newest history entries the --snapshot keeps")
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
	if f.snapshot != "" && f.compare {
		return usagef("--snapshot records one replay; it cannot be combined with --compare")
	}
	cfg, err := allocator.ParseConfig(f.config)
	if err != nil {
		return usagef("--config: %w", err)
	}
	opts := replay.Options{Name: policyLabel(f.config, cfg), Config: cfg, Check: f.check}
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
	var reports []*replay.Report
	var rep *replay.Report
	if f.compare {
		events, err := in.all()
		if err != nil {
			return err
		}
		policies := replay.DefaultPolicies()
		if strings.TrimSpace(f.config) != "" {
			policies = append([]replay.Policy{{Name: "custom", Config: f.config}}, policies...)
		}
		copts := opts
		copts.MinCapacity = true
		for i, p := range policies {
			pb := newProgress(stderr, fmt.Sprintf("%s %d/%d %s", label, i+1, len(policies), p.Name), in.fraction)
			copts.Progress = pb.update
			if pb == nil {
				copts.Progress = nil
			}
			rs, err := replay.Compare(events, policies[i:i+1], copts)
			pb.done()
			if err != nil {
				return err
			}
			reports = append(reports, rs...)
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
		if err := writeSVG(f.svg, replay.ReportPlot(plotTitle(in, rep), rep, ref)); err != nil {
			return err
		}
	}
	if f.asJSON {
		return writeJSON(stdout, in, rep, reports, f)
	}
	return writeTextReport(stdout, in, rep, reports)
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
		pr, pl := pt.PeakReserved, pt.PeakLive
		out.PyTorchPeakReserved, out.PyTorchPeakLive = &pr, &pl
		if pl > 0 {
			r := float64(pr) / float64(pl)
			out.PyTorchReservedOverLive = &r
		}
	}
	for _, r := range reports {
		out.Compare = append(out.Compare, strip(r))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeTextReport(w io.Writer, in *input, rep *replay.Report, reports []*replay.Report) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "trace   %s (%s", in.name, in.format)
	if in.info.Source != "" {
		fmt.Fprintf(b, ", %s", in.info.Source)
	}
	fmt.Fprintf(b, ")\n")
	if pt := in.pytorch; pt != nil {
		fmt.Fprintf(b, "PyTorch recorded: peak reserved %s for %s peak live (%.4f×), %d segment allocs",
			replay.FormatBytes(pt.PeakReserved), replay.FormatBytes(pt.PeakLive),
			ratioOf(pt.PeakReserved, pt.PeakLive), pt.SegmentAllocs)
		if v, ok := pt.Settings["PYTORCH_CUDA_ALLOC_CONF"]; ok {
			fmt.Fprintf(b, ", PYTORCH_CUDA_ALLOC_CONF=%q", fmt.Sprint(v))
		}
		if es, ok := pt.Settings["expandable_segments"]; ok {
			fmt.Fprintf(b, ", expandable_segments=%v", es)
		}
		fmt.Fprintf(b, "\n")
		if pt.UnmatchedFrees > 0 {
			fmt.Fprintf(b, "        %d frees of blocks allocated before the trace began were skipped\n", pt.UnmatchedFrees)
		}
	}
	if rt := in.rmm; rt != nil && rt.Failures > 0 {
		fmt.Fprintf(b, "RMM log: %d allocation failures recorded (not replayed)\n", rt.Failures)
	}
	fmt.Fprintln(b)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(reports) > 0 {
		return replay.WriteTable(w, reports)
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
