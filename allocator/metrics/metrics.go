// Package metrics exports the statistics of vmmalloc allocators
// (torch.cuda.memory_stats) to Prometheus and expvar. It is a package of
// its own so that importing the allocator does not pull in
// github.com/prometheus/client_golang.
//
// Both exporters read every allocator's Stats at scrape time; nothing is
// cached or updated on the allocation path. Metric families are the ones
// stats.Metrics describes (vmmalloc_reserved_bytes_current and so on),
// with the labels device and, for per-pool figures, pool (all,
// large_pool, small_pool).
package metrics

import (
	"errors"
	"expvar"
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/stats"
)

// ErrDuplicateDevice: two allocators given to one exporter serve the same
// device, so their samples would collide.
var ErrDuplicateDevice = errors.New("metrics: two allocators for one device")

// Collector is a prometheus.Collector of the statistics of a fixed set of
// allocators. Register it with prometheus.MustRegister or a Registry.
type Collector struct {
	allocs []*allocator.Allocator
	descs  []metricDesc
}

type metricDesc struct {
	m    stats.Metric
	desc *prometheus.Desc
	kind prometheus.ValueType
}

// NewCollector returns a collector of allocs, one sample set per device.
// Nil allocators are an error, as are two for one device.
func NewCollector(allocs ...*allocator.Allocator) (*Collector, error) {
	if err := checkAllocs(allocs); err != nil {
		return nil, err
	}
	c := &Collector{allocs: append([]*allocator.Allocator(nil), allocs...)}
	for _, m := range stats.Metrics() {
		labels := []string{"device"}
		if m.Pooled {
			labels = append(labels, "pool")
		}
		kind := prometheus.GaugeValue
		if m.Counter {
			kind = prometheus.CounterValue
		}
		c.descs = append(c.descs, metricDesc{m: m, desc: prometheus.NewDesc(m.Name, m.Help, labels, nil), kind: kind})
	}
	return c, nil
}

func checkAllocs(allocs []*allocator.Allocator) error {
	seen := map[int]bool{}
	for i, a := range allocs {
		if a == nil {
			return fmt.Errorf("metrics: allocator %d is nil", i)
		}
		if seen[a.Device()] {
			return fmt.Errorf("%w: device %d", ErrDuplicateDevice, a.Device())
		}
		seen[a.Device()] = true
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d.desc
	}
}

// Collect implements prometheus.Collector: one consistent Stats copy per
// allocator, then every family's samples.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, a := range c.allocs {
		st := a.Stats()
		dev := strconv.Itoa(a.Device())
		for _, d := range c.descs {
			if !d.m.Pooled {
				v, _ := d.m.Value(&st, stats.AllPools) // st is not nil
				ch <- prometheus.MustNewConstMetric(d.desc, d.kind, float64(v), dev)
				continue
			}
			for _, p := range stats.MetricPools() {
				v, _ := d.m.Value(&st, p)
				ch <- prometheus.MustNewConstMetric(d.desc, d.kind, float64(v), dev, p.String())
			}
		}
	}
}

// Expvar returns an expvar.Var whose value is, per device, the flattened
// statistics (stats.Flatten: "reserved_bytes.large_pool.current" and so
// on), read when /debug/vars is served:
//
//	{"0": {"active.all.allocated": 12, ...}, "1": {...}}
func Expvar(allocs ...*allocator.Allocator) (expvar.Var, error) {
	if err := checkAllocs(allocs); err != nil {
		return nil, err
	}
	allocs = append([]*allocator.Allocator(nil), allocs...)
	return expvar.Func(func() any {
		out := make(map[string]map[string]int64, len(allocs))
		for _, a := range allocs {
			st := a.Stats()
			out[strconv.Itoa(a.Device())] = stats.Flatten(&st)
		}
		return out
	}), nil
}

// publishMu serialises PublishExpvar's check and publish.
var publishMu sync.Mutex

// PublishExpvar publishes Expvar(allocs...) under name. Like
// expvar.Publish, it may be called once per name; a name already
// published is an error (expvar itself would panic), unless another
// package publishes the same name concurrently with expvar.Publish.
func PublishExpvar(name string, allocs ...*allocator.Allocator) error {
	v, err := Expvar(allocs...)
	if err != nil {
		return err
	}
	publishMu.Lock()
	defer publishMu.Unlock()
	if expvar.Get(name) != nil {
		return fmt.Errorf("metrics: expvar %q is already published", name)
	}
	expvar.Publish(name, v)
	return nil
}
