package replay_test

import (
	"fmt"
	"os"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// layers is a tiny trace: three 30 MiB activations, freed in reverse.
func layers() []trace.Event {
	const mib = 1 << 20
	var ev []trace.Event
	for id := uint64(1); id <= 3; id++ {
		ev = append(ev, trace.Event{Kind: trace.Alloc, ID: id, Size: 30 * mib})
	}
	for id := uint64(3); id >= 1; id-- {
		ev = append(ev, trace.Event{Kind: trace.Free, ID: id})
	}
	return ev
}

func ExampleRun() {
	rep, err := replay.Run(trace.NewSliceReader(layers()), replay.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("events:", rep.Events, "OOMs:", rep.OOMs)
	fmt.Println("peak live:", replay.FormatBytes(rep.PeakLive))
	fmt.Println("reserved ≥ live:", rep.PeakReserved >= rep.PeakLive)
	// Output:
	// events: 6 OOMs: 0
	// peak live: 90.00 MiB
	// reserved ≥ live: true
}

func ExampleMinCapacity() {
	ev := layers()
	c, err := replay.MinCapacity(ev, allocator.DefaultConfig(), replay.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The three live activations need at least 90 MiB.
	fmt.Println(c >= 90<<20, c%replay.Resolution == 0)
	// Output: true true
}

func ExampleCompare() {
	policies := []replay.Policy{
		{Name: "expandable", Config: ""},
		{Name: "classic", Config: "expandable_segments:False"},
	}
	reps, err := replay.Compare(layers(), policies, replay.Options{MinCapacity: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	// replay.WriteTable(os.Stdout, reps) prints them side by side.
	for _, r := range reps {
		fmt.Println(r.Policy, r.MinCapacity >= r.PeakLive)
	}
	// Output:
	// expandable true
	// classic true
}

func ExamplePlot_WriteSVG() {
	rep, err := replay.Run(trace.NewSliceReader(layers()), replay.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	p := replay.ReportPlot("three layers", rep, nil)
	f, err := os.CreateTemp("", "replay-*.svg")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	fmt.Println(p.WriteSVG(f), len(p.Curves))
	// Output: <nil> 3
}

// ExampleRun_pools replays a CUDA graph's capture: the allocations PyTorch
// made in the graph's private pool (1, 0) replay in a pool of their own,
// and the report gives each pool's peaks.
func ExampleRun_pools() {
	const mib = 1 << 20
	graph := trace.PoolID{1, 0}
	ev := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 64 * mib},              // weights
		{Kind: trace.Alloc, ID: 2, Size: 30 * mib, Pool: graph}, // captured activations
		{Kind: trace.Alloc, ID: 3, Size: 10 * mib, Pool: graph},
		{Kind: trace.Free, ID: 2}, // freed during capture: reusable by the graph only
		{Kind: trace.Alloc, ID: 4, Size: 8 * mib},
	}
	rep, err := replay.Run(trace.NewSliceReader(ev), replay.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range rep.Pools {
		fmt.Printf("%-9s %d allocs, peak live %s, peak allocated %s\n",
			p.Pool, p.Allocs, replay.FormatBytes(p.PeakLive), replay.FormatBytes(p.PeakAllocated))
	}
	fmt.Println("total peak live:", replay.FormatBytes(rep.PeakLive))
	// Output:
	// default   2 allocs, peak live 72.00 MiB, peak allocated 72.00 MiB
	// pool(1,0) 2 allocs, peak live 40.00 MiB, peak allocated 40.00 MiB
	// total peak live: 104.00 MiB
}
