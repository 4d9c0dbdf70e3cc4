package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/metrics"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestMisuse: every exporter refuses nil allocators, duplicate devices and
// a name already published with a sentinel, and publishes nothing then.
func TestMisuse(t *testing.T) {
	drv, err := emulated.New(emulated.WithDevices(2))
	require.NoError(t, err)
	defer drv.Close()
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	b, err := allocator.New(drv, allocator.DefaultConfig()) // device 0 again
	require.NoError(t, err)
	defer b.Close()

	for _, tc := range []struct {
		name   string
		allocs []*allocator.Allocator
		want   error
	}{
		{"nil", []*allocator.Allocator{nil}, metrics.ErrNilAllocator},
		{"nil after a good one", []*allocator.Allocator{a, nil}, metrics.ErrNilAllocator},
		{"duplicate device", []*allocator.Allocator{a, b}, metrics.ErrDuplicateDevice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := metrics.NewCollector(tc.allocs...)
			require.ErrorIs(t, err, tc.want)
			assert.Nil(t, c)
			v, err := metrics.Expvar(tc.allocs...)
			require.ErrorIs(t, err, tc.want)
			assert.Nil(t, v)
			require.ErrorIs(t, metrics.PublishExpvar("vmmalloc_misuse_"+tc.name, tc.allocs...), tc.want)
			require.NoError(t, metrics.PublishExpvar("vmmalloc_misuse_"+tc.name, a), "the name was not taken")
		})
	}
	require.ErrorIs(t, metrics.PublishExpvar("vmmalloc_misuse_nil", a), metrics.ErrPublished)

	// A closed allocator still collects (its final statistics).
	require.NoError(t, b.Close())
	c, err := metrics.NewCollector(b)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	fams, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, f := range fams {
		if f.GetName() == "vmmalloc_allocated_bytes_current" {
			n = len(f.GetMetric())
		}
	}
	assert.Equal(t, 3, n, "all, large_pool, small_pool")
}

// TestScrapeDuringUse: scrapes and expvar reads run against Malloc, Free
// and Close (-race), and the final scrape reports the closed allocator's
// zero allocated bytes.
func TestScrapeDuringUse(t *testing.T) {
	drv, err := emulated.New()
	require.NoError(t, err)
	defer drv.Close()
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	c, err := metrics.NewCollector(a)
	require.NoError(t, err)
	v, err := metrics.Expvar(a)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			p, err := a.Malloc(uint64(i+1)<<12, 0)
			if !assert.NoError(t, err) {
				return
			}
			assert.NoError(t, a.Free(p))
		}
		assert.NoError(t, a.Close())
	}()
	for range 50 {
		_, err := reg.Gather()
		require.NoError(t, err)
		assert.NotEmpty(t, v.String())
	}
	<-done
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == "vmmalloc_allocated_bytes_current" {
			for _, m := range f.GetMetric() {
				assert.Zero(t, m.GetGauge().GetValue())
			}
		}
	}
}
