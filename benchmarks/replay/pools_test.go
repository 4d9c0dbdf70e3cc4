package replay

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

var (
	graphPool = trace.PoolID{1, 0} // the first CUDA graph's pool, as PyTorch numbers it
	memPool   = trace.PoolID{0, 1} // the first torch.cuda.MemPool
)

func allocIn(pool trace.PoolID, id, size, stream uint64) trace.Event {
	e := alloc(id, size, stream)
	e.Pool = pool
	return e
}

// graphCaptureTrace is a training step whose middle is captured as a CUDA
// graph (PyTorch's private pool (1, 0)) plus a MemPool (0, 1): the
// default pool peaks at 10 MiB live, the graph pool at 34, the MemPool at
// 1.
func graphCaptureTrace() []trace.Event {
	return []trace.Event{
		alloc(1, 10*mib, 0),              // weights, default pool
		allocIn(graphPool, 2, 30*mib, 0), // capture: static input
		allocIn(graphPool, 3, 4*mib, 0),  // graph pool live: 34 MiB
		free(2),
		allocIn(graphPool, 4, 20*mib, 0), // fits the pool's freed 30 MiB
		allocIn(memPool, 5, 1*mib, 1),
		alloc(6, 6*mib, 0), // the default pool cannot use the graph pool's free memory
		free(6),
		{Kind: trace.EmptyCache},
		free(5),
	}
}

func poolByName(t *testing.T, rep *Report, name string) PoolReport {
	t.Helper()
	for _, p := range rep.Pools {
		if p.Pool == name {
			return p
		}
	}
	t.Fatalf("no pool %q in %+v", name, rep.Pools)
	return PoolReport{}
}

// TestReplayPools: each pool's allocations land in an allocator pool of
// its own, the per-pool peaks are the pool's, and the totals add up.
func TestReplayPools(t *testing.T) {
	for _, config := range []string{"", "expandable_segments:False"} {
		t.Run("config="+config, func(t *testing.T) {
			rep, err := Run(sliceOf(graphCaptureTrace()), Options{Config: mustConfig(t, config), Check: true})
			require.NoError(t, err)
			require.Len(t, rep.Pools, 3)
			assert.Equal(t, []string{"default", "pool(0,1)", "pool(1,0)"},
				[]string{rep.Pools[0].Pool, rep.Pools[1].Pool, rep.Pools[2].Pool}, "default first, then by ID")
			def, graph, mem := poolByName(t, rep, "default"), poolByName(t, rep, "pool(1,0)"), poolByName(t, rep, "pool(0,1)")
			assert.Equal(t, [2]uint64{1, 0}, graph.ID)
			assert.Equal(t, [2]uint64{0, 1}, mem.ID)

			assert.Equal(t, [3]int64{2, 3, 1}, [3]int64{def.Allocs, graph.Allocs, mem.Allocs})
			assert.Equal(t, [3]uint64{16 * mib, 34 * mib, 1 * mib}, [3]uint64{def.PeakLive, graph.PeakLive, mem.PeakLive})
			sum, err := trace.Summarize(sliceOf(graphCaptureTrace())) // the reference
			require.NoError(t, err)
			for _, p := range rep.Pools {
				assert.Equal(t, sum.PoolPeakLive[p.ID], p.PeakLive, p.Pool)
			}
			// MiB multiples round to themselves: each pool allocated exactly
			// its live bytes at its peak.
			for _, p := range rep.Pools {
				assert.Equal(t, p.PeakLive, p.PeakRequested, p.Pool)
				assert.Equal(t, p.PeakLive, p.PeakAllocated, p.Pool)
				assert.GreaterOrEqual(t, p.PeakReserved, p.PeakAllocated, p.Pool)
				assert.InDelta(t, float64(p.PeakReserved)/float64(p.PeakLive), p.ReservedOverLive, 1e-12, p.Pool)
			}
			assert.Equal(t, [3]uint64{10 * mib, 24 * mib, 0}, [3]uint64{def.EndLive, graph.EndLive, mem.EndLive})
			assert.Equal(t, [3]uint64{10 * mib, 24 * mib, 0}, [3]uint64{def.EndAllocated, graph.EndAllocated, mem.EndAllocated})

			// The graph pool kept its 34 MiB peak mapped: the 20 MiB
			// allocation reused its free memory, the default pool's 6 MiB
			// did not, and the EmptyCache event left it alone (PyTorch's
			// empty_cache releases the default pool only).
			assert.GreaterOrEqual(t, graph.EndReserved, 34*uint64(mib))
			assert.GreaterOrEqual(t, def.PeakReserved, 16*uint64(mib))
			assert.Less(t, def.EndReserved, 16*uint64(mib), "the default pool's cache was released")

			// Totals add up; peaks are per pool.
			var allocs, ooms int64
			var endLive, endAlloc, endRes, sumPeakRes, maxPeakRes uint64
			for _, p := range rep.Pools {
				allocs += p.Allocs
				ooms += p.OOMs
				endLive += p.EndLive
				endAlloc += p.EndAllocated
				endRes += p.EndReserved
				sumPeakRes += p.PeakReserved
				maxPeakRes = max(maxPeakRes, p.PeakReserved)
			}
			assert.Equal(t, rep.Allocs, allocs)
			assert.Equal(t, rep.OOMs, ooms)
			assert.Equal(t, rep.EndLive, endLive)
			assert.Equal(t, rep.EndAllocated, endAlloc)
			assert.Equal(t, rep.EndReserved, endRes)
			assert.LessOrEqual(t, maxPeakRes, rep.PeakReserved)
			assert.GreaterOrEqual(t, sumPeakRes, rep.PeakReserved)
			assert.Equal(t, 44*uint64(mib), rep.PeakLive, "10 + 30 + 4 MiB, before id 2 is freed")
		})
	}
}

// TestReplayPoolsDefaultOnly: a trace that names no private pool has no
// Pools, and the pool field of the formats changes nothing: the same
// events with Pool zero replay to the same figures as before pools
// existed (the shared-trace tests check the real traces).
func TestReplayPoolsDefaultOnly(t *testing.T) {
	ev := synth(3000, 1)
	rep, err := Run(sliceOf(ev), Options{MaxSamples: -1})
	require.NoError(t, err)
	assert.Nil(t, rep.Pools)
	var text bytes.Buffer
	require.NoError(t, WriteText(&text, rep))
	assert.NotContains(t, text.String(), "pools")

	// The same trace in one private pool: the same peaks, in that pool.
	inPool := make([]trace.Event, len(ev))
	for i, e := range ev {
		if e.Kind == trace.Alloc {
			e.Pool = memPool
		}
		inPool[i] = e
	}
	rep2, err := Run(sliceOf(inPool), Options{MaxSamples: -1, Check: true})
	require.NoError(t, err)
	require.Len(t, rep2.Pools, 2)
	assert.Equal(t, PoolReport{Pool: "default", ReservedOverLive: 0}, rep2.Pools[0])
	p := rep2.Pools[1]
	assert.Equal(t, rep.PeakLive, p.PeakLive)
	assert.Equal(t, rep.PeakAllocated, p.PeakAllocated)
	assert.Equal(t, rep.PeakReserved, p.PeakReserved)
	assert.Equal(t, rep.PeakReserved, rep2.PeakReserved)
	assert.Equal(t, rep.Allocs, p.Allocs)
	text.Reset()
	require.NoError(t, WriteText(&text, rep2))
	assert.Contains(t, text.String(), "  pools             2 ")
	assert.Contains(t, text.String(), "    pool(0,1)        ")
}

// TestReplayManyPools: a trace that uses more private pools than an
// allocator holds replays by closing empty ones (keeping their figures),
// and fails with ErrTooManyPools when they all hold memory.
func TestReplayManyPools(t *testing.T) {
	const pools = 70
	var ev []trace.Event
	id := uint64(0)
	for round := range 2 {
		for i := range pools {
			id++
			ev = append(ev, allocIn(trace.PoolID{0, uint64(i + 1)}, id, uint64(round+1)*mib, 0), free(id))
		}
	}
	rep, err := Run(sliceOf(ev), Options{MaxSamples: -1, Check: true})
	require.NoError(t, err)
	require.Len(t, rep.Pools, pools+1)
	reopened := 0
	for i, p := range rep.Pools[1:] {
		assert.Equal(t, fmt.Sprintf("pool(0,%d)", i+1), p.Pool)
		assert.Equal(t, int64(2), p.Allocs)
		assert.Equal(t, 2*uint64(mib), p.PeakLive)
		assert.Equal(t, 2*uint64(mib), p.PeakAllocated, "the peak of the pool's second life")
		assert.GreaterOrEqual(t, p.PeakReserved, 2*uint64(mib))
		reopened += p.Reopened
	}
	assert.Positive(t, reopened)
	sum, err := trace.Summarize(sliceOf(ev))
	require.NoError(t, err)
	for _, p := range rep.Pools {
		assert.Equal(t, sum.PoolPeakLive[p.ID], p.PeakLive, p.Pool)
	}

	var held []trace.Event
	for i := range 65 {
		held = append(held, allocIn(trace.PoolID{0, uint64(i + 1)}, uint64(i+1), mib, 0))
	}
	_, err = Run(sliceOf(held), Options{MaxSamples: -1})
	require.ErrorIs(t, err, ErrTooManyPools)
	assert.ErrorContains(t, err, "pool(0,65)")
}

// TestReplayPoolsSnapshotRoundTrip: a replay's snapshot records the pool
// of every segment and trace entry, and the importer reads them back: the
// re-imported trace has every alloc in its original pool and replays to
// the same per-pool peaks.
func TestReplayPoolsSnapshotRoundTrip(t *testing.T) {
	ev := graphCaptureTrace()
	ev = ev[:len(ev)-2] // no empty_cache, which the format cannot express; id 5 stays live
	var snap bytes.Buffer
	orig, err := Run(sliceOf(ev), Options{Snapshot: &snap, MaxSamples: -1})
	require.NoError(t, err)

	pt, err := trace.ImportPyTorchSnapshot(bytes.NewReader(snap.Bytes()), 0)
	require.NoError(t, err)
	var want, got []trace.PoolID
	for _, e := range ev {
		if e.Kind == trace.Alloc {
			want = append(want, e.Pool)
		}
	}
	for _, e := range pt.Events {
		if e.Kind == trace.Alloc {
			got = append(got, e.Pool)
		}
	}
	assert.Equal(t, want, got)
	assert.Equal(t, pt.Allocs, pt.AllocPoolIDs, "vmmalloc writes every entry's pool_id")
	assert.Equal(t, map[trace.PoolID]int{graphPool: 3, memPool: 1}, pt.PoolAllocs)
	assert.Positive(t, pt.PrivateSegments, "the graph and MemPool memory is still mapped")

	again, err := Run(pt.Reader(), Options{MaxSamples: -1})
	require.NoError(t, err)
	require.Len(t, again.Pools, len(orig.Pools))
	for i := range orig.Pools {
		o, a := orig.Pools[i], again.Pools[i]
		assert.Equal(t, o.Pool, a.Pool)
		assert.Equal(t, [3]uint64{o.PeakLive, o.PeakAllocated, o.PeakReserved}, [3]uint64{a.PeakLive, a.PeakAllocated, a.PeakReserved}, o.Pool)
	}

}

// TestReplayPoolsHostile: a trace naming thousands of pools, one at a
// time, replays with at most 64 open (each a few allocator calls), and one
// naming pools only through zero-byte allocations opens none.
func TestReplayPoolsHostile(t *testing.T) {
	const n = 2000
	ev := make([]trace.Event, 0, 2*n)
	for i := range uint64(n) {
		ev = append(ev, allocIn(trace.PoolID{i + 1, 0}, i+1, 4096, 0), free(i+1))
	}
	rep, err := Run(sliceOf(ev), Options{MaxSamples: -1, Check: true})
	require.NoError(t, err)
	require.Len(t, rep.Pools, n+1)
	assert.Equal(t, "pool(2000,0)", rep.Pools[n].Pool)
	assert.Equal(t, uint64(4096), rep.Pools[n].PeakLive)

	ev = ev[:0]
	for i := range uint64(n) {
		ev = append(ev, allocIn(trace.PoolID{0, i + 1}, i+1, 0, 0))
	}
	rep, err = Run(sliceOf(ev), Options{MaxSamples: -1})
	require.NoError(t, err)
	require.Len(t, rep.Pools, n+1)
	assert.Equal(t, int64(n), rep.ZeroAllocs)
	assert.Zero(t, rep.DriverCallsTotal-rep.DriverCalls["MemGetAllocationGranularity"], "no pool was made")
}
