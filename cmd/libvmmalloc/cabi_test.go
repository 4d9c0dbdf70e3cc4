package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// The tests here build libvmmalloc.so once per test binary (without -race:
// see the package doc) and load it into C and Python programs over the
// test doubles of the vendor libraries. They skip, saying why, where there
// is no C compiler (or no python3, for the ctypes test).

var built struct {
	once sync.Once
	dir  string // holds libvmmalloc.so and vmmalloc.h
	cc   string
	skip string // why the tests cannot run
	err  error
}

// buildLibrary builds libvmmalloc.so and returns its directory and the C
// compiler.
func buildLibrary(t *testing.T) (dir, cc string) {
	t.Helper()
	built.once.Do(func() {
		built.cc = os.Getenv("CC")
		if built.cc == "" {
			built.cc = "cc"
		}
		if _, err := exec.LookPath(built.cc); err != nil {
			built.skip = fmt.Sprintf("no C compiler (%s) to build and drive libvmmalloc.so: %v", built.cc, err)
			return
		}
		built.dir, built.err = os.MkdirTemp("", "libvmmalloc")
		if built.err != nil {
			return
		}
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-o", filepath.Join(built.dir, "libvmmalloc.so"), ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build -buildmode=c-shared: %v\n%s", err, out)
		}
	})
	if built.skip != "" {
		t.Skip(built.skip)
	}
	require.NoError(t, built.err)
	return built.dir, built.cc
}

// compile builds testdata/src.c into dir and returns the program's path.
func compile(t *testing.T, cc, dir, src string) string {
	t.Helper()
	out := filepath.Join(dir, strings.TrimSuffix(src, ".c"))
	cmd := exec.Command(cc, "-std=gnu11", "-O1", "-Wall", "-Werror", "-I", ".", "-o", out,
		filepath.Join("testdata", src), "-ldl", "-lpthread")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

// double builds the test double of backend ("cuda": libcuda.so.1, "acl":
// libascendcl.so) into a directory of its own and returns it.
func double(t *testing.T, cc, backend string) string {
	t.Helper()
	dir := t.TempDir()
	switch backend {
	case "cuda":
		_, err := cudatest.Build(dir)
		require.NoError(t, err)
	case "acl":
		cmd := exec.Command(cc, "-std=c11", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o",
			filepath.Join(dir, "libascendcl.so"), filepath.Join("..", "..", "backend", "acl", "testdata", "fakeacl.c"), "-lpthread")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", b)
	}
	return dir
}

// env is the environment of a program loading libvmmalloc.so from lib over
// the double in dbl: both found by name through LD_LIBRARY_PATH.
func env(lib, dbl, backend string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "VMMALLOC_") {
			out = append(out, kv)
		}
	}
	return append(out, "LD_LIBRARY_PATH="+dbl+":"+lib, "VMMALLOC_CONF=backend:"+backend)
}

func TestPyTorchCallPattern(t *testing.T) {
	lib, cc := buildLibrary(t)
	prog := compile(t, cc, t.TempDir(), "pytorch_pattern.c")
	for _, backend := range []string{"cuda", "acl"} {
		t.Run(backend, func(t *testing.T) {
			dbl := double(t, cc, backend)
			snap := filepath.Join(t.TempDir(), "snapshot.pickle")
			cmd := exec.Command(prog, backend, snap)
			cmd.Env = env(lib, dbl, backend)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			t.Logf("%s", stdout.String())
			require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.True(t, strings.HasSuffix(stdout.String(), "PASS\n"))
			// Refused calls are logged, each on a line of its own.
			assert.Contains(t, stderr.String(), "vmmalloc: free(0x12345000, device 0): vmmalloc: pointer was not allocated")
			assert.Contains(t, stderr.String(), "vmmalloc: alloc(4096, device 7): vmmalloc: invalid device")

			// The snapshot: the project's reader finds the history of both
			// devices, every allocation freed; Python's pickle loads it.
			for dev := 0; dev < 2; dev++ {
				f, err := os.Open(snap)
				require.NoError(t, err)
				tr, err := trace.ImportPyTorchSnapshot(f, dev)
				require.NoError(t, f.Close())
				require.NoError(t, err, "device %d", dev)
				allocs, frees := 0, 0
				for _, e := range tr.Events {
					switch e.Kind {
					case trace.Alloc:
						allocs++
					case trace.Free:
						frees++
					}
				}
				assert.Greater(t, allocs, 1000, "device %d", dev)
				assert.Equal(t, allocs, frees, "device %d: every allocation is freed", dev)
			}
			if py, err := exec.LookPath("python3"); err == nil {
				out, err := exec.Command(py, "-c", `import pickle,sys
s = pickle.load(open(sys.argv[1], "rb"))
print(len(s["segments"]), [len(t) for t in s["device_traces"]], sorted(s))`, snap).CombinedOutput()
				require.NoError(t, err, "%s", out)
				assert.Contains(t, string(out), "'device_traces', 'segments'")
				t.Logf("python3 pickle.load: %s", out)
			}
		})
	}
}

func TestPythonCtypes(t *testing.T) {
	lib, cc := buildLibrary(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 to load libvmmalloc.so with ctypes")
	}
	dbl := double(t, cc, "cuda")
	snap := filepath.Join(t.TempDir(), "snapshot.pickle")
	cmd := exec.Command(py, filepath.Join("testdata", "ctypes_check.py"), lib, snap)
	cmd.Env = env(lib, dbl, "cuda")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("%s", stdout.String())
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.True(t, strings.HasSuffix(stdout.String(), "PASS\n"))
	assert.Contains(t, stderr.String(), "vmmalloc: alloc(4096, device 5): vmmalloc: invalid device")

	// A bad VMMALLOC_CONF: every call fails, saying why.
	cmd = exec.Command(py, "-c", `import ctypes, sys
lib = ctypes.CDLL(sys.argv[1] + "/libvmmalloc.so")
lib.vmmalloc_alloc.restype = ctypes.c_void_p
assert lib.vmmalloc_alloc(ctypes.c_size_t(4096), 0, None) is None
assert lib.vmmalloc_empty_cache(-1) == -1
buf = ctypes.create_string_buffer(512)
lib.vmmalloc_last_error(buf, ctypes.c_size_t(512))
print(buf.value.decode())`, lib)
	cmd.Env = append(env(lib, dbl, "cuda"), "VMMALLOC_CONF=backend:cuda,no_such_key:1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "VMMALLOC_CONF: vmmalloc: invalid config")
	assert.Contains(t, string(out), "no_such_key")
	assert.Contains(t, string(out), "vmmalloc: VMMALLOC_CONF: ", "logged on stderr too")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}
