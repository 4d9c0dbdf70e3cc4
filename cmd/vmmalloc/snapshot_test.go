package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// importSnapshot reads a snapshot the CLI wrote with vmmalloc's importer.
func importSnapshot(t *testing.T, path string) *trace.PyTorchTrace {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	pt, err := trace.ImportPyTorchSnapshot(f, 0)
	require.NoError(t, err)
	return pt
}

func TestReplaySnapshot(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "mix.bin")
	code, _, stderr := runCLI("gen", "--kind", "mix", "--seed", "3", "-o", tr)
	require.Equal(t, exitOK, code, stderr)
	snap := filepath.Join(dir, "out.pickle")
	code, stdout, stderr := runCLI("replay", "--snapshot", snap, tr)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "peak")
	pt := importSnapshot(t, snap)
	assert.Positive(t, pt.Allocs)
	assert.Positive(t, pt.SegmentMaps)
	assert.Equal(t, "vmmalloc", pt.Settings["backend"])

	// The snapshot replays like any PyTorch snapshot.
	code, stdout, stderr = runCLI("replay", snap)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "PyTorch recorded")
}

func TestReplaySnapshotHTML(t *testing.T) {
	page := filepath.Join(t.TempDir(), "view.html")
	code, _, stderr := runCLI("replay", "--snapshot", page)
	require.Equal(t, exitOK, code, stderr)
	data, err := os.ReadFile(page)
	require.NoError(t, err)
	html := string(data)
	assert.True(t, strings.HasPrefix(html, "<!DOCTYPE html>"))
	assert.Contains(t, html, memviz.ViewerURL)
	i := strings.Index(html, `base64: "`) + len(`base64: "`)
	j := strings.Index(html[i:], `"`)
	raw, err := base64.StdEncoding.DecodeString(html[i : i+j])
	require.NoError(t, err)
	pt, err := trace.ImportPyTorchSnapshot(bytes.NewReader(raw), 0)
	require.NoError(t, err)
	assert.Positive(t, pt.Allocs)
}

func TestConvertToPyTorch(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "train.txt")
	code, _, stderr := runCLI("gen", "--kind", "training", "-o", tr)
	require.Equal(t, exitOK, code, stderr)
	for _, args := range [][]string{
		{"convert", "--to", "pytorch", "-o", filepath.Join(dir, "a.snap"), tr},
		{"convert", "--config", "expandable_segments:False", "-o", filepath.Join(dir, "b.pickle"), tr},
	} {
		code, _, stderr := runCLI(args...)
		require.Equal(t, exitOK, code, stderr)
		assert.Contains(t, stderr, "peak reserved")
	}
	a, b := importSnapshot(t, filepath.Join(dir, "a.snap")), importSnapshot(t, filepath.Join(dir, "b.pickle"))
	assert.Equal(t, true, a.Settings["expandable_segments"])
	assert.Equal(t, false, b.Settings["expandable_segments"])
	assert.Positive(t, a.SegmentMaps)
	assert.Zero(t, a.SegmentAllocs)
	assert.Positive(t, b.SegmentAllocs, "classic segments are segment_alloc")
	assert.Equal(t, a.Allocs, b.Allocs)
}

func TestSnapshotFlagErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "x.pickle")
	tr := filepath.Join(dir, "t.txt")
	code, _, stderr := runCLI("gen", "-o", tr)
	require.Equal(t, exitOK, code, stderr)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"replay", "--compare", "--snapshot", out}, exitUsage, "--compare"},
		{[]string{"replay", "--snapshot", out, "--snapshot-entries", "0"}, exitUsage, "--snapshot-entries"},
		{[]string{"replay", "--snapshot", filepath.Join(dir, "no", "such", "dir.pickle")}, exitFailure, "no such file"},
		{[]string{"convert", "--to", "pytorch", filepath.Join(dir, "missing.bin")}, exitFailure, "missing.bin"},
		{[]string{"gen", "-o", out}, exitUsage, "--snapshot"},
		{[]string{"convert", "--to", "pytorch", tr}, exitUsage, "-o file"},
		{[]string{"convert", "--to", "pytorch", "--config", "bogus:1", "-o", out, tr}, exitUsage, "--config"},
	} {
		code, _, stderr := runCLI(tc.args...)
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.msg, "%v", tc.args)
	}
	_, err := os.Stat(out)
	assert.True(t, os.IsNotExist(err), "no snapshot left behind by a failed command")
}
