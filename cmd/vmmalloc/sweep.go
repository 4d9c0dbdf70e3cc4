package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

// policyFlags collects repeated --policy name=config flags.
type policyFlags []replay.Policy

func (p *policyFlags) String() string {
	var s []string
	for _, x := range *p {
		s = append(s, x.Name+"="+x.Config)
	}
	return strings.Join(s, " ")
}

func (p *policyFlags) Set(v string) error {
	name, cfg, ok := strings.Cut(v, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fmt.Errorf("want name=config, e.g. classic=expandable_segments:False")
	}
	for _, x := range *p {
		if x.Name == name {
			return fmt.Errorf("policy %q given twice", name)
		}
	}
	*p = append(*p, replay.Policy{Name: name, Config: strings.TrimSpace(cfg)})
	return nil
}

func cmdSweep(args []string, stdout, stderr io.Writer) error {
	var policies policyFlags
	fs := newFlagSet("sweep", "[flags] trace...", stdout)
	fs.Var(&policies, "policy", "a policy to replay, `name=config` (repeatable; default: the --compare set, plus \"custom\" from $VMMALLOC_CONF)")
	capacity := fs.String("capacity", "", "emulated device memory `size` of the plain replay (default 80GiB); the capacity search starts there")
	parallel := fs.Int("parallel", 0, "runs at once (default GOMAXPROCS)")
	out := fs.String("o", "sweep", "output `prefix`: writes prefix.md, prefix.csv and prefix.svg")
	format := fs.String("format", fmtAuto, "input format of every trace: auto, binary, text, pytorch or rmm")
	device := fs.Int("device", 0, "device index of PyTorch snapshots")
	strict := fs.Bool("strict", false, "fail when a trace frees unknown blocks or allocates blocks already live")
	costProfile := fs.String("cost-profile", emulated.DefaultCostProfile, "driver cost profile of the simulated driver time: "+costProfileChoices+", or a profile `file`")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("want at least one trace")
	}
	if n := slices.Index(pos, "-"); n >= 0 && slices.Index(pos[n+1:], "-") >= 0 {
		return usagef("standard input (-) can be read only once")
	}
	if *parallel < 0 {
		return usagef("--parallel %d: want ≥ 0", *parallel)
	}
	if *device < 0 {
		return usagef("--device %d: want ≥ 0", *device)
	}
	if strings.TrimSpace(*out) == "" {
		return usagef("-o: want a file name prefix")
	}
	inFmt, err := parseFormat(*format)
	if err != nil {
		return usageError{err}
	}
	_, envConf, err := cliConfig("")
	if err != nil {
		return err
	}
	if len(policies) == 0 {
		policies = replay.DefaultPolicies()
		if envConf != "" {
			policies = append([]replay.Policy{{Name: "custom", Config: envConf}}, policies...)
		}
	}
	for _, p := range policies {
		if _, err := allocator.ParseConfig(p.Config); err != nil {
			return usagef("--policy %s: %w%s", p.Name, err, keysHint(err))
		}
	}
	opts := replay.Options{MinCapacity: true}
	if err := setCostProfile(&opts, *costProfile); err != nil {
		return err
	}
	if *capacity != "" {
		c, err := humanize.ParseBytes(*capacity)
		if err != nil || c == 0 || c > replay.MaxSearchCapacity {
			return usagef("--capacity %q: want a positive size up to %s, such as 80GiB", *capacity, replay.FormatBytes(replay.MaxSearchCapacity))
		}
		opts.Capacity = c
	}

	traces, unmatched, err := loadTraces(pos, inFmt, *device)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "sweeping %d traces × %d policies\n", len(traces), len(policies))
	// Ctrl-C cancels the runs in flight (through the context each replay
	// checks) instead of killing the process mid-write.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	runs, err := runSweep(ctx, traces, policies, replay.SweepOptions{Options: opts, Parallel: *parallel},
		newSweepBoard(stderr, isTerminal(stderr), time.Now))
	if err != nil {
		return err
	}
	// The trace's own inconsistencies are the same under every policy:
	// read them from each trace's first run.
	for ti, tr := range traces {
		rep := runs[ti*len(policies)].Report
		issues := issuesOf(rep, nil)
		issues.unknownFrees += unmatched[ti]
		if *strict {
			if err := issues.check(); err != nil {
				return fmt.Errorf("trace %s: %w", tr.Name, err)
			}
		}
		issues.warn(stderr, "vmmalloc sweep: "+tr.Name)
	}
	for _, r := range runs {
		if r.Report.OOMs > 0 {
			fmt.Fprintf(stderr, "vmmalloc sweep: warning: %s × %s\n", r.Trace, oomMessage(r.Report))
		}
	}
	if err := replay.WriteSweepMarkdown(stdout, runs); err != nil {
		return err
	}
	title := fmt.Sprintf("%d traces × %d policies: min capacity against driver calls", len(traces), len(policies))
	if len(traces) == 1 {
		title = traces[0].Name + ": min capacity against driver calls"
	}
	files := []struct {
		path  string
		write func(io.Writer) error
	}{
		{*out + ".md", func(w io.Writer) error { return replay.WriteSweepMarkdown(w, runs) }},
		{*out + ".csv", func(w io.Writer) error { return replay.WriteSweepCSV(w, runs) }},
		{*out + ".svg", replay.SweepPlot(title, runs).WriteSVG},
	}
	for _, f := range files {
		if err := writeFile(f.path, f.write); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "wrote %s.md, %s.csv and %s.svg\n", *out, *out, *out)
	return nil
}

// runSweep runs the sweep reporting to board (a bar per run in flight on a
// terminal, a line per finished run), and erases the board before it
// returns, whether the sweep ended, failed or was cancelled.
func runSweep(ctx context.Context, traces []replay.SweepTrace, policies []replay.Policy, o replay.SweepOptions, board *sweepBoard) ([]replay.SweepRun, error) {
	o.OnProgress, o.OnDone = board.progress, board.finish
	stopTicks := board.ticks(progressInterval)
	defer board.close()
	defer stopTicks()
	return replay.Sweep(ctx, traces, policies, o)
}

// loadTraces reads every trace whole and names each by its header name or
// file name (numbering repeats). unmatched[i] counts the frees the
// PyTorch importer dropped from trace i (blocks allocated before
// recording began).
func loadTraces(paths []string, format string, device int) (traces []replay.SweepTrace, unmatched []int64, err error) {
	seen := map[string]int{}
	for _, path := range paths {
		in, err := openInput(path, format, device, os.Stdin)
		if err != nil {
			return nil, nil, err
		}
		events, err := in.all()
		_ = in.Close()
		if err != nil {
			return nil, nil, err
		}
		name := in.info.Name
		if name == "" {
			name = path
		}
		for n, base := 2, name; seen[name] > 0; n++ {
			name = fmt.Sprintf("%s#%d", base, n) // "a#2" given as a name included
		}
		seen[name]++
		var u int64
		if in.pytorch != nil {
			u = int64(in.pytorch.UnmatchedFrees)
		}
		traces = append(traces, replay.SweepTrace{Name: name, Events: events})
		unmatched = append(unmatched, u)
	}
	return traces, unmatched, nil
}

// runLine is the progress line of a run, the done-th to finish.
func runLine(r replay.SweepRun, done int) string {
	rep := r.Report
	return fmt.Sprintf("[%d/%d] %s × %s: min capacity %s (%.4f× peak live %s), %s driver calls (%s simulated), %s",
		done, r.Total, r.Trace, r.Policy.Name, replay.FormatBytes(rep.MinCapacity), rep.MinCapacityOverLive,
		replay.FormatBytes(rep.PeakLive), replay.FormatCount(rep.DriverCallsTotal), rep.SimDriverTime.Round(time.Microsecond),
		r.Wall.Round(time.Millisecond))
}

// writeFile creates path and writes it with write, removing it on error.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
