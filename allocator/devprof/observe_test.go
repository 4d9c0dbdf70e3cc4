package devprof_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/devprof"
	"github.com/vmmalloc/vmmalloc/allocator/metrics"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// startHistory, writeFiles and serve are the snippets of
// docs/observability.md, in the order a program runs them.
func startHistory(a *allocator.Allocator) error {
	// a is an *allocator.Allocator; errors are returned to the caller.
	if err := a.RecordHistory(allocator.HistoryOptions{MaxEntries: 100_000, Stacks: true}); err != nil {
		return err
	}
	return nil
}

func writeFiles(a *allocator.Allocator) error {
	var snap bytes.Buffer
	if err := a.WriteSnapshot(&snap); err != nil { // PyTorch _dump_snapshot format (pickle protocol 4)
		return err
	}
	if err := os.WriteFile("snapshot.pickle", snap.Bytes(), 0o644); err != nil {
		return err
	}
	var prof bytes.Buffer
	if err := devprof.Write(&prof, a); err != nil { // allocator/devprof
		return err
	}
	if err := os.WriteFile("devmem.pb.gz", prof.Bytes(), 0o644); err != nil {
		return err
	}
	return nil
}

func serve(a *allocator.Allocator, mux *http.ServeMux, reg *prometheus.Registry) error {
	mux.Handle("/debug/pprof/devmem", devprof.Handler(a)) // next to net/http/pprof
	c, err := metrics.NewCollector(a)                     // allocator/metrics: Prometheus
	if err != nil {
		return err
	}
	reg.MustRegister(c) // or prometheus.MustRegister(c) for the default registry
	return nil
}

// TestObservabilitySnippets runs the snippets as a program would: the
// snapshot is a pickle (protocol 4), the profile holds the 96 MiB the
// workload keeps, and the served profile and metrics say the same.
func TestObservabilitySnippets(t *testing.T) {
	t.Chdir(t.TempDir())
	drv, err := emulated.New(emulated.WithCapacity(8 << 30))
	require.NoError(t, err)
	defer drv.Close()
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	defer a.Close()

	require.NoError(t, startHistory(a))
	for range 3 { // the workload: 3 × 32 MiB kept, 1 MiB freed
		_, err := a.Malloc(32<<20, 0)
		require.NoError(t, err)
	}
	p, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, writeFiles(a))

	snap, err := os.ReadFile("snapshot.pickle")
	require.NoError(t, err)
	require.Greater(t, len(snap), 2)
	assert.Equal(t, []byte{0x80, 4}, snap[:2], "pickle protocol 4")
	inUse := func(r io.Reader) int64 {
		prof, err := profile.Parse(r)
		require.NoError(t, err)
		var n int64
		for _, s := range prof.Sample {
			n += s.Value[3] // inuse_space
		}
		return n
	}
	f, err := os.Open("devmem.pb.gz")
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, int64(96<<20), inUse(f))

	mux, reg := http.NewServeMux(), prometheus.NewRegistry()
	require.NoError(t, serve(a, mux, reg))
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/devmem", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, int64(96<<20), inUse(rec.Body))
	families, err := reg.Gather()
	require.NoError(t, err)
	var allocated float64
	for _, fam := range families {
		if fam.GetName() != "vmmalloc_allocated_bytes_current" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() == "all" {
					allocated = m.GetGauge().GetValue()
				}
			}
		}
	}
	assert.Equal(t, float64(96<<20), allocated)
}
