//go:build linux

package host_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestSleepBackupsPinWhatTheyBackUp: a pool of weights of assorted sizes
// offloaded to pinned memory (allocator.Pool.Sleep, Offload) pins at most
// 1.02 times the bytes backed up with expandable segments, the default;
// the size classes pin more. The pins go through the pin budget.
func TestSleepBackupsPinWhatTheyBackUp(t *testing.T) {
	for _, tc := range []struct {
		conf     string
		maxRatio float64
	}{
		{"", 1.02},
		{"expandable_segments:False", 1.25},
	} {
		t.Run("conf="+tc.conf, func(t *testing.T) {
			drv, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(1<<30))
			require.NoError(t, err)
			t.Cleanup(func() { _ = drv.Close() })
			a, err := allocator.New(drv, allocator.DefaultConfig())
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Close() })
			cfg, err := host.ParseConfig(tc.conf)
			require.NoError(t, err)
			budget := host.NewPinBudget(0)
			cfg.Budget = budget
			pinned, err := host.New(drv, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = pinned.Close() })
			pool, err := a.NewPool(allocator.PoolOptions{Name: "weights"})
			require.NoError(t, err)
			var ptrs []uintptr
			for i := range 40 { // 40 tensors from 0.3 to 12 MiB
				n := uint64(300<<10) + uint64(i*i)*(7<<10)
				p, err := pool.Malloc(n, 0)
				require.NoError(t, err)
				ptrs = append(ptrs, p)
			}
			require.NoError(t, pool.Sleep(allocator.SleepOptions{Mode: allocator.Offload, Host: pinned}))
			backed := a.Stats().HostBackupBytes
			require.Positive(t, backed)
			st := pinned.Stats()
			ratio := float64(st.ReservedBytes.Current) / float64(backed)
			t.Logf("%s: %d bytes backed up, %d pinned (%.4f×)", cfg, backed, st.ReservedBytes.Current, ratio)
			assert.LessOrEqual(t, ratio, tc.maxRatio)
			assert.Equal(t, uint64(st.ReservedBytes.Current), budget.Stats().Pinned, "the pins went through the budget")
			require.NoError(t, pool.Wake())
			for _, p := range ptrs {
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, pinned.Check())
		})
	}
}
