package stats

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
)

// SegmentTable renders the segments of s as a fixed-width text table, one
// line per segment sorted by device then address, followed by a totals
// line:
//
//	Address             Device  Pool            Total     Mapped  Allocated  Blocks  Expandable
//	0x7f0000000000           0  large_pool     90 GiB     40 MiB     20 MiB       3  yes
//	Total (1)                                  90 GiB     40 MiB     20 MiB       3
//
// Sizes are humanised in IEC units. The table of an empty snapshot has
// only the header and a zero totals line. s is not modified.
func SegmentTable(s Snapshot) string {
	segs := slices.Clone(s.Segments)
	slices.SortStableFunc(segs, func(a, b SegmentInfo) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Address, b.Address))
	})
	var b strings.Builder
	line := func(args ...any) {
		b.WriteString(strings.TrimRight(fmt.Sprintf("%-18s %7s  %-10s %10s %10s %10s %7s  %s", args...), " "))
		b.WriteByte('\n')
	}
	line("Address", "Device", "Pool", "Total", "Mapped", "Allocated", "Blocks", "Expandable")
	var total, mapped, allocated uint64
	var blocks int
	for _, g := range segs {
		exp := "no"
		if g.IsExpandable {
			exp = "yes"
		}
		line(fmt.Sprintf("%#x", g.Address), itoa(int64(g.Device)), g.Pool.String(),
			humanize.IBytes(g.TotalSize), humanize.IBytes(g.MappedSize), humanize.IBytes(g.AllocatedSize),
			itoa(int64(len(g.Blocks))), exp)
		total += g.TotalSize
		mapped += g.MappedSize
		allocated += g.AllocatedSize
		blocks += len(g.Blocks)
	}
	line(fmt.Sprintf("Total (%d)", len(segs)), "", "",
		humanize.IBytes(total), humanize.IBytes(mapped), humanize.IBytes(allocated), itoa(int64(blocks)), "")
	return b.String()
}
