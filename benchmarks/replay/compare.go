package replay

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
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
		{Name: "expandable-page2M", Config: "large_segment_size_mb:2,expandable_handle_mb:0"},
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
//
// Compare is a one-trace Sweep that runs one policy at a time.
func Compare(events []trace.Event, policies []Policy, opts Options) ([]*Report, error) {
	return CompareContext(context.Background(), events, policies, opts)
}

// CompareContext is Compare under ctx.
func CompareContext(ctx context.Context, events []trace.Event, policies []Policy, opts Options) ([]*Report, error) {
	runs, err := Sweep(ctx, []SweepTrace{{Events: events}}, policies, SweepOptions{Options: opts, Parallel: 1})
	if err != nil {
		return nil, err
	}
	reps := make([]*Report, len(runs))
	for i, r := range runs {
		reps[i] = r.Report
	}
	return reps, nil
}

// FormatBytes renders n bytes in binary units with two decimals
// ("38.34 GiB"), as PyTorch's memory_summary does; below 1 KiB it gives
// the plain count ("512 B").
func FormatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, u := float64(n)/1024, 0
	for v >= 1024-0.005 && u < len(units)-1 {
		v /= 1024
		u++
	}
	return fmt.Sprintf("%.2f %ciB", v, units[u])
}

// FormatCount renders a count with thousands separators ("70,726").
func FormatCount(n int64) string { return humanize.Comma(n) }

// WritePolicies writes which config each policy name stands for, one
// line per policy ("  classic  = expandable_segments:False").
func WritePolicies(w io.Writer, policies []Policy) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, p := range policies {
		fmt.Fprintf(tw, "  %s\t= %s\n", p.Name, PolicyConfig(p))
	}
	return tw.Flush()
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			name, FormatBytes(r.PeakLive), FormatBytes(r.PeakReserved), r.ReservedOverLive,
			mc, mcr, FormatCount(r.OOMs), FormatCount(r.DriverCallsTotal), r.SimDriverTime.Round(time.Microsecond), formatRate(r.EventsPerSec))
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
	c := FormatCount
	fmt.Fprintf(b, "  events            %s (%s alloc, %s free, %s record, %s sync, %s empty_cache)%s\n",
		c(r.Events), c(r.Allocs), c(r.Frees), c(r.RecordStreams), c(r.StreamSyncs), c(r.EmptyCaches), incomplete(r))
	fmt.Fprintf(b, "  peak live         %s\n", FormatBytes(r.PeakLive))
	fmt.Fprintf(b, "  peak allocated    %s\n", FormatBytes(r.PeakAllocated))
	fmt.Fprintf(b, "  peak reserved     %s  (%.4f × peak live)\n", FormatBytes(r.PeakReserved), r.ReservedOverLive)
	if r.MinCapacity != 0 {
		fmt.Fprintf(b, "  min capacity      %s  (%.4f × peak live)\n", FormatBytes(r.MinCapacity), r.MinCapacityOverLive)
	}
	fmt.Fprintf(b, "  at end            %s reserved, %s allocated, largest free block %s\n",
		FormatBytes(r.EndReserved), FormatBytes(r.EndAllocated), FormatBytes(r.LargestFreeBlock))
	fmt.Fprintf(b, "  fragmentation     mean %.4f, max %.4f (1 − allocated/reserved over %s samples)\n",
		r.MeanFragmentation, r.MaxFragmentation, c(int64(len(r.Samples))))
	fmt.Fprintf(b, "  OOMs              %s (retries %s)\n", c(r.OOMs), c(r.AllocRetries))
	if len(r.Pools) > 0 {
		fmt.Fprintf(b, "  pools             %d (peak live, peak allocated, peak reserved; at end reserved)\n", len(r.Pools))
		for _, p := range r.Pools {
			fmt.Fprintf(b, "    %-16s %s allocs: %s live, %s allocated, %s reserved (%.4f×); %s reserved at end",
				p.Pool, c(p.Allocs), FormatBytes(p.PeakLive), FormatBytes(p.PeakAllocated), FormatBytes(p.PeakReserved),
				p.ReservedOverLive, FormatBytes(p.EndReserved))
			if p.OOMs > 0 {
				fmt.Fprintf(b, ", %s OOMs", c(p.OOMs))
			}
			b.WriteString("\n")
		}
	}
	if n := r.SkippedFrees + r.FailedFrees + r.SkippedRecords + r.DuplicateAllocs + r.ZeroAllocs; n > 0 {
		fmt.Fprintf(b, "  skipped           %s unknown frees, %s frees of failed allocs, %s records, %s duplicate allocs, %s zero-byte allocs\n",
			c(r.SkippedFrees), c(r.FailedFrees), c(r.SkippedRecords), c(r.DuplicateAllocs), c(r.ZeroAllocs))
	}
	profile := ""
	if r.CostProfile != "" {
		profile = " (cost profile " + r.CostProfile + ")"
	}
	fmt.Fprintf(b, "  driver calls      %s, simulated driver time %s%s\n", c(r.DriverCallsTotal), r.SimDriverTime.Round(time.Microsecond), profile)
	for _, name := range sortedKeys(r.DriverCalls) {
		fmt.Fprintf(b, "    %-36s %12s  %12s\n", name, c(r.DriverCalls[name]), r.SimDriverTimes[name].Round(time.Microsecond))
	}
	fmt.Fprintf(b, "  replay            %s, %s events/s\n", r.Wall.Round(time.Microsecond), formatRate(r.EventsPerSec))
	_, err := io.WriteString(w, b.String())
	return err
}

func incomplete(r *Report) string {
	if r.Complete {
		return ""
	}
	return " — stopped at the first OOM (event " + FormatCount(r.FirstOOMEvent) + ")"
}

func sortedKeys(m map[string]int64) []string { return slices.Sorted(maps.Keys(m)) }
