package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestDefragSlack: given 1 GiB mapped and free in the default pool (high
// water mark 1 GiB, defrag limit 1.01 GiB + a 20 MiB page), a growth of
// 40 MiB would pass the limit by 9.76 MiB. The first such growth at the
// mark only anchors it; a second one learns the excess as slack once the
// pool has allocated a mark's worth since, and only below the pressure
// line; the slack then keeps such a growth under the limit, but not under
// pressure, and never exceeds 2 thresholds of the mark.
func TestDefragSlack(t *testing.T) {
	const (
		mark   = 1 << 30
		grow   = 40 * mib
		excess = mark + grow - (mark + mark/100 + 20*mib) // 9.76 MiB
	)
	tests := []struct {
		name     string
		capacity uint64
		churn    []int  // bytes allocated (and freed) before each growth check, in marks
		rounded  uint64 // the growth's request
		slack    uint64 // learned after the checks
		excess   uint64 // defragExcess after them
	}{
		{"first past the limit at the mark", 80 << 30, []int{0}, grow, 0, excess},
		{"again within one step", 80 << 30, []int{0, 0}, grow, 0, excess},
		{"again a step later", 80 << 30, []int{0, 1}, grow, excess, 0},
		{"again two steps later, then once more", 80 << 30, []int{0, 2, 1}, grow, excess, 0},
		{"capped at 2 thresholds", 80 << 30, []int{0, 1, 1}, 300 * mib, 2 * mark / 100, 300*mib - 2*mark/100 - mark/100 - 20*mib},
		{"under pressure: nothing learned", 2 << 30, []int{0, 1}, grow, 0, excess},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, "", emulated.WithCapacity(tc.capacity))
			p, err := a.Malloc(mark, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p)) // mapped, free: reserved = mark
			for _, marks := range tc.churn {
				for range marks {
					q, err := a.Malloc(mark, 0) // a cache hit: a mark's worth allocated
					require.NoError(t, err)
					require.NoError(t, a.Free(q))
				}
				a.mu.Lock()
				a.learnDefragSlack(&a.def, &a.classes[largeIdx], tc.rounded)
				a.mu.Unlock()
			}
			a.mu.Lock()
			slack := a.def.defragSlack[largeIdx]
			got := a.defragExcess(&a.def, &a.classes[largeIdx], tc.rounded)
			a.mu.Unlock()
			assert.Equal(t, tc.slack, slack, "slack")
			assert.Equal(t, tc.excess, got, "excess")
			mustCheck(t, a, e)
		})
	}
}
