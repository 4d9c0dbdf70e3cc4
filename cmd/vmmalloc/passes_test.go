package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReplayPasses(t *testing.T) {
	code, out, errs := runCLI("replay", "--passes", "4", "--json")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var m struct {
		Input    string
		Passes   int
		Planned  map[string]any
		Baseline map[string]any
	}
	require.NoError(t, json.Unmarshal([]byte(out), &m), out)
	assert.Equal(t, 4, m.Passes)
	assert.Equal(t, "built-in training workload", m.Input)
	for _, k := range []string{"steady_peak_reserved_bytes", "steady_driver_calls", "steady_ns_per_call", "passes", "steady_peak_live_bytes"} {
		assert.Contains(t, m.Planned, k)
		assert.Contains(t, m.Baseline, k)
	}
	passes, ok := m.Planned["passes"].([]any)
	require.True(t, ok)
	require.Len(t, passes, 4)
	first := passes[0].(map[string]any)
	base := m.Baseline["passes"].([]any)[0].(map[string]any)
	assert.Equal(t, base["peak_reserved_bytes"], first["peak_reserved_bytes"], "the first pass is as without planning")
	assert.Equal(t, base["driver_calls"], first["driver_calls"])
	assert.LessOrEqual(t, m.Planned["steady_peak_reserved_bytes"], m.Baseline["steady_peak_reserved_bytes"])

	code, out, _ = runCLI("replay", "--passes", "3")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "3 warm passes, MarkStep after each")
	assert.Contains(t, out, "steady (last pass)")

	for _, args := range [][]string{
		{"replay", "--passes", "-1"},
		{"replay", "--passes", "2", "--compare"},
		{"replay", "--passes", "2", "--min-capacity"},
	} {
		code, _, errs := runCLI(args...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, errs)
	}
}
