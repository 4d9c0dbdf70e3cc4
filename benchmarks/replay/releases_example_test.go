package replay_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// ExampleOptions_ignoreReleases replays a two-stream trace whose program
// released the cache between the streams' work (as a PyTorch snapshot's
// segment frees record) with PyTorch's classic algorithm, honouring the
// release and ignoring it.
func ExampleOptions_ignoreReleases() {
	const mib = 1 << 20
	events := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 100 * mib, Stream: 1},
		{Kind: trace.Free, ID: 1, Stream: 1},
		{Kind: trace.EmptyCache},
		{Kind: trace.Alloc, ID: 2, Size: 100 * mib, Stream: 2},
		{Kind: trace.Free, ID: 2, Stream: 2},
	}
	cfg, _ := allocator.ParseConfig("expandable_segments:False")
	for _, ignore := range []bool{false, true} {
		rep, err := replay.Run(trace.NewSliceReader(events), replay.Options{Config: cfg, IgnoreReleases: ignore})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("ignore %v: peak reserved %s, %d applied, %d ignored\n",
			ignore, replay.FormatBytes(rep.PeakReserved), rep.ReleasesApplied, rep.ReleasesIgnored)
	}
	// Output:
	// ignore false: peak reserved 100.00 MiB, 1 applied, 0 ignored
	// ignore true: peak reserved 200.00 MiB, 0 applied, 1 ignored
}
