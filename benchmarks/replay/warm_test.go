package replay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// TestWarmReplaySettles replays the Malloc and Free calls of training
// steps (BenchmarkWarmReplay measures the first), pass after pass on one
// allocator, and requires that the passes stop calling the driver once the
// heap holds the layouts the step produces: within settleBound passes, and
// then for steadyPasses passes in a row. The first pass grows the heap in
// the order the step allocates; a later pass starts from a heap that is
// all free and places the same blocks by best fit into it, which fragments
// it differently, so a few passes still grow (and defragment, unmapping
// holes to remap them where the heap grows) until reserved memory holds
// every such layout, or until the defrag limit has learned the slack the
// step needs (allocator: learnDefragSlack). BenchmarkWarmReplay's
// driver-calls/op is those passes' calls spread over b.N.
func TestWarmReplaySettles(t *testing.T) {
	const settleBound, steadyPasses = 8, 5
	for _, name := range []string{"cs336_ctx128_fullstep.pickle", "cs336_medium_ctx1024_train.pickle"} {
		t.Run(name, func(t *testing.T) {
			warmReplaySettles(t, name, settleBound, steadyPasses)
		})
	}
}

func warmReplaySettles(t *testing.T, name string, settleBound, steadyPasses int) {
	pt := loadSnapshot(t, sharedTrace(t, name))
	var events []trace.Event
	for _, ev := range pt.Events {
		if ev.Kind == trace.Alloc || ev.Kind == trace.Free {
			events = append(events, ev)
		}
	}
	ops, slots := denseOps(events)
	ptrs := make([]uintptr, slots)
	e, err := emulated.New(emulated.WithCapacity(80 << 30))
	require.NoError(t, err)
	a, err := allocator.New(e, allocator.DefaultConfig())
	require.NoError(t, err)
	defer func() {
		require.NoError(t, a.Close())
		require.NoError(t, e.Close())
	}()
	calls := func() (n int64) {
		for _, c := range e.CallCounts() {
			n += c
		}
		return n
	}
	pass := func() int64 {
		before := calls()
		for _, op := range ops {
			if op.size != 0 {
				p, err := a.Malloc(op.size, 0)
				require.NoError(t, err)
				ptrs[op.slot] = p
				continue
			}
			require.NoError(t, a.Free(ptrs[op.slot]))
			ptrs[op.slot] = 0
		}
		for i, p := range ptrs {
			if p != 0 {
				require.NoError(t, a.Free(p))
				ptrs[i] = 0
			}
		}
		return calls() - before
	}
	first := pass()
	firstReserved := a.MemoryReserved()
	settled, warmCalls := 0, int64(0)
	for i := 1; i <= settleBound && settled == 0; i++ {
		if n := pass(); n > 0 {
			warmCalls += n
		} else {
			settled = i
		}
	}
	require.NotZero(t, settled, "a pass still calls the driver after %d warm passes (%d calls)", settleBound, warmCalls)
	for i := range steadyPasses {
		assert.Zero(t, pass(), "steady pass %d", settled+1+i)
	}
	require.NoError(t, a.Check())
	t.Logf("first pass: %d driver calls, reserved %d MiB; passes 1..%d: %d calls; then none; reserved %d MiB",
		first, firstReserved>>20, settled-1, warmCalls, a.MemoryReserved()>>20)
}
