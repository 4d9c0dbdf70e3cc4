package segment

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// TestRandomFaults runs random maps and unmaps with random driver faults
// armed and checks after every step that the segment agrees with the
// driver, that nothing leaked, that successful calls did exactly what they
// said, and that failed ones changed nothing beyond what they report.
func TestRandomFaults(t *testing.T) {
	faultOps := []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess,
		backend.OpUnmap, backend.OpFree, backend.OpStreamSync}
	kinds := []error{backend.ErrOutOfMemory, backend.ErrUnavailable}
	for seed := uint64(1); seed <= 6; seed++ {
		maxCache := []int{-1, 0, 3}[seed%3]
		t.Run("seed="+itoa(int(seed)), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			const npages = 16
			d, s, c := newSeg(t, npages, maxCache)
			st, err := d.StreamCreate(0)
			require.NoError(t, err)
			for step := 0; step < 600; step++ {
				d.clearFaults()
				if rng.IntN(3) == 0 {
					d.failFrom(faultOps[rng.IntN(len(faultOps))], 1+rng.IntN(4), 1+rng.IntN(2), kinds[rng.IntN(2)])
				}
				first := rng.IntN(npages)
				count := 1 + rng.IntN(min(4, npages-first))
				off, n := uint64(first)*ps, uint64(count)*ps
				before := append([]backend.Handle(nil), s.handles...)
				if rng.IntN(2) == 0 {
					err := s.Map(off, n)
					switch {
					case err == nil:
						for p := first; p < first+count; p++ {
							require.True(t, s.IsMapped(p))
						}
					default:
						for p := range npages {
							if p < first || p >= first+count {
								require.Equal(t, before[p], s.handles[p], "page %d outside the range changed", p)
							}
						}
					}
				} else {
					done, err := s.Unmap(off, n, st)
					require.LessOrEqual(t, done, n)
					require.Zero(t, done%ps)
					for p := first; p < first+int(done/ps); p++ {
						require.False(t, s.IsMapped(p))
					}
					if err == nil {
						require.Equal(t, n, done)
					}
					if done < n { // stopped early: the rest is as it was
						for p := first + int(done/ps); p < npages; p++ {
							require.Equal(t, before[p], s.handles[p], "page %d", p)
						}
					}
				}
				checkConsistent(t, d, s)
				require.Equal(t, int64(s.MappedPages()), c.Maps-c.Unmaps)
				require.Equal(t, int64(d.liveHandles()), c.HandlesCreated-c.HandlesFreed)
			}
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
