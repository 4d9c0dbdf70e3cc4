package replay

import (
	"math/rand/v2"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// synth returns a deterministic trace of about n events: a stack of
// activations allocated and freed in reverse (like a training step), plus
// short-lived temporaries of mixed sizes, on one stream.
func synth(n int, seed uint64) []trace.Event {
	rng := rand.New(rand.NewPCG(seed, 1))
	ev := make([]trace.Event, 0, n+64)
	var id uint64
	var stack []uint64
	var t int64
	push := func(e trace.Event) {
		t += 1000
		e.TimeNs = t
		ev = append(ev, e)
	}
	for len(ev) < n {
		// forward: activations
		depth := 16 + rng.IntN(16)
		for i := 0; i < depth && len(ev) < n; i++ {
			id++
			push(trace.Event{Kind: trace.Alloc, ID: id, Size: uint64(1+rng.IntN(64)) << 20})
			stack = append(stack, id)
			// a temporary
			id++
			tmp := id
			push(trace.Event{Kind: trace.Alloc, ID: tmp, Size: uint64(512 + rng.IntN(1<<20))})
			push(trace.Event{Kind: trace.Free, ID: tmp})
		}
		// backward: free in reverse
		for len(stack) > 0 {
			push(trace.Event{Kind: trace.Free, ID: stack[len(stack)-1]})
			stack = stack[:len(stack)-1]
		}
	}
	return ev
}

func sliceOf(ev []trace.Event) trace.EventReader { return trace.NewSliceReader(ev) }
