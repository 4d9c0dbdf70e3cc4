package plan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

func TestPackRandomVerifies(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		n := r.IntN(60)
		ivs := make([]plan.Interval, n)
		for i := range ivs {
			b := r.Uint64N(100)
			ivs[i] = plan.Interval{Size: 1 + r.Uint64N(1000), Birth: b, Death: b + 1 + r.Uint64N(50)}
		}
		align := uint64(1) << r.IntN(8)
		offs, size, err := plan.Pack(ivs, align)
		require.NoError(t, err)
		require.NoError(t, plan.Verify(ivs, offs, align, size))
		require.GreaterOrEqual(t, size, plan.PeakLive(ivs, align))
	}
}
