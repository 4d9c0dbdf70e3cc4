//go:build unix

package cuda_test

// The GPU check: run by backend/cuda/gpucheck.sh with VMMALLOC_GPUCHECK=1
// against the real libcuda.so.1 (or, with VMMALLOC_GPUCHECK=double, against
// the C test double, which proves the script's path on machines without a
// GPU). Skipped otherwise.

import (
	"bytes"
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
	"github.com/vmmalloc/vmmalloc/backend/emulated"
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

// TestGPULatency times each VMM primitive on device 0 (reserve, create,
// map, set-access, unmap, free, release) over at least 1,000 calls of one
// granule and 20 of 512 MiB, and prints the mean and 99th percentile of
// each. With VMMALLOC_GPUCHECK_PROFILE set (gpucheck.sh --profile FILE) it
// fits per call + per GiB to every sample of each primitive
// (emulated.FitCost) and writes the result there as a cost profile.
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
	big := max(g, 512<<20) / g * g
	if free, _, err := d.MemGetInfo(0); err == nil && free < 2*big {
		big = max(g, free/4/g*g)
	}
	rw := []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}
	ops := []backend.Op{backend.OpReserve, backend.OpCreate, backend.OpMap, backend.OpSetAccess, backend.OpUnmap, backend.OpFree, backend.OpRelease}
	names := []string{"reserve", "create", "map", "set-access", "unmap", "free", "release"}
	samples := make([][]emulated.CostSample, len(ops))
	for _, run := range []struct {
		size  uint64
		calls int
	}{{g, n}, {big, max(n/50, 1)}} {
		lat := make([][]time.Duration, len(ops))
		for range run.calls {
			var (
				h  backend.Handle
				va uintptr
			)
			steps := []func() error{
				func() (err error) { va, err = d.ReserveAddress(run.size); return err },
				func() (err error) { h, err = d.CreatePhysical(run.size, backend.DeviceProp(0)); return err },
				func() error { return d.Map(va, run.size, h) },
				func() error { return d.SetAccess(va, run.size, rw) },
				func() error { return d.Unmap(va, run.size) },
				func() error { return d.FreePhysical(h) },
				func() error { return d.ReleaseAddress(va, run.size) },
			}
			for i, step := range steps {
				t0 := time.Now()
				err := step()
				dt := time.Since(t0)
				require.NoError(t, err, names[i])
				lat[i] = append(lat[i], dt)
				samples[i] = append(samples[i], emulated.CostSample{Bytes: run.size, Latency: dt})
			}
		}
		for i, name := range names {
			l := lat[i]
			var sum time.Duration
			for _, x := range l {
				sum += x
			}
			slices.Sort(l)
			fmt.Printf("GPUCHECK latency %-10s %5d × %4d MiB: mean %8.2f µs  median %8.2f µs  p99 %8.2f µs  (granule %d KiB)\n",
				name, len(l), run.size>>20, float64(sum.Nanoseconds())/float64(len(l))/1e3,
				float64(l[len(l)/2].Nanoseconds())/1e3, float64(l[len(l)*99/100].Nanoseconds())/1e3, g>>10)
		}
	}
	prof := emulated.CostProfile{Name: "measured", Model: emulated.LegacyCostModel(),
		Source: fmt.Sprintf("backend/cuda/gpucheck.sh on %s, granule %d KiB, per call + per GiB fitted to %d calls at %d KiB and %d at %d MiB (VMM calls); other primitives legacy",
			d.Library(), g>>10, n, g>>10, max(n/50, 1), big>>20)}
	for i, op := range ops {
		c, perGiB, err := emulated.FitCost(samples[i])
		require.NoError(t, err)
		prof.Model.PerCall[op], prof.Model.PerGiB[op] = c, perGiB
		fmt.Printf("GPUCHECK cost %-10s %8.2f µs + %8.2f µs/GiB\n", names[i], float64(c)/1e3, float64(perGiB)/1e3)
	}
	if path := os.Getenv("VMMALLOC_GPUCHECK_PROFILE"); path != "" {
		var b bytes.Buffer
		require.NoError(t, emulated.WriteCostProfile(&b, prof))
		require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
		fmt.Printf("GPUCHECK profile written to %s (vmmalloc replay --cost-profile %s)\n", path, path)
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
