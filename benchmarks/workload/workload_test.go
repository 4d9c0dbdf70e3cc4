package workload

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// small configs keep the tests fast; the defaults are checked separately.
func smallTraining() TrainingConfig {
	return TrainingConfig{Layers: 2, Hidden: 64, Heads: 4, Vocab: 500, Batch: 2,
		MinSeq: 8, MaxSeq: 64, Steps: 5, DTypeBytes: 2, OptimizerStates: 2}
}

func smallInference() InferenceConfig {
	return InferenceConfig{Layers: 2, Hidden: 64, Heads: 4, Vocab: 500, DTypeBytes: 2,
		Steps: 200, MaxBatch: 4, ArrivalRate: 0.7, MinPrompt: 4, MaxPrompt: 40,
		MinOutput: 1, MaxOutput: 50, KVChunkTokens: 8}
}

func smallMix() MixConfig {
	return MixConfig{Allocs: 3000, MinSize: 1, MaxSize: 1 << 20, MeanLifetime: 30,
		Streams: 3, RecordStreamProb: 0.1, SyncProb: 0.05, EmptyCacheProb: 0.01}
}

type generator struct {
	name string
	gen  func(seed int64) ([]trace.Event, error)
}

func generators() []generator {
	realloc := smallInference()
	realloc.ReallocKV = true
	return []generator{
		{"training", func(s int64) ([]trace.Event, error) { return TransformerTraining(smallTraining(), s) }},
		{"inference", func(s int64) ([]trace.Event, error) { return LLMInference(smallInference(), s) }},
		{"inference-realloc", func(s int64) ([]trace.Event, error) { return LLMInference(realloc, s) }},
		{"mix", func(s int64) ([]trace.Event, error) { return RandomMix(smallMix(), s) }},
	}
}

// checkInvariants asserts the package's promises about a generated trace.
func checkInvariants(t *testing.T, events []trace.Event) trace.Summary {
	t.Helper()
	s, err := trace.Summarize(trace.NewSliceReader(events))
	require.NoError(t, err, "every Free and RecordStream names a live allocation, no id is freed twice")
	assert.Zero(t, s.LiveAllocs, "everything is freed by the end")
	assert.Zero(t, s.LiveBytes)
	assert.Equal(t, s.Allocs, s.Frees)

	next := uint64(1)
	allocStream := map[uint64]uint64{}
	freed := map[uint64]bool{}
	var last int64 = math.MinInt64
	for i, e := range events {
		require.GreaterOrEqual(t, e.TimeNs, last, "time never goes back (event %d)", i)
		last = e.TimeNs
		switch e.Kind {
		case trace.Alloc:
			require.Equal(t, next, e.ID, "ids are sequential (event %d)", i)
			require.Positive(t, e.Size, "event %d", i)
			next++
			allocStream[e.ID] = e.Stream
		case trace.Free:
			require.False(t, freed[e.ID], "id %d freed twice", e.ID)
			freed[e.ID] = true
			require.Equal(t, allocStream[e.ID], e.Stream, "Free carries its Alloc's stream (event %d)", i)
		}
	}
	return s
}

func TestGeneratorInvariants(t *testing.T) {
	for _, g := range generators() {
		t.Run(g.name, func(t *testing.T) {
			for _, seed := range []int64{1, 2, -7} {
				ev, err := g.gen(seed)
				require.NoError(t, err)
				require.NotEmpty(t, ev)
				checkInvariants(t, ev)
			}
		})
	}
}

func TestGeneratorsDeterministic(t *testing.T) {
	for _, g := range generators() {
		t.Run(g.name, func(t *testing.T) {
			a, err := g.gen(42)
			require.NoError(t, err)
			b, err := g.gen(42)
			require.NoError(t, err)
			assert.Equal(t, a, b, "same seed, same events")
			c, err := g.gen(43)
			require.NoError(t, err)
			assert.NotEqual(t, a, c, "different seed, different events")
		})
	}
}

func TestTrainingStructure(t *testing.T) {
	cfg := smallTraining()
	cfg.MinSeq, cfg.MaxSeq = 32, 32 // fixed length: every step identical in shape
	ev, err := TransformerTraining(cfg, 1)
	require.NoError(t, err)
	s := checkInvariants(t, ev)
	assert.Equal(t, int64(cfg.Steps), s.Marks)

	d, e := uint64(cfg.Hidden), uint64(cfg.DTypeBytes)
	nParams := 12*cfg.Layers + 4
	paramElems := uint64(cfg.Vocab)*d + uint64(cfg.MaxSeq)*d + 2*d +
		uint64(cfg.Layers)*(12*d*d+13*d)
	// The first allocations are exactly the parameters.
	var sum uint64
	for _, x := range ev[:nParams] {
		require.Equal(t, trace.Alloc, x.Kind)
		sum += x.Size
	}
	assert.Equal(t, paramElems*e, sum)
	assert.Equal(t, trace.Mark, ev[nParams].Kind)

	// Persistent memory after the first step: params, grads and two
	// optimizer states = 4 × params. Live bytes at each later Mark equal it.
	live := map[uint64]uint64{}
	var cur uint64
	var atMarks []uint64
	for _, x := range ev {
		switch x.Kind {
		case trace.Alloc:
			live[x.ID] = x.Size
			cur += x.Size
		case trace.Free:
			cur -= live[x.ID]
		case trace.Mark:
			atMarks = append(atMarks, cur)
		}
	}
	require.Len(t, atMarks, cfg.Steps)
	assert.Equal(t, paramElems*e, atMarks[0])
	for _, m := range atMarks[1:] {
		assert.Equal(t, 4*paramElems*e, m)
	}

	// The attention matrix B×H×S²×e appears in every step.
	attn := uint64(cfg.Batch*cfg.Heads*32*32) * e
	n := 0
	for _, x := range ev {
		if x.Kind == trace.Alloc && x.Size == attn {
			n++
		}
	}
	assert.Equal(t, 4*cfg.Layers*cfg.Steps, n, "scores, probs, grad probs, grad scores per layer per step")
}

func TestTrainingSeqVaries(t *testing.T) {
	ev, err := TransformerTraining(smallTraining(), 3)
	require.NoError(t, err)
	// The token-id tensor is the first allocation after each Mark: B×S×8.
	seqs := map[uint64]bool{}
	for i, x := range ev {
		if x.Kind == trace.Mark {
			seq := ev[i+1].Size / uint64(8*smallTraining().Batch)
			assert.GreaterOrEqual(t, seq, uint64(8))
			assert.LessOrEqual(t, seq, uint64(64))
			seqs[seq] = true
		}
	}
	assert.Greater(t, len(seqs), 1, "sequence length varies between steps")
}

func TestInferenceKVGrowth(t *testing.T) {
	cfg := smallInference()
	kvChunk := uint64(cfg.Layers * 2 * cfg.Hidden * cfg.DTypeBytes * cfg.KVChunkTokens)
	paged, err := LLMInference(cfg, 5)
	require.NoError(t, err)
	cfg.ReallocKV = true
	realloc, err := LLMInference(cfg, 5)
	require.NoError(t, err)

	// Distinct allocation sizes that are whole numbers of KV chunks: paged
	// growth adds single chunks, realloc growth whole caches of many sizes.
	multiples := func(ev []trace.Event) map[uint64]int {
		m := map[uint64]int{}
		for _, x := range ev {
			if x.Kind == trace.Alloc && x.Size%kvChunk == 0 {
				m[x.Size/kvChunk]++
			}
		}
		return m
	}
	mp, mr := multiples(paged), multiples(realloc)
	assert.Greater(t, mp[1], 100, "paged: many single-chunk allocations")
	assert.GreaterOrEqual(t, len(mr), 10, "realloc: caches of many sizes")
	assert.Less(t, 4*mr[1], mp[1], "realloc: few single-chunk allocations")

	sp := checkInvariants(t, paged)
	sr := checkInvariants(t, realloc)
	assert.Equal(t, int64(cfg.Steps), sp.Marks)
	assert.Equal(t, sp.Marks, sr.Marks)
	// Same request stream, so paged holds no more than realloc at peak
	// (realloc briefly holds old and new copies).
	assert.LessOrEqual(t, sp.PeakLiveBytes, sr.PeakLiveBytes)
}

func TestMixFeatures(t *testing.T) {
	cfg := smallMix()
	ev, err := RandomMix(cfg, 9)
	require.NoError(t, err)
	s := checkInvariants(t, ev)
	assert.Equal(t, int64(cfg.Allocs), s.Allocs)
	assert.Positive(t, s.RecordStreams)
	assert.Positive(t, s.StreamSyncs)
	assert.Positive(t, s.EmptyCaches)
	assert.Equal(t, cfg.Streams, s.Streams)
	assert.GreaterOrEqual(t, s.MinAllocSize, cfg.MinSize)
	assert.LessOrEqual(t, s.MaxAllocSize, cfg.MaxSize)

	live := map[uint64]uint64{} // id -> stream
	for _, x := range ev {
		switch x.Kind {
		case trace.Alloc:
			live[x.ID] = x.Stream
			assert.Less(t, x.Stream, uint64(cfg.Streams))
		case trace.RecordStream:
			assert.NotEqual(t, live[x.ID], x.Stream, "record_stream names another stream")
		}
	}
	// Log-uniform: about as many sizes below the geometric midpoint as above.
	mid := math.Sqrt(float64(cfg.MinSize) * float64(cfg.MaxSize))
	below := 0
	for _, x := range ev {
		if x.Kind == trace.Alloc && float64(x.Size) < mid {
			below++
		}
	}
	assert.InDelta(t, 0.5, float64(below)/float64(cfg.Allocs), 0.05)

	one := cfg
	one.Streams, one.RecordStreamProb = 1, 1
	ev, err = RandomMix(one, 9)
	require.NoError(t, err)
	s = checkInvariants(t, ev)
	assert.Zero(t, s.RecordStreams, "no other stream to record on")

	none := cfg
	none.Allocs = 0
	ev, err = RandomMix(none, 1)
	require.NoError(t, err)
	assert.Empty(t, ev)
}

func TestDefaults(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			ev, info, err := Generate(name, DefaultSeed)
			require.NoError(t, err)
			assert.Equal(t, name, info.Name)
			assert.Contains(t, info.Source, "seed 1")
			s := checkInvariants(t, ev)
			assert.Greater(t, s.Events, int64(10_000), "tens of thousands of events")
			assert.Less(t, s.Events, int64(100_000))
			assert.Greater(t, s.PeakLiveBytes, uint64(1<<30), "peak live above 1 GiB")
			assert.Less(t, s.PeakLiveBytes, uint64(8<<30), "peak live a few GiB")
		})
	}
	def, err := Default()
	require.NoError(t, err)
	tr, _, err := Generate("training", DefaultSeed)
	require.NoError(t, err)
	assert.Equal(t, tr, def)

	_, _, err = Generate("nope", 1)
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

func TestDefaultRoundTripsThroughBinary(t *testing.T) {
	ev, err := Default()
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, trace.WriteAll(trace.NewWriter(&buf), ev))
	r, err := trace.Open(&buf)
	require.NoError(t, err)
	got, err := trace.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, ev, got)
	assert.Less(t, buf.Len(), 8*len(ev), "compact: under 8 bytes per event")
}

func TestInvalidConfigs(t *testing.T) {
	tr := func(f func(*TrainingConfig)) error {
		c := smallTraining()
		f(&c)
		ev, err := TransformerTraining(c, 1)
		assert.Nil(t, ev)
		return err
	}
	inf := func(f func(*InferenceConfig)) error {
		c := smallInference()
		f(&c)
		ev, err := LLMInference(c, 1)
		assert.Nil(t, ev)
		return err
	}
	mix := func(f func(*MixConfig)) error {
		c := smallMix()
		f(&c)
		ev, err := RandomMix(c, 1)
		assert.Nil(t, ev)
		return err
	}
	tests := []struct {
		name string
		err  error
		msg  string
	}{
		{"training zero layers", tr(func(c *TrainingConfig) { c.Layers = 0 }), "must be >= 1"},
		{"training negative batch", tr(func(c *TrainingConfig) { c.Batch = -1 }), "must be >= 1"},
		{"training inverted seq", tr(func(c *TrainingConfig) { c.MinSeq, c.MaxSeq = 10, 5 }), "MinSeq <= MaxSeq"},
		{"training dtype", tr(func(c *TrainingConfig) { c.DTypeBytes = 3 }), "DTypeBytes 3"},
		{"training optimizer", tr(func(c *TrainingConfig) { c.OptimizerStates = 5 }), "OptimizerStates 5"},
		{"training huge tensor", tr(func(c *TrainingConfig) { c.MaxSeq = 1 << 30 }), "exceeds"},
		{"training overflow", tr(func(c *TrainingConfig) { c.Hidden = math.MaxInt }), "exceeds"},
		{"training too many events", tr(func(c *TrainingConfig) { c.Steps = 1 << 30 }), "events"},
		{"inference zero chunk", inf(func(c *InferenceConfig) { c.KVChunkTokens = 0 }), "must be >= 1"},
		{"inference inverted prompt", inf(func(c *InferenceConfig) { c.MinPrompt = 100 }), "MinPrompt <= MaxPrompt"},
		{"inference inverted output", inf(func(c *InferenceConfig) { c.MinOutput = 0 }), "MinOutput <= MaxOutput"},
		{"inference NaN rate", inf(func(c *InferenceConfig) { c.ArrivalRate = math.NaN() }), "ArrivalRate"},
		{"inference huge rate", inf(func(c *InferenceConfig) { c.ArrivalRate = 1000 }), "ArrivalRate"},
		{"inference dtype", inf(func(c *InferenceConfig) { c.DTypeBytes = 0 }), "DTypeBytes"},
		{"inference huge prompt", inf(func(c *InferenceConfig) { c.MaxPrompt = 1 << 40 }), "exceeds"},
		{"inference too many events", inf(func(c *InferenceConfig) { c.Steps = 1 << 40 }), "events"},
		{"mix negative allocs", mix(func(c *MixConfig) { c.Allocs = -1 }), "Allocs"},
		{"mix too many allocs", mix(func(c *MixConfig) { c.Allocs = maxEvents }), "Allocs"},
		{"mix zero size", mix(func(c *MixConfig) { c.MinSize = 0 }), "MinSize"},
		{"mix inverted size", mix(func(c *MixConfig) { c.MinSize = 1 << 21 }), "MinSize"},
		{"mix huge size", mix(func(c *MixConfig) { c.MaxSize = math.MaxUint64 }), "MaxSize"},
		{"mix lifetime", mix(func(c *MixConfig) { c.MeanLifetime = 0.5 }), "MeanLifetime"},
		{"mix NaN lifetime", mix(func(c *MixConfig) { c.MeanLifetime = math.NaN() }), "MeanLifetime"},
		{"mix streams", mix(func(c *MixConfig) { c.Streams = 0 }), "Streams"},
		{"mix probability", mix(func(c *MixConfig) { c.SyncProb = 1.5 }), "probabilities"},
		{"mix NaN probability", mix(func(c *MixConfig) { c.EmptyCacheProb = math.NaN() }), "probabilities"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.err, ErrInvalidConfig)
			assert.ErrorContains(t, tc.err, tc.msg)
		})
	}
}

func BenchmarkDefault(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Default(); err != nil {
			b.Fatal(err)
		}
	}
}
