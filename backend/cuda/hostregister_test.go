//go:build unix

package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
)

// TestHostRegisterRefusesMallocHostMemory: CUDA refuses to register memory
// cuMemHostAlloc pinned already (CUDA_ERROR_INVALID_VALUE, measured on an
// H200), and the double does too; the device address of such memory comes
// from cuMemHostGetDevicePointer alone (DEVICEMAP).
func TestHostRegisterRefusesMallocHostMemory(t *testing.T) {
	d, dbl := openDouble(t, nil)
	p, err := d.MallocHost(3 * 4096)
	require.NoError(t, err)
	for _, off := range []uintptr{0, 4096} {
		err = d.HostRegister(p+off, 4096, backend.HostRegisterMapped)
		require.ErrorIs(t, err, backend.ErrInvalidArgument, "offset %d", off)
	}
	dp, err := d.HostGetDevicePointer(p + 100)
	require.NoError(t, err)
	assert.Equal(t, p+100, dp, "unified addressing")
	require.NoError(t, d.FreeHost(p))
	assert.Equal(t, int64(2), dbl.Calls("cuMemHostRegister_v2"))
}

// TestHostAllocatorNeverRegistersMallocHostMemory: over the CUDA double,
// neither host policy registers MallocHost memory: the size-class policy
// asks its blocks' device addresses directly, expandable segments register
// OS memory of their own.
func TestHostAllocatorNeverRegistersMallocHostMemory(t *testing.T) {
	for _, conf := range []string{"expandable_segments:False", "expandable_segments:True"} {
		t.Run(conf, func(t *testing.T) {
			d, dbl := openDouble(t, nil)
			cfg, err := host.ParseConfig(conf + ",pinned_budget_mb:0")
			require.NoError(t, err)
			cfg.Budget = host.NewPinBudget(0)
			a, err := host.New(d, cfg)
			require.NoError(t, err)
			var ptrs []uintptr
			for _, n := range []uint64{100, 64 << 10, 3 << 20} {
				p, err := a.Malloc(n)
				require.NoError(t, err)
				dp, err := a.DevicePointer(p + 10)
				require.NoError(t, err)
				assert.Equal(t, p+10, dp, "unified addressing: the device address is the host address")
				ptrs = append(ptrs, p)
			}
			require.NoError(t, a.Check())
			for _, p := range ptrs {
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, a.Close())
			if conf == "expandable_segments:False" {
				assert.Equal(t, int64(3), dbl.Calls("cuMemHostAlloc"))
				assert.Zero(t, dbl.Calls("cuMemHostRegister_v2"), "MallocHost memory must never be registered")
			} else {
				assert.Zero(t, dbl.Calls("cuMemHostAlloc"))
				assert.Equal(t, int64(2), dbl.Calls("cuMemHostRegister_v2"), "one 2 MiB chunk for the small blocks, one 4 MiB for the 3 MiB one")
			}
		})
	}
}
