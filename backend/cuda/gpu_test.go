//go:build unix

package cuda_test

// The GPU check: run by backend/cuda/gpucheck.sh with VMMALLOC_GPUCHECK=1
// against the real libcuda.so.1 (or, with VMMALLOC_GPUCHECK=double, against
// the C test double, which proves the script's path on machines without a
// GPU). Skipped otherwise.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/integrity"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// gpuDriver opens the driver the GPU check runs against, or skips.
func gpuDriver(t *testing.T) *cuda.Driver {
	t.Helper()
	var opts []cuda.Option
	switch os.Getenv("VMMALLOC_GPUCHECK") {
	case "":
		t.Skip("set VMMALLOC_GPUCHECK=1 (real driver) or =double to run the GPU check")
	case "double":
		path, err := cudatest.Shared()
		if err != nil {
			t.Skipf("CUDA test double unavailable: %v", err)
		}
		opts = append(opts, cuda.WithLibrary(path))
	}
	d, err := cuda.Open(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

func TestGPUInfo(t *testing.T) {
	d := gpuDriver(t)
	t.Logf("library %s, %d device(s)", d.Library(), d.DeviceCount())
	for dev := 0; dev < d.DeviceCount(); dev++ {
		free, total, err := d.MemGetInfo(dev)
		require.NoError(t, err)
		gmin, err := d.Granularity(backend.DeviceProp(dev), backend.GranularityMinimum)
		require.NoError(t, err)
		grec, err := d.Granularity(backend.DeviceProp(dev), backend.GranularityRecommended)
		require.NoError(t, err)
		fmt.Printf("GPUCHECK device %d: memory %d MiB free of %d MiB; granularity minimum %d KiB, recommended %d KiB\n",
			dev, free>>20, total>>20, gmin>>10, grec>>10)
	}
}

func TestGPUConformance(t *testing.T) {
	gpuDriver(t) // skips unless asked
	conformance.Run(t, func(t *testing.T) backend.Driver { return gpuDriver(t) })
}

func TestGPUIntegrity(t *testing.T) {
	d := gpuDriver(t)
	for _, conf := range []string{"", "expandable_segments:False"} {
		t.Run(conf, func(t *testing.T) {
			r := integrity.Run(t, d, integrity.Options{Config: conf, Ops: 600, Workers: 4, MaxSize: 64 << 20})
			fmt.Printf("GPUCHECK integrity %q: %d mallocs, %d frees, %d OOMs, %d MiB verified, peak reserved %d MiB\n",
				conf, r.Mallocs, r.Frees, r.OOMs, r.Verified>>20, r.PeakReserved>>20)
			assert.Equal(t, r.Mallocs, r.Frees)
		})
	}
}

// TestGPUShareableFile shares a handle with a child process through a
// duplicate of its exported POSIX fd (Driver.ShareableFile), on the driver
// the check runs against (exchangeWithChild).
func TestGPUShareableFile(t *testing.T) {
	d := gpuDriver(t)
	fd := exchangeWithChild(t, d)
	fmt.Printf("GPUCHECK ipc: a child process imported, read and wrote a handle through a duplicate of exported fd %d\n", fd)
}

// TestGPULatency times each VMM primitive over at least 1,000 calls of one
// granule on device 0 and prints the median and 99th percentile.
func TestGPULatency(t *testing.T) {
	d := gpuDriver(t)
	n := 1000
	if s := os.Getenv("VMMALLOC_GPUCHECK_N"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err)
		n = max(v, 1)
	}
	g, err := d.Granularity(backend.DeviceProp(0), backend.GranularityMinimum)
	require.NoError(t, err)
	va, err := d.ReserveAddress(g)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseAddress(va, g)) }()
	rw := []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}
	names := []string{"create", "map", "set-access", "unmap", "release"}
	lat := make([][]time.Duration, len(names))
	for range n {
		var h backend.Handle
		steps := []func() error{
			func() (err error) { h, err = d.CreatePhysical(g, backend.DeviceProp(0)); return err },
			func() error { return d.Map(va, g, h) },
			func() error { return d.SetAccess(va, g, rw) },
			func() error { return d.Unmap(va, g) },
			func() error { return d.FreePhysical(h) },
		}
		for i, step := range steps {
			t0 := time.Now()
			err := step()
			lat[i] = append(lat[i], time.Since(t0))
			require.NoError(t, err, names[i])
		}
	}
	for i, name := range names {
		slices.Sort(lat[i])
		fmt.Printf("GPUCHECK latency %-10s n=%d median %8.2f µs  p99 %8.2f µs  (granule %d KiB)\n", name, n,
			float64(lat[i][n/2].Nanoseconds())/1e3, float64(lat[i][n*99/100].Nanoseconds())/1e3, g>>10)
	}
}

func TestGPUReplay(t *testing.T) {
	d := gpuDriver(t)
	dir, err := trace.SharedDir()
	if err != nil {
		t.Skip(err)
	}
	path := filepath.Join(dir, "cs336_ctx128_fullstep.pickle")
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("trace not available: %v", err)
	}
	defer f.Close()
	tr, err := trace.ImportPyTorchSnapshot(f, 0)
	require.NoError(t, err)
	for _, conf := range []string{"", "expandable_segments:False"} {
		t.Run(conf, func(t *testing.T) {
			cfg, err := allocator.ParseConfig(conf)
			require.NoError(t, err)
			r, err := replay.RunOnDriver(d, tr.Events, replay.DeviceOptions{Config: cfg})
			require.NoError(t, err)
			fmt.Printf("GPUCHECK replay %s %q: %s (PyTorch recorded peak reserved %s)\n",
				filepath.Base(path), conf, r, replay.FormatBytes(tr.PeakReserved))
			assert.Zero(t, r.OOMs)
			assert.GreaterOrEqual(t, r.PeakReserved, r.PeakLive)
		})
	}
}
