package workload

import "github.com/vmmalloc/vmmalloc/benchmarks/trace"

// MultiStreamConfig describes inference with layer weights offloaded to the
// host and prefetched on side streams, as DeepSpeed/accelerate offloading
// and the llama7b_offload_4streams snapshot do: compute runs on stream 0;
// before layer l computes, side stream 1 + l mod SideStreams allocates its
// weights (the host-to-device copy) and the compute stream is recorded on
// them (RecordStream); the compute stream frees them once the layer is
// done. Every OffloadEvery layers, the layer's input activation is copied
// back to the host on a side stream (RecordStream on that stream) before
// the compute stream frees it.
type MultiStreamConfig struct {
	Layers       int // transformer blocks
	Hidden       int // model width d
	FFN          int // MLP width
	Heads        int // attention heads
	DTypeBytes   int // bytes per element (1, 2, 4 or 8)
	Batch        int // sequences per step
	MinSeq       int // sequence length range in tokens, drawn per step
	MaxSeq       int //
	Steps        int // forward passes
	SideStreams  int // prefetch/offload streams (trace streams 1..SideStreams), 1..64
	Prefetch     int // layers whose weights are fetched ahead of the computing one, 0..Layers
	OffloadEvery int // offload a layer's input every this many layers; 0: never
}

// DefaultMultiStreamConfig is a LLaMA-7B-shaped model (32 × 4096, MLP
// 11008, bf16) with weights prefetched two layers ahead over 8 side
// streams, batch 4 of 128–1024 tokens, every fourth layer's input
// offloaded, 8 steps: about 4 GB live at the peak and 8,000 events.
func DefaultMultiStreamConfig() MultiStreamConfig {
	return MultiStreamConfig{
		Layers: 32, Hidden: 4096, FFN: 11008, Heads: 32, DTypeBytes: 2,
		Batch: 4, MinSeq: 128, MaxSeq: 1024, Steps: 12,
		SideStreams: 8, Prefetch: 2, OffloadEvery: 4,
	}
}

func (c MultiStreamConfig) validate() error {
	switch {
	case c.Layers < 1, c.Hidden < 1, c.FFN < 1, c.Heads < 1, c.Batch < 1, c.Steps < 1:
		return invalid("multistream: Layers, Hidden, FFN, Heads, Batch and Steps must be >= 1 (got %+v)", c)
	case c.MinSeq < 1 || c.MaxSeq < c.MinSeq:
		return invalid("multistream: need 1 <= MinSeq <= MaxSeq (got %d, %d)", c.MinSeq, c.MaxSeq)
	case !validDType(c.DTypeBytes):
		return invalid("multistream: DTypeBytes %d (want 1, 2, 4 or 8)", c.DTypeBytes)
	case c.SideStreams < 1 || c.SideStreams > 64:
		return invalid("multistream: SideStreams %d (want 1..64)", c.SideStreams)
	case c.Prefetch < 0 || c.Prefetch > c.Layers:
		return invalid("multistream: Prefetch %d (want 0..Layers)", c.Prefetch)
	case c.OffloadEvery < 0:
		return invalid("multistream: OffloadEvery %d (want >= 0)", c.OffloadEvery)
	}
	d, f, h, e := uint64(c.Hidden), uint64(c.FFN), uint64(c.Heads), uint64(c.DTypeBytes)
	b, s := uint64(c.Batch), uint64(c.MaxSeq)
	for _, t := range [][]uint64{{d, d, e}, {d, f, e}, {3, b, s, d, e}, {b, h, s, s, e}, {b, s, f, e}} {
		if _, ok := mul(t...); !ok {
			return invalid("multistream: a tensor of %v elements×bytes exceeds %d bytes", t, uint64(maxTensorBytes))
		}
	}
	// Per layer: 7 weights (alloc, record, free) and 7 activations (alloc,
	// free), plus an offload record.
	perLayer := uint64(7*3 + 7*2 + 1)
	if n, ok := mul(perLayer, uint64(c.Layers), uint64(c.Steps)); !ok || n > maxEvents {
		return invalid("multistream: about %d×%d×%d events (limit %d)", perLayer, c.Layers, c.Steps, maxEvents)
	}
	return nil
}

// record appends a RecordStream of live allocation id on stream.
func (g *gen) record(id, stream uint64) {
	g.advance(0)
	g.events = append(g.events, trace.Event{Kind: trace.RecordStream, ID: id, Stream: stream, TimeNs: g.timeNs})
}

// MultiStream generates the offloaded-inference trace of cfg (see
// MultiStreamConfig). Step n begins with Mark n.
func MultiStream(cfg MultiStreamConfig, seed int64) ([]trace.Event, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d, f, h, e := uint64(cfg.Hidden), uint64(cfg.FFN), uint64(cfg.Heads), uint64(cfg.DTypeBytes)
	g := newGen(seed, cfg.Steps*cfg.Layers*40)
	side := func(l int) uint64 { return 1 + uint64(l%cfg.SideStreams) }
	weights := make([][]uint64, cfg.Layers) // ids of each fetched layer's weights
	fetch := func(l int) {
		if l >= cfg.Layers || weights[l] != nil {
			return
		}
		s := side(l)
		ids := make([]uint64, 0, 7)
		for range 4 { // q, k, v, o projections
			ids = append(ids, g.alloc(d*d*e, s))
		}
		for range 3 { // gate, up, down
			ids = append(ids, g.alloc(d*f*e, s))
		}
		for _, id := range ids {
			g.record(id, 0) // used by the compute stream
		}
		weights[l] = ids
	}
	for step := range cfg.Steps {
		g.mark(uint64(step))
		seq := uint64(g.between(cfg.MinSeq, cfg.MaxSeq))
		tokens := uint64(cfg.Batch) * seq
		x := g.alloc(tokens*d*e, 0)
		for l := range cfg.Layers {
			for k := l; k <= l+cfg.Prefetch; k++ {
				fetch(k)
			}
			qkv := g.alloc(3*tokens*d*e, 0)
			scores := g.alloc(uint64(cfg.Batch)*h*seq*seq*e, 0)
			attn := g.alloc(tokens*d*e, 0)
			g.free(scores)
			g.free(qkv)
			up := g.alloc(tokens*f*e, 0)
			gate := g.alloc(tokens*f*e, 0)
			g.free(up)
			out := g.alloc(tokens*d*e, 0)
			g.free(gate)
			g.free(attn)
			if cfg.OffloadEvery > 0 && l%cfg.OffloadEvery == 0 {
				g.record(x, side(l+1)) // copied to the host on a side stream
			}
			g.free(x)
			x = out
			g.freeAll(weights[l]) // by the compute stream, once the layer is done
			weights[l] = nil
		}
		g.free(x)
	}
	return g.events, nil
}
