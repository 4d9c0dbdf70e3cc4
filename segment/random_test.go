package segment

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// TestRandomFaults runs random maps and unmaps at granule offsets of a
// segment with 8 MiB pages and 2 MiB granules, with random driver faults
// armed, and checks after every step that the segment agrees with the
// driver, that nothing leaked, that successful calls did exactly what they
// said, and that failed ones changed nothing beyond what they report.
// Unmap ranges are random (mostly rejected) or whole handles chosen by
// WholeHandles, which is checked against a brute-force answer.
func TestRandomFaults(t *testing.T) {
	faultOps := []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess,
		backend.OpUnmap, backend.OpFree, backend.OpStreamSync}
	kinds := []error{backend.ErrOutOfMemory, backend.ErrUnavailable}
	const (
		page   = 4 * gr
		npages = 8
		ngran  = int(npages * page / gr)
	)
	for seed := uint64(1); seed <= 6; seed++ {
		maxCache := []int{-1, 0, 3}[seed%3]
		t.Run("seed="+itoa(int(seed)), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			d, s, c := newSeg(t, page, npages, maxCache)
			if seed%2 == 0 {
				s.cut = CutFromStart
			}
			st, err := d.StreamCreate(0)
			require.NoError(t, err)
			var maps, unmaps, failed int
			for step := 0; step < 600; step++ {
				d.clearFaults()
				if rng.IntN(3) == 0 {
					d.failFrom(faultOps[rng.IntN(len(faultOps))], 1+rng.IntN(4), 1+rng.IntN(2), kinds[rng.IntN(2)])
				}
				first := rng.IntN(ngran)
				count := 1 + rng.IntN(min(10, ngran-first))
				off, n := uint64(first)*gr, uint64(count)*gr
				before := snap(s)
				handlesBefore := s.Handles()
				if rng.IntN(2) == 0 {
					err := s.Map(off, n)
					if err == nil {
						maps++
						for g := first; g < first+count; g++ {
							require.NotZero(t, s.span[g], "granule %d", g)
						}
					} else {
						failed++
					}
					for g := range ngran {
						if g < first || g >= first+count {
							require.Equal(t, before.span[g], s.span[g], "granule %d outside the range changed", g)
							require.Equal(t, before.hnd[g], s.hnd[g], "granule %d outside the range changed", g)
						}
					}
				} else {
					if rng.IntN(4) != 0 {
						// Mostly whole handles, as the allocator asks.
						limit := ^uint64(0)
						if rng.IntN(2) == 0 {
							limit = uint64(rng.IntN(int(n)))
						}
						roff := off - uint64(rng.IntN(2))*512 // sometimes unaligned
						lo, hi := s.WholeHandles(roff, n, limit)
						wlo, whi := bruteWholeHandles(handlesBefore, roff, n, limit)
						require.Equal(t, [2]uint64{wlo, whi}, [2]uint64{lo, hi}, "WholeHandles(%#x, %#x, %#x)", roff, n, limit)
						if hi > lo {
							off, n = lo, hi-lo
							first = int(off / gr)
						}
					}
					done, err := s.Unmap(off, n, st)
					require.LessOrEqual(t, done, n)
					require.Zero(t, done%gr)
					if err == nil {
						unmaps++
						require.Equal(t, n, done)
					} else {
						failed++
					}
					for g := first; g < first+int(done/gr); g++ {
						require.Zero(t, s.span[g], "granule %d", g)
					}
					if done > 0 && done < n {
						_, _, inside := s.HandleRange(off + done - 1)
						require.False(t, inside, "done is a handle boundary")
						start, _, ok := s.HandleRange(off + done)
						require.True(t, ok)
						require.Equal(t, off+done, start)
					}
					if done < n { // stopped early: the rest is as it was
						for g := first + int(done/gr); g < ngran; g++ {
							require.Equal(t, before.span[g], s.span[g], "granule %d", g)
							require.Equal(t, before.hnd[g], s.hnd[g], "granule %d", g)
						}
					}
				}
				checkConsistent(t, d, s)
				require.Equal(t, int64(s.HandleCount()), c.Maps-c.Unmaps)
				require.Equal(t, int64(d.liveHandles()), c.HandlesCreated-c.HandlesFreed)
			}
			require.Greater(t, maps, 50, "too few successful maps to mean anything")
			require.Greater(t, unmaps, 50, "too few successful unmaps to mean anything")
			require.Greater(t, failed, 50)
			d.clearFaults()
			require.NoError(t, s.Destroy(st))
			if s.cache != nil {
				require.NoError(t, s.cache.Trim(0))
			}
			require.Zero(t, d.liveHandles())
			require.Zero(t, d.liveReservations())
			require.Empty(t, d.ruleViolations())
		})
	}
}
