package workload_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// ExampleMultiStream generates a small offloaded-inference trace: 4 layers
// of 7 weight tensors (each fetched on a side stream and recorded on the
// compute stream), 6 activations per layer plus each step's input, and one
// offloaded activation per step.
func ExampleMultiStream() {
	cfg := workload.DefaultMultiStreamConfig()
	cfg.Layers, cfg.Steps = 4, 2
	events, err := workload.MultiStream(cfg, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	s, _ := trace.Summarize(trace.NewSliceReader(events))
	fmt.Println(s.Allocs, s.RecordStreams, s.Streams)
	// Output: 106 58 5
}
