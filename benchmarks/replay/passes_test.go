package replay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// stepEvents is a small training step: two activations and a temporary
// born and freed within it, and a block it leaves live (WarmPasses frees
// it at the end of the pass, so it is planned too).
func stepEvents() []trace.Event {
	return []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 64 << 20},
		{Kind: trace.Alloc, ID: 2, Size: 32 << 20},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Alloc, ID: 3, Size: 48 << 20},
		{Kind: trace.Free, ID: 3},
		{Kind: trace.Free, ID: 2},
		{Kind: trace.Alloc, ID: 4, Size: 1000},
		{Kind: trace.Free, ID: 99}, // allocated before the trace: skipped
	}
}

func TestWarmPasses(t *testing.T) {
	on, off := allocator.DefaultConfig(), allocator.DefaultConfig()
	on.PlannedSteps, off.PlannedSteps = true, false
	planned, err := WarmPasses(stepEvents(), on, 1<<30, 5)
	require.NoError(t, err)
	base, err := WarmPasses(stepEvents(), off, 1<<30, 5)
	require.NoError(t, err)
	require.Len(t, planned.Passes, 5)
	states := []string{}
	for _, p := range planned.Passes {
		states = append(states, p.State)
		assert.Equal(t, 8, p.Calls, "4 Mallocs, 3 Frees, and the Free of the block left live")
	}
	assert.Equal(t, []string{"learning", "learning", "planned", "planned", "planned"}, states)
	for i := 0; i < 2; i++ { // learning: as without planning
		assert.Equal(t, base.Passes[i].PeakReservedBytes, planned.Passes[i].PeakReservedBytes, "pass %d", i+1)
		assert.Equal(t, base.Passes[i].DriverCalls, planned.Passes[i].DriverCalls, "pass %d", i+1)
	}
	assert.Zero(t, planned.SteadyDriverCalls)
	assert.Equal(t, uint64(96<<20), planned.SteadyPeakLiveBytes)
	assert.Equal(t, uint64(96<<20), planned.PlanPeakLiveBytes)
	assert.Equal(t, planned.PlanPeakLiveBytes, planned.PlanBytes)
	assert.Equal(t, 4, planned.PlannedBlocks)
	assert.LessOrEqual(t, planned.SteadyPeakReservedBytes, planned.SteadyPeakLiveBytes+2<<20, "within a page of live")
	assert.InDelta(t, 1.0, planned.PlanOverPeakLive, 1e-9)
	assert.Zero(t, base.RegionBytes)
	assert.Equal(t, "off", base.Passes[4].State)

	_, err = WarmPasses(stepEvents(), on, 1<<30, 0)
	assert.ErrorIs(t, err, ErrNoPasses)
}
