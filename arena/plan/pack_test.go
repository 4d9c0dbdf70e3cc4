package plan_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

// packChecked packs and checks every promise Pack makes about a result.
func packChecked(t testing.TB, ivs []plan.Interval, align uint64) ([]uint64, uint64) {
	t.Helper()
	in := slices.Clone(ivs)
	offs, size, err := plan.Pack(ivs, align)
	require.NoError(t, err)
	require.Equal(t, in, ivs, "Pack must not modify its input")
	require.Len(t, offs, len(ivs))
	require.NoError(t, plan.Verify(ivs, offs, align, size))
	_, _, ok := bruteVerify(ivs, offs)
	require.True(t, ok)
	var top uint64
	for i, iv := range ivs {
		require.Zero(t, offs[i]%align)
		top = max(top, offs[i]+roundUp(iv.Size, align))
	}
	require.Equal(t, top, size, "size is the highest end, sizes rounded up to align")
	require.GreaterOrEqual(t, size, plan.PeakLive(ivs, align))
	return offs, size
}

func TestPackTable(t *testing.T) {
	tests := []struct {
		name  string
		ivs   []plan.Interval
		align uint64
		offs  []uint64
		size  uint64
	}{
		{"empty", nil, 1, []uint64{}, 0},
		{"one block", []plan.Interval{{Size: 100, Birth: 0, Death: 1}}, 1, []uint64{0}, 100},
		{"one block rounded to align", []plan.Interval{{Size: 100, Birth: 0, Death: 1}}, 512, []uint64{0}, 512},
		{
			// Disjoint lifetimes share offset 0; [Birth, Death) is
			// half-open, so a block born at another's death reuses it.
			"reuse after free",
			[]plan.Interval{{Size: 64, Birth: 0, Death: 1}, {Size: 32, Birth: 1, Death: 2}, {Size: 64, Birth: 2, Death: 5}},
			1, []uint64{0, 0, 0}, 64,
		},
		{
			// Overlapping lifetimes stack, the larger one lowest.
			"larger first",
			[]plan.Interval{{Size: 10, Birth: 0, Death: 4}, {Size: 30, Birth: 1, Death: 3}},
			1, []uint64{30, 0}, 40,
		},
		{
			// Three 100-byte blocks live one after another (A, then D, then
			// B) and share offset 0; C lives throughout and sits above
			// them: the peak, 150 bytes.
			"reuse in sequence under a long-lived block",
			[]plan.Interval{
				{Size: 100, Birth: 0, Death: 4},  // A
				{Size: 100, Birth: 5, Death: 10}, // B: reuses A's place
				{Size: 50, Birth: 0, Death: 10},  // C: lives throughout
				{Size: 100, Birth: 4, Death: 5},  // D: A's place, between A and B
			},
			1, []uint64{0, 0, 100, 0}, 150,
		},
		{
			// A training-step shape: activations a1, a2 saved in the
			// forward pass and freed in reverse in the backward pass, a
			// temporary in each pass. The peak (a1+a2+grad) is 96.
			"forward backward",
			[]plan.Interval{
				{Size: 32, Birth: 0, Death: 9}, // a1
				{Size: 16, Birth: 1, Death: 3}, // t1
				{Size: 32, Birth: 2, Death: 8}, // a2
				{Size: 32, Birth: 4, Death: 7}, // grad temp
			},
			16, []uint64{0, 64, 32, 64}, 96,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			offs, size := packChecked(t, tc.ivs, tc.align)
			assert.Equal(t, tc.offs, offs)
			assert.Equal(t, tc.size, size)
		})
	}
}

func TestPackBadInput(t *testing.T) {
	const max = math.MaxUint64
	ok := plan.Interval{Size: 8, Birth: 0, Death: 1}
	const anyIndex = -2 // some interval of the stack is named
	tests := []struct {
		name  string
		ivs   []plan.Interval
		align uint64
		err   error
		index int    // of the interval named, -1 for none
		peak  uint64 // PeakLive: 0 for input Validate rejects
	}{
		{"align zero", []plan.Interval{ok}, 0, plan.ErrAlign, -1, 0},
		{"align not a power of two", []plan.Interval{ok}, 24, plan.ErrAlign, -1, 0},
		{"align max", []plan.Interval{ok}, max, plan.ErrAlign, -1, 0},
		{"zero size", []plan.Interval{ok, {Size: 0, Birth: 0, Death: 1}}, 1, plan.ErrZeroSize, 1, 0},
		{"birth equals death", []plan.Interval{{Size: 1, Birth: 5, Death: 5}}, 1, plan.ErrLifetime, 0, 0},
		{"birth after death", []plan.Interval{ok, ok, {Size: 1, Birth: 6, Death: 5}}, 1, plan.ErrLifetime, 2, 0},
		{"size rounds past 2^64", []plan.Interval{{Size: max - 510, Birth: 0, Death: 1}}, 512, plan.ErrOverflow, 0, 0},
		// Valid input whose packing cannot fit in 64 bits.
		{"stack past 2^64", []plan.Interval{{Size: 1 << 63, Birth: 0, Death: 2}, {Size: 1 << 63, Birth: 1, Death: 3}}, 1, plan.ErrOverflow, anyIndex, max},
		{"stack of four past 2^64", []plan.Interval{{Size: 1 << 62, Birth: 0, Death: 2}, {Size: 1 << 63, Birth: 0, Death: 2}, {Size: 1 << 62, Birth: 0, Death: 2}, {Size: 1, Birth: 1, Death: 2}}, 1, plan.ErrOverflow, anyIndex, max},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.ivs)
			offs, size, err := plan.Pack(tc.ivs, tc.align)
			require.ErrorIs(t, err, tc.err)
			assert.Nil(t, offs)
			assert.Zero(t, size)
			assert.Equal(t, in, tc.ivs)
			var ie *plan.IntervalError
			switch tc.index {
			case -1:
				assert.False(t, errors.As(err, &ie))
			case anyIndex:
				require.ErrorAs(t, err, &ie)
				require.Less(t, ie.Index, len(tc.ivs))
				assert.Equal(t, tc.ivs[ie.Index], ie.Interval)
			default:
				require.ErrorAs(t, err, &ie)
				assert.Equal(t, tc.index, ie.Index)
				assert.Equal(t, tc.ivs[tc.index], ie.Interval)
			}
			assert.Equal(t, tc.peak, plan.PeakLive(tc.ivs, tc.align))
			if tc.peak == 0 {
				assert.ErrorIs(t, plan.Validate(tc.ivs, tc.align), tc.err)
			} else {
				assert.NoError(t, plan.Validate(tc.ivs, tc.align))
			}
		})
	}
}

// TestPackTooMany: more intervals than Pack numbers (2^31-1; lowered here)
// are refused with ErrTooMany by Pack, Validate, Verify and PeakLive.
func TestPackTooMany(t *testing.T) {
	defer plan.SetMaxIntervals(3)()
	ivs := make([]plan.Interval, 4)
	for i := range ivs {
		ivs[i] = plan.Interval{Size: 1, Birth: uint64(i), Death: uint64(i) + 1}
	}
	offs, size, err := plan.Pack(ivs, 1)
	require.ErrorIs(t, err, plan.ErrTooMany)
	assert.Nil(t, offs)
	assert.Zero(t, size)
	require.ErrorIs(t, plan.Validate(ivs, 1), plan.ErrTooMany)
	require.ErrorIs(t, plan.Verify(ivs, make([]uint64, 4), 1, 1), plan.ErrTooMany)
	assert.Zero(t, plan.PeakLive(ivs, 1))
	_, _, err = plan.Pack(ivs[:3], 1)
	require.NoError(t, err)
}

// TestPackSizesNear2To64 packs blocks whose sum exceeds 64 bits but whose
// lifetimes let them share memory: no overflow is reported.
func TestPackSizesNear2To64(t *testing.T) {
	ivs := []plan.Interval{
		{Size: math.MaxUint64, Birth: 0, Death: 1},
		{Size: math.MaxUint64, Birth: 1, Death: 2},
		{Size: 1 << 63, Birth: 2, Death: 4},
		{Size: 1<<63 - 1, Birth: 3, Death: 4},
	}
	offs, size := packChecked(t, ivs, 1)
	assert.Equal(t, uint64(math.MaxUint64), size)
	assert.Equal(t, []uint64{0, 0, 0, 1 << 63}, offs)
	assert.Equal(t, uint64(math.MaxUint64), plan.PeakLive(ivs, 1))
}

func TestPackRandomVerifies(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		n := r.IntN(80)
		align := uint64(1) << r.IntN(10)
		ivs := randomIntervals(r, n, 1+r.Uint64N(5000), 2+r.Uint64N(200))
		packChecked(t, ivs, align)
	}
}

// TestPackIsDeterministic: a plan computed twice from the same step is the
// same plan.
func TestPackIsDeterministic(t *testing.T) {
	ivs := trainingStep(rand.New(rand.NewPCG(5, 6)), 200)
	offs1, size1 := packChecked(t, ivs, 512)
	offs2, size2 := packChecked(t, ivs, 512)
	assert.Equal(t, offs1, offs2)
	assert.Equal(t, size1, size2)
}

// trainingStep draws the blocks of a training step of the given layers:
// in the forward pass each layer saves activations until the backward
// pass frees them in reverse, and both passes make short-lived
// temporaries; sizes come from a few tensor shapes.
func trainingStep(r *rand.Rand, layers int) []plan.Interval {
	shapes := []uint64{4 << 20, 16 << 20, 1 << 20, 64 << 10, 12 << 20, 3 << 20}
	var ivs []plan.Interval
	var t uint64
	type saved struct{ size, birth uint64 }
	var stack [][]saved
	for l := 0; l < layers; l++ {
		var keep []saved
		for k := 0; k < 6; k++ {
			s := shapes[r.IntN(len(shapes))] + uint64(r.IntN(4))*512
			if r.IntN(2) == 0 {
				keep = append(keep, saved{s, t})
				t++
			} else {
				ivs = append(ivs, plan.Interval{Size: s, Birth: t, Death: t + 1 + uint64(r.IntN(4))})
				t += 2
			}
		}
		stack = append(stack, keep)
	}
	for l := layers - 1; l >= 0; l-- {
		for k := 0; k < 4; k++ {
			ivs = append(ivs, plan.Interval{Size: shapes[r.IntN(len(shapes))], Birth: t, Death: t + 1 + uint64(r.IntN(6))})
			t += 2
		}
		for _, a := range stack[l] {
			t++
			ivs = append(ivs, plan.Interval{Size: a.size, Birth: a.birth, Death: t})
		}
	}
	return ivs
}

// TestPackTrainingStepReachesPeak: a training step's blocks pack into
// exactly their peak live bytes, the lower bound.
func TestPackTrainingStepReachesPeak(t *testing.T) {
	for seed := uint64(0); seed < 5; seed++ {
		ivs := trainingStep(rand.New(rand.NewPCG(seed, 1)), 100+int(seed)*50)
		_, size := packChecked(t, ivs, 512)
		assert.Equal(t, plan.PeakLive(ivs, 512), size, "seed %d", seed)
	}
}

// TestFirstFitMatchesModel holds the packer's index (segment tree of
// coalesced span sets) to the obvious quadratic lowest-fit placement: for
// any order, both place every interval at the same offset.
func TestFirstFitMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 305; trial++ {
		n, span := r.IntN(120), 2+r.Uint64N(100)
		if trial >= 300 {
			// Larger, fragmented layouts: sets of many spans, cursors
			// that gallop.
			n, span = 250+r.IntN(100), 20+r.Uint64N(400)
		}
		align := uint64(1) << r.IntN(4)
		ivs := randomIntervals(r, n, 1+r.Uint64N(300), span)
		order := r.Perm(n)
		offs, size, err := plan.FirstFitInOrder(ivs, align, order)
		require.NoError(t, err)
		wantOffs, wantSize := firstFitInOrder(ivs, order, align)
		require.Equal(t, wantOffs, offs, "trial %d", trial)
		require.Equal(t, wantSize, size)
	}
}

func TestPeakLiveMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for trial := 0; trial < 300; trial++ {
		align := uint64(1) << r.IntN(10)
		ivs := randomIntervals(r, r.IntN(60), 1+r.Uint64N(5000), 2+r.Uint64N(50))
		require.Equal(t, brutePeak(ivs, align), plan.PeakLive(ivs, align))
	}
}

func TestPeakLive(t *testing.T) {
	ivs := []plan.Interval{
		{Size: 10, Birth: 0, Death: 2},
		{Size: 20, Birth: 1, Death: 3},
		{Size: 40, Birth: 2, Death: 3}, // born as the first dies: 20+40
		{Size: 5, Birth: 3, Death: 4},
	}
	assert.Equal(t, uint64(60), plan.PeakLive(ivs, 1))
	assert.Equal(t, uint64(64+64), plan.PeakLive(ivs, 64))
	assert.Zero(t, plan.PeakLive(nil, 1))
	assert.Zero(t, plan.PeakLive(ivs, 3), "invalid align")
}
