package replay

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// svgElements parses doc as XML and counts its elements by name.
func svgElements(t *testing.T, doc []byte) map[string]int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	counts := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return counts
		}
		require.NoError(t, err, "well-formed XML")
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
}

func TestReportPlot(t *testing.T) {
	rep, err := Run(sliceOf(synth(20_000, 12)), Options{Name: "expandable"})
	require.NoError(t, err)
	ref := []trace.Point{{TimeNs: 0, Bytes: 0}, {TimeNs: 1e6, Bytes: 1 << 30}, {TimeNs: 2e6, Bytes: 512 << 20}}
	p := ReportPlot(`a <b> & "c"`, rep, ref)
	require.Len(t, p.Curves, 4)
	assert.Equal(t, "trace time (s)", p.XLabel)
	names := []string{p.Curves[0].Name, p.Curves[1].Name, p.Curves[2].Name, p.Curves[3].Name}
	assert.Equal(t, []string{"reserved (expandable)", "PyTorch reserved (recorded)", "allocated", "live (requested)"}, names)
	assert.True(t, p.Curves[1].Step)
	assert.Equal(t, []float64{0, 0.001, 0.002}, p.Curves[1].X)
	for i := 1; i < len(p.Curves); i++ {
		assert.Less(t, p.Curves[i].Width, p.Curves[i-1].Width, "each line is narrower than the one under it")
		assert.NotEmpty(t, p.Curves[i].Dash, "upper lines are dashed: %s", p.Curves[i].Name)
	}
	last := rep.Samples[len(rep.Samples)-1]
	assert.Equal(t, float64(last.Reserved), p.Curves[0].Y[len(p.Curves[0].Y)-1])

	var buf bytes.Buffer
	require.NoError(t, p.WriteSVG(&buf))
	doc := buf.Bytes()
	assert.True(t, bytes.HasPrefix(doc, []byte("<svg ")))
	els := svgElements(t, doc)
	assert.Equal(t, 4, els["polyline"], "one line per curve")
	out := buf.String()
	assert.True(t, strings.Contains(out, "a &lt;b&gt; &amp; &#34;c&#34;"), "title escaped")
	assert.True(t, strings.Contains(out, "PyTorch reserved (recorded)"))
	assert.Regexp(t, `[0-9] [KMG]iB</text>`, out, "byte ticks in binary units")
	assert.NotContains(t, out, " MB</text>")
}

func TestReportPlotWithoutTime(t *testing.T) {
	ev := synth(2_000, 13)
	for i := range ev {
		ev[i].TimeNs = 0
	}
	rep, err := Run(sliceOf(ev), Options{})
	require.NoError(t, err)
	p := ReportPlot("t", rep, []trace.Point{{TimeNs: 5, Bytes: 1}})
	assert.Equal(t, "events", p.XLabel)
	assert.Len(t, p.Curves, 3, "a time-based reference cannot share an event axis")
	assert.Equal(t, "allocated", p.Curves[1].Name)
	assert.Equal(t, float64(rep.Events), p.Curves[0].X[len(p.Curves[0].X)-1])
}

func TestWriteSVGEdgeCases(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, Plot{Title: "empty"}.WriteSVG(&buf))
	svgElements(t, buf.Bytes())

	buf.Reset()
	one := Plot{Curves: []Curve{{Name: "one", X: []float64{3}, Y: []float64{7}}, {Name: "nan", X: []float64{math.NaN(), 1}, Y: []float64{1, math.Inf(1)}}}}
	require.NoError(t, one.WriteSVG(&buf))
	svgElements(t, buf.Bytes())
	assert.NotContains(t, buf.String(), "NaN")
	assert.NotContains(t, buf.String(), "Inf")

	err := Plot{Curves: []Curve{{Name: "bad", X: []float64{1, 2}, Y: []float64{1}}}}.WriteSVG(&buf)
	assert.ErrorIs(t, err, ErrInvalidOptions)

	long := Plot{Title: strings.Repeat("x", 500)}
	buf.Reset()
	require.NoError(t, long.WriteSVG(&buf))
	assert.Contains(t, buf.String(), strings.Repeat("x", maxTitle-1)+"…")
	assert.NotContains(t, buf.String(), strings.Repeat("x", maxTitle))
}

func TestDecimateKeepsExtremes(t *testing.T) {
	n := 100_000
	xs, ys := make([]float64, n), make([]float64, n)
	for i := range xs {
		xs[i] = float64(i)
		ys[i] = float64(i % 1000)
	}
	ys[54_321] = 1e9
	ys[77_777] = -5
	ox, oy := decimate(xs, ys, 3000)
	assert.LessOrEqual(t, len(ox), 3001)
	assert.Equal(t, len(ox), len(oy))
	assert.Contains(t, oy, 1e9)
	assert.Contains(t, oy, -5.0)
	assert.Equal(t, xs[0], ox[0])
	assert.Equal(t, xs[n-1], ox[len(ox)-1])
	for i := 1; i < len(ox); i++ {
		assert.LessOrEqual(t, ox[i-1], ox[i], "x stays ordered")
	}
	sx, sy := decimate(xs[:10], ys[:10], 3000)
	assert.Equal(t, xs[:10], sx)
	assert.Equal(t, ys[:10], sy)
}

func TestTicks(t *testing.T) {
	tests := []struct {
		v, want float64
	}{{0.7, 1}, {1, 1}, {1.1, 2}, {3, 5}, {7, 10}, {4.1e9, 5e9}, {0, 1}, {math.NaN(), 1}}
	for _, tc := range tests {
		assert.Equal(t, tc.want, niceStep(tc.v), "niceStep(%v)", tc.v)
	}
	tests2 := []struct {
		ymax     float64
		hi, step float64
		unit     string
		label    string // label of the step-th tick
	}{
		{80 << 30, 80 << 30, 20 << 30, "GiB", "20 GiB"},
		{3 << 29, 3 << 29, 0.5 * (1 << 30), "GiB", "0.5 GiB"},
		{500, 500, 100, "B", "100 B"},
		{0, 1, 0.2, "B", "0.2 B"},
		{1023 << 20, 1500 << 20, 500 << 20, "MiB", "500 MiB"},
	}
	for _, tc := range tests2 {
		a := byteAxis(tc.ymax)
		assert.Equal(t, tc.hi, a.hi, "byteAxis(%v).hi", tc.ymax)
		assert.Equal(t, tc.step, a.step, "byteAxis(%v).step", tc.ymax)
		assert.Equal(t, tc.unit, a.unitName, "byteAxis(%v)", tc.ymax)
		assert.Equal(t, tc.label, a.label(a.step), "byteAxis(%v)", tc.ymax)
		assert.Equal(t, 0.0, a.lo)
	}
	pa := plainAxis(1.003, 1.15, 0)
	assert.InDelta(t, 1.0, pa.lo, 1e-12)
	assert.InDelta(t, 1.15, pa.hi, 1e-12)
	assert.Equal(t, "1.05", pa.label(1.05))
	one := plainAxis(7, 7, 0)
	assert.Less(t, one.lo, 7.0)
	assert.Greater(t, one.hi, 7.0)
	assert.Equal(t, "0.25", tickNum(0.25, 0.05))
	assert.Equal(t, "70,000", tickNum(70_000, 10_000))
	assert.Equal(t, "5,000", tickNum(5000, 1000))
	assert.Equal(t, "999", tickNum(999, 1))
}

func TestLogAxis(t *testing.T) {
	a := logAxis(math.Log10(685), math.Log10(70_214))
	assert.InDelta(t, math.Log10(500), a.lo, 1e-12)
	assert.InDelta(t, 5.0, a.hi, 1e-12)
	assert.Equal(t, []float64{500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}, roundAll(a.ticks(true)))
	assert.Equal(t, "100,000", a.label(100_000))

	wide := logAxis(0, 6) // 1 .. 1e6: powers of ten only
	assert.Equal(t, []float64{1, 10, 100, 1000, 10000, 100000, 1e6}, roundAll(wide.ticks(true)))
	small := logAxis(math.Log10(0.3), math.Log10(0.3))
	assert.Less(t, small.lo, small.hi)
	assert.Equal(t, "0.2", small.label(0.2))

	for _, tc := range []struct{ v, down, up float64 }{{685, 500, 1000}, {1000, 1000, 1000}, {1999, 1000, 2000}, {70_214, 50_000, 100_000}, {0.3, 0.2, 0.5}} {
		assert.InDelta(t, tc.down, logBound(tc.v, false), 1e-9, "down %v", tc.v)
		assert.InDelta(t, tc.up, logBound(tc.v, true), 1e-9, "up %v", tc.v)
	}
	assert.Equal(t, 0.0, plainAxis(0, 70_000, 0.05).lo, "counts do not go below zero")
	assert.Less(t, plainAxis(-5, 5, 0.05).lo, -5.0)
}

func roundAll(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Round(x*1e6) / 1e6
	}
	return out
}

func TestLogXSkipsNonPositive(t *testing.T) {
	p := Plot{LogX: true, YLabel: "r", Curves: []Curve{{Name: "a", X: []float64{0, -1, 100, 1000}, Y: []float64{1, 1, 1, 2}, Marker: MarkerCircle}}}
	var buf bytes.Buffer
	require.NoError(t, p.WriteSVG(&buf))
	els := svgElements(t, buf.Bytes())
	assert.Equal(t, 2+1, els["circle"], "two drawable points and the legend")
	assert.NotContains(t, buf.String(), "NaN")
}
