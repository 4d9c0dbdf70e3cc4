package stats

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
		`  "segment.small_pool.peak": 1,`,
		`  "stranded_bytes": 0`,
	} {
		assert.Contains(t, strings.Split(buf.String(), "\n"), l)
	}

	var back map[string]int64
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back))
	assert.Equal(t, Flatten(d), back)
}

func TestMetricsShape(t *testing.T) {
	ms := Metrics()
	require.Len(t, ms, 67)
	names := make([]string, len(ms))
	samples := 0
	for i, m := range ms {
		names[i] = m.Name
		assert.True(t, strings.HasPrefix(m.Name, PrometheusPrefix), m.Name)
		assert.Regexp(t, `^vmmalloc_[a-z_]+$`, m.Name)
		assert.Equal(t, m.Counter, strings.HasSuffix(m.Name, "_total"), m.Name)
		assert.NotEmpty(t, m.Help)
		if m.Pooled {
			samples += len(MetricPools())
		} else {
			samples++
		}
	}
	assert.True(t, sort.StringsAreSorted(names))
	assert.Equal(t, NumFlatKeys, samples, "one sample per flattened key")
	assert.Equal(t, []PoolKind{AllPools, LargePool, SmallPool}, MetricPools())
}

func TestMetricsValues(t *testing.T) {
	d := fixture()
	byName := map[string]Metric{}
	var got []int64
	for _, m := range Metrics() {
		byName[m.Name] = m
		pools := []PoolKind{AllPools}
		if m.Pooled {
			pools = MetricPools()
		}
		for _, p := range pools {
			v, err := m.Value(d, p)
			require.NoError(t, err)
			got = append(got, v)
		}
	}
	// The samples carry exactly the values of Flatten.
	var want []int64
	for _, v := range Flatten(d) {
		want = append(want, v)
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	assert.Equal(t, want, got)

	for _, c := range []struct {
		name string
		pool PoolKind
		want int64
	}{
		{"vmmalloc_reserved_bytes_current", AllPools, 46137344},
		{"vmmalloc_reserved_bytes_current", LargePool, 44040192},
		{"vmmalloc_reserved_bytes_current", SmallPool, 2097152},
		{"vmmalloc_allocation_freed_total", LargePool, 1},
		{"vmmalloc_oversize_allocations_peak", AllPools, 2},
		{"vmmalloc_num_ooms_total", AllPools, 2},
		{"vmmalloc_max_split_size", AllPools, 67108864},
		{"vmmalloc_handles_reused_total", AllPools, 11},
	} {
		m, ok := byName[c.name]
		require.True(t, ok, c.name)
		v, err := m.Value(d, c.pool)
		require.NoError(t, err)
		assert.Equal(t, c.want, v, "%s %s", c.name, c.pool)
	}
	m := byName["vmmalloc_reserved_bytes_current"]
	assert.Equal(t, "Current value of the bytes of mapped device memory.", m.Help)
	assert.False(t, m.Counter)
	assert.True(t, m.Pooled)
	_, err := m.Value(nil, AllPools)
	require.ErrorIs(t, err, ErrNilStats)
}

func TestExportErrors(t *testing.T) {
	tests := []struct {
		name string
		call func(w *bytes.Buffer) error
		want error
	}{
		{"json nil", func(w *bytes.Buffer) error { return WriteJSON(w, nil) }, ErrNilStats},
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
		"json": func(w *errWriter) error { return WriteJSON(w, fixture()) },
	} {
		t.Run(name, func(t *testing.T) {
			w := &errWriter{}
			err := call(w)
			require.ErrorIs(t, err, errDiskFull)
			assert.Equal(t, 1, w.calls, "output is written in one Write")
		})
	}
}
