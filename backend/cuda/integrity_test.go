//go:build unix

package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/integrity"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

// TestIntegrityDouble runs the allocator's real-memory integrity test over
// the binding and the double, in strict-context mode, from several
// goroutines: every byte goes through cuMemcpy*/cuMemsetD8 of the double.
func TestIntegrityDouble(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False", "expandable_segments:True,handle_cache_mb:0,release_threshold_mb:0"} {
		t.Run(conf, func(t *testing.T) {
			d, dbl := openDouble(t, func(dbl *cudatest.Double) {
				require.NoError(t, dbl.SetGranularity(64<<10, 2<<20))
				require.NoError(t, dbl.SetCapacity(-1, 256<<20))
			})
			_, total, err := d.MemGetInfo(0)
			require.NoError(t, err)
			require.Equal(t, uint64(256<<20), total, "the device has the capacity the test set")
			r := integrity.Run(t, d, integrity.Options{Config: conf, Ops: 250, Workers: 4})
			assert.Greater(t, r.Mallocs, 250)
			assert.Equal(t, r.Mallocs, r.Frees)
			assert.Positive(t, dbl.Calls("cuMemcpyDtoHAsync_v2"))
			assert.Positive(t, dbl.Calls("cuMemMap"))
		})
	}
}

// TestSleepCyclesDouble: sleep and wake keep contents byte-exact over the
// binding and the double (cuMemUnmap/cuMemRelease at sleep, cuMemCreate/
// cuMemMap/cuMemSetAccess at the old addresses at wake, backups through
// cuMemHostAlloc'd buffers and cuMemcpy*).
func TestSleepCyclesDouble(t *testing.T) {
	d, dbl := openDouble(t, func(dbl *cudatest.Double) {
		require.NoError(t, dbl.SetGranularity(64<<10, 2<<20))
		require.NoError(t, dbl.SetCapacity(-1, 256<<20))
	})
	_, total, err := d.MemGetInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(256<<20), total, "the device has the capacity the test set")
	r := integrity.SleepCycles(t, d, integrity.SleepOptions{})
	assert.Equal(t, 6, r.Cycles)
	assert.Positive(t, r.Verified)
	assert.Positive(t, dbl.Calls("cuMemRelease"))
	// The pinned backups: expandable host segments register OS memory.
	assert.Positive(t, dbl.Calls("cuMemHostRegister_v2"))
}
