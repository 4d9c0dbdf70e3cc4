package workload_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

func ExampleDefault() {
	events, err := workload.Default()
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := trace.Summarize(trace.NewSliceReader(events))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d events, %d steps, peak live %.2f GiB, all freed: %v\n",
		s.Events, s.Marks, float64(s.PeakLiveBytes)/(1<<30), s.LiveAllocs == 0)
	// Output: 23964 events, 20 steps, peak live 5.36 GiB, all freed: true
}

func ExampleTransformerTraining() {
	cfg := workload.TrainingConfig{
		Layers: 2, Hidden: 256, Heads: 4, Vocab: 1000, Batch: 2,
		MinSeq: 64, MaxSeq: 128, Steps: 3, DTypeBytes: 4, OptimizerStates: 2,
	}
	events, err := workload.TransformerTraining(cfg, 7)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range events[:3] {
		fmt.Println(e)
	}
	// Output:
	// alloc 1 1024000 s=0 t=700
	// alloc 2 131072 s=0 t=964
	// alloc 3 1024 s=0 t=1164
}

func ExampleRandomMix() {
	cfg := workload.DefaultMixConfig()
	cfg.Allocs = 1000
	events, err := workload.RandomMix(cfg, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	s, _ := trace.Summarize(trace.NewSliceReader(events))
	fmt.Println(s.Allocs, s.Frees, s.Streams)
	// Output: 1000 1000 2
}

func ExampleGenerate() {
	for _, name := range workload.Names() {
		events, info, err := workload.Generate(name, 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(info.Name, len(events) > 10000)
	}
	// Output:
	// training true
	// inference true
	// mix true
	// multistream true
}
