package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/workload/rl"
)

// TestGenRL: gen --kind rl writes a program rl.Read takes back, the same
// for the same seed; --run replays it scaled over real memory and
// reports its peak within the device and no corrupted tensor; bad flags
// are usage errors.
func TestGenRL(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rl.txt")
	code, _, errs := runCLI("gen", "--kind", "rl", "--seed", "4", "-o", f)
	require.Zero(t, code, errs)
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	ops, err := rl.Read(strings.NewReader(string(b)))
	require.NoError(t, err)
	want, err := rl.Generate(rl.DefaultConfig(), 4)
	require.NoError(t, err)
	assert.Equal(t, want, ops)

	code, out, errs := runCLI("gen", "--kind", "rl", "--run", "--scale", "512")
	require.Zero(t, code, errs)
	assert.Contains(t, out, "1/512 scale: device 32 MiB")
	assert.Contains(t, out, "50 steps")
	assert.Contains(t, out, "0 kept tensors corrupted")

	code, _, _ = runCLI("gen", "--kind", "rl", "--run", "--scale", "0")
	assert.Equal(t, 2, code)
	code, _, _ = runCLI("gen", "--kind", "rl", "--run", "--scale", "1000000")
	assert.Equal(t, 2, code, "a scenario scaled to nothing is refused")
	code, _, _ = runCLI("gen", "--kind", "training", "--run")
	assert.Equal(t, 2, code)
}
