//go:build unix

package drivers_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/backend/drivers"
)

func TestNames(t *testing.T) {
	assert.Equal(t, []string{"acl", "cuda", "emulated"}, drivers.Names())
}

func TestOpenEmulated(t *testing.T) {
	for _, name := range []string{"", "native", "emulated"} {
		d, err := drivers.Open(name, drivers.Options{Devices: 2, Capacity: 1 << 30})
		require.NoError(t, err, name)
		assert.Equal(t, "emulated", d.Name())
		assert.Equal(t, 2, d.DeviceCount())
		_, total, err := d.MemGetInfo(1)
		require.NoError(t, err)
		assert.Equal(t, uint64(1<<30), total)
		require.NoError(t, drivers.Close(d))
	}
}

func TestOpenUnknown(t *testing.T) {
	_, err := drivers.Open("cudaMallocAsync", drivers.Options{})
	require.ErrorIs(t, err, drivers.ErrUnknown)
	assert.Contains(t, err.Error(), "cuda, emulated")
}

func TestOpenCUDA(t *testing.T) {
	_, err := drivers.Open("cuda", drivers.Options{Library: filepath.Join(t.TempDir(), "libcuda.so.1")})
	require.ErrorIs(t, err, backend.ErrUnavailable)
	assert.ErrorIs(t, err, cuda.ErrNoLibrary)

	path, err := cudatest.Shared()
	if err != nil {
		t.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	dbl.Reset()
	d, err := drivers.Open("cuda", drivers.Options{Library: path, Visible: []int{1}})
	require.NoError(t, err)
	assert.Equal(t, "cuda", d.Name())
	assert.Equal(t, 1, d.DeviceCount())
	require.NoError(t, drivers.Close(d))
}

// ExampleOpen picks a backend by name, as the CLI's --backend does.
func ExampleOpen() {
	d, err := drivers.Open("emulated", drivers.Options{Capacity: 8 << 30})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drivers.Close(d)
	_, total, _ := d.MemGetInfo(0)
	fmt.Println(d.Name(), total>>30, "GiB")
	_, err = drivers.Open("tpu", drivers.Options{})
	fmt.Println(err)
	// Output:
	// emulated 8 GiB
	// drivers: unknown backend "tpu" (want acl, cuda, emulated, or native)
}
