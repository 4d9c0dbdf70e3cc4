package devprof_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/devprof"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestMisuse: nil writers are a typed error; nil and closed allocators
// give an empty or last-known profile, never a panic.
func TestMisuse(t *testing.T) {
	drv, err := emulated.New()
	require.NoError(t, err)
	defer drv.Close()
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	p, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)

	require.ErrorIs(t, devprof.Write(nil, a), devprof.ErrNilWriter)

	for _, tc := range []struct {
		name   string
		allocs []*allocator.Allocator
		inuse  int64
	}{
		{"none", nil, 0},
		{"nil", []*allocator.Allocator{nil}, 0},
		{"live", []*allocator.Allocator{a, nil}, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, devprof.Write(&buf, tc.allocs...))
			prof, err := profile.Parse(&buf)
			require.NoError(t, err)
			var inuse int64
			for _, s := range prof.Sample {
				inuse += s.Value[3]
			}
			assert.Equal(t, tc.inuse, inuse)
		})
	}
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Close())
	var buf bytes.Buffer
	require.NoError(t, devprof.Write(&buf, a), "a closed allocator's profile is empty")
	prof, err := profile.Parse(&buf)
	require.NoError(t, err)
	assert.Empty(t, prof.Sample)

	rec := httptest.NewRecorder()
	devprof.Handler(a).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/pprof/devmem", nil))
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
	assert.Equal(t, "GET, HEAD", rec.Header().Get("Allow"))
}
