package stats

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata golden files (review the diff by hand)")

// errWriter fails every Write.
type errWriter struct{ calls int }

var errDiskFull = errors.New("disk full")

func (w *errWriter) Write([]byte) (int, error) { w.calls++; return 0, errDiskFull }

func TestWriteJSONExact(t *testing.T) {
	d := fixture()
	// Expected output built from the test's own key list: two-space
	// indent, sorted keys, trailing newline.
	ptrs := flatKeyPointers(d)
	keys := make([]string, 0, len(ptrs))
	for k := range ptrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var want strings.Builder
	want.WriteString("{\n")
	for i, k := range keys {
		sep := ","
		if i == len(keys)-1 {
			sep = ""
		}
		fmt.Fprintf(&want, "  %q: %d%s\n", k, *ptrs[k], sep)
	}
	want.WriteString("}\n")

	var buf bytes.Buffer
	require.NoError(t, WriteJSON(&buf, d))
	assert.Equal(t, want.String(), buf.String())

	// Spot-check a few literal lines.
	for _, l := range []string{
		`  "active.all.allocated": 3,`,
		`  "allocated_bytes.all.current": 31458816,`,
		`  "reserved_bytes.large_pool.peak": 44040192,`,
		`  "num_ooms": 2,`,
		`  "segment.small_pool.peak": 1`,
	} {
		assert.Contains(t, strings.Split(buf.String(), "\n"), l)
	}

	var back map[string]int64
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back))
	assert.Equal(t, Flatten(d), back)
}

func TestWritePrometheusGolden(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WritePrometheus(&buf, 0, fixture()))
	golden := filepath.Join("testdata", "fixture.prom")
	if *update {
		require.NoError(t, os.WriteFile(golden, buf.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), buf.String())
}

func TestWritePrometheusFamilies(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WritePrometheus(&buf, 3, fixture()))
	out := buf.String()

	// Exact blocks for one family of each shape.
	for _, block := range []string{
		"# HELP vmmalloc_reserved_bytes_current Current value of the bytes of mapped device memory.\n" +
			"# TYPE vmmalloc_reserved_bytes_current gauge\n" +
			"vmmalloc_reserved_bytes_current{device=\"3\",pool=\"all\"} 46137344\n" +
			"vmmalloc_reserved_bytes_current{device=\"3\",pool=\"large_pool\"} 44040192\n" +
			"vmmalloc_reserved_bytes_current{device=\"3\",pool=\"small_pool\"} 2097152\n",
		"# HELP vmmalloc_allocation_freed_total Total decrease of the number of allocated blocks since the last accumulated reset.\n" +
			"# TYPE vmmalloc_allocation_freed_total counter\n" +
			"vmmalloc_allocation_freed_total{device=\"3\",pool=\"all\"} 1\n" +
			"vmmalloc_allocation_freed_total{device=\"3\",pool=\"large_pool\"} 1\n" +
			"vmmalloc_allocation_freed_total{device=\"3\",pool=\"small_pool\"} 0\n",
		"# HELP vmmalloc_oversize_allocations_peak Peak value of the number of allocations of at least max_split_size since the last peak reset.\n" +
			"# TYPE vmmalloc_oversize_allocations_peak gauge\n" +
			"vmmalloc_oversize_allocations_peak{device=\"3\"} 2\n",
		"# HELP vmmalloc_num_ooms_total Mallocs that failed with out-of-memory.\n" +
			"# TYPE vmmalloc_num_ooms_total counter\n" +
			"vmmalloc_num_ooms_total{device=\"3\"} 2\n",
		"# HELP vmmalloc_max_split_size Configured max_split_size in bytes; 0 means unlimited.\n" +
			"# TYPE vmmalloc_max_split_size gauge\n" +
			"vmmalloc_max_split_size{device=\"3\"} 67108864\n",
		"# TYPE vmmalloc_handles_reused_total counter\nvmmalloc_handles_reused_total{device=\"3\"} 11\n",
	} {
		assert.Contains(t, out, block)
	}

	// Structure: every family is HELP, TYPE, then its samples; names are
	// sorted and unique; counters end in _total and gauges do not.
	help := regexp.MustCompile(`^# HELP (vmmalloc_[a-z_]+) \S.*$`)
	typ := regexp.MustCompile(`^# TYPE (vmmalloc_[a-z_]+) (counter|gauge)$`)
	sample := regexp.MustCompile(`^(vmmalloc_[a-z_]+)\{device="3"(,pool="(all|large_pool|small_pool)")?\} -?[0-9]+$`)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var names []string
	samples := 0
	for i := 0; i < len(lines); {
		m := help.FindStringSubmatch(lines[i])
		require.NotNil(t, m, "line %d: %q", i, lines[i])
		name := m[1]
		names = append(names, name)
		m = typ.FindStringSubmatch(lines[i+1])
		require.NotNil(t, m, "line %d: %q", i+1, lines[i+1])
		require.Equal(t, name, m[1])
		assert.Equal(t, m[2] == "counter", strings.HasSuffix(name, "_total"), name)
		i += 2
		n := 0
		for ; i < len(lines) && !strings.HasPrefix(lines[i], "#"); i++ {
			m := sample.FindStringSubmatch(lines[i])
			require.NotNil(t, m, "line %d: %q", i, lines[i])
			require.Equal(t, name, m[1])
			n++
		}
		assert.Contains(t, []int{1, 3}, n, name)
		samples += n
	}
	assert.Len(t, names, 54)
	assert.True(t, sort.StringsAreSorted(names))
	assert.Equal(t, NumFlatKeys, samples, "one sample per flattened key")
}

func TestWritePrometheusDevices(t *testing.T) {
	d0, d1 := &DeviceStats{}, &DeviceStats{}
	d0.NumOOMs = 4
	d1.NumOOMs = 9
	d1.ReservedBytes.Add(SmallPool, 2<<20)
	var buf bytes.Buffer
	// Map iteration order must not matter: output is by device ID.
	require.NoError(t, WritePrometheusDevices(&buf, map[int]*DeviceStats{10: d1, 2: d0}))
	out := buf.String()
	assert.Contains(t, out, "# TYPE vmmalloc_num_ooms_total counter\n"+
		"vmmalloc_num_ooms_total{device=\"2\"} 4\n"+
		"vmmalloc_num_ooms_total{device=\"10\"} 9\n")
	assert.Contains(t, out, "# TYPE vmmalloc_reserved_bytes_peak gauge\n"+
		"vmmalloc_reserved_bytes_peak{device=\"2\",pool=\"all\"} 0\n"+
		"vmmalloc_reserved_bytes_peak{device=\"2\",pool=\"large_pool\"} 0\n"+
		"vmmalloc_reserved_bytes_peak{device=\"2\",pool=\"small_pool\"} 0\n"+
		"vmmalloc_reserved_bytes_peak{device=\"10\",pool=\"all\"} 2097152\n"+
		"vmmalloc_reserved_bytes_peak{device=\"10\",pool=\"large_pool\"} 0\n"+
		"vmmalloc_reserved_bytes_peak{device=\"10\",pool=\"small_pool\"} 2097152\n")
	assert.Equal(t, 54, strings.Count(out, "# TYPE "), "each family once")
	assert.Equal(t, 2*NumFlatKeys, strings.Count(out, "\nvmmalloc_"))

	var one bytes.Buffer
	require.NoError(t, WritePrometheusDevices(&one, map[int]*DeviceStats{}))
	assert.Empty(t, one.String())
}

func TestExportErrors(t *testing.T) {
	tests := []struct {
		name string
		call func(w *bytes.Buffer) error
		want error
	}{
		{"json nil", func(w *bytes.Buffer) error { return WriteJSON(w, nil) }, ErrNilStats},
		{"prometheus nil", func(w *bytes.Buffer) error { return WritePrometheus(w, 0, nil) }, ErrNilStats},
		{"prometheus negative device", func(w *bytes.Buffer) error { return WritePrometheus(w, -1, &DeviceStats{}) }, ErrInvalidDevice},
		{"devices nil entry", func(w *bytes.Buffer) error {
			return WritePrometheusDevices(w, map[int]*DeviceStats{0: {}, 1: nil})
		}, ErrNilStats},
		{"devices negative ID", func(w *bytes.Buffer) error {
			return WritePrometheusDevices(w, map[int]*DeviceStats{0: {}, -3: {}})
		}, ErrInvalidDevice},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := tt.call(&buf)
			require.ErrorIs(t, err, tt.want)
			assert.Empty(t, buf.String(), "nothing written on error")
		})
	}
}

func TestExportWriterErrors(t *testing.T) {
	for name, call := range map[string]func(w *errWriter) error{
		"json":       func(w *errWriter) error { return WriteJSON(w, fixture()) },
		"prometheus": func(w *errWriter) error { return WritePrometheus(w, 0, fixture()) },
	} {
		t.Run(name, func(t *testing.T) {
			w := &errWriter{}
			err := call(w)
			require.ErrorIs(t, err, errDiskFull)
			assert.Equal(t, 1, w.calls, "output is written in one Write")
		})
	}
}
