package metrics_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/metrics"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// ExampleNewCollector registers the allocator's statistics and scrapes
// them as Prometheus would.
func ExampleNewCollector() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	_, _ = a.Malloc(30<<20, 0)

	c, err := metrics.NewCollector(a)
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	// In a program: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, req)
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, "vmmalloc_allocated_bytes_current") {
			fmt.Println(l)
		}
	}
	// Output:
	// vmmalloc_allocated_bytes_current{device="0",pool="all"} 3.145728e+07
	// vmmalloc_allocated_bytes_current{device="0",pool="large_pool"} 3.145728e+07
	// vmmalloc_allocated_bytes_current{device="0",pool="small_pool"} 0
}

// ExamplePublishExpvar publishes the statistics under /debug/vars.
func ExamplePublishExpvar() {
	drv, _ := emulated.New()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	if err := metrics.PublishExpvar("vmmalloc_example", a); err != nil {
		fmt.Println(err)
	}
	fmt.Println(metrics.PublishExpvar("vmmalloc_example", a))
	// Output:
	// metrics: expvar "vmmalloc_example" is already published
}
