package metrics_test

import (
	"encoding/json"
	"expvar"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/metrics"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// twoDevices returns allocators for devices 0 and 1 with some memory in
// use on each.
func twoDevices(t *testing.T) (*allocator.Allocator, *allocator.Allocator) {
	t.Helper()
	drv, err := emulated.New(emulated.WithCapacity(8<<30), emulated.WithDevices(2))
	require.NoError(t, err)
	t.Cleanup(func() { _ = drv.Close() })
	var as [2]*allocator.Allocator
	for dev := range as {
		cfg := allocator.DefaultConfig()
		cfg.Device = dev
		a, err := allocator.New(drv, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Close() })
		as[dev] = a
	}
	p, err := as[0].Malloc(30<<20, 0)
	require.NoError(t, err)
	_, err = as[0].Malloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, as[0].Free(p))
	_, err = as[1].Malloc(100<<20, 0)
	require.NoError(t, err)
	return as[0], as[1]
}

// scrape serves the registry over HTTP and parses the text exposition.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.PanicOnError}))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestCollectorScrape(t *testing.T) {
	a0, a1 := twoDevices(t)
	c, err := metrics.NewCollector(a0, a1)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	fams := scrape(t, reg)
	require.Len(t, fams, len(stats.Metrics()))

	// Every sample equals the statistic it names, on its device.
	samples := 0
	for _, m := range stats.Metrics() {
		f, ok := fams[m.Name]
		require.True(t, ok, m.Name)
		wantType := dto.MetricType_GAUGE
		if m.Counter {
			wantType = dto.MetricType_COUNTER
		}
		assert.Equal(t, wantType, f.GetType(), m.Name)
		assert.Equal(t, m.Help, f.GetHelp())
		for _, s := range f.GetMetric() {
			l := labels(s)
			v := s.GetGauge().GetValue()
			if m.Counter {
				v = s.GetCounter().GetValue()
			}
			st := a0.Stats()
			if l["device"] == "1" {
				st = a1.Stats()
			}
			pool := stats.AllPools
			for _, p := range stats.MetricPools() {
				if p.String() == l["pool"] {
					pool = p
				}
			}
			want, err := m.Value(&st, pool)
			require.NoError(t, err)
			assert.Equal(t, float64(want), v, "%s %v", m.Name, l)
			samples++
		}
	}
	assert.Equal(t, 2*stats.NumFlatKeys, samples, "one sample per flattened key and device")

	find := func(name, dev, pool string) float64 {
		for _, s := range fams[name].GetMetric() {
			if l := labels(s); l["device"] == dev && l["pool"] == pool {
				return s.GetGauge().GetValue() + s.GetCounter().GetValue()
			}
		}
		t.Fatalf("no %s{device=%q,pool=%q}", name, dev, pool)
		return 0
	}
	assert.Equal(t, float64(a0.MemoryAllocated()), find("vmmalloc_allocated_bytes_current", "0", "all"))
	assert.Equal(t, float64(4096), find("vmmalloc_allocated_bytes_current", "0", "small_pool"))
	assert.Equal(t, float64(30<<20), find("vmmalloc_allocated_bytes_freed_total", "0", "large_pool"))
	assert.Equal(t, float64(a1.MemoryReserved()), find("vmmalloc_reserved_bytes_current", "1", "large_pool"))
	assert.Equal(t, float64(100<<20), find("vmmalloc_allocated_bytes_peak", "1", "all"))
}

func TestCollectorRejects(t *testing.T) {
	a0, _ := twoDevices(t)
	_, err := metrics.NewCollector(a0, a0)
	require.ErrorIs(t, err, metrics.ErrDuplicateDevice)
	_, err = metrics.NewCollector(nil)
	require.Error(t, err)
	_, err = metrics.Expvar(a0, a0)
	require.ErrorIs(t, err, metrics.ErrDuplicateDevice)
}

func TestExpvar(t *testing.T) {
	a0, a1 := twoDevices(t)
	require.NoError(t, metrics.PublishExpvar("vmmalloc_test", a0, a1))
	require.Error(t, metrics.PublishExpvar("vmmalloc_test", a0), "a name is published once")

	srv := httptest.NewServer(expvar.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	var vars map[string]json.RawMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&vars))
	var got map[string]map[string]int64
	require.NoError(t, json.Unmarshal(vars["vmmalloc_test"], &got))
	st0, st1 := a0.Stats(), a1.Stats()
	assert.Equal(t, map[string]map[string]int64{"0": stats.Flatten(&st0), "1": stats.Flatten(&st1)}, got)
	assert.Equal(t, int64(a1.MemoryAllocated()), got["1"]["allocated_bytes.all.current"])
}
