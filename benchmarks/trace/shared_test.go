package trace

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSharedDir: the traces are found through $VMMALLOC_TRACES (which must
// name a directory when set) or shared/traces beside the module root,
// from the root or any package below it, and nowhere else: not in a
// shared/traces further up (a fixed workplace folder), not beside a
// directory with no go.mod.
func TestSharedDir(t *testing.T) {
	top := t.TempDir()
	mkdir := func(parts ...string) string {
		d := filepath.Join(append([]string{top}, parts...)...)
		require.NoError(t, os.MkdirAll(d, 0o755))
		return d
	}
	// top/shared/traces: a workplace folder above the module's parent.
	// top/wt/mod: a module with a package; top/wt/shared/traces beside it.
	// top/bare/mod: a module with nothing beside it.
	// top/loose: no go.mod above (top has none).
	workplace := mkdir("shared", "traces")
	mod := mkdir("wt", "mod")
	pkg := mkdir("wt", "mod", "benchmarks", "trace")
	beside := mkdir("wt", "shared", "traces")
	bare := mkdir("bare", "mod", "pkg")
	loose := mkdir("loose")
	for _, m := range []string{mod, filepath.Dir(bare)} {
		require.NoError(t, os.WriteFile(filepath.Join(m, "go.mod"), []byte("module m\n"), 0o644))
	}
	explicit := mkdir("elsewhere")

	for _, tc := range []struct {
		name, env, wd string
		want          string // "" for ErrNoSharedDir
		msg           string // in the error
	}{
		{name: "env names a directory", env: explicit, wd: pkg, want: explicit},
		{name: "env wins over beside the module", env: workplace, wd: pkg, want: workplace},
		{name: "env names a missing directory", env: filepath.Join(top, "missing"), wd: pkg, msg: "missing is not a directory"},
		{name: "env names a file", env: filepath.Join(mod, "go.mod"), wd: pkg, msg: "is not a directory"},
		{name: "beside the module root, from the root", wd: mod, want: beside},
		{name: "beside the module root, from a package", wd: pkg, want: beside},
		{name: "nothing beside the module root", wd: bare, msg: filepath.Join(top, "bare", "shared", "traces") + " does not exist"},
		{name: "no module above", wd: loose, msg: "no go.mod"},
		{name: "no working directory", wd: "", msg: "no go.mod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sharedDirFrom(tc.env, tc.wd)
			if tc.want == "" {
				require.ErrorIs(t, err, ErrNoSharedDir)
				assert.ErrorContains(t, err, tc.msg)
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	// SharedDir reads the environment and the working directory.
	t.Setenv(SharedDirEnv, "")
	t.Chdir(pkg)
	got, err := SharedDir()
	require.NoError(t, err)
	assert.Equal(t, beside, got)
	t.Setenv(SharedDirEnv, explicit)
	got, err = SharedDir()
	require.NoError(t, err)
	assert.Equal(t, explicit, got)
	t.Setenv(SharedDirEnv, filepath.Join(top, "missing"))
	_, err = SharedDir()
	require.ErrorIs(t, err, ErrNoSharedDir)
	t.Setenv(SharedDirEnv, "")
	t.Chdir(bare)
	_, err = SharedDir()
	require.ErrorIs(t, err, ErrNoSharedDir, "the workplace folder above is not looked at")
}

// TestSharedFile: a trace is found by name (or a path below the
// directory); a missing directory, a missing file, a directory of that
// name and a path leaving the directory are errors a test skips on.
func TestSharedFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "policy", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.pickle"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "policy", "b.pickle"), []byte("y"), 0o644))
	t.Setenv(SharedDirEnv, dir)

	got, err := SharedFile("a.pickle")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "a.pickle"), got)
	got, err = SharedFile("policy/b.pickle")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "policy", "b.pickle"), got)

	for _, tc := range []struct {
		name string
		want error
	}{
		{"missing.pickle", fs.ErrNotExist},
		{"policy/sub", fs.ErrNotExist}, // a directory, not a trace
		{"../a.pickle", fs.ErrInvalid},
		{"/etc/passwd", fs.ErrInvalid},
		{"", fs.ErrInvalid},
	} {
		got, err := SharedFile(tc.name)
		require.ErrorIs(t, err, tc.want, "%q", tc.name)
		assert.Empty(t, got)
	}

	t.Setenv(SharedDirEnv, filepath.Join(dir, "missing"))
	_, err = SharedFile("a.pickle")
	require.ErrorIs(t, err, ErrNoSharedDir)
}
