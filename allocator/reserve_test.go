package allocator

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// manualReserve makes the Allocators the test creates run their handle
// reserve's refill only when the test calls refillReserve (no goroutine).
func manualReserve(t testing.TB) {
	reserveManual = true
	t.Cleanup(func() { reserveManual = false })
}

func TestHandleReserve(t *testing.T) {
	manualReserve(t)
	a, e := newAlloc(t, "handle_reserve_mb:64", emulated.WithCapacity(4*gib))
	assert.Zero(t, e.Calls(backend.OpCreate), "manual: nothing created before the refill")
	a.refillReserve()
	// The large pool stocks 20 MiB pages until its cache holds 64 MiB
	// (four: 80 MiB), the small pool 2 MiB pages up to an eighth (8 MiB).
	st := a.Stats()
	assert.Equal(t, int64(80+8)<<20, st.CachedHandleBytes)
	assert.Equal(t, int64(4+4), st.ReserveHandlesCreated)
	assert.Equal(t, int64(8), st.HandlesCreated)
	assert.Equal(t, int64(8), e.Calls(backend.OpCreate))
	mustCheck(t, a, e)

	// A growing Malloc of two pages maps cached handles: no create on its
	// path.
	creates := e.Calls(backend.OpCreate)
	p, err := a.Malloc(40<<20, 0)
	require.NoError(t, err)
	assert.Equal(t, creates, e.Calls(backend.OpCreate))
	assert.Equal(t, int64(40+8)<<20, a.Stats().CachedHandleBytes)
	a.refillReserve() // what the goroutine does after the growth
	assert.Equal(t, int64(80+8)<<20, a.Stats().CachedHandleBytes)
	mustCheck(t, a, e)

	// A growth of 64 MiB handles makes the reserve stock that size.
	q, err := a.Malloc(128<<20, 0)
	require.NoError(t, err)
	a.refillReserve()
	assert.Equal(t, uint64(64<<20), a.reserve.stock[largeIdx])
	mustCheck(t, a, e)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	mustCheck(t, a, e)
}

// TestHandleReserveFaults: a create that fails in the refill is counted,
// changes nothing else, and the next refill stocks up.
func TestHandleReserveFaults(t *testing.T) {
	manualReserve(t)
	a, e := newAlloc(t, "handle_reserve_mb:64", emulated.WithCapacity(4*gib))
	require.NoError(t, e.FailNth(backend.OpCreate, 2, backend.ErrOutOfMemory))
	a.refillReserve()
	st := a.Stats()
	assert.Equal(t, int64(1), st.ReserveFailures)
	assert.Equal(t, int64(1), st.ReserveHandlesCreated)
	assert.Equal(t, int64(20<<20), st.CachedHandleBytes)
	mustCheck(t, a, e)
	a.refillReserve()
	st = a.Stats()
	assert.Equal(t, int64(1), st.ReserveFailures)
	assert.Equal(t, int64(88<<20), st.CachedHandleBytes)
	mustCheck(t, a, e)
}

// TestHandleReserveLimits: the reserve stops at the pressure line of the
// memory the process may use (per_process_memory_fraction), is given back
// first when the device runs out, does not refill under pressure, and
// lets no pool past its memory limit.
func TestHandleReserveLimits(t *testing.T) {
	manualReserve(t)
	t.Run("memory fraction", func(t *testing.T) {
		a, e := newAlloc(t, "handle_reserve_mb:512,per_process_memory_fraction:0.25", emulated.WithCapacity(1*gib))
		a.refillReserve()
		// The line is 128 MiB: six pages of 20 MiB; a seventh would cross
		// it, and the refill stops there.
		assert.Equal(t, int64(120<<20), a.Stats().CachedHandleBytes)
		mustCheck(t, a, e)
	})
	t.Run("given back first", func(t *testing.T) {
		a, e := newAlloc(t, "handle_reserve_mb:256", emulated.WithCapacity(1*gib))
		a.refillReserve()
		require.Equal(t, int64((260+32)<<20), a.Stats().CachedHandleBytes)
		freed := e.Calls(backend.OpFree)
		p, err := a.Malloc(900<<20, 0) // fits only once the reserve is freed (rung 1)
		require.NoError(t, err)
		st := a.Stats()
		assert.Zero(t, st.CachedHandleBytes)
		assert.Positive(t, e.Failures(backend.OpCreate), "the device ran out beside the reserve")
		assert.GreaterOrEqual(t, e.Calls(backend.OpFree)-freed, int64(13+16), "every reserve handle freed")
		assert.Zero(t, st.NumOOMs)
		a.refillReserve() // under pressure: nothing
		assert.Zero(t, a.Stats().CachedHandleBytes)
		mustCheck(t, a, e)
		require.NoError(t, a.Free(p))
		mustCheck(t, a, e)
	})
	t.Run("pool limit", func(t *testing.T) {
		a, e := newAlloc(t, "handle_reserve_mb:256", emulated.WithCapacity(4*gib))
		a.refillReserve()
		pool, err := a.NewPool(PoolOptions{Name: "capped", MemoryLimit: 128 << 20})
		require.NoError(t, err)
		creates := e.Calls(backend.OpCreate)
		x, err := pool.Malloc(40<<20, 0)
		require.NoError(t, err)
		assert.Equal(t, creates, e.Calls(backend.OpCreate), "mapped from the reserve")
		_, err = pool.Malloc(100<<20, 0) // the reserve holds it, the limit does not
		var oom *OutOfMemoryError
		require.ErrorAs(t, err, &oom)
		assert.Equal(t, uint64(128<<20), oom.PoolLimit)
		mustCheck(t, a, e)
		require.NoError(t, a.Free(x))
	})
}

// blockingCreate holds the first CreatePhysical until release is closed,
// telling entered when it starts.
type blockingCreate struct {
	*emulated.Emulator
	entered, release chan struct{}
	first            bool
}

func (d *blockingCreate) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	if !d.first {
		d.first = true // only the goroutine creates before release
		close(d.entered)
		<-d.release
	}
	return d.Emulator.CreatePhysical(size, prop)
}

// TestHandleReserveCloseDuringRefill: Close while the background refill
// is creating a handle waits for that create, stops the goroutine and
// frees every handle.
func TestHandleReserveCloseDuringRefill(t *testing.T) {
	e := newEmu(t, emulated.WithCapacity(4*gib))
	d := &blockingCreate{Emulator: e, entered: make(chan struct{}), release: make(chan struct{})}
	cfg, err := ParseConfig("handle_reserve_mb:64")
	require.NoError(t, err)
	a, err := New(d, cfg)
	require.NoError(t, err)
	<-d.entered // the goroutine is inside CreatePhysical
	closed := make(chan error)
	go func() { closed <- a.Close() }()
	close(d.release)
	require.NoError(t, <-closed)
	assert.Zero(t, e.Live().Handles)
	assert.LessOrEqual(t, e.Calls(backend.OpCreate), int64(8))
	assert.Equal(t, e.Calls(backend.OpCreate), e.Calls(backend.OpFree))
	assertNoDriverState(t, e)
}

// TestHandleReserveGoroutine: the goroutine stocks the reserve at New and
// after a growth; Check waits for a create in flight.
func TestHandleReserveGoroutine(t *testing.T) {
	a, e := newAlloc(t, "handle_reserve_mb:64", emulated.WithCapacity(4*gib))
	p, err := a.Malloc(40<<20, 0)
	require.NoError(t, err)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(p))
	mustCheck(t, a, e)
	require.NoError(t, a.Close())
	assert.Zero(t, e.Live().Handles)
}

// BenchmarkGrowingMallocLatency measures the simulated driver time (the
// default cost profile) of each Malloc that grows the pool, with and
// without the handle reserve, and reports its median and 99th
// percentile. Each Malloc of a cycle of sizes stays live, so each grows;
// the reserve is refilled between Mallocs, off their path, as its
// goroutine would be given time to.
func BenchmarkGrowingMallocLatency(b *testing.B) {
	sizes := []uint64{20 << 20, 40 << 20, 6 << 20, 100 << 20, 60 << 20, 1 << 20, 128 << 20}
	for _, reserve := range []int{0, 64, 256} {
		b.Run("reserve_mb="+strconv.Itoa(reserve), func(b *testing.B) {
			manualReserve(b)
			a, e := newAlloc(b, "handle_reserve_mb:"+strconv.Itoa(reserve), emulated.WithCapacity(80*gib))
			var lat []time.Duration
			var creates, total int64
			for b.Loop() {
				a.refillReserve()
				var live []uintptr
				for i := range 64 {
					s0, c0 := e.SimulatedTime(), e.Calls(backend.OpCreate)
					p, err := a.Malloc(sizes[i%len(sizes)], 0)
					if err != nil {
						b.Fatal(err)
					}
					lat = append(lat, e.SimulatedTime()-s0)
					creates += e.Calls(backend.OpCreate) - c0
					live = append(live, p)
					a.refillReserve()
				}
				for _, p := range live {
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
				}
				if err := a.EmptyCache(); err != nil {
					b.Fatal(err)
				}
				total += 64
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "sim-p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "sim-p99-µs")
			b.ReportMetric(float64(creates)/float64(total), "creates/malloc")
			b.ReportMetric(float64(e.SimulatedTime().Microseconds())/float64(total), "sim-total-µs/malloc")
		})
	}
}
