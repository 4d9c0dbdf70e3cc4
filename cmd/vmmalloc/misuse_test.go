package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// TestSubcommandMisuse: every subcommand, given bad flags, values or
// files, exits with its documented status and one line naming the
// problem on stderr, and never panics.
func TestSubcommandMisuse(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "tr.bin")
	var out, errb bytes.Buffer
	require.Equal(t, exitOK, run([]string{"gen", "--kind", "inference", "-o", tr}, &out, &errb), errb.String())
	junk := filepath.Join(dir, "junk.bin")
	require.NoError(t, os.WriteFile(junk, []byte("garbage\x00\x01"), 0o644))
	empty := filepath.Join(dir, "empty.bin")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	trunc := filepath.Join(dir, "trunc.pickle")
	require.NoError(t, os.WriteFile(trunc, []byte("\x80\x04\x95"), 0o644))
	missing := filepath.Join(dir, "none", "x")
	t.Setenv("VMMALLOC_CONF", "")
	t.Setenv("VMMALLOC_LIBCUDA", filepath.Join(dir, "no-libcuda.so"))
	t.Setenv("VMMALLOC_LIBASCENDCL", filepath.Join(dir, "no-libascendcl.so"))

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nope"}, exitUsage, "unknown command"},
		{[]string{"replay", "--capacity", "-1", tr}, exitUsage, "--capacity"},
		{[]string{"replay", "--capacity", "0", tr}, exitUsage, "--capacity"},
		{[]string{"replay", "--capacity", "16EiB", tr}, exitUsage, "--capacity"},
		{[]string{"replay", "--capacity", "99999999999999999999", tr}, exitUsage, "--capacity"},
		{[]string{"replay", "--capacity", "1", tr}, exitIncomplete, "out of memory"},
		{[]string{"replay", "--device", "-1", tr}, exitUsage, "--device"},
		{[]string{"replay", "--snapshot-entries", "-1", "--snapshot", filepath.Join(dir, "s.pickle"), tr}, exitUsage, "--snapshot-entries"},
		{[]string{"replay", "--snapshot-entries", "99999999999", "--snapshot", filepath.Join(dir, "s.pickle"), tr}, exitUsage, "--snapshot-entries"},
		{[]string{"replay", "--snapshot", dir, tr}, exitFailure, "is a directory"},
		{[]string{"replay", "--snapshot", missing, tr}, exitFailure, "no such file"},
		{[]string{"replay", "--svg", missing, tr}, exitFailure, "no such file"},
		{[]string{"replay", "--format", "nope", tr}, exitUsage, "unknown format"},
		{[]string{"replay", "--backend", "nope", tr}, exitUsage, "--backend"},
		{[]string{"replay", "--backend", "cuda", tr}, exitFailure, "cuda"},
		{[]string{"replay", "--backend", "acl", tr}, exitFailure, "acl"},
		{[]string{"replay", "--config", "nonsense:1", tr}, exitUsage, "unknown key"},
		{[]string{"replay", "--config", "max_split_size_mb:1", tr}, exitUsage, "max_split_size_mb"},
		{[]string{"replay", "--config", "max_split_size_mb:20,max_split_size_mb:30", tr}, exitUsage, "more than once"},
		{[]string{"replay", junk}, exitFailure, "unrecognised trace format"},
		{[]string{"replay", empty}, exitFailure, "is empty"},
		{[]string{"replay", trunc}, exitFailure, "truncated"},
		{[]string{"replay", dir}, exitFailure, "is a directory"},
		{[]string{"replay", missing}, exitFailure, "no such file"},
		{[]string{"replay", tr, tr}, exitUsage, "at most one trace"},
		{[]string{"sweep"}, exitUsage, "at least one trace"},
		{[]string{"sweep", "--parallel", "-1", tr}, exitUsage, "--parallel"},
		{[]string{"sweep", "--policy", "x", tr}, exitUsage, "name=config"},
		{[]string{"sweep", "--policy", "=a", tr}, exitUsage, "name=config"},
		{[]string{"sweep", "--policy", "a=nonsense", tr}, exitUsage, "--policy a"},
		{[]string{"sweep", "--policy", "a=", "--policy", "a=", tr}, exitUsage, "given twice"},
		{[]string{"sweep", "-o", missing, tr}, exitFailure, "no such file"},
		{[]string{"sweep", junk}, exitFailure, "unrecognised trace format"},
		{[]string{"sweep", tr, dir}, exitFailure, "is a directory"},
		{[]string{"sweep", "-", tr, "-"}, exitUsage, "read only once"},
		{[]string{"gen", "--kind", "nope", "-o", filepath.Join(dir, "g.bin")}, exitUsage, "unknown workload"},
		{[]string{"gen", "--format", "nope", "-o", filepath.Join(dir, "g.bin")}, exitUsage, "unknown output format"},
		{[]string{"gen", "-o", missing}, exitFailure, "no such file"},
		{[]string{"gen", "-o", dir}, exitFailure, "is a directory"},
		{[]string{"convert"}, exitUsage, "exactly one input"},
		{[]string{"convert", "--to", "nope", tr}, exitUsage, "unknown output format"},
		{[]string{"convert", "--to", "pytorch", tr}, exitUsage, "needs -o"},
		{[]string{"convert", "--to", "pytorch", "-o", filepath.Join(dir, "c.pickle"), "--snapshot-entries", "-1", tr}, exitUsage, "--snapshot-entries"},
		{[]string{"convert", "--to", "pytorch", "-o", filepath.Join(dir, "c.pickle"), "--device", "-1", tr}, exitUsage, "--device"},
		{[]string{"convert", "-o", dir, tr}, exitFailure, "is a directory"},
		{[]string{"convert", "-o", filepath.Join(dir, "j.bin"), junk}, exitFailure, "unrecognised trace format"},
		{[]string{"convert", "-o", filepath.Join(dir, "t.bin"), trunc}, exitFailure, "truncated"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			assert.Equal(t, tc.code, code, "stderr: %s", stderr.String())
			assert.Contains(t, stderr.String(), tc.want)
			assert.NotContains(t, stderr.String(), "panic")
			assert.NotContains(t, stderr.String(), "goroutine")
		})
	}
}

// TestSweepNamesCollide: traces whose names repeat, including one named
// what numbering makes of another ("a#2"), each get a row of their own
// (replay.Sweep refuses two traces of one name).
func TestSweepNamesCollide(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i, name := range []string{"a", "a", "a#2"} {
		p := filepath.Join(dir, fmt.Sprint(i, ".txt"))
		body := trace.TextHeader + "\n# name: " + name + "\nalloc 1 4096 s=0 t=0\nfree 1\n"
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		paths = append(paths, p)
	}
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"sweep", "--policy", "e=", "-o", filepath.Join(dir, "study")}, paths...), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	csv, err := os.ReadFile(filepath.Join(dir, "study.csv"))
	require.NoError(t, err)
	rows := strings.Split(strings.TrimSpace(string(csv)), "\n")[1:]
	var names []string
	for _, r := range rows {
		names = append(names, strings.SplitN(r, ",", 2)[0])
	}
	assert.Equal(t, []string{"a", "a#2", "a#2#2"}, names)
}
