// Package plan packs the blocks of a repeating step into one region. It is
// the mechanism under planned steps: the allocator records a step's calls,
// turns each block born and freed within the step into an Interval (its
// size, and the call indices of its Malloc and its Free), asks Pack for an
// offset per block once, and serves every later step from the plan at
// base+offset. Verify checks a plan; PeakLive bounds it from below.
//
// # The problem
//
// Given intervals (size, birth, death), choose offsets so that no two
// intervals live at the same instant share an address, minimising the
// region's size: the largest offset plus size. Lifetimes are half-open,
// [Birth, Death), so a block born at the index where another dies may take
// its memory. This is the dynamic storage allocation problem (Garey
// and Johnson's SR2), NP-hard in general. Its lower bound is PeakLive, the
// most bytes live at any instant; no packing is smaller, and some inputs
// admit no packing that small. Every size is first rounded up to align,
// and every offset is a multiple of it.
//
// # The algorithm
//
// A pass places the intervals one at a time, in a given order, each at
// the lowest offset where it overlaps none of the placed intervals live
// at the same time (first fit over time and address; compare the
// greedy-by-size planners of TFLite's arena and XLA's heap simulator).
// Lowest fit loses nothing in itself: moving the blocks of any packing
// down, one at a time in order of offset, each as low as it fits, gives
// the lowest-fit packing of that order, and it is no larger; so the search
// is over orders. Pack tries four:
//
//   - decreasing size, ties to the longer lifetime (greedy by size);
//   - decreasing lifetime, ties to the larger;
//   - decreasing area, size × lifetime;
//   - decreasing contention, the most bytes live at any instant of the
//     interval's lifetime (an interval of the peak instant is placed
//     before those of quieter ones, in the spirit of TelaMalloc's
//     contention-driven choices: the most constrained blocks go first).
//
// It stops at the first packing that reaches PeakLive, which is then
// optimal. Otherwise it improves the best by local search over orders:
// a culprit is an interval that ends above PeakLive; the first culprit
// whose move helps is moved earlier in the order (halfway to the front, a
// quarter of the way, then to the front), and the first packing no larger
// than the best replaces it. A pass whose size exceeds the best so far is
// abandoned as soon as it does.
//
// # The index
//
// Finding the lowest fit must not cost a scan of every placed interval.
// Time is compressed to one slot per distinct birth, and a segment tree
// over the slots holds, per node, two sets of address spans, each sorted
// and coalesced (adjacent or overlapping spans merge, so a densely packed
// stack is one span however many blocks it holds): cover, the spans of the
// intervals whose canonical cover includes the node, and sub, the union of
// cover over the node's subtree. The addresses held at some instant of a
// lifetime are the union of sub over the lifetime's O(log T) canonical
// nodes and cover over their ancestors. The lowest fit is found by
// leapfrogging cursors over those sets: each pushes the candidate offset
// past its spans in the way until none does. Placing an interval adds its
// span to O(log T) sets.
//
// # Cost
//
// n intervals, T <= n slots. Setting up costs O(n log n). A query costs
// O(log T) to gather its sets plus a step per set and per span it passes
// below the answer; a placement costs O(log T) insertions, each O(log m)
// plus a move of the m spans of a set. In the worst case (a fragmented
// layout where many gaps are too small) a query passes O(k) spans, k the
// intervals overlapping it in time: O(n·k·log T) a pass. On training and
// inference steps, whose layouts stay dense, it passes a few spans a
// query: a step of 50,000 blocks plans in well under a second.
// Memory is O(n log T) spans at worst (each interval's span in O(log T)
// sets), far less on dense layouts where spans coalesce.
// The first order is always packed in full; the other orders and the
// local search stop when their work (tree nodes visited and cursor steps,
// counted, so the result never depends on timing) exceeds a fixed budget
// of 2^24 units (a few tenths of a second), after 64 local-search passes,
// or after 16 kept packings in a row that were no smaller.
//
// # Guarantees
//
//   - Every packing returned passes Verify: aligned, inside the region,
//     no two intervals live at once overlapping in address. The size is
//     the highest end and at least PeakLive.
//   - Pack is deterministic: the same intervals and alignment give the
//     same offsets (ties in every order go to the lower index).
//   - Bad input (a zero size, Birth >= Death, align not a power of two, a
//     size that rounds up past 2^64, more than 2^31-1 intervals) yields an *IntervalError or a wrapped
//     sentinel from Validate; a packing whose end would pass 2^64 under
//     every order tried yields ErrOverflow. Nothing panics, and the
//     intervals given are never modified.
//   - Quality is measured, not promised: the tests hold Pack within 1.25×
//     of the optimum on random inputs of up to eight intervals (found by
//     exhaustive search) and optimal on at least 97% of them, and at
//     PeakLive on synthetic training steps; the benchmarks in
//     package benchmarks report the size against PeakLive on the shared
//     PyTorch traces.
package plan
