package workload

import "github.com/vmmalloc/vmmalloc/benchmarks/trace"

// TrainingConfig describes a decoder-only transformer training run.
type TrainingConfig struct {
	Layers          int // transformer blocks
	Hidden          int // model width d
	Heads           int // attention heads (the attention matrix is Batch×Heads×Seq×Seq)
	Vocab           int // vocabulary size (tied embedding / LM head; logits are Batch×Seq×Vocab)
	Batch           int // sequences per step
	MinSeq          int // shortest sequence length in tokens
	MaxSeq          int // longest; each step draws its length uniformly from [MinSeq, MaxSeq]
	Steps           int // optimizer steps
	DTypeBytes      int // bytes per element of weights, gradients, activations (1, 2, 4 or 8)
	OptimizerStates int // optimizer tensors per parameter, created at the first step (Adam: 2); 0..4
}

// DefaultTrainingConfig is a GPT-2-medium-like model (12 × 1024, 185 M
// parameters in bf16) on batches of 4 sequences of 128–1024 tokens, 20
// steps: about 25 k events and a peak of a few GiB live.
func DefaultTrainingConfig() TrainingConfig {
	return TrainingConfig{
		Layers: 12, Hidden: 1024, Heads: 16, Vocab: 32000,
		Batch: 4, MinSeq: 128, MaxSeq: 1024, Steps: 20,
		DTypeBytes: 2, OptimizerStates: 2,
	}
}

func validDType(n int) bool { return n == 1 || n == 2 || n == 4 || n == 8 }

func (c TrainingConfig) validate() error {
	switch {
	case c.Layers < 1, c.Hidden < 1, c.Heads < 1, c.Vocab < 1, c.Batch < 1, c.Steps < 1:
		return invalid("training: Layers, Hidden, Heads, Vocab, Batch and Steps must be >= 1 (got %+v)", c)
	case c.MinSeq < 1 || c.MaxSeq < c.MinSeq:
		return invalid("training: need 1 <= MinSeq <= MaxSeq (got %d, %d)", c.MinSeq, c.MaxSeq)
	case !validDType(c.DTypeBytes):
		return invalid("training: DTypeBytes %d (want 1, 2, 4 or 8)", c.DTypeBytes)
	case c.OptimizerStates < 0 || c.OptimizerStates > 4:
		return invalid("training: OptimizerStates %d (want 0..4)", c.OptimizerStates)
	}
	b, s, d, h, v, e := uint64(c.Batch), uint64(c.MaxSeq), uint64(c.Hidden), uint64(c.Heads), uint64(c.Vocab), uint64(c.DTypeBytes)
	for _, t := range [][]uint64{{b, h, s, s, e}, {b, s, v, 4}, {b, s, d, 4, e}, {d, d, 4, e}, {v, d, e}} {
		if _, ok := mul(t...); !ok {
			return invalid("training: a tensor of %v elements×bytes exceeds %d bytes", t, uint64(maxTensorBytes))
		}
	}
	perStep := uint64(c.Layers)*60 + uint64(12*c.Layers+4)*4 + 20
	if n, ok := mul(perStep, uint64(c.Steps)); !ok || n > maxEvents {
		return invalid("training: about %d×%d events (limit %d)", perStep, c.Steps, maxEvents)
	}
	return nil
}

// TransformerTraining generates a training run. The trace opens with the
// parameters (per layer: two LayerNorms, QKV, output projection, MLP up and
// down, each weight and bias a separate tensor; plus tied embedding,
// positional embedding, final LayerNorm). Each step then:
//
//   - forward: per layer the saved activations (LayerNorm outputs, QKV,
//     softmax probabilities Batch×Heads×Seq², attention context, residuals,
//     MLP up and GELU outputs at 4×Hidden) and short-lived temporaries (raw
//     attention scores, projection outputs), then logits and the fp32
//     log-softmax over Batch×Seq×Vocab;
//   - backward, layers in reverse: gradient temporaries allocated and freed
//     as the activations they consume are released; at the first step each
//     parameter's gradient is allocated when first produced and kept;
//   - optimizer: at the first step OptimizerStates tensors per parameter,
//     then per parameter two update temporaries.
//
// The sequence length is drawn per step from [MinSeq, MaxSeq] with seed, so
// activation sizes differ from step to step as in variable-length training.
// After the last step the persistent tensors are freed, newest first.
func TransformerTraining(cfg TrainingConfig, seed int64) ([]trace.Event, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := uint64(cfg.Hidden)
	e := uint64(cfg.DTypeBytes)
	g := newGen(seed, cfg.Steps*(cfg.Layers*60+(12*cfg.Layers+4)*4))

	// Parameters, in module order.
	type param struct {
		id, size uint64
		grad     uint64   // 0 until the first backward produces it
		states   []uint64 // optimizer state ids
	}
	var params []*param
	newParam := func(elems uint64) *param {
		p := &param{size: elems * e}
		p.id = g.alloc(p.size, 0)
		params = append(params, p)
		return p
	}
	embed := newParam(uint64(cfg.Vocab) * d)
	pos := newParam(uint64(cfg.MaxSeq) * d)
	type layerParams struct{ ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, wup, bup, wdown, bdown *param }
	layers := make([]layerParams, cfg.Layers)
	for l := range layers {
		layers[l] = layerParams{
			ln1w: newParam(d), ln1b: newParam(d),
			wqkv: newParam(3 * d * d), bqkv: newParam(3 * d),
			wo: newParam(d * d), bo: newParam(d),
			ln2w: newParam(d), ln2b: newParam(d),
			wup: newParam(4 * d * d), bup: newParam(4 * d),
			wdown: newParam(4 * d * d), bdown: newParam(d),
		}
	}
	lnfw, lnfb := newParam(d), newParam(d)

	// grad makes sure p has a gradient tensor (allocated on first use).
	grad := func(ps ...*param) {
		for _, p := range ps {
			if p.grad == 0 {
				p.grad = g.alloc(p.size, 0)
			}
		}
	}

	type saved struct{ ln1, qkv, probs, ctx, resid1, ln2, up, gelu, resid2 uint64 }
	acts := make([]saved, cfg.Layers)

	for step := 0; step < cfg.Steps; step++ {
		g.mark(uint64(step))
		b, s := uint64(cfg.Batch), uint64(g.between(cfg.MinSeq, cfg.MaxSeq))
		act := b * s * d * e                      // one Batch×Seq×Hidden activation
		attn := b * uint64(cfg.Heads) * s * s * e // one attention matrix
		logitsBytes := b * s * uint64(cfg.Vocab) * e

		// Forward.
		tokens := g.alloc(b*s*8, 0) // int64 token ids
		h := g.alloc(act, 0)        // embedding + positional output
		for l := range acts {
			a := &acts[l]
			a.ln1 = g.alloc(act, 0)
			a.qkv = g.alloc(3*act, 0)
			scores := g.alloc(attn, 0)
			a.probs = g.alloc(attn, 0)
			g.free(scores)
			a.ctx = g.alloc(act, 0)
			proj := g.alloc(act, 0)
			a.resid1 = g.alloc(act, 0)
			g.free(proj)
			a.ln2 = g.alloc(act, 0)
			a.up = g.alloc(4*act, 0)
			a.gelu = g.alloc(4*act, 0)
			down := g.alloc(act, 0)
			a.resid2 = g.alloc(act, 0)
			g.free(down)
		}
		lnf := g.alloc(act, 0)
		logits := g.alloc(logitsBytes, 0)
		logProbs := g.alloc(b*s*uint64(cfg.Vocab)*4, 0) // fp32 log-softmax
		loss := g.alloc(4, 0)

		// Backward.
		gLogits := g.alloc(logitsBytes, 0)
		g.free(logProbs)
		g.free(logits)
		grad(embed) // tied LM head
		gx := g.alloc(act, 0)
		g.free(gLogits)
		grad(lnfw, lnfb)
		gNext := g.alloc(act, 0)
		g.free(gx)
		g.free(lnf)
		gx = gNext
		for l := cfg.Layers - 1; l >= 0; l-- {
			a, p := &acts[l], &layers[l]
			// MLP.
			gGelu := g.alloc(4*act, 0)
			grad(p.wdown, p.bdown)
			g.free(a.gelu)
			gUp := g.alloc(4*act, 0)
			g.free(gGelu)
			grad(p.wup, p.bup)
			g.free(a.up)
			gLn2 := g.alloc(act, 0)
			g.free(gUp)
			grad(p.ln2w, p.ln2b)
			g.free(a.ln2)
			gMid := g.alloc(act, 0)
			g.free(gLn2)
			g.free(a.resid2)
			g.free(gx)
			// Attention.
			gCtx := g.alloc(act, 0)
			grad(p.wo, p.bo)
			g.free(a.resid1)
			gProbs := g.alloc(attn, 0)
			g.free(a.ctx)
			gScores := g.alloc(attn, 0)
			g.free(gProbs)
			g.free(a.probs)
			gQKV := g.alloc(3*act, 0)
			g.free(gScores)
			g.free(gCtx)
			grad(p.wqkv, p.bqkv)
			g.free(a.qkv)
			gLn1 := g.alloc(act, 0)
			g.free(gQKV)
			grad(p.ln1w, p.ln1b)
			g.free(a.ln1)
			gx = g.alloc(act, 0)
			g.free(gLn1)
			g.free(gMid)
		}
		grad(pos)
		g.free(gx)
		g.free(h)
		g.free(loss)
		g.free(tokens)

		// Optimizer.
		for _, p := range params {
			for len(p.states) < cfg.OptimizerStates {
				p.states = append(p.states, g.alloc(p.size, 0))
			}
			t1 := g.alloc(p.size, 0)
			t2 := g.alloc(p.size, 0)
			g.free(t1)
			g.free(t2)
		}
	}

	// Teardown: optimizer states, gradients, parameters, newest first.
	for i := len(params) - 1; i >= 0; i-- {
		g.freeReverse(params[i].states)
	}
	for i := len(params) - 1; i >= 0; i-- {
		if params[i].grad != 0 {
			g.free(params[i].grad)
		}
	}
	for i := len(params) - 1; i >= 0; i-- {
		g.free(params[i].id)
	}
	return g.events, nil
}
