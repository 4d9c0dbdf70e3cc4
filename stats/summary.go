package stats

import (
	"fmt"
	"strings"

	"github.com/dustin/go-humanize"
)

// Layout of the Summary table: every line is summaryWidth characters
// between and including its outer bars.
const (
	summaryWidth  = 80 // characters per line
	metricWidth   = 24 // first column: metric names
	valueWidth    = 10 // each value column
	driverLabelW2 = 23 // label of the second pair in the driver section
)

// summaryRow is one metric of the main section of Summary.
type summaryRow struct {
	label string
	bytes bool
	get   func(*DeviceStats) *StatArray
}

// summaryRows lists the StatArray rows in torch.cuda.memory_summary() order.
var summaryRows = [...]summaryRow{
	{"Allocated memory", true, func(d *DeviceStats) *StatArray { return &d.AllocatedBytes }},
	{"Active memory", true, func(d *DeviceStats) *StatArray { return &d.ActiveBytes }},
	{"Requested memory", true, func(d *DeviceStats) *StatArray { return &d.RequestedBytes }},
	{"Device reserved memory", true, func(d *DeviceStats) *StatArray { return &d.ReservedBytes }},
	{"Non-releasable memory", true, func(d *DeviceStats) *StatArray { return &d.InactiveSplitBytes }},
	{"Allocations", false, func(d *DeviceStats) *StatArray { return &d.Allocation }},
	{"Active allocs", false, func(d *DeviceStats) *StatArray { return &d.Active }},
	{"Device reserved segments", false, func(d *DeviceStats) *StatArray { return &d.Segment }},
	{"Non-releasable allocs", false, func(d *DeviceStats) *StatArray { return &d.InactiveSplit }},
}

// poolLabels are the sub-row labels of the pools Summary breaks out.
var poolLabels = [...]struct {
	pool  PoolKind
	label string
}{
	{LargePool, "      from large pool"},
	{SmallPool, "      from small pool"},
}

// Summary renders d as a fixed-width text table in the manner of
// torch.cuda.memory_summary(): a header naming the device, a line with the
// OOM and retry counts, then for each quantity its current value, peak,
// total allocated and total freed, and a section of driver counters.
//
// Rows are Allocated, Active, Requested, Device reserved and Non-releasable
// (inactive split) memory in bytes, then Allocations, Active allocs, Device
// reserved segments and Non-releasable allocs as counts; each is followed by
// "from large pool" and "from small pool" sub-rows unless abbreviated is
// true. Oversize allocations and Oversize segments follow. The driver
// section shows maps (num_device_alloc), unmaps (num_device_free), handles
// created, freed and reused, stream syncs, all-stream syncs and the
// max_split_size setting, and, when handles are shared with other
// processes, how many and the bytes only exporters still hold.
//
// Byte values are humanised in IEC units by go-humanize ("20 MiB",
// "1.5 KiB"); counts are plain integers. Lines are 80 characters wide
// (wider only if a value does not fit its column) and each ends in a
// newline. A nil d reads as a zero DeviceStats.
func Summary(d *DeviceStats, device int, abbreviated bool) string {
	if d == nil {
		d = &DeviceStats{}
	}
	var b strings.Builder
	heavy := "|" + strings.Repeat("=", summaryWidth-2) + "|\n"
	light := "|" + strings.Repeat("-", summaryWidth-2) + "|\n"

	b.WriteString(heavy)
	fmt.Fprintf(&b, "| %s |\n", center(fmt.Sprintf("vmmalloc memory summary, device ID %d", device), summaryWidth-4))
	b.WriteString(light)
	// Two cells sharing summaryWidth-7 characters between "| ", " | " and " |".
	left := (summaryWidth - 7) / 2
	fmt.Fprintf(&b, "| %s | %s |\n",
		center(fmt.Sprintf("Device OOMs: %d", d.NumOOMs), left),
		center(fmt.Sprintf("Alloc retries: %d", d.NumAllocRetries), summaryWidth-7-left))
	b.WriteString(heavy)
	fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n",
		center("Metric", metricWidth), center("Cur Usage", valueWidth), center("Peak Usage", valueWidth),
		center("Tot Alloc", valueWidth), center("Tot Freed", valueWidth))

	for _, r := range summaryRows {
		b.WriteString(light)
		arr := r.get(d)
		writeStatRow(&b, r.label, &arr[AllPools], r.bytes)
		if abbreviated {
			continue
		}
		for _, p := range poolLabels {
			writeStatRow(&b, p.label, &arr[p.pool], r.bytes)
		}
	}
	b.WriteString(light)
	writeStatRow(&b, "Oversize allocations", &d.OversizeAllocations, false)
	b.WriteString(light)
	writeStatRow(&b, "Oversize segments", &d.OversizeSegments, false)

	b.WriteString(heavy)
	fmt.Fprintf(&b, "| %s |\n", center("Driver operations", summaryWidth-4))
	b.WriteString(light)
	maxSplit := "unlimited"
	if d.MaxSplitSize != 0 {
		maxSplit = formatBytes(d.MaxSplitSize)
	}
	pairs := [...][4]string{
		{"Device maps", itoa(d.NumDeviceAlloc), "Device unmaps", itoa(d.NumDeviceFree)},
		{"Handles created", itoa(d.HandlesCreated), "Handles freed", itoa(d.HandlesFreed)},
		{"Handles reused", itoa(d.HandlesReused), "Stream syncs", itoa(d.NumStreamSyncs)},
		{"All-stream syncs", itoa(d.NumSyncAllStreams), "Max split size", maxSplit},
	}
	rows := pairs[:]
	if d.ExportedHandles != 0 || d.ExporterHeldBytes != 0 {
		rows = append(rows, [4]string{"Exported handles", itoa(d.ExportedHandles), "Held by exporters", formatBytes(d.ExporterHeldBytes)})
	}
	for _, p := range rows {
		fmt.Fprintf(&b, "| %-*s | %*s | %-*s | %*s |\n",
			metricWidth, p[0], valueWidth, p[1], driverLabelW2, p[2], valueWidth, p[3])
	}
	b.WriteString(heavy)
	return b.String()
}

// writeStatRow writes one "| label | cur | peak | alloc | freed |" line.
func writeStatRow(b *strings.Builder, label string, s *Stat, bytes bool) {
	f := itoa
	if bytes {
		f = formatBytes
	}
	fmt.Fprintf(b, "| %-*s | %*s | %*s | %*s | %*s |\n", metricWidth, label,
		valueWidth, f(s.Current), valueWidth, f(s.Peak),
		valueWidth, f(s.Allocated), valueWidth, f(s.Freed))
}

// formatBytes humanises a byte count in IEC units; a negative count (a
// bookkeeping bug upstream, but possible) keeps its sign.
func formatBytes(v int64) string {
	if v < 0 {
		// uint64(-v) is the right magnitude even for math.MinInt64.
		return "-" + humanize.IBytes(uint64(-v))
	}
	return humanize.IBytes(uint64(v))
}

// center pads s with spaces to width w, the extra space (if any) on the
// right. A string longer than w is returned unchanged.
func center(s string, w int) string {
	n := len(s)
	if n >= w {
		return s
	}
	l := (w - n) / 2
	return strings.Repeat(" ", l) + s + strings.Repeat(" ", w-n-l)
}
