package plan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

// randomIntervals draws n intervals with sizes up to maxSize and lifetimes
// within [0, span).
func randomIntervals(r *rand.Rand, n int, maxSize, span uint64) []plan.Interval {
	ivs := make([]plan.Interval, n)
	for i := range ivs {
		b := r.Uint64N(span - 1)
		ivs[i] = plan.Interval{Size: 1 + r.Uint64N(maxSize), Birth: b, Death: b + 1 + r.Uint64N(span-1-b)}
	}
	return ivs
}

func TestPackAgainstOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var worst, sum float64
	optimal, trials := 0, 1000
	for trial := 0; trial < trials; trial++ {
		n := 1 + r.IntN(8)
		ivs := randomIntervals(r, n, 100, 12)
		offs, size, err := plan.Pack(ivs, 1)
		require.NoError(t, err)
		require.NoError(t, plan.Verify(ivs, offs, 1, size))
		opt := optimalSize(ivs, 1)
		require.GreaterOrEqual(t, size, opt, "%v", ivs)
		ratio := float64(size) / float64(opt)
		if size == opt {
			optimal++
		}
		sum += ratio
		if ratio > worst {
			worst = ratio
			t.Logf("new worst %.3f: %v pack %d opt %d", ratio, ivs, size, opt)
		}
	}
	t.Logf("optimal in %d of %d, mean ratio %.4f, worst %.3f", optimal, trials, sum/float64(trials), worst)
}
