package host

import (
	"fmt"
	"strings"
)

// Summary renders the statistics as a table, the host side of the device
// allocator's Summary (PyTorch's memory_summary): current, peak, allocated
// and freed totals of each statistic, then the counters and the pin
// budget.
func (a *Allocator) Summary() string {
	st := a.Stats()
	policy := "size classes"
	if a.cfg.ExpandableSegments {
		policy = "expandable segments"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "pinned host memory (%s)\n", policy)
	fmt.Fprintf(&sb, "%-22s %16s %16s %16s %16s\n", "metric", "current", "peak", "allocated", "freed")
	names := []string{"allocations", "allocated bytes", "requested bytes", "active", "active bytes",
		"segments (pinned)", "pinned bytes", "registrations", "registered bytes", "quarantined", "quarantined bytes",
		"pageable", "pageable bytes"}
	for i, s := range st.stats() {
		fmt.Fprintf(&sb, "%-22s %16d %16d %16d %16d\n", names[i], s.Current, s.Peak, s.Allocated, s.Freed)
	}
	fmt.Fprintf(&sb, "cache hits %d, pins %d, unpins %d, events created %d, recorded %d, sync fallbacks %d, device syncs %d, OOMs %d\n",
		st.CacheHits, st.NumHostAlloc, st.NumHostFree, st.NumEventsCreate, st.NumEventRecords, st.NumSyncFallback, st.NumDeviceSyncs, st.NumOOMs)
	limit := "unlimited"
	if st.Budget.Limit != 0 {
		limit = fmt.Sprintf("%d bytes", st.Budget.Limit)
	}
	fmt.Fprintf(&sb, "pin budget: %d bytes pinned, limit %s, %d denials (%d here), %d pageable fallbacks\n",
		st.Budget.Pinned, limit, st.Budget.Denials, st.NumBudgetDenials, st.NumPageableFallbacks)
	return sb.String()
}
