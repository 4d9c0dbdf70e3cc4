package stats

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Errors the exporters return, wrapped with detail; test them with
// errors.Is. On either, nothing has been written.
var (
	// ErrNilStats: a nil *DeviceStats was passed to an exporter.
	ErrNilStats = errors.New("stats: nil DeviceStats")
	// ErrInvalidDevice: a device ID was negative.
	ErrInvalidDevice = errors.New("stats: invalid device ID")
)

// PrometheusPrefix begins every metric name WritePrometheus writes.
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

// WritePrometheus writes the counters of one device in the Prometheus
// text exposition format (version 0.0.4). Every key of Flatten becomes a
// metric family named PrometheusPrefix + key with the pool moved into a
// label:
//
//   - <array>.<pool>.current and .peak become the gauges
//     vmmalloc_<array>_current and vmmalloc_<array>_peak with labels
//     device and pool;
//   - <array>.<pool>.allocated and .freed become the counters
//     vmmalloc_<array>_allocated_total and vmmalloc_<array>_freed_total
//     (the _total suffix is the Prometheus naming convention for counters;
//     they restart from 0 after DeviceStats.ResetAccumulated, which
//     Prometheus treats as a counter reset);
//   - oversize_allocations and oversize_segments follow the same rule
//     with only the device label;
//   - the scalars become counters vmmalloc_<key>_total with the device
//     label, except max_split_size, a gauge.
//
// Each family has a HELP and a TYPE line; families are sorted by name and
// samples by pool (all, large_pool, small_pool). A text exposition may
// hold each family only once, so to export several devices in one scrape
// use WritePrometheusDevices rather than calling this once per device.
//
// A nil d is ErrNilStats and a negative device is ErrInvalidDevice. The
// output is built in memory and written with a single Write.
func WritePrometheus(w io.Writer, device int, d *DeviceStats) error {
	return WritePrometheusDevices(w, map[int]*DeviceStats{device: d})
}

// WritePrometheusDevices is WritePrometheus for several devices at once:
// each family lists the samples of every device, in ascending device
// order. An empty map writes nothing. A nil entry is ErrNilStats and a
// negative device ErrInvalidDevice; on either, nothing is written.
func WritePrometheusDevices(w io.Writer, devices map[int]*DeviceStats) error {
	ids := make([]int, 0, len(devices))
	for id, d := range devices {
		if id < 0 {
			return fmt.Errorf("%w: %d", ErrInvalidDevice, id)
		}
		if d == nil {
			return fmt.Errorf("%w: device %d", ErrNilStats, id)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)

	fams := promFamilies()
	var b strings.Builder
	for _, f := range fams {
		b.WriteString("# HELP ")
		b.WriteString(f.name)
		b.WriteByte(' ')
		b.WriteString(f.help)
		b.WriteString("\n# TYPE ")
		b.WriteString(f.name)
		if f.kind == kindCounter {
			b.WriteString(" counter\n")
		} else {
			b.WriteString(" gauge\n")
		}
		for _, id := range ids {
			d := devices[id]
			dev := itoa(int64(id))
			if f.pooled == nil {
				fmt.Fprintf(&b, "%s{device=%q} %d\n", f.name, dev, f.value(d))
				continue
			}
			for _, p := range reportPools {
				fmt.Fprintf(&b, "%s{device=%q,pool=%q} %d\n", f.name, dev, p.String(), f.pooled(d, p))
			}
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("stats: write Prometheus: %w", err)
	}
	return nil
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
