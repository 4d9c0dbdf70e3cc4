package fuzz

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
)

// sweepWorkload is a fixed program of about 1,000 operations on a 1 GiB
// device with three streams: it grows past the capacity (so the
// out-of-memory ladder runs), shrinks, empties the cache, regrows with
// big blocks, churns with RecordStream, Synchronize and EmptyCache, and
// frees everything.
func sweepWorkload() []byte {
	rng := rand.New(rand.NewPCG(2024, 3))
	p := &prog{}
	u16 := func() uint16 { return uint16(rng.IntN(1 << 16)) }
	stream := func() byte { return byte(rng.IntN(3)) }
	classes := []byte{szTiny, szTiny, szSmall, szSmall, szBoundary, szJustLarge, szPages, szPages, szEighth}
	// Grow.
	for i := 0; i < 200; i++ {
		p.malloc(classes[rng.IntN(len(classes))], u16(), stream()|launch)
		switch {
		case i%3 == 2:
			p.free(byte(rng.IntN(256)))
		case i%10 == 5:
			p.record(byte(rng.IntN(256)), (stream()+1)|launch)
		case i%7 == 0:
			p.complete(stream(), 3)
		}
	}
	// Shrink and empty the cache.
	for i := 0; i < 100; i++ {
		p.free(byte(rng.IntN(256)))
		if i%20 == 0 {
			p.complete(stream(), 0)
		}
	}
	p.completeAll().emptyCache()
	// Regrow with big blocks, until out of memory, freeing now and then.
	for i := 0; i < 60; i++ {
		p.malloc(szQuarter, u16(), stream()|launch)
		if i%4 == 3 {
			p.free(byte(rng.IntN(256)))
			p.sync(stream())
		}
	}
	// Churn.
	for i := 0; i < 250; i++ {
		switch r := rng.IntN(20); {
		case r < 8:
			p.malloc(classes[rng.IntN(len(classes))], u16(), stream()|launch)
		case r < 14:
			p.free(byte(rng.IntN(256)))
		case r < 16:
			p.record(byte(rng.IntN(256)), stream()|launch)
		case r < 18:
			p.complete(stream(), byte(rng.IntN(3)))
		case r < 19:
			p.sync(stream())
		default:
			p.emptyCache()
		}
	}
	// Free everything.
	for i := 0; i < 200; i++ {
		p.free(0)
	}
	p.completeAll().emptyCache()
	return p.b
}

// sweepModes are the allocator configurations the sweep runs.
var sweepModes = []struct{ name, conf string }{
	{"expandable", "large_segment_size_mb:20,release_threshold_mb:32,handle_cache_mb:64"},
	{"classic", "expandable_segments:False,max_split_size_mb:64,release_threshold_mb:32"},
}

// sweepFaults are the primitives the allocator calls, with the kind each
// fails with. Creation and mapping fail both as out of memory (the
// out-of-memory ladder) and as another error (plain propagation).
var sweepFaults = []struct {
	op   backend.Op
	kind error
}{
	{backend.OpReserve, backend.ErrOutOfMemory},
	{backend.OpReserve, backend.ErrUnavailable},
	{backend.OpCreate, backend.ErrOutOfMemory},
	{backend.OpCreate, backend.ErrUnavailable},
	{backend.OpMap, backend.ErrOutOfMemory},
	{backend.OpMap, backend.ErrUnavailable},
	{backend.OpSetAccess, backend.ErrUnavailable},
	{backend.OpUnmap, backend.ErrUnavailable},
	{backend.OpFree, backend.ErrUnavailable},
	{backend.OpRelease, backend.ErrUnavailable},
	{backend.OpEventCreate, backend.ErrOutOfMemory},
	{backend.OpEventRecord, backend.ErrUnavailable},
	{backend.OpEventQuery, backend.ErrUnavailable},
	{backend.OpEventSync, backend.ErrUnavailable},
	{backend.OpStreamSync, backend.ErrUnavailable},
	{backend.OpEventDestroy, backend.ErrUnavailable},
	{backend.OpStreamDestroy, backend.ErrUnavailable},
}

// sampleKs returns up to limit call numbers spread evenly over 1..kmax,
// always including 1 and kmax.
func sampleKs(kmax, limit int) []int {
	if kmax <= limit {
		ks := make([]int, kmax)
		for i := range ks {
			ks[i] = i + 1
		}
		return ks
	}
	ks := make([]int, 0, limit)
	for i := 0; i < limit; i++ {
		k := 1 + i*(kmax-1)/(limit-1)
		if len(ks) == 0 || ks[len(ks)-1] != k {
			ks = append(ks, k)
		}
	}
	return ks
}

func TestSampleKs(t *testing.T) {
	require.Equal(t, []int{1, 2, 3}, sampleKs(3, 10))
	require.Equal(t, []int{1, 50, 100}, sampleKs(100, 3))
	ks := sampleKs(1000, 60)
	require.Len(t, ks, 60)
	require.Equal(t, 1, ks[0])
	require.Equal(t, 1000, ks[59])
	require.Empty(t, sampleKs(0, 5))
}

// sweepLimit is how many call numbers of each primitive the sweep tries.
// Under the race detector a faulted run costs about 25 times as much (over
// 2 s on a loaded 2-core machine): 16 call numbers took the package past
// go test's 10-minute timeout there, so -race samples 4 (the first, the
// last and two between), and CI runs the sweep of 60 without -race too.
func sweepLimit() int {
	switch {
	case os.Getenv("VMMALLOC_SWEEP_FULL") == "1":
		return 1 << 30
	case testing.Short(), raceEnabled:
		return 4
	}
	return 60
}

// TestFaultSweep runs the sweep workload once clean, counting the calls of
// each primitive, then for every call number k (sampled evenly) runs it
// again with the k-th call failing: every operation must succeed or return
// a typed error (and fail only when the fault fired), Check and the model
// must pass after every operation, and after Close (retried once the
// faults are cleared) the emulator must hold nothing.
func TestFaultSweep(t *testing.T) {
	work := sweepWorkload()
	limit := sweepLimit()
	for _, mode := range sweepModes {
		hc := harnessConfig{conf: mode.conf, capacity: 1 * gib, streams: 2, manual: true}
		clean := newHarness(t, hc)
		clean.maxOps = len(work)
		clean.run(work)
		require.Positive(t, clean.nMalloc)
		st := clean.a.Stats()
		require.Positive(t, st.NumOOMs, "the workload must reach out of memory")
		clean.closeArmed()
		counts := clean.e.CallCounts()
		var calls []string
		runs := 0
		for _, f := range sweepFaults {
			calls = append(calls, fmt.Sprintf("%v %d", f.op, counts[f.op]))
			runs += len(sampleKs(int(counts[f.op]), limit))
		}
		t.Logf("%s: %d ops, %d mallocs (%d out of memory); %d faulted runs; calls: %s",
			mode.name, clean.ops, clean.nMalloc, st.NumOOMs, runs, strings.Join(calls, ", "))
		for _, f := range sweepFaults {
			kmax := int(counts[f.op])
			require.Positive(t, kmax, "%s: the workload never calls %v", mode.name, f.op)
			t.Run(fmt.Sprintf("%s/%v/%v", mode.name, f.op, f.kind), func(t *testing.T) {
				t.Parallel()
				for _, k := range sampleKs(kmax, limit) {
					h := newHarness(t, hc)
					h.maxOps = len(work)
					h.quietUntilFault = true
					h.fullEvery = 25
					h.arm(f.op, k, f.kind)
					h.run(work)
					h.closeArmed()
					if !h.firedAny && k <= kmax/2 {
						h.fatalf("fault %v #%d of %d never fired", f.op, k, kmax)
					}
				}
			})
		}
	}
}

// TestEventFailureDoesNotFreeEarly: a block freed after RecordStream on a
// busy stream stays unavailable while EventQuery or EventSynchronize fails:
// Malloc never hands it out, EmptyCache and the out-of-memory ladder never
// unmap it, and it comes back once the faults are cleared and the stream's
// work completes.
func TestEventFailureDoesNotFreeEarly(t *testing.T) {
	for _, failing := range []backend.Op{backend.OpEventQuery, backend.OpEventSync} {
		t.Run(failing.String(), func(t *testing.T) {
			e, err := emulated.New(emulated.WithCapacity(256*mib), emulated.WithManualCompletion())
			require.NoError(t, err)
			cfg, err := allocator.ParseConfig("large_segment_size_mb:2,handle_cache_mb:0")
			require.NoError(t, err)
			d, chk := handlecheck.ForTest(t, e) // fails t on a handle-lifetime violation
			a, err := allocator.New(d, cfg)
			require.NoError(t, err)
			s0 := a.DefaultStream()
			busy, err := e.StreamCreate(0)
			require.NoError(t, err)

			p, err := a.Malloc(8*mib, s0)
			require.NoError(t, err)
			require.NoError(t, e.Launch(busy, p, 8*mib)) // busy's work reads p
			require.NoError(t, a.RecordStream(p, busy))
			require.NoError(t, a.Free(p))
			require.NoError(t, e.FailRandom(failing, 1, 1, backend.ErrUnavailable))

			var got []uintptr
			// busyNow reports whether the busy stream's work is still pending:
			// only then is handing out p's memory a bug (a successful
			// EventSynchronize in the out-of-memory ladder may complete it).
			busyNow := func() bool {
				n, err := e.Pending(busy)
				require.NoError(t, err)
				return n > 0
			}
			overlaps := func(q uintptr, n uint64) bool { return q < p+8*mib && p < q+uintptr(n) }
			// Plain reuse: many Mallocs of the freed size.
			for i := 0; i < 4; i++ {
				q, err := a.Malloc(8*mib, s0)
				require.NoError(t, err)
				require.False(t, overlaps(q, 8*mib), "block handed out while the busy stream may use it")
				got = append(got, q)
			}
			require.True(t, busyNow())
			// EmptyCache must not unmap it while the wait fails.
			err = a.EmptyCache()
			if failing == backend.OpEventSync {
				require.ErrorIs(t, err, backend.ErrUnavailable, "EmptyCache must report the failed wait")
				require.True(t, busyNow())
			}
			require.Empty(t, e.Violations())
			// Fill the device: the out-of-memory ladder must not take it either.
			for {
				q, err := a.Malloc(16*mib, s0)
				if err != nil {
					require.True(t, typed(err), "untyped error: %v", err)
					break
				}
				require.False(t, busyNow() && overlaps(q, 16*mib), "block handed out by the out-of-memory ladder")
				got = append(got, q)
			}
			require.Empty(t, e.Violations(), "memory the busy stream uses was unmapped")
			if failing == backend.OpEventSync {
				require.True(t, busyNow(), "a failed EventSynchronize completed the work")
			}
			require.NoError(t, a.Check())

			// Faults cleared and work complete: the block comes back.
			e.ClearFaults()
			require.NoError(t, e.CompleteAll())
			for _, q := range got {
				require.NoError(t, a.Free(q))
			}
			q, err := a.Malloc(8*mib, s0)
			require.NoError(t, err)
			require.Equal(t, int64(1), a.Stats().Active[0].Current, "the pending-free block was freed once its event completed")
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Check())
			require.NoError(t, a.Close())
			require.Zero(t, e.Live().Mappings)
			require.Empty(t, e.Violations())
			require.NoError(t, chk.Err())
		})
	}
}

// sleepSweepWorkload is a fixed program of sleeps and wakes of the
// default pool over real memory: each round allocates blocks of several
// sizes (some with work on another stream), frees some, sleeps in another
// mode (Offload to pinned memory, Discard, Offload keeping the host
// buffers, Offload to Go memory), frees a block and tries a Malloc while
// asleep, wakes, and sleeps and wakes once more with the buffers it kept.
func sleepSweepWorkload() []byte {
	rng := rand.New(rand.NewPCG(2026, 5))
	p := &prog{}
	// Up to 1.5 MiB each, about 8 MiB live at most: the backups fit the
	// harness's 16 MiB of pinned host memory.
	classes := []byte{szTiny, szSmall, szBoundary, szJustLarge}
	modes := []byte{sleepOffload | sleepPinned, 0, sleepOffload | sleepPinned | sleepKeep, sleepOffload}
	for round, mode := range modes {
		for i := 0; i < 6; i++ {
			st := streamDefault
			if i%3 == 1 {
				st = 1 | launch
			}
			p.malloc(classes[rng.IntN(len(classes))], uint16(rng.IntN(8192)), st)
		}
		p.free(byte(rng.IntN(256))).free(byte(rng.IntN(256)))
		p.completeAll().sleep(0, mode)
		p.free(byte(rng.IntN(256))).malloc(szTiny, 1, streamDefault) // refused: asleep
		p.wake(0)
		if round%2 == 0 {
			p.completeAll().sleep(0, mode).wake(0).wake(0) // a duplicate wake is refused
		}
	}
	for i := 0; i < 40; i++ {
		p.free(0)
	}
	p.completeAll().emptyCache()
	return p.b
}

// sweepPairOps are the calls sleep and wake make that the two-fault sweep
// fails, two at a time.
var sweepPairOps = []struct {
	op   backend.Op
	kind error
}{
	{backend.OpCreate, backend.ErrOutOfMemory},
	{backend.OpMap, backend.ErrUnavailable},
	{backend.OpSetAccess, backend.ErrUnavailable},
	{backend.OpUnmap, backend.ErrUnavailable},
	{backend.OpFree, backend.ErrUnavailable},
	{backend.OpMemcpy, backend.ErrUnavailable},
	{backend.OpHostRegister, backend.ErrOutOfMemory}, // offload backups pin registered host memory
	{backend.OpStreamSync, backend.ErrUnavailable},
}

// TestFaultSweepTwoFaults runs sleepSweepWorkload with two faults armed
// at once, for every pair of sweepPairOps (an op with itself: two
// consecutive calls, the second often a rollback's or a retry's), at call
// numbers sampled over the clean run's: every Sleep and Wake succeeds or
// answers a typed error, leaves the pool awake or asleep and never part
// mapped (the harness's model and Check after every operation, the
// contents of offloaded blocks checked after every wake), and after Close
// the emulator holds nothing. Bounded: 3 call numbers per op, about 300
// runs of a 100-operation program (with -short or -race the middle call
// of each, about 40 runs).
func TestFaultSweepTwoFaults(t *testing.T) {
	work := sleepSweepWorkload()
	hc := harnessConfig{conf: realConfigs[0], capacity: 32 * mib, real: true, streams: 2, manual: true}
	clean := newHarness(t, hc)
	clean.keepTrace = true
	clean.maxOps = len(work)
	clean.run(work)
	tr := strings.Join(clean.trace, "\n")
	require.Contains(t, tr, "Sleep(pool 0, mode 1, pinned true, keep true)")
	require.Contains(t, tr, "in asleep pool 0")
	clean.closeArmed()
	counts := clean.e.CallCounts()
	// Call numbers sampled per op; 1: the middle call.
	limit := 3
	if testing.Short() || raceEnabled {
		limit = 1
	}
	ks := func(op backend.Op) []int {
		if limit == 1 {
			return []int{(int(counts[op]) + 1) / 2}
		}
		return sampleKs(int(counts[op]), limit)
	}
	for _, f := range sweepPairOps {
		require.Positive(t, counts[f.op], "the workload never calls %v", f.op)
	}
	for i, f := range sweepPairOps {
		for _, g := range sweepPairOps[i:] {
			t.Run(fmt.Sprintf("%v+%v", f.op, g.op), func(t *testing.T) {
				t.Parallel()
				fired := 0
				for _, k1 := range ks(f.op) {
					k2s := ks(g.op)
					if f.op == g.op {
						k2s = []int{k1 + 1, k1 + 2}
					}
					for _, k2 := range k2s {
						h := newHarness(t, hc)
						h.maxOps = len(work)
						h.quietUntilFault = true
						h.fullEvery = 10
						h.arm(f.op, k1, f.kind)
						h.arm(g.op, k2, g.kind)
						h.run(work)
						if h.firedAny {
							fired++
						}
						h.closeArmed()
					}
				}
				require.Positive(t, fired, "no fault of %v or %v fired", f.op, g.op)
			})
		}
	}
}
