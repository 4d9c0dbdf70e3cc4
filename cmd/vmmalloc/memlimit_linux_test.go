//go:build !race && !asan && !msan

// The race detector and the sanitizers map terabytes of shadow memory, so
// no address-space limit can hold them.

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// addressSpaceLimitKiB is `ulimit -v 2097152`: 2 GiB.
const addressSpaceLimitKiB = 2097152

// underLimit runs the test binary as a child of kind (runTestChild) with
// args under the address-space limit, through sh's ulimit, and returns its
// exit status and output. GOMAXPROCS=2 and MALLOC_ARENA_MAX=1 keep what
// the Go runtime and the C library reserve independent of the machine: the
// runtime reserves about 1.1 GiB of address space up front (page
// summaries, the first heap arena), and with cgo each thread that calls
// malloc would reserve a 128 MiB arena of its own.
func underLimit(t *testing.T, kind string, args ...string) (int, string, string) {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh for ulimit")
	}
	cmd := exec.Command(sh, append([]string{"-c", `ulimit -v "$LIMIT" && exec "$0" "$@"`, os.Args[0]}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"="+kind, "GOMAXPROCS=2", "MALLOC_ARENA_MAX=1",
		"LIMIT="+strconv.Itoa(addressSpaceLimitKiB))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, stdout.String(), stderr.String()
}

// TestReplayUnderAddressSpaceLimit: `vmmalloc replay` of a hostile
// 383,508-byte trace, 100,000 streams each synchronized once, completes
// under `ulimit -v 2097152` (at 8.5 KB of Go heap a stream it would hold
// 850 MB and die with "fatal error: out of memory").
// The control shows that the limit binds: a child reserving a 3 GiB heap
// dies.
func TestReplayUnderAddressSpaceLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 100,000 streams")
	}
	code, _, stderr := underLimit(t, "hog")
	require.NotEqual(t, 0, code, "a 3 GiB heap fits under the limit, so it does not bind: %s", stderr)
	require.Contains(t, stderr, "out of memory")

	var buf bytes.Buffer
	w := trace.NewWriter(&buf)
	const streams = 100_000
	for i := 1; i <= streams; i++ {
		require.NoError(t, w.Write(trace.Event{Kind: trace.StreamSync, Stream: uint64(i)}))
	}
	require.NoError(t, w.Close())
	require.Equal(t, 383_508, buf.Len(), "the hostile trace's file size")
	path := filepath.Join(t.TempDir(), "streams.trace")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))

	code, stdout, stderr := underLimit(t, "cli", "replay", path)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	assert.NotContains(t, stderr, "fatal error")
	assert.Regexp(t, `CreateStream\s+100,000`, stdout)
	assert.Regexp(t, `SynchronizeStream\s+100,000`, stdout)
}
