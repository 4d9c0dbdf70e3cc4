package workload

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

func smallMultiStream() MultiStreamConfig {
	return MultiStreamConfig{
		Layers: 6, Hidden: 256, FFN: 688, Heads: 4, DTypeBytes: 2,
		Batch: 2, MinSeq: 16, MaxSeq: 64, Steps: 3,
		SideStreams: 3, Prefetch: 2, OffloadEvery: 2,
	}
}

func TestMultiStreamStructure(t *testing.T) {
	cfg := smallMultiStream()
	ev, err := MultiStream(cfg, 1)
	require.NoError(t, err)
	s := checkInvariants(t, ev)
	assert.Equal(t, 1+cfg.SideStreams, s.Streams, "compute stream and every side stream")
	assert.Equal(t, int64(cfg.Steps), s.Marks)

	d, f, e := uint64(cfg.Hidden), uint64(cfg.FFN), uint64(cfg.DTypeBytes)
	size := map[uint64]uint64{}
	allocStream := map[uint64]uint64{}
	var weights, weightRecords, offloads int
	for _, x := range ev {
		switch x.Kind {
		case trace.Alloc:
			size[x.ID], allocStream[x.ID] = x.Size, x.Stream
			if x.Stream != 0 {
				weights++
				assert.Contains(t, []uint64{d * d * e, d * f * e}, x.Size, "side streams allocate layer weights")
			}
		case trace.RecordStream:
			if allocStream[x.ID] != 0 {
				weightRecords++
				assert.Zero(t, x.Stream, "weights are recorded on the compute stream")
			} else {
				offloads++
				assert.NotZero(t, x.Stream, "activations are offloaded on a side stream")
			}
		}
	}
	assert.Equal(t, 7*cfg.Layers*cfg.Steps, weights, "7 weight tensors per layer per step")
	assert.Equal(t, weights, weightRecords)
	assert.Equal(t, cfg.Steps*cfg.Layers/cfg.OffloadEvery, offloads)

	// At most Prefetch+1 layers of weights are live at once.
	perLayer := 4*d*d*e + 3*d*f*e
	var live, peakWeights uint64
	for _, x := range ev {
		switch {
		case x.Kind == trace.Alloc && x.Stream != 0:
			live += x.Size
		case x.Kind == trace.Free && allocStream[x.ID] != 0:
			live -= size[x.ID]
		}
		peakWeights = max(peakWeights, live)
	}
	assert.Equal(t, uint64(cfg.Prefetch+1)*perLayer, peakWeights)
}

func TestMultiStreamDeterministic(t *testing.T) {
	a, err := MultiStream(smallMultiStream(), 5)
	require.NoError(t, err)
	b, err := MultiStream(smallMultiStream(), 5)
	require.NoError(t, err)
	assert.Equal(t, a, b)
	c, err := MultiStream(smallMultiStream(), 6)
	require.NoError(t, err)
	assert.NotEqual(t, a, c, "the seed draws the sequence lengths")
}

func TestMultiStreamInvalid(t *testing.T) {
	tests := []struct {
		name string
		edit func(*MultiStreamConfig)
	}{
		{"no layers", func(c *MultiStreamConfig) { c.Layers = 0 }},
		{"inverted seq", func(c *MultiStreamConfig) { c.MinSeq, c.MaxSeq = 9, 8 }},
		{"dtype", func(c *MultiStreamConfig) { c.DTypeBytes = 3 }},
		{"no side stream", func(c *MultiStreamConfig) { c.SideStreams = 0 }},
		{"too many side streams", func(c *MultiStreamConfig) { c.SideStreams = 65 }},
		{"prefetch past the model", func(c *MultiStreamConfig) { c.Prefetch = c.Layers + 1 }},
		{"negative offload", func(c *MultiStreamConfig) { c.OffloadEvery = -1 }},
		{"huge tensor", func(c *MultiStreamConfig) { c.Hidden = 1 << 30 }},
		{"too many events", func(c *MultiStreamConfig) { c.Steps = 1 << 30 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallMultiStream()
			tc.edit(&cfg)
			ev, err := MultiStream(cfg, 1)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Nil(t, ev)
		})
	}
}
