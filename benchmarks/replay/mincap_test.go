package replay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// fitsAt replays events at capacity c and reports whether no Alloc ran out
// of memory.
func fitsAt(t *testing.T, events []trace.Event, cfg string, c uint64) bool {
	t.Helper()
	rep, err := Run(trace.NewSliceReader(events), Options{Config: mustConfig(t, cfg), Capacity: c, StopOnOOM: true, MaxSamples: -1})
	require.NoError(t, err)
	return rep.OOMs == 0
}

func TestMinCapacityBracketsTheAnswer(t *testing.T) {
	// A hole the big allocation cannot reuse: A and B, free A, then C.
	hole := []trace.Event{alloc(1, 100*mib, 0), alloc(2, 100*mib, 0), free(1), alloc(3, 150*mib, 0), free(2), free(3)}
	tests := []struct {
		name   string
		events []trace.Event
		cfg    string
	}{
		{"hole/expandable", hole, ""},
		{"hole/classic", hole, "expandable_segments:False"},
		{"synth/expandable", synth(20_000, 7), ""},
		{"synth/classic", synth(20_000, 7), "expandable_segments:False"},
		{"synth/page2M", synth(20_000, 7), "large_segment_size_mb:2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.cfg)
			res, err := SearchMinCapacity(tc.events, cfg, Options{})
			require.NoError(t, err)
			unbounded, err := Run(trace.NewSliceReader(tc.events), Options{Config: cfg})
			require.NoError(t, err)
			assert.Equal(t, unbounded.PeakLive, res.PeakLive)
			assert.Zero(t, res.Capacity%Resolution, "capacity is a multiple of the resolution")
			assert.GreaterOrEqual(t, res.Capacity, res.PeakLive)
			assert.LessOrEqual(t, res.Capacity, roundUpRes(unbounded.PeakReserved), "never above what the unbounded replay mapped")
			assert.Equal(t, res.Capacity-Resolution, res.Failing, "bounds one step apart")
			assert.InDelta(t, float64(res.Capacity)/float64(res.PeakLive), res.OverLive, 1e-12)
			assert.GreaterOrEqual(t, res.Replays, 2)
			assert.True(t, fitsAt(t, tc.events, tc.cfg, res.Capacity), "fits at the answer")
			if res.Failing > 0 {
				assert.False(t, fitsAt(t, tc.events, tc.cfg, res.Failing), "runs out one step below")
			}
			c, err := MinCapacity(tc.events, cfg, Options{Parallel: 1})
			require.NoError(t, err)
			assert.Equal(t, res.Capacity, c, "sequential search finds the same capacity")
		})
	}
}

func TestMinCapacityGrowsTheProbe(t *testing.T) {
	// Peak live 96 MiB on a 64 MiB starting device: the probe doubles.
	ev := []trace.Event{alloc(1, 48*mib, 0), alloc(2, 48*mib, 0), free(1), free(2)}
	res, err := SearchMinCapacity(ev, mustConfig(t, ""), Options{Capacity: 64 * mib})
	require.NoError(t, err)
	assert.Equal(t, uint64(96*mib), res.PeakLive)
	assert.GreaterOrEqual(t, res.Capacity, uint64(96*mib))
	assert.True(t, fitsAt(t, ev, "", res.Capacity))
}

func TestMinCapacityEdgeCases(t *testing.T) {
	t.Run("nothing live", func(t *testing.T) {
		res, err := SearchMinCapacity([]trace.Event{{Kind: trace.Mark}}, mustConfig(t, ""), Options{})
		require.NoError(t, err)
		assert.Zero(t, res.Capacity)
		assert.Zero(t, res.PeakLive)
	})
	t.Run("no fit", func(t *testing.T) {
		_, err := MinCapacity([]trace.Event{alloc(1, MaxSearchCapacity+1, 0)}, mustConfig(t, ""), Options{})
		assert.ErrorIs(t, err, ErrNoFit)
	})
	t.Run("bad config", func(t *testing.T) {
		cfg := mustConfig(t, "")
		cfg.MaxSegmentsPerPool = 0
		_, err := MinCapacity(nil, cfg, Options{})
		assert.ErrorIs(t, err, ErrInvalidOptions)
	})
}

func TestPoints(t *testing.T) {
	r := uint64(Resolution)
	tests := []struct {
		lo, hi uint64
		k      int
		want   []uint64
	}{
		{0, r, 2, nil},
		{0, 2 * r, 2, []uint64{r}},
		{0, 3 * r, 2, []uint64{r, 2 * r}},
		{0, 12 * r, 2, []uint64{4 * r, 8 * r}},
		{0, 12 * r, 1, []uint64{6 * r}},
		{10 * r, 30 * r, 3, []uint64{15 * r, 20 * r, 25 * r}},
		{0, 12 * r, 0, nil},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, points(tc.lo, tc.hi, tc.k), "points(%d, %d, %d)", tc.lo/r, tc.hi/r, tc.k)
	}
}
