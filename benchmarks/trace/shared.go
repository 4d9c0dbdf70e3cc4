package trace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SharedDirEnv names the environment variable that points at the
// directory of real traces (the PyTorch snapshots the studies, tests and
// benchmarks read). They are measurement input kept outside the
// repository.
const SharedDirEnv = "VMMALLOC_TRACES"

// ErrNoSharedDir says that the directory of real traces was not found:
// SharedDirEnv is unset and no shared/traces sits beside the module root,
// or SharedDirEnv names no directory. Tests and benchmarks that need the
// traces skip on it.
var ErrNoSharedDir = errors.New("trace: no directory of shared traces")

// SharedDir returns the directory of real traces: $VMMALLOC_TRACES when it
// is set (it must then name a directory: an explicit setting is never
// second-guessed), else shared/traces beside the root of the module that
// contains the working directory (the directory holding go.mod, as
// go test runs in a package's directory). It looks nowhere else. The error
// wraps ErrNoSharedDir and says where it looked.
func SharedDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		wd = ""
	}
	return sharedDirFrom(os.Getenv(SharedDirEnv), wd)
}

// SharedFile returns the path of the real trace name in SharedDir: a
// file name such as "cs336_ctx128_fullstep.pickle", or a slash-separated
// path below the directory such as "policy/cs336_ctx512_fullstep.pickle".
// The error wraps ErrNoSharedDir when the directory is not found,
// fs.ErrNotExist when the file is not in it, and fs.ErrInvalid when name
// is not a local path (absolute, empty, or reaching above with ".."); a
// test or benchmark that needs the trace skips on any error.
func SharedFile(name string) (string, error) {
	if !filepath.IsLocal(filepath.FromSlash(name)) {
		return "", fmt.Errorf("trace: shared trace %q: %w: not a path inside the directory", name, fs.ErrInvalid)
	}
	dir, err := SharedDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, filepath.FromSlash(name))
	st, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("trace: shared trace %s not available: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("trace: shared trace %s: %w: %s is not a regular file", name, fs.ErrNotExist, p)
	}
	return p, nil
}

// sharedDirFrom is SharedDir for the value env of SharedDirEnv and the
// working directory wd ("" if unknown).
func sharedDirFrom(env, wd string) (string, error) {
	if env != "" {
		if isDir(env) {
			return env, nil
		}
		return "", fmt.Errorf("%w: $%s=%s is not a directory", ErrNoSharedDir, SharedDirEnv, env)
	}
	root := moduleRoot(wd)
	if root == "" {
		return "", fmt.Errorf("%w: $%s is unset and no go.mod is above %q", ErrNoSharedDir, SharedDirEnv, wd)
	}
	dir := filepath.Join(filepath.Dir(root), "shared", "traces")
	if !isDir(dir) {
		return "", fmt.Errorf("%w: $%s is unset and %s does not exist", ErrNoSharedDir, SharedDirEnv, dir)
	}
	return dir, nil
}

// moduleRoot returns the nearest directory at or above dir that holds a
// go.mod file, "" if none does (or dir is "").
func moduleRoot(dir string) string {
	if dir == "" {
		return ""
	}
	dir = filepath.Clean(dir)
	for {
		if st, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil && !st.IsDir() {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}
