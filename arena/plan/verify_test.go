package plan_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

func TestVerifyTable(t *testing.T) {
	two := []plan.Interval{{Size: 16, Birth: 0, Death: 2}, {Size: 16, Birth: 1, Death: 3}}
	tests := []struct {
		name   string
		ivs    []plan.Interval
		offs   []uint64
		align  uint64
		size   uint64
		err    error
		i, j   int // the intervals named (OverlapError: both; IntervalError: i)
		naming int // 0 none, 1 IntervalError, 2 OverlapError
	}{
		{"valid stack", two, []uint64{0, 16}, 16, 32, nil, 0, 0, 0},
		{"valid with slack", two, []uint64{16, 32}, 16, 64, nil, 0, 0, 0},
		{"empty", nil, []uint64{}, 1, 0, nil, 0, 0, 0},
		{"length", two, []uint64{0}, 16, 32, plan.ErrLength, 0, 0, 0},
		{"align", two, []uint64{0, 16}, 12, 32, plan.ErrAlign, 0, 0, 0},
		{"size not aligned", two, []uint64{0, 16}, 16, 40, plan.ErrMisaligned, 0, 0, 0},
		{"offset not aligned", two, []uint64{0, 24}, 16, 48, plan.ErrMisaligned, 1, 0, 1},
		{"beyond the region", two, []uint64{0, 16}, 16, 16, plan.ErrOutside, 1, 0, 1},
		{"offset beyond the region", two, []uint64{0, 48}, 16, 32, plan.ErrOutside, 1, 0, 1},
		{"offset near 2^64", two, []uint64{0, math.MaxUint64 - 15}, 16, 32, plan.ErrOutside, 1, 0, 1},
		{"same offset", two, []uint64{0, 0}, 16, 32, plan.ErrOverlap, 0, 1, 2},
		{"partial overlap", two, []uint64{16, 0}, 1, 32, nil, 0, 0, 0},
		{"partial overlap by one byte", two, []uint64{15, 0}, 1, 32, plan.ErrOverlap, 0, 1, 2},
		{"death meets birth", []plan.Interval{{Size: 16, Birth: 0, Death: 1}, {Size: 16, Birth: 1, Death: 2}}, []uint64{0, 0}, 16, 16, nil, 0, 0, 0},
		{"bad interval", []plan.Interval{{Size: 16, Birth: 1, Death: 1}}, []uint64{0}, 16, 16, plan.ErrLifetime, 0, 0, 1},
		{
			// The overlap is between non-neighbours in birth order.
			"overlap under a hole",
			[]plan.Interval{{Size: 8, Birth: 0, Death: 10}, {Size: 8, Birth: 1, Death: 2}, {Size: 8, Birth: 3, Death: 4}, {Size: 4, Birth: 5, Death: 6}},
			[]uint64{8, 0, 0, 12}, 4, 16, plan.ErrOverlap, 0, 3, 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := plan.Verify(tc.ivs, tc.offs, tc.align, tc.size)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			switch tc.naming {
			case 1:
				var ie *plan.IntervalError
				require.ErrorAs(t, err, &ie)
				assert.Equal(t, tc.i, ie.Index)
				assert.Equal(t, tc.ivs[tc.i], ie.Interval)
				if tc.err == plan.ErrMisaligned || tc.err == plan.ErrOutside {
					assert.Equal(t, tc.offs[tc.i], ie.Offset)
					assert.Contains(t, err.Error(), fmt.Sprintf("at offset %d", tc.offs[tc.i]))
				} else {
					assert.NotContains(t, err.Error(), "offset")
				}
			case 2:
				var oe *plan.OverlapError
				require.ErrorAs(t, err, &oe)
				assert.Equal(t, [2]int{tc.i, tc.j}, [2]int{oe.I, oe.J})
			}
		})
	}
}

// TestVerifyMatchesBruteForce holds Verify's sweep to the pairwise check
// on packings with random offsets: it reports an overlap exactly when some
// pair of live intervals overlaps, and the pair it names does.
func TestVerifyMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	overlaps := 0
	for trial := 0; trial < 2000; trial++ {
		n := r.IntN(30)
		ivs := randomIntervals(r, n, 1+r.Uint64N(64), 2+r.Uint64N(40))
		var offs []uint64
		if r.IntN(2) == 0 {
			var size uint64
			var err error
			offs, size, err = plan.Pack(ivs, 1)
			require.NoError(t, err)
			// Nudge one offset: a packing that is sometimes still valid.
			if n > 0 {
				k := r.IntN(n)
				offs[k] = uint64(max(0, int64(offs[k])+r.Int64N(17)-8))
			}
			_ = size
		} else {
			offs = make([]uint64, n)
			for i := range offs {
				offs[i] = r.Uint64N(256)
			}
		}
		err := plan.Verify(ivs, offs, 1, 1024)
		i, j, ok := bruteVerify(ivs, offs)
		if ok {
			require.NoError(t, err, "trial %d", trial)
			continue
		}
		overlaps++
		require.ErrorIs(t, err, plan.ErrOverlap, "trial %d: %d and %d overlap", trial, i, j)
		var oe *plan.OverlapError
		require.ErrorAs(t, err, &oe)
		require.Less(t, oe.I, oe.J)
		a, b := ivs[oe.I], ivs[oe.J]
		assert.True(t, live(a, b) && offs[oe.I] < offs[oe.J]+b.Size && offs[oe.J] < offs[oe.I]+a.Size,
			"the pair named overlaps")
	}
	assert.Greater(t, overlaps, 500, "the trials exercise both outcomes")
}
