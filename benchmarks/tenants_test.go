package benchmarks

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// The two-tenant alternation: two tenants, each in its own private pool,
// take turns on one 8 GiB device, one peaking at 60 % of it and the other
// at 55 %, so that neither peak fits beside the other's cache. Each turn
// allocates the tenant's working set in tensors of a few sizes (as a model
// serving or training step would), frees it all, and leaves it cached in
// the tenant's pool; the other tenant's turn can grow only by taking that
// memory back.
const (
	tenantDevice = 8 << 30
	tenantA      = tenantDevice / 100 * 60
	tenantB      = tenantDevice / 100 * 55
)

// tenantSizes are the tensor sizes a turn cycles through (MiB).
var tenantSizes = []uint64{8, 24, 40, 72, 16, 56}

// tenantRound is what one round (a turn of each tenant) cost.
type tenantRound struct {
	calls        int64         // driver calls
	sim          time.Duration // simulated driver time (default cost profile)
	byOp         emulated.CallCounts
	peakReserved uint64 // device-wide peak of reserved bytes over the rounds measured
}

// runTenants runs warm rounds of the alternation (after one warm-up round)
// on a fresh device with config conf and returns the mean cost per round.
// With ownStreams each tenant allocates on a stream of its own, else both
// on the default stream.
func runTenants(tb testing.TB, conf string, rounds int, ownStreams bool) tenantRound {
	tb.Helper()
	e, err := emulated.New(emulated.WithCapacity(tenantDevice))
	require.NoError(tb, err)
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(tb, err)
	a, err := allocator.New(e, cfg)
	require.NoError(tb, err)
	defer a.Close()
	pa, err := a.NewPool(allocator.PoolOptions{Name: "tenant-a"})
	require.NoError(tb, err)
	pb, err := a.NewPool(allocator.PoolOptions{Name: "tenant-b"})
	require.NoError(tb, err)
	streams := map[*allocator.Pool]backend.Stream{}
	if ownStreams {
		for _, p := range []*allocator.Pool{pa, pb} {
			s, err := e.StreamCreate(0)
			require.NoError(tb, err)
			streams[p] = s
		}
	}
	var ptrs []uintptr
	turn := func(p *allocator.Pool, total uint64) {
		ptrs = ptrs[:0]
		var got uint64
		for i := 0; got < total; i++ {
			size := min(tenantSizes[i%len(tenantSizes)]<<20, total-got)
			ptr, err := p.Malloc(size, streams[p])
			require.NoError(tb, err, "turn of %s at %d of %d bytes", p.Name(), got, total)
			ptrs = append(ptrs, ptr)
			got += size
		}
		for _, ptr := range ptrs {
			require.NoError(tb, a.Free(ptr))
		}
	}
	turn(pa, tenantA)
	turn(pb, tenantB)
	require.NoError(tb, a.Check())
	a.ResetPeakStats()
	c0, s0 := e.CallCounts(), e.SimulatedTime()
	for range rounds {
		turn(pa, tenantA)
		turn(pb, tenantB)
	}
	require.NoError(tb, a.Check())
	var r tenantRound
	c1 := e.CallCounts()
	for op := range c1 {
		r.byOp[op] = (c1[op] - c0[op]) / int64(rounds)
		r.calls += c1[op] - c0[op]
	}
	r.calls /= int64(rounds)
	r.sim = (e.SimulatedTime() - s0) / time.Duration(rounds)
	r.peakReserved = uint64(a.Stats().ReservedBytes[stats.AllPools].Peak)
	return r
}

// TestTwoTenantAlternation: the tenants hand their memory to each other
// where it is mapped (cross-pool adoption under pressure): a round makes
// the idle probes of the other tenant's stream (an event record and
// query) and, once in three rounds, maps one granule; it unmaps and frees
// nothing, and the device never holds more than the larger peak and that
// granule. Before adoption crossed pools, a round made
// 20,977 driver calls (4,195 each of create, map, set-access, unmap and
// free: granule handles under pressure, all of one tenant's cache unmapped
// by the out-of-memory ladder) and 1.145 s of simulated driver time under
// the a100 profile.
func TestTwoTenantAlternation(t *testing.T) {
	for _, own := range []bool{false, true} {
		r := runTenants(t, "", 3, own)
		logTenants(t, r)
		// Over the three rounds: twelve idle probes, and once the
		// granule a turn could not fit into what it adopted (created,
		// mapped, given access).
		assert.Equal(t, int64(5), r.calls, "own streams %v", own)
		assert.Equal(t, int64(2), r.byOp[backend.OpEventRecord])
		assert.Equal(t, int64(2), r.byOp[backend.OpEventQuery])
		assert.Zero(t, r.byOp[backend.OpUnmap])
		assert.Zero(t, r.byOp[backend.OpFree])
		assert.Less(t, r.sim, 100*time.Microsecond)
		assert.Equal(t, uint64(tenantA+2<<20-1)/(2<<20)*(2<<20)+2<<20, r.peakReserved, "the larger peak and a granule")
	}
}

func logTenants(t *testing.T, r tenantRound) {
	t.Logf("per round: %d driver calls (create %d, map %d, set-access %d, unmap %d, free %d), %v simulated; peak reserved %d MiB",
		r.calls, r.byOp[backend.OpCreate], r.byOp[backend.OpMap], r.byOp[backend.OpSetAccess], r.byOp[backend.OpUnmap], r.byOp[backend.OpFree],
		r.sim, r.peakReserved>>20)
}

// BenchmarkTwoTenantAlternation reports the driver calls and simulated
// driver time (default cost profile) of one round of the alternation.
func BenchmarkTwoTenantAlternation(b *testing.B) {
	var r tenantRound
	for b.Loop() {
		r = runTenants(b, "", 3, false)
	}
	b.ReportMetric(float64(r.calls), "driver-calls/round")
	b.ReportMetric(float64(r.sim.Microseconds())/1e3, "sim-driver-ms/round")
	b.ReportMetric(float64(r.byOp[backend.OpCreate]), "creates/round")
	b.ReportMetric(float64(r.peakReserved)/(1<<20), "peak-reserved-MiB")
}
