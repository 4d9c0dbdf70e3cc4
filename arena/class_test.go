package arena

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClassOf(t *testing.T) {
	cases := []struct {
		size  uint64
		class int
	}{
		{0, 0}, {1, 1}, {15, 15}, {16, 16}, {17, 17}, {31, 31}, {32, 32}, {33, 32}, {34, 33},
		{512, 6*16 + 0}, {544, 6*16 + 1}, {1023, 6*16 + 15}, {1024, 7 * 16},
		{2 << 20, 18 * 16}, {1<<63 + 1<<62, 60*16 + 8},
	}
	for _, c := range cases {
		assert.Equal(t, c.class, classOf(c.size), "size %d", c.size)
		assert.LessOrEqual(t, ClassLowerBound(c.class), c.size, "size %d", c.size)
		if c.class+1 < numClass {
			assert.Greater(t, ClassLowerBound(c.class+1), c.size, "size %d", c.size)
		}
	}
}

// TestClassWidth states the class table's spread: every class spans at most
// 1/16 of its lower bound, so blocks in one class differ by < 6.25%.
func TestClassWidth(t *testing.T) {
	worst := 0.0
	for c := linearMax; c+1 < numClass; c++ {
		lo, hi := ClassLowerBound(c), ClassLowerBound(c+1)
		require.Greater(t, hi, lo)
		w := float64(hi-lo) / float64(lo)
		if w > worst {
			worst = w
		}
	}
	assert.InDelta(t, 1.0/16, worst, 1e-9)
}

func TestSameClassIsClassOfEquality(t *testing.T) {
	var sizes []uint64
	for k := 0; k < 64; k++ {
		for _, d := range []int64{-3, -2, -1, 0, 1, 2, 3} {
			for _, frac := range []uint64{0, 1, 3, 7, 15, 16, 17} {
				v := int64(uint64(1)<<k + (uint64(1)<<k)/16*frac)
				if x := v + d; x > 0 {
					sizes = append(sizes, uint64(x))
				}
			}
		}
	}
	sizes = append(sizes, 1, 2, 15, 16, 31, 32, 33, math.MaxUint64, math.MaxUint64-1)
	for _, x := range sizes {
		for _, y := range sizes {
			if sameClass(x, y) != (classOf(x) == classOf(y)) {
				t.Fatalf("sameClass(%d, %d) = %v, classes %d and %d", x, y, sameClass(x, y), classOf(x), classOf(y))
			}
		}
	}
}
