package replay_test

import (
	"context"
	"fmt"

	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

// ExampleSweepProgress follows the runs of a sweep as they go: the calls
// come one at a time (here the runs too, Parallel 1, so the order is
// fixed), each run's OnProgress calls before its OnDone.
func ExampleSweepProgress() {
	traces := []replay.SweepTrace{{Name: "layers", Events: layers()}}
	policies := []replay.Policy{{Name: "expandable"}, {Name: "classic", Config: "expandable_segments:False"}}
	_, err := replay.Sweep(context.Background(), traces, policies, replay.SweepOptions{
		Options:  replay.Options{MinCapacity: true},
		Parallel: 1,
		OnProgress: func(p replay.SweepProgress) {
			fmt.Printf("run %d/%d %s × %s: %s, %d of %d events\n", p.Index+1, p.Total, p.Trace, p.Policy, p.Stage, p.Events, p.EventsTotal)
		},
		OnDone: func(r replay.SweepRun) { fmt.Printf("run %d/%d done\n", r.Index+1, r.Total) },
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// run 1/2 layers × expandable: replay, 0 of 6 events
	// run 1/2 layers × expandable: replay, 6 of 6 events
	// run 1/2 layers × expandable: min-capacity search, 6 of 6 events
	// run 1/2 done
	// run 2/2 layers × classic: replay, 0 of 6 events
	// run 2/2 layers × classic: replay, 6 of 6 events
	// run 2/2 layers × classic: min-capacity search, 6 of 6 events
	// run 2/2 done
}
