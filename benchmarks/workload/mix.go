package workload

import (
	"container/heap"
	"math"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// MixConfig describes a random allocation mix, the classic allocator
// stress test.
type MixConfig struct {
	Allocs           int     // number of allocations
	MinSize          uint64  // sizes are log-uniform in [MinSize, MaxSize] bytes
	MaxSize          uint64  //
	MeanLifetime     float64 // mean lifetime, in allocations (exponentially distributed), >= 1
	Streams          int     // allocations spread uniformly over streams 0..Streams-1
	RecordStreamProb float64 // per allocation: chance of a RecordStream on another stream (needs Streams >= 2)
	SyncProb         float64 // per allocation: chance of a StreamSync of a random stream
	EmptyCacheProb   float64 // per allocation: chance of an EmptyCache
}

// DefaultMixConfig: 20 000 allocations of 512 B–64 MiB living about 200
// allocations each, on 2 streams, with occasional record_stream, syncs and
// empty_cache: about 1.6 GiB live at peak.
func DefaultMixConfig() MixConfig {
	return MixConfig{
		Allocs: 20000, MinSize: 512, MaxSize: 64 << 20, MeanLifetime: 200,
		Streams: 2, RecordStreamProb: 0.02, SyncProb: 0.01, EmptyCacheProb: 0.0005,
	}
}

func validProb(p float64) bool { return p >= 0 && p <= 1 }

func (c MixConfig) validate() error {
	switch {
	case c.Allocs < 0 || c.Allocs > maxEvents/5:
		return invalid("mix: Allocs %d (want 0..%d)", c.Allocs, maxEvents/5)
	case c.MinSize < 1 || c.MaxSize < c.MinSize || c.MaxSize > maxTensorBytes:
		return invalid("mix: need 1 <= MinSize <= MaxSize <= %d (got %d, %d)", uint64(maxTensorBytes), c.MinSize, c.MaxSize)
	case !(c.MeanLifetime >= 1 && c.MeanLifetime <= 1e9):
		return invalid("mix: MeanLifetime %v (want 1..1e9)", c.MeanLifetime)
	case c.Streams < 1 || c.Streams > 1024:
		return invalid("mix: Streams %d (want 1..1024)", c.Streams)
	case !validProb(c.RecordStreamProb) || !validProb(c.SyncProb) || !validProb(c.EmptyCacheProb):
		return invalid("mix: probabilities must be in [0, 1] (got %v, %v, %v)", c.RecordStreamProb, c.SyncProb, c.EmptyCacheProb)
	}
	return nil
}

type death struct {
	at int    // allocation index at which to free
	id uint64 // allocation
}

// deaths is a min-heap by (at, id): ties free the older allocation first.
type deaths []death

func (h deaths) Len() int { return len(h) }
func (h deaths) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].id < h[j].id
}
func (h deaths) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *deaths) Push(x any)   { *h = append(*h, x.(death)) }
func (h *deaths) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// RandomMix generates cfg.Allocs allocations. Before allocation i, every
// allocation whose lifetime has run out is freed; then the new one gets a
// log-uniform size, a uniform stream and an exponential lifetime (at least
// one allocation), and with the configured probabilities a RecordStream
// (on a different stream), a StreamSync and an EmptyCache follow. At the
// end the survivors are freed in order of their scheduled death.
func RandomMix(cfg MixConfig, seed int64) ([]trace.Event, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := newGen(seed, cfg.Allocs*2+cfg.Allocs/16)
	logMin, logMax := math.Log2(float64(cfg.MinSize)), math.Log2(float64(cfg.MaxSize))
	pending := &deaths{}
	for i := 0; i < cfg.Allocs; i++ {
		for pending.Len() > 0 && (*pending)[0].at <= i {
			g.free(heap.Pop(pending).(death).id)
		}
		size := uint64(math.Exp2(logMin + g.rng.Float64()*(logMax-logMin)))
		size = min(max(size, cfg.MinSize), cfg.MaxSize) // guard rounding at the ends
		stream := uint64(g.rng.IntN(cfg.Streams))
		id := g.alloc(size, stream)
		life := 1 + int(g.rng.ExpFloat64()*cfg.MeanLifetime)
		if life > cfg.Allocs { // beyond the end: freed in the final sweep anyway
			life = cfg.Allocs
		}
		heap.Push(pending, death{at: i + life, id: id})
		if cfg.Streams > 1 && g.rng.Float64() < cfg.RecordStreamProb {
			other := uint64(g.rng.IntN(cfg.Streams - 1))
			if other >= stream {
				other++
			}
			g.advance(0)
			g.events = append(g.events, trace.Event{Kind: trace.RecordStream, ID: id, Stream: other, TimeNs: g.timeNs})
		}
		if g.rng.Float64() < cfg.SyncProb {
			g.advance(0)
			g.events = append(g.events, trace.Event{Kind: trace.StreamSync, Stream: uint64(g.rng.IntN(cfg.Streams)), TimeNs: g.timeNs})
		}
		if g.rng.Float64() < cfg.EmptyCacheProb {
			g.advance(0)
			g.events = append(g.events, trace.Event{Kind: trace.EmptyCache, TimeNs: g.timeNs})
		}
	}
	for pending.Len() > 0 {
		g.free(heap.Pop(pending).(death).id)
	}
	return g.events, nil
}
