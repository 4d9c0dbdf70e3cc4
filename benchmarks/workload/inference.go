package workload

import "github.com/vmmalloc/vmmalloc/benchmarks/trace"

// InferenceConfig describes an LLM serving loop with continuous batching.
type InferenceConfig struct {
	Layers        int     // transformer blocks
	Hidden        int     // model width d
	Heads         int     // attention heads
	Vocab         int     // vocabulary size
	DTypeBytes    int     // bytes per element (1, 2, 4 or 8)
	Steps         int     // decode iterations
	MaxBatch      int     // most requests decoded together
	ArrivalRate   float64 // mean requests arriving per step (Poisson), 0..100
	MinPrompt     int     // prompt length range in tokens
	MaxPrompt     int     //
	MinOutput     int     // generated length range in tokens
	MaxOutput     int     //
	KVChunkTokens int     // the KV cache grows in chunks of this many tokens
	ReallocKV     bool    // grow a request's cache by reallocating it whole (torch.cat style) instead of adding a chunk (paged style)
}

// DefaultInferenceConfig is a 16 × 2048 model in bf16 serving up to 16
// requests of 64–1024 prompt and 16–512 output tokens, about one arrival
// every two steps, paged KV chunks of 16 tokens, 400 steps: tens of
// thousands of events and a few GiB live.
func DefaultInferenceConfig() InferenceConfig {
	return InferenceConfig{
		Layers: 16, Hidden: 2048, Heads: 16, Vocab: 32000, DTypeBytes: 2,
		Steps: 400, MaxBatch: 16, ArrivalRate: 0.5,
		MinPrompt: 64, MaxPrompt: 1024, MinOutput: 16, MaxOutput: 512,
		KVChunkTokens: 16,
	}
}

func (c InferenceConfig) validate() error {
	switch {
	case c.Layers < 1, c.Hidden < 1, c.Heads < 1, c.Vocab < 1, c.Steps < 1, c.MaxBatch < 1, c.KVChunkTokens < 1:
		return invalid("inference: Layers, Hidden, Heads, Vocab, Steps, MaxBatch and KVChunkTokens must be >= 1 (got %+v)", c)
	case c.MinPrompt < 1 || c.MaxPrompt < c.MinPrompt:
		return invalid("inference: need 1 <= MinPrompt <= MaxPrompt (got %d, %d)", c.MinPrompt, c.MaxPrompt)
	case c.MinOutput < 1 || c.MaxOutput < c.MinOutput:
		return invalid("inference: need 1 <= MinOutput <= MaxOutput (got %d, %d)", c.MinOutput, c.MaxOutput)
	case !validDType(c.DTypeBytes):
		return invalid("inference: DTypeBytes %d (want 1, 2, 4 or 8)", c.DTypeBytes)
	case !(c.ArrivalRate >= 0 && c.ArrivalRate <= 100):
		return invalid("inference: ArrivalRate %v (want 0..100)", c.ArrivalRate)
	}
	l, d, h, v, e := uint64(c.Layers), uint64(c.Hidden), uint64(c.Heads), uint64(c.Vocab), uint64(c.DTypeBytes)
	ctx := uint64(c.MaxPrompt) + uint64(c.MaxOutput) + uint64(c.KVChunkTokens)
	p, mb := uint64(c.MaxPrompt), uint64(c.MaxBatch)
	for _, t := range [][]uint64{{2, l, d, e, ctx}, {h, p, p, e}, {mb, h, ctx, e}, {4, d, d, e}, {v, d, e}, {mb, v, 4}, {4, p, d, e}} {
		if _, ok := mul(t...); !ok {
			return invalid("inference: a tensor of %v elements×bytes exceeds %d bytes", t, uint64(maxTensorBytes))
		}
	}
	// Decode: ~6 events per layer per step; prefill: ~8 per layer per request.
	perStep := 6*l + 10 + uint64(c.ArrivalRate*float64(8*l+2*ctx/uint64(c.KVChunkTokens)+10)) + 1
	if n, ok := mul(perStep, uint64(c.Steps)); !ok || n > maxEvents {
		return invalid("inference: about %d×%d events (limit %d)", perStep, c.Steps, maxEvents)
	}
	return nil
}

type request struct {
	ctx, output int      // tokens in context; tokens still to generate
	capacity    int      // tokens the KV allocations hold
	kv          []uint64 // KV cache allocation ids, oldest first
}

// LLMInference generates a serving trace. The weights (per layer QKV,
// output projection, MLP up and down, two LayerNorms; embedding, LM head,
// final LayerNorm) are allocated first. Each step then:
//
//   - new requests arrive (Poisson with mean ArrivalRate) into a queue
//     capped at 4×MaxBatch (arrivals beyond it are turned away);
//   - while fewer than MaxBatch are active, a queued request is admitted
//     and prefilled: KV cache for its prompt (Layers×2×Hidden×DTypeBytes
//     per token, in KVChunkTokens chunks) and per-layer prefill
//     temporaries (QKV, Heads×Prompt² attention scores, 4×Hidden MLP),
//     freed as soon as the layer is done;
//   - one decode iteration for the whole batch: per-layer temporaries
//     sized by the batch and its longest context, then logits; each active
//     request gains a token, and when its cache is full it grows by one
//     chunk (a new allocation, or with ReallocKV a larger copy replacing
//     the old);
//   - requests that have generated their output tokens free their cache.
//
// At the end the remaining requests finish and the weights are freed.
func LLMInference(cfg InferenceConfig, seed int64) ([]trace.Event, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d, e, h := uint64(cfg.Hidden), uint64(cfg.DTypeBytes), uint64(cfg.Heads)
	kvPerToken := uint64(cfg.Layers) * 2 * d * e
	chunk := cfg.KVChunkTokens
	g := newGen(seed, cfg.Steps*(6*cfg.Layers+20))

	var weights []uint64
	w := func(elems uint64) { weights = append(weights, g.alloc(elems*e, 0)) }
	w(uint64(cfg.Vocab) * d) // embedding
	for range cfg.Layers {
		w(d) // ln1
		w(3 * d * d)
		w(d * d)
		w(d) // ln2
		w(4 * d * d)
		w(4 * d * d)
	}
	w(d)                     // final LayerNorm
	w(uint64(cfg.Vocab) * d) // LM head

	// grow extends r's cache to hold at least tokens.
	grow := func(r *request, tokens int) {
		if tokens <= r.capacity {
			return
		}
		if cfg.ReallocKV {
			newCap := (tokens + chunk - 1) / chunk * chunk
			id := g.alloc(uint64(newCap)*kvPerToken, 0)
			g.freeAll(r.kv) // copied into the new buffer
			r.kv, r.capacity = append(r.kv[:0], id), newCap
			return
		}
		for r.capacity < tokens {
			r.kv = append(r.kv, g.alloc(uint64(chunk)*kvPerToken, 0))
			r.capacity += chunk
		}
	}

	var queue []request
	var active []*request
	for step := 0; step < cfg.Steps; step++ {
		g.mark(uint64(step))
		for n := g.poisson(cfg.ArrivalRate); n > 0 && len(queue) < 4*cfg.MaxBatch; n-- {
			queue = append(queue, request{
				ctx:    g.between(cfg.MinPrompt, cfg.MaxPrompt),
				output: g.between(cfg.MinOutput, cfg.MaxOutput),
			})
		}
		// Admission and prefill.
		for len(active) < cfg.MaxBatch && len(queue) > 0 {
			r := &request{ctx: queue[0].ctx, output: queue[0].output}
			queue = queue[1:]
			p := uint64(r.ctx)
			grow(r, r.ctx)
			x := g.alloc(p*d*e, 0) // hidden states
			for range cfg.Layers {
				qkv := g.alloc(3*p*d*e, 0)
				scores := g.alloc(h*p*p*e, 0)
				attnOut := g.alloc(p*d*e, 0)
				g.free(scores)
				g.free(qkv)
				mlp := g.alloc(4*p*d*e, 0)
				g.free(attnOut)
				g.free(mlp)
			}
			logits := g.alloc(uint64(cfg.Vocab)*4, 0) // last position only, fp32
			g.free(x)
			g.free(logits)
			active = append(active, r)
		}
		if len(active) == 0 {
			continue
		}
		// One batched decode iteration.
		b := uint64(len(active))
		maxCtx := 0
		for _, r := range active {
			maxCtx = max(maxCtx, r.ctx)
		}
		x := g.alloc(b*d*e, 0)
		for range cfg.Layers {
			qkv := g.alloc(3*b*d*e, 0)
			scores := g.alloc(b*h*uint64(maxCtx+1)*e, 0)
			g.free(scores)
			mlp := g.alloc(4*b*d*e, 0)
			g.free(qkv)
			g.free(mlp)
		}
		logits := g.alloc(b*uint64(cfg.Vocab)*4, 0)
		tokens := g.alloc(b*8, 0)
		g.free(logits)
		g.free(x)
		g.free(tokens)
		// Each request gains a token; finished ones release their cache.
		kept := active[:0]
		for _, r := range active {
			r.ctx++
			r.output--
			grow(r, r.ctx)
			if r.output <= 0 {
				g.freeAll(r.kv)
				continue
			}
			kept = append(kept, r)
		}
		active = kept
	}
	for _, r := range active {
		g.freeAll(r.kv)
	}
	g.freeReverse(weights)
	return g.events, nil
}
