package plan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

// BenchmarkPack plans synthetic steps: training steps (saved activations,
// short temporaries; 10 intervals per layer) and random lifetimes. It
// reports the planning time per interval and the region's size over the
// peak live bytes (1 is optimal).
func BenchmarkPack(b *testing.B) {
	cases := []struct {
		name string
		ivs  []plan.Interval
	}{
		{"train/n=1k", trainingStep(rand.New(rand.NewPCG(1, 1)), 100)},
		{"train/n=10k", trainingStep(rand.New(rand.NewPCG(1, 1)), 1000)},
		{"train/n=50k", trainingStep(rand.New(rand.NewPCG(1, 1)), 5000)},
		{"random/n=10k", randomIntervals(rand.New(rand.NewPCG(2, 2)), 10000, 1<<20, 20000)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			peak := plan.PeakLive(c.ivs, 512)
			var size uint64
			b.ReportAllocs()
			for b.Loop() {
				_, s, err := plan.Pack(c.ivs, 512)
				if err != nil {
					b.Fatal(err)
				}
				size = s
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(c.ivs)), "ns/interval")
			b.ReportMetric(float64(size)/float64(peak), "size/peak")
			b.ReportMetric((float64(size)/float64(peak)-1)*1e6, "excess-ppm")
		})
	}
}

// BenchmarkVerify checks a 50k-interval plan.
func BenchmarkVerify(b *testing.B) {
	ivs := trainingStep(rand.New(rand.NewPCG(1, 1)), 5000)
	offs, size, err := plan.Pack(ivs, 512)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := plan.Verify(ivs, offs, 512, size); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ivs)), "ns/interval")
}
