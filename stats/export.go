package stats

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ErrNilStats: a nil *DeviceStats was passed to an exporter, which then
// wrote nothing. Test with errors.Is.
var ErrNilStats = errors.New("stats: nil DeviceStats")

// PrometheusPrefix begins every metric name Metrics returns.
const PrometheusPrefix = "vmmalloc_"

// WriteJSON writes Flatten(d) to w as one indented JSON object with its
// keys sorted, followed by a newline. A nil d is ErrNilStats. The output
// is built in memory and written with a single Write.
func WriteJSON(w io.Writer, d *DeviceStats) error {
	if d == nil {
		return fmt.Errorf("%w: WriteJSON", ErrNilStats)
	}
	// encoding/json sorts map keys, which makes the output deterministic.
	b, err := json.MarshalIndent(Flatten(d), "", "  ")
	if err != nil {
		return fmt.Errorf("stats: encode JSON: %w", err)
	}
	b = append(b, '\n')
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("stats: write JSON: %w", err)
	}
	return nil
}

// Metric describes one metric family of the exported statistics, for
// exporters such as the Prometheus collector of package
// allocator/metrics. Every key of Flatten belongs to exactly one family,
// named PrometheusPrefix + key with the pool moved into a label:
//
//   - <array>.<pool>.current and .peak become the gauges
//     vmmalloc_<array>_current and vmmalloc_<array>_peak, one sample per
//     pool (all, large_pool, small_pool);
//   - <array>.<pool>.allocated and .freed become the counters
//     vmmalloc_<array>_allocated_total and vmmalloc_<array>_freed_total
//     (the _total suffix is the Prometheus naming convention for counters;
//     they restart from 0 after DeviceStats.ResetAccumulated, which
//     Prometheus treats as a counter reset);
//   - oversize_allocations and oversize_segments follow the same rule
//     with one sample;
//   - the scalars become counters vmmalloc_<key>_total, except the
//     gauges max_split_size, cached_handle_bytes, stranded_bytes, exported_handles,
//     exported_bytes, exporter_held_handles, exporter_held_bytes,
//     owned_bytes, asleep_bytes and host_backup_bytes.
type Metric struct {
	Name    string // full metric name, e.g. "vmmalloc_reserved_bytes_current"
	Help    string // one sentence
	Counter bool   // a counter (else a gauge)
	Pooled  bool   // one sample per pool of MetricPools (else one sample)

	pooled func(*DeviceStats, PoolKind) int64 // per-pool value; nil if unpooled
	value  func(*DeviceStats) int64           // unpooled value
}

// Value returns the metric's value in d for pool p (ignored unless
// m.Pooled). A nil d is ErrNilStats.
func (m Metric) Value(d *DeviceStats, p PoolKind) (int64, error) {
	if d == nil {
		return 0, fmt.Errorf("%w: %s", ErrNilStats, m.Name)
	}
	if m.pooled != nil {
		return m.pooled(d, p), nil
	}
	return m.value(d), nil
}

// MetricPools lists the pools a pooled metric has a sample for, in report
// order: all, large_pool, small_pool.
func MetricPools() []PoolKind { return reportPools[:] }

// Metrics lists every metric family, sorted by name.
func Metrics() []Metric {
	fams := promFamilies()
	out := make([]Metric, len(fams))
	for i, f := range fams {
		out[i] = Metric{Name: f.name, Help: f.help, Counter: f.kind == kindCounter, Pooled: f.pooled != nil, pooled: f.pooled, value: f.value}
	}
	return out
}

// promFamily is one metric family of the Prometheus exposition.
type promFamily struct {
	name   string
	help   string
	kind   metricKind
	pooled func(*DeviceStats, PoolKind) int64 // per-pool value; nil if unpooled
	value  func(*DeviceStats) int64           // unpooled value
}

// promFamilies lists every family, sorted by name.
func promFamilies() []promFamily {
	var fams []promFamily
	name := func(key string, k metricKind) string {
		if k == kindCounter {
			return PrometheusPrefix + key + "_total"
		}
		return PrometheusPrefix + key
	}
	for _, a := range arrayDescs {
		for _, f := range statFields {
			fams = append(fams, promFamily{
				name: name(a.name+"_"+f.name, f.kind),
				help: fmt.Sprintf(f.help, a.help),
				kind: f.kind,
				pooled: func(d *DeviceStats, p PoolKind) int64 {
					return f.get(&a.get(d)[p])
				},
			})
		}
	}
	for _, s := range statDescs {
		for _, f := range statFields {
			fams = append(fams, promFamily{
				name:  name(s.name+"_"+f.name, f.kind),
				help:  fmt.Sprintf(f.help, s.help),
				kind:  f.kind,
				value: func(d *DeviceStats) int64 { return f.get(s.get(d)) },
			})
		}
	}
	for _, s := range scalarDescs {
		fams = append(fams, promFamily{
			name:  name(s.name, s.kind),
			help:  s.help,
			kind:  s.kind,
			value: s.get,
		})
	}
	slices.SortFunc(fams, func(x, y promFamily) int { return strings.Compare(x.name, y.name) })
	return fams
}
