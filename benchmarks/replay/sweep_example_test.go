package replay_test

import (
	"context"
	"fmt"
	"os"

	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// ExampleSweep replays two traces under two policies, four runs in
// parallel, and prints the Markdown table.
func ExampleSweep() {
	const mib = 1 << 20
	wide := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 50 * mib},
		{Kind: trace.Alloc, ID: 2, Size: 3 * mib},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Alloc, ID: 3, Size: 60 * mib},
		{Kind: trace.Free, ID: 2},
		{Kind: trace.Free, ID: 3},
	}
	traces := []replay.SweepTrace{{Name: "layers", Events: layers()}, {Name: "wide", Events: wide}}
	policies := []replay.Policy{
		{Name: "expandable", Config: ""},
		{Name: "classic", Config: "expandable_segments:False"},
	}
	runs, err := replay.Sweep(context.Background(), traces, policies, replay.SweepOptions{
		Options: replay.Options{MinCapacity: true},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// replay.WriteSweepCSV and replay.SweepPlot(title, runs).WriteSVG
	// write the same runs as CSV and as a plot.
	if err := replay.WriteSweepMarkdown(os.Stdout, runs); err != nil {
		fmt.Println(err)
	}
	// Output:
	// | trace | policy | config | peak live | peak reserved | reserved/live | min capacity | mincap/live | OOMs | driver calls | sim driver time |
	// |---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|
	// | layers | expandable | `defaults` | 90.00 MiB | 90.00 MiB | 1.0000 | 90.00 MiB | 1.0000 | 0 | 20 | 1.422ms |
	// | layers | classic | `expandable_segments:False` | 90.00 MiB | 90.00 MiB | 1.0000 | 90.00 MiB | 1.0000 | 0 | 15 | 773µs |
	// | wide | expandable | `defaults` | 63.00 MiB | 64.00 MiB | 1.0159 | 64.00 MiB | 1.0159 | 0 | 26 | 1.373ms |
	// | wide | classic | `expandable_segments:False` | 63.00 MiB | 130.00 MiB | 2.0635 | 80.00 MiB | 1.2698 | 0 | 15 | 783µs |
}
