//go:build unix

package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

func TestReplayBackendErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown backend", []string{"replay", "--backend", "tpu"}, exitUsage, `--backend "tpu": want one of acl, cuda, emulated`},
		{"unknown backend in config", []string{"replay", "--config", "backend:tpu"}, exitUsage, "backend"},
		{"compare on a device", []string{"replay", "--backend", "cuda", "--compare"}, exitUsage, "--compare needs the emulated backend"},
		{"capacity on a device", []string{"replay", "--config", "backend:cuda", "--capacity", "1GiB"}, exitUsage, "--capacity needs the emulated backend"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runCLI(c.args...)
			assert.Equal(t, c.code, code, errs)
			assert.Contains(t, errs, c.want)
		})
	}
	t.Run("no driver library", func(t *testing.T) {
		t.Setenv(cuda.EnvLibrary, filepath.Join(t.TempDir(), "libcuda.so.1"))
		code, _, errs := runCLI("replay", "--backend", "cuda")
		assert.Equal(t, exitFailure, code)
		assert.Contains(t, errs, "not found: install the NVIDIA driver, or use the emulated backend")
	})
}

// TestReplayOnCUDADouble replays the built-in workload through the cuda
// binding over its C test double, picked by --backend and by the config key.
func TestReplayOnCUDADouble(t *testing.T) {
	path, err := cudatest.Shared()
	if err != nil {
		t.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	t.Setenv(cuda.EnvLibrary, path)
	for _, args := range [][]string{
		{"replay", "--backend", "cuda", "--json"},
		{"replay", "--config", "backend:cuda,expandable_segments:False", "--json"},
	} {
		dbl.Reset()
		code, out, errs := runCLI(args...)
		require.Equal(t, exitOK, code, errs)
		var rep replay.DeviceReport
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		assert.Equal(t, "cuda", rep.Backend)
		assert.Positive(t, rep.Allocs)
		assert.Zero(t, rep.OOMs)
		assert.Less(t, rep.Scale, 1.0, "the 1 GiB double cannot hold the workload unscaled")
		assert.GreaterOrEqual(t, rep.PeakReserved, rep.PeakLive)
		assert.Zero(t, dbl.Live().Handles, "the replay left handles behind")
	}
}
