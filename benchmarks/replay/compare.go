package replay

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// Policy is a named allocator configuration to compare.
type Policy struct {
	Name   string // label in reports and tables
	Config string // allocator config string (allocator.ParseConfig)
}

// DefaultPolicies is the policy set Compare is usually run with:
// expandable segments (the default), PyTorch's classic algorithm, the
// expandable large pool with 2 MiB and 64 MiB pages instead of 20 MiB,
// classic with max_split_size_mb:128, and expandable releasing cached
// memory above 256 MiB at every stream synchronisation.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: "expandable", Config: ""},
		{Name: "classic", Config: "expandable_segments:False"},
		{Name: "expandable-page2M", Config: "large_segment_size_mb:2"},
		{Name: "expandable-page64M", Config: "large_segment_size_mb:64"},
		{Name: "classic-split128", Config: "expandable_segments:False,max_split_size_mb:128"},
		{Name: "expandable-release256", Config: "release_threshold_mb:256"},
	}
}

// Compare replays events once per policy (in order, one at a time, so that
// events per second are comparable) with opts, each with its policy's
// config and name, and, when opts.MinCapacity is set, searches each
// policy's minimum capacity too. A policy whose config does not parse
// yields ErrInvalidOptions naming it; nothing is replayed then.
func Compare(events []trace.Event, policies []Policy, opts Options) ([]*Report, error) {
	if len(policies) == 0 {
		return nil, fmt.Errorf("%w: no policies", ErrInvalidOptions)
	}
	cfgs := make([]allocator.Config, len(policies))
	for i, p := range policies {
		cfg, err := allocator.ParseConfig(p.Config)
		if err != nil {
			return nil, fmt.Errorf("%w: policy %q: %w", ErrInvalidOptions, p.Name, err)
		}
		cfgs[i] = cfg
	}
	reps := make([]*Report, 0, len(policies))
	for i, p := range policies {
		o := opts
		o.Name = p.Name
		o.Config = cfgs[i]
		rep, err := Run(trace.NewSliceReader(events), o)
		if err != nil {
			return nil, fmt.Errorf("replay: policy %q: %w", p.Name, err)
		}
		if opts.MinCapacity {
			res, err := SearchMinCapacity(events, cfgs[i], o)
			if err != nil {
				return nil, fmt.Errorf("replay: policy %q: %w", p.Name, err)
			}
			rep.MinCapacity = res.Capacity
			rep.MinCapacityOverLive = res.OverLive
		}
		reps = append(reps, rep)
	}
	return reps, nil
}

// FormatBytes renders n bytes with an SI unit and two decimals
// ("41.17 GB"), as the study figures are quoted.
func FormatBytes(n uint64) string {
	v, unit := humanize.ComputeSI(float64(n))
	if unit == "" {
		return strconv.FormatUint(n, 10) + " B"
	}
	return fmt.Sprintf("%.2f %sB", v, unit)
}

// formatRate renders a count per second with an SI unit ("5.21 M").
func formatRate(v float64) string {
	x, unit := humanize.ComputeSI(v)
	return strings.TrimSpace(fmt.Sprintf("%.2f %s", x, unit))
}

// WriteTable writes reports as an aligned text table, one row per report:
// policy, peak live, peak reserved, reserved/live, minimum capacity and
// its ratio to live ("-" when not searched), out-of-memory errors, driver
// calls, simulated driver time and replay speed.
func WriteTable(w io.Writer, reports []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tpeak live\tpeak reserved\treserved/live\tmin capacity\tmincap/live\tOOMs\tdriver calls\tsim driver time\tevents/s\t")
	for _, r := range reports {
		mc, mcr := "-", "-"
		if r.MinCapacity != 0 {
			mc, mcr = FormatBytes(r.MinCapacity), fmt.Sprintf("%.4f", r.MinCapacityOverLive)
		}
		name := r.Policy
		if name == "" {
			name = r.Config
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%s\t%s\t%d\t%d\t%s\t%s\t\n",
			name, FormatBytes(r.PeakLive), FormatBytes(r.PeakReserved), r.ReservedOverLive,
			mc, mcr, r.OOMs, r.DriverCallsTotal, r.SimDriverTime.Round(time.Microsecond), formatRate(r.EventsPerSec))
	}
	return tw.Flush()
}

// WriteText writes one report as a human-readable block: counts, peaks
// and ratios with humanised sizes, fragmentation, driver calls by
// primitive and speed.
func WriteText(w io.Writer, r *Report) error {
	b := &strings.Builder{}
	title := r.Policy
	if title == "" {
		title = "replay"
	}
	fmt.Fprintf(b, "%s (%s) on a %s device\n", title, r.Config, FormatBytes(r.Capacity))
	fmt.Fprintf(b, "  events            %d (%d alloc, %d free, %d record, %d sync, %d empty_cache)%s\n",
		r.Events, r.Allocs, r.Frees, r.RecordStreams, r.StreamSyncs, r.EmptyCaches, incomplete(r))
	fmt.Fprintf(b, "  peak live         %s\n", FormatBytes(r.PeakLive))
	fmt.Fprintf(b, "  peak allocated    %s\n", FormatBytes(r.PeakAllocated))
	fmt.Fprintf(b, "  peak reserved     %s  (%.4f × peak live)\n", FormatBytes(r.PeakReserved), r.ReservedOverLive)
	if r.MinCapacity != 0 {
		fmt.Fprintf(b, "  min capacity      %s  (%.4f × peak live)\n", FormatBytes(r.MinCapacity), r.MinCapacityOverLive)
	}
	fmt.Fprintf(b, "  at end            %s reserved, %s allocated, largest free block %s\n",
		FormatBytes(r.EndReserved), FormatBytes(r.EndAllocated), FormatBytes(r.LargestFreeBlock))
	fmt.Fprintf(b, "  fragmentation     mean %.4f, max %.4f (1 − allocated/reserved over %d samples)\n",
		r.MeanFragmentation, r.MaxFragmentation, len(r.Samples))
	fmt.Fprintf(b, "  OOMs              %d (retries %d)\n", r.OOMs, r.AllocRetries)
	if n := r.SkippedFrees + r.FailedFrees + r.SkippedRecords + r.DuplicateAllocs + r.ZeroAllocs; n > 0 {
		fmt.Fprintf(b, "  skipped           %d unknown frees, %d frees of failed allocs, %d records, %d duplicate allocs, %d zero-byte allocs\n",
			r.SkippedFrees, r.FailedFrees, r.SkippedRecords, r.DuplicateAllocs, r.ZeroAllocs)
	}
	fmt.Fprintf(b, "  driver calls      %d, simulated driver time %s\n", r.DriverCallsTotal, r.SimDriverTime.Round(time.Microsecond))
	for _, name := range sortedKeys(r.DriverCalls) {
		fmt.Fprintf(b, "    %-36s %d\n", name, r.DriverCalls[name])
	}
	fmt.Fprintf(b, "  replay            %s, %s events/s\n", r.Wall.Round(time.Microsecond), formatRate(r.EventsPerSec))
	_, err := io.WriteString(w, b.String())
	return err
}

func incomplete(r *Report) string {
	if r.Complete {
		return ""
	}
	return fmt.Sprintf(" — stopped at the first OOM (event %d)", r.FirstOOMEvent)
}

func sortedKeys(m map[string]int64) []string { return slices.Sorted(maps.Keys(m)) }
