package replay

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// renderPNG renders p with rsvg-convert (librsvg2-bin), skipping the test
// when it is not installed.
func renderPNG(t *testing.T, p Plot) image.Image {
	t.Helper()
	bin, err := exec.LookPath("rsvg-convert")
	if err != nil {
		t.Skip("rsvg-convert not installed (apt-get install librsvg2-bin); cannot render the SVG")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "plot.svg"), filepath.Join(dir, "plot.png")
	var buf bytes.Buffer
	require.NoError(t, p.WriteSVG(&buf))
	require.NoError(t, os.WriteFile(in, buf.Bytes(), 0o644))
	msg, err := exec.Command(bin, "-o", out, in).CombinedOutput()
	require.NoError(t, err, "rsvg-convert: %s", msg)
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, image.Rect(0, 0, plotW, plotH), img.Bounds())
	return img
}

// dataArea is the inside of the plot frame, less a margin that keeps the
// frame's own pixels out.
var dataArea = image.Rect(marginL+3, marginT+3, plotW-marginR-3, plotH-marginB-3)

// legendArea is the right margin, where the legend is drawn.
var legendArea = image.Rect(plotW-marginR+2, marginT, plotW, plotH-marginB)

// pixelsOf counts the pixels of r within a small distance of colour hex
// ("#rrggbb"): what a person sees drawn in that colour.
func pixelsOf(img image.Image, r image.Rectangle, hex string) int {
	var cr, cg, cb int
	if _, err := fmt.Sscanf(hex, "#%02x%02x%02x", &cr, &cg, &cb); err != nil {
		panic(err)
	}
	const tol = 28
	near := func(a, b int) bool { return a-b <= tol && b-a <= tol }
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			R, G, B, _ := img.At(x, y).RGBA()
			if near(int(R>>8), cr) && near(int(G>>8), cg) && near(int(B>>8), cb) {
				n++
			}
		}
	}
	return n
}

// coincidingReport is a replay whose reserved, allocated and live bytes
// are equal at every sample: the worst case for lines hiding each other.
func coincidingReport(policy string) (*Report, []trace.Point) {
	r := &Report{Policy: policy}
	var ref []trace.Point
	for i := range 200 {
		b := uint64(1<<30) + uint64(i%50)*(40<<20)
		r.Samples = append(r.Samples, Sample{Event: int64(i * 100), TimeNs: int64(i) * 1e7, Live: b, Allocated: b, Reserved: b})
		ref = append(ref, trace.Point{TimeNs: int64(i) * 1e7, Bytes: b})
	}
	return r, ref
}

func TestRenderedReportPlotShowsEverySeries(t *testing.T) {
	rep, ref := coincidingReport("expandable")
	p := ReportPlot("coinciding", rep, ref)
	require.Len(t, p.Curves, 4)
	img := renderPNG(t, p)
	for i, c := range p.Curves {
		st := c.style(i)
		assert.Greater(t, pixelsOf(img, dataArea, st.color), 100, "%s (%s) is visible over the data", c.Name, st.color)
		assert.Greater(t, pixelsOf(img, legendArea, st.color), 10, "%s has a legend entry beside the data", c.Name)
	}
	assert.Zero(t, pixelsOf(img, dataArea, palette[4]), "a colour that is not drawn is not found")
}

func TestRenderedComparePlotShowsEveryPolicy(t *testing.T) {
	var reps []*Report
	var ref []trace.Point
	for _, p := range DefaultPolicies() {
		r, pts := coincidingReport(p.Name)
		reps, ref = append(reps, r), pts
	}
	p := ComparePlot("six policies, one curve", reps, ref)
	require.Len(t, p.Curves, len(reps)+2, "PyTorch, one per policy, live")
	colours := map[string]bool{}
	for i, c := range p.Curves {
		colours[c.style(i).color] = true
	}
	assert.Len(t, colours, len(p.Curves), "every series has its own colour")
	img := renderPNG(t, p)
	for i, c := range p.Curves {
		st := c.style(i)
		assert.Greater(t, pixelsOf(img, dataArea, st.color), 50, "%s (%s) is visible over the data", c.Name, st.color)
	}
}

func TestRenderedSweepPlotShowsEveryPoint(t *testing.T) {
	var runs []SweepRun
	for ti, tr := range []string{"a", "b"} {
		for pi, p := range DefaultPolicies()[:3] {
			runs = append(runs, SweepRun{Trace: tr, Policy: p, Report: &Report{
				DriverCallsTotal: int64(2000 * (pi + 1)), MinCapacity: 1, MinCapacityOverLive: 1.01 + 0.05*float64(ti)}})
		}
	}
	img := renderPNG(t, SweepPlot("sweep", runs))
	for pi := range 3 {
		assert.Greater(t, pixelsOf(img, dataArea, palette[pi]), 2*40, "both points of policy %d are drawn", pi)
	}
}

// TestRenderedHiddenLineIsCaught is the control of the tests above: two
// identical solid lines of one width, and the lower one is not seen.
func TestRenderedHiddenLineIsCaught(t *testing.T) {
	rep, _ := coincidingReport("x")
	xs := sampleEvents(rep)
	var ys []float64
	for _, s := range rep.Samples {
		ys = append(ys, float64(s.Reserved))
	}
	p := Plot{Curves: []Curve{
		{Name: "under", X: xs, Y: ys, Color: palette[0], Width: 2},
		{Name: "over", X: xs, Y: ys, Color: palette[1], Width: 2},
	}}
	img := renderPNG(t, p)
	assert.Greater(t, pixelsOf(img, dataArea, palette[1]), 100)
	assert.Less(t, pixelsOf(img, dataArea, palette[0]), 20, "the lower line is hidden")
}
