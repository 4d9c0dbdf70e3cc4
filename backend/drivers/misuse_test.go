//go:build unix

package drivers_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/backend/drivers"
)

// TestOpenMisuse: every bad option is an error wrapping a backend
// sentinel, never a panic and never a driver.
func TestOpenMisuse(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "libcuda.so.1")
	require.NoError(t, os.WriteFile(notELF, []byte("not a shared object"), 0o644))
	libc := "/lib/x86_64-linux-gnu/libc.so.6" // a real library without the vendor symbols
	dbl, dblErr := cudatest.Shared()
	for _, tc := range []struct {
		name    string
		backend string
		o       drivers.Options
		want    error
		needs   string // a path that must exist
	}{
		{"emulated negative devices", "emulated", drivers.Options{Devices: -1}, backend.ErrInvalidArgument, ""},
		{"emulated too many devices", "emulated", drivers.Options{Devices: 1 << 30}, backend.ErrInvalidArgument, ""},
		{"cuda missing library", "cuda", drivers.Options{Library: filepath.Join(dir, "none.so")}, backend.ErrUnavailable, ""},
		{"cuda not a library", "cuda", drivers.Options{Library: notELF}, backend.ErrUnavailable, ""},
		{"cuda library without its symbols", "cuda", drivers.Options{Library: libc}, backend.ErrUnavailable, libc},
		{"cuda directory", "cuda", drivers.Options{Library: dir}, backend.ErrUnavailable, ""},
		{"acl missing library", "acl", drivers.Options{Library: filepath.Join(dir, "none.so")}, backend.ErrUnavailable, ""},
		{"acl not a library", "acl", drivers.Options{Library: notELF}, backend.ErrUnavailable, ""},
		{"acl library without its symbols", "acl", drivers.Options{Library: libc}, backend.ErrUnavailable, libc},
		{"cuda visible negative", "cuda", drivers.Options{Library: dbl, Visible: []int{-1}}, backend.ErrInvalidArgument, dbl},
		{"cuda visible beyond", "cuda", drivers.Options{Library: dbl, Visible: []int{99}}, backend.ErrInvalidArgument, dbl},
		{"cuda visible twice", "cuda", drivers.Options{Library: dbl, Visible: []int{0, 0}}, backend.ErrInvalidArgument, dbl},
		{"cuda visible empty", "cuda", drivers.Options{Library: dbl, Visible: []int{}}, backend.ErrInvalidArgument, dbl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needs != "" {
				if _, err := os.Stat(tc.needs); err != nil {
					t.Skipf("%s: %v (%v)", tc.needs, err, dblErr)
				}
			} else if tc.o.Library == dbl && dblErr != nil {
				t.Skipf("CUDA test double unavailable: %v", dblErr)
			}
			d, err := drivers.Open(tc.backend, tc.o)
			require.ErrorIs(t, err, tc.want)
			assert.Nil(t, d)
		})
	}
	require.NoError(t, drivers.Close(nil))
}
