package replay

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
)

func TestDefaultPoliciesParse(t *testing.T) {
	ps := DefaultPolicies()
	require.Len(t, ps, 6)
	names := map[string]bool{}
	for _, p := range ps {
		cfg, err := allocator.ParseConfig(p.Config)
		require.NoError(t, err, p.Name)
		names[p.Name] = true
		assert.Equal(t, !strings.HasPrefix(p.Name, "classic"), cfg.ExpandableSegments, p.Name)
	}
	assert.Len(t, names, len(ps), "names are distinct")
	assert.Equal(t, "expandable", ps[0].Name)
	assert.Equal(t, "classic", ps[1].Name)
}

func TestCompare(t *testing.T) {
	ev := synth(10_000, 9)
	ps := []Policy{{"expandable", ""}, {"classic", "expandable_segments:False"}, {"page2M", "large_segment_size_mb:2"}}
	reps, err := Compare(ev, ps, Options{MinCapacity: true})
	require.NoError(t, err)
	require.Len(t, reps, len(ps))
	for i, r := range reps {
		assert.Equal(t, ps[i].Name, r.Policy)
		assert.Equal(t, mustConfig(t, ps[i].Config).String(), r.Config)
		assert.Equal(t, reps[0].PeakLive, r.PeakLive, "same trace, same demand")
		assert.GreaterOrEqual(t, r.ReservedOverLive, 1.0)
		assert.GreaterOrEqual(t, r.MinCapacity, r.PeakLive)
		assert.LessOrEqual(t, r.MinCapacity, roundUpRes(r.PeakReserved))
		assert.Equal(t, int64(len(ev)), r.Events)
	}
	// Smaller pages map more often.
	assert.Greater(t, reps[2].DriverCalls["MapMem"], reps[0].DriverCalls["MapMem"])

	var buf bytes.Buffer
	require.NoError(t, WriteTable(&buf, reps))
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	require.Len(t, lines, 1+len(ps))
	assert.Contains(t, lines[0], "peak reserved")
	assert.Contains(t, lines[0], "mincap/live")
	for i, p := range ps {
		assert.Contains(t, lines[i+1], p.Name)
		assert.Contains(t, lines[i+1], FormatBytes(reps[i].PeakReserved))
		assert.Contains(t, lines[i+1], FormatBytes(reps[i].MinCapacity))
	}
}

func TestCompareWithoutSearchAndErrors(t *testing.T) {
	ev := synth(2_000, 10)
	reps, err := Compare(ev, []Policy{{"x", ""}}, Options{})
	require.NoError(t, err)
	assert.Zero(t, reps[0].MinCapacity)
	var buf bytes.Buffer
	require.NoError(t, WriteTable(&buf, reps))
	assert.Contains(t, buf.String(), "  -  ")

	_, err = Compare(ev, []Policy{{"ok", ""}, {"broken", "max_split_size_mb:1"}}, Options{})
	assert.ErrorIs(t, err, ErrInvalidOptions)
	assert.ErrorIs(t, err, allocator.ErrInvalidConfig)
	assert.Contains(t, err.Error(), `"broken"`)

	_, err = Compare(ev, nil, Options{})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"},
		{999, "999 B"},
		{1000, "1000 B"},
		{1023, "1023 B"},
		{1024, "1.00 KiB"},
		{1536, "1.50 KiB"},
		{1<<20 - 1, "1.00 MiB"},
		{80 << 30, "80.00 GiB"},
		{41174114308, "38.35 GiB"},
		{47347400704, "44.10 GiB"},
		{2 << 40, "2.00 TiB"},
		{1<<64 - 1, "16.00 EiB"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, FormatBytes(tc.n), "%d", tc.n)
	}
}

func TestFormatCount(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 70726: "70,726", -1234567: "-1,234,567"} {
		assert.Equal(t, want, FormatCount(n))
	}
}

func TestWritePolicies(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WritePolicies(&buf, []Policy{{"expandable", ""}, {"classic-split128", "expandable_segments:False,max_split_size_mb:128"}}))
	assert.Equal(t, "  expandable       = defaults\n  classic-split128 = expandable_segments:False,max_split_size_mb:128\n", buf.String())
}

func TestWriteText(t *testing.T) {
	rep, err := Run(sliceOf(synth(5_000, 11)), Options{Name: "expandable"})
	require.NoError(t, err)
	rep.MinCapacity, rep.MinCapacityOverLive = rep.PeakReserved, 1.5
	var buf bytes.Buffer
	require.NoError(t, WriteText(&buf, rep))
	out := buf.String()
	for _, want := range []string{"expandable (", "peak live", FormatBytes(rep.PeakLive), "peak reserved", "min capacity", "1.5000 × peak live", "MapMem", "events/s"} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "stopped at the first OOM")
}
