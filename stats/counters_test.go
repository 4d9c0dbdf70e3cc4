package stats

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// HotCounters must settle to exactly what eager DeviceStats calls leave,
// through any mix of hot counts, eager Add/Dec on hot arrays (the
// allocator's slow paths), peak and accumulated resets.
func TestHotCountersSettleExact(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			var got HotCounters
			var want DeviceStats
			type blk struct {
				p      PoolKind
				n, req int64
			}
			var live, pending []blk
			for i := 0; i < 2000; i++ {
				switch op := r.IntN(20); {
				case op < 9 || len(live) == 0: // malloc
					b := blk{PoolKind(1 + r.IntN(2)), int64(512 * (1 + r.IntN(64))), 0}
					b.req = b.n - int64(r.IntN(512))
					got.CountMalloc(b.p, b.n, b.req)
					wantMalloc(&want, b.p, b.n, b.req)
					live = append(live, b)
				case op < 17: // cache-hit free
					j := r.IntN(len(live))
					b := live[j]
					live = append(live[:j], live[j+1:]...)
					got.CountFree(b.p, b.n, b.req)
					wantFree(&want, b.p, b.n, b.req)
				case op == 17 && len(pending) > 0 && r.IntN(2) == 0: // a pending free's events complete
					j := r.IntN(len(pending))
					b := pending[j]
					pending = append(pending[:j], pending[j+1:]...)
					got.CountPendingFreed(b.p, b.n, b.req)
					want.Active.Dec(b.p, 1)
					want.ActiveBytes.Dec(b.p, b.n)
					want.RequestedBytes.Dec(b.p, b.req)
				case op == 17: // a free pending on events (the slow path)
					j := r.IntN(len(live))
					b := live[j]
					live = append(live[:j], live[j+1:]...)
					pending = append(pending, b)
					got.CountPending(b.p, b.n)
					want.Allocation.Dec(b.p, 1)
					want.AllocatedBytes.Dec(b.p, b.n)
					for _, d := range []*DeviceStats{&got.DeviceStats, &want} {
						d.ReservedBytes.Add(b.p, b.n) // a cold array moves too
					}
				case op == 18:
					got.ResetPeak()
					want.ResetPeak()
				default:
					got.ResetAccumulated()
					want.ResetAccumulated()
				}
				// Current and Peak are exact without settling (Active's
				// Current through ActiveNow).
				for _, pair := range [][2]*StatArray{{&got.Allocation, &want.Allocation}, {&got.AllocatedBytes, &want.AllocatedBytes}, {&got.Active, &want.Active}, {&got.ActiveBytes, &want.ActiveBytes}} {
					for k := AllPools; k < NumPoolKinds; k++ {
						if pair[0] != &got.Active && pair[0] != &got.ActiveBytes {
							require.Equal(t, pair[1][k].Current, pair[0][k].Current, "step %d", i)
						}
						require.Equal(t, pair[1][k].Peak, pair[0][k].Peak, "step %d", i)
					}
				}
				for k := AllPools; k < NumPoolKinds; k++ {
					n, bytes := got.ActiveNow(k)
					require.Equal(t, want.Active[k].Current, n, "step %d", i)
					require.Equal(t, want.ActiveBytes[k].Current, bytes, "step %d", i)
				}
				if i%97 == 0 {
					require.Equal(t, want, got.Settled(), "step %d", i)
				}
			}
			require.Equal(t, want, got.Settled())
			require.Equal(t, want, got.Settled(), "settling twice changes nothing")
		})
	}
}

// The derivation of Freed restarts at ResetAccumulated from the pools'
// Current then: blocks live across the reset count as freed only when
// freed after it.
func TestHotCountersResetAccumulated(t *testing.T) {
	var c HotCounters
	c.CountMalloc(SmallPool, 4096, 4000)
	c.CountMalloc(LargePool, 2<<20, 2<<20)
	c.CountFree(SmallPool, 4096, 4000)
	c.ResetAccumulated()
	s := c.Settled()
	assert.Equal(t, Stat{Current: 2 << 20, Peak: 2<<20 + 4096}, s.AllocatedBytes[AllPools])
	assert.Equal(t, Stat{Current: 2 << 20, Peak: 2 << 20}, s.AllocatedBytes[LargePool])
	c.CountFree(LargePool, 2<<20, 2<<20)
	c.CountMalloc(SmallPool, 512, 1)
	s = c.Settled()
	assert.Equal(t, Stat{Current: 512, Peak: 2<<20 + 4096, Allocated: 512, Freed: 2 << 20}, s.AllocatedBytes[AllPools])
	assert.Equal(t, Stat{Current: 0, Peak: 2 << 20, Allocated: 0, Freed: 2 << 20}, s.AllocatedBytes[LargePool])
	assert.Equal(t, Stat{Current: 1, Peak: 1, Allocated: 1, Freed: 0}, s.Allocation[SmallPool])
}

// BenchmarkCountMallocFree compares the eager and the hot counters for one
// cache-hit Malloc+Free pair.
func BenchmarkCountMallocFree(b *testing.B) {
	b.Run("eager", func(b *testing.B) {
		var d DeviceStats
		for i := 0; i < b.N; i++ {
			wantMalloc(&d, SmallPool, 4096, 4000)
			wantFree(&d, SmallPool, 4096, 4000)
		}
	})
	b.Run("hot", func(b *testing.B) {
		var d HotCounters
		for i := 0; i < b.N; i++ {
			d.CountMalloc(SmallPool, 4096, 4000)
			d.CountFree(SmallPool, 4096, 4000)
		}
	})
}

// wantMalloc and wantFree are the reference for HotCounters: the plain
// per-array updates of a cache hit.
func wantMalloc(d *DeviceStats, p PoolKind, n, req int64) {
	d.Allocation.Inc(p, 1)
	d.Active.Inc(p, 1)
	d.AllocatedBytes.Inc(p, n)
	d.ActiveBytes.Inc(p, n)
	d.RequestedBytes.Inc(p, req)
}

func wantFree(d *DeviceStats, p PoolKind, n, req int64) {
	d.Allocation.Dec(p, 1)
	d.Active.Dec(p, 1)
	d.AllocatedBytes.Dec(p, n)
	d.ActiveBytes.Dec(p, n)
	d.RequestedBytes.Dec(p, req)
}

// CountMallocBoth counts both records exactly as two CountMalloc calls do,
// with and without blocks pending free.
func TestCountMallocBothIsTwoCountMallocs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	var agg, own, aggWant, ownWant HotCounters
	all := []*HotCounters{&agg, &own, &aggWant, &ownWant}
	type blk struct {
		p PoolKind
		n int64
	}
	var pending []blk
	for i := 0; i < 500; i++ {
		b := blk{PoolKind(1 + r.IntN(2)), int64(512 * (1 + r.IntN(16)))}
		switch op := r.IntN(4); {
		case op == 0: // a block allocated and freed pending on events
			for _, c := range all {
				c.CountMalloc(b.p, b.n, b.n)
				c.CountPending(b.p, b.n)
			}
			pending = append(pending, b)
		case op == 1 && len(pending) > 0: // its events complete
			b = pending[len(pending)-1]
			pending = pending[:len(pending)-1]
			for _, c := range all {
				c.CountPendingFreed(b.p, b.n, b.n)
			}
		default:
			CountMallocBoth(&agg, &own, b.p, b.n, b.n-1)
			aggWant.CountMalloc(b.p, b.n, b.n-1)
			ownWant.CountMalloc(b.p, b.n, b.n-1)
		}
		require.Equal(t, aggWant.Settled(), agg.Settled(), "step %d", i)
		require.Equal(t, ownWant.Settled(), own.Settled(), "step %d", i)
	}
}
