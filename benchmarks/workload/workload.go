// Package workload generates synthetic allocation traces for fragmentation
// studies: a transformer training loop, an LLM inference server with a
// growing KV cache, and a random mix of sizes and lifetimes.
//
// Every generator is a pure function of its config and seed: the same
// inputs give the same []trace.Event (math/rand/v2 PCG, no map iteration,
// no clock). The traces they produce satisfy
// trace.Summarize's rules: ids are 1, 2, 3, … in Alloc order and never
// reused, every Free and RecordStream names a live allocation, and every
// allocation — persistent ones (weights, gradients, optimizer state)
// included — is freed before the trace ends, so a replay that finishes
// with memory still allocated has leaked. A Free carries the stream of its
// Alloc. Mark events number the steps (Mark ID = step index from 0).
// TimeNs is synthetic: it advances a little per event and in proportion to
// the bytes each tensor occupies, so it orders events but measures nothing.
//
// Sizes are the bytes a framework would request (elements × dtype bytes),
// not rounded; rounding is the allocator's business.
//
// Configs are validated: a zero or negative dimension, an inverted range,
// a tensor over 256 TiB or a trace estimated above 50 M events yields
// ErrInvalidConfig and no events.
package workload

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// ErrInvalidConfig reports a generator config that is out of range.
var ErrInvalidConfig = errors.New("workload: invalid config")

const (
	maxTensorBytes = 1 << 48    // largest single allocation a config may imply
	maxEvents      = 50_000_000 // largest trace a config may imply
	rngStream      = 0x766d6d61 // second PCG word; fixed so the seed alone selects the stream
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// mul multiplies sizes, reporting overflow past maxTensorBytes.
func mul(xs ...uint64) (uint64, bool) {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, x)
		if hi != 0 || lo > maxTensorBytes {
			return 0, false
		}
		p = lo
	}
	return p, true
}

// gen accumulates events.
type gen struct {
	rng    *rand.Rand
	events []trace.Event
	nextID uint64
	timeNs int64
	stream map[uint64]uint64 // live id -> stream (for Free.Stream)
}

func newGen(seed int64, capHint int) *gen {
	return &gen{
		rng:    rand.New(rand.NewPCG(uint64(seed), rngStream)),
		events: make([]trace.Event, 0, capHint),
		nextID: 1,
		stream: make(map[uint64]uint64),
	}
}

// advance moves synthetic time: a fixed cost per event plus one ns per
// 2 KiB touched.
func (g *gen) advance(nbytes uint64) {
	g.timeNs += 200 + int64(nbytes>>11)
}

func (g *gen) alloc(nbytes, stream uint64) uint64 {
	g.advance(nbytes)
	id := g.nextID
	g.nextID++
	g.stream[id] = stream
	g.events = append(g.events, trace.Event{Kind: trace.Alloc, ID: id, Size: nbytes, Stream: stream, TimeNs: g.timeNs})
	return id
}

func (g *gen) free(id uint64) {
	g.advance(0)
	s := g.stream[id]
	delete(g.stream, id)
	g.events = append(g.events, trace.Event{Kind: trace.Free, ID: id, Stream: s, TimeNs: g.timeNs})
}

func (g *gen) freeAll(ids []uint64) {
	for _, id := range ids {
		g.free(id)
	}
}

// freeReverse frees ids last-allocated first.
func (g *gen) freeReverse(ids []uint64) {
	for i := len(ids) - 1; i >= 0; i-- {
		g.free(ids[i])
	}
}

func (g *gen) mark(n uint64) {
	g.advance(0)
	g.events = append(g.events, trace.Event{Kind: trace.Mark, ID: n, TimeNs: g.timeNs})
}

// between returns a uniform int in [lo, hi].
func (g *gen) between(lo, hi int) int { return lo + g.rng.IntN(hi-lo+1) }

// Names lists the workloads Generate knows, in a stable order.
func Names() []string { return []string{"training", "inference", "mix", "multistream"} }

// Generate runs the named workload ("training", "inference", "mix" or
// "multistream") with its default config and returns the events and a
// trace.Info describing them. An unknown name yields ErrInvalidConfig.
func Generate(name string, seed int64) ([]trace.Event, trace.Info, error) {
	var ev []trace.Event
	var err error
	var fn string
	switch name {
	case "training":
		fn = "TransformerTraining"
		ev, err = TransformerTraining(DefaultTrainingConfig(), seed)
	case "inference":
		fn = "LLMInference"
		ev, err = LLMInference(DefaultInferenceConfig(), seed)
	case "mix":
		fn = "RandomMix"
		ev, err = RandomMix(DefaultMixConfig(), seed)
	case "multistream":
		fn = "MultiStream"
		ev, err = MultiStream(DefaultMultiStreamConfig(), seed)
	default:
		return nil, trace.Info{}, invalid("unknown workload %q (want one of %q)", name, Names())
	}
	if err != nil {
		return nil, trace.Info{}, err
	}
	return ev, trace.Info{Name: name, Source: fmt.Sprintf("workload.%s default config, seed %d", fn, seed)}, nil
}

// DefaultSeed is the seed Default uses.
const DefaultSeed = 1

// Default returns the embedded default synthetic workload: a small
// transformer training run (DefaultTrainingConfig, DefaultSeed).
func Default() ([]trace.Event, error) {
	return TransformerTraining(DefaultTrainingConfig(), DefaultSeed)
}

// poisson draws from a Poisson distribution with mean lambda (Knuth; fine
// for the small means used here).
func (g *gen) poisson(lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	l := math.Exp(-lambda)
	k, p := 0, 1.0
	for {
		p *= g.rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
