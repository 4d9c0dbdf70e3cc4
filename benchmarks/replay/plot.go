package replay

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"

	"github.com/dustin/go-humanize"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// Marker is the shape a Curve draws at each point instead of a line.
type Marker int

// Markers.
const (
	MarkerNone Marker = iota // a line through the points
	MarkerCircle
	MarkerSquare
	MarkerTriangle
	MarkerDiamond
)

const numMarkers = 4 // shapes after MarkerNone

// Curve is one series of a Plot: Y against X. With Step set the line holds
// each Y until the next X (a step function, as PyTorch's reserved curve
// is); otherwise points are joined by straight segments, or marked one by
// one when Marker is set.
type Curve struct {
	Name   string    // legend text
	X      []float64 // abscissae, ascending for lines
	Y      []float64 // len(Y) == len(X); bytes unless the Plot has a YLabel
	Step   bool      // draw as a step function
	Color  string    // "#rrggbb"; empty: the palette colour of the curve's index
	Dash   string    // SVG stroke-dasharray, e.g. "8 4"; empty: solid
	Width  float64   // stroke width in SVG user units (marker radius for markers); 0: 1.5 (5)
	Marker Marker    // draw this shape at each point and no line
}

// Plot is a chart that WriteSVG renders: lines of memory over time, or a
// scatter of figures. Curves are drawn in order, each over the previous
// ones; the legend sits to the right of the data, outside it.
type Plot struct {
	Title  string
	XLabel string // axis label for X ("trace time (s)", "events", "driver calls")
	// YLabel labels the Y axis. Empty means Y is bytes: the axis starts at
	// 0, is labelled "memory" and ticks are in binary units (GiB).
	// Otherwise Y is a plain number and the axis spans the data.
	YLabel string
	// LogX puts X on a log10 scale (for counts spanning decades); points
	// with X ≤ 0 are not drawn.
	LogX   bool
	Curves []Curve
}

// Plot geometry, in SVG user units.
const (
	plotW, plotH         = 1020, 540
	marginL, marginR     = 90, 280 // the legend lives in the right margin
	marginT, marginB     = 50, 60
	maxPointsPerCurve    = 4 * (plotW - marginL - marginR)
	legendRow, legendPad = 18, 14
	maxLegendRows        = (plotH - marginT - marginB) / legendRow
	maxTitle             = 120 // runes of the title shown
	maxLegendText        = 32  // runes of a legend entry shown
	defaultWidth         = 1.5
	markerSize           = 5.0
)

// palette holds the colours of curves without one, chosen to be told
// apart: red, blue, green, orange, purple, brown, pink, olive.
var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22"}

// dashes are the dash patterns of the policies of a comparison, so that
// coinciding lines stay visible through each other's gaps.
var dashes = []string{"", "10 5", "4 4", "14 4 3 4", "7 7", "2 5", "18 6", "1 3"}

// Colours of the fixed series.
const (
	colorLive    = "#404040" // live (requested) bytes
	colorPyTorch = "#17becf" // PyTorch's recorded reserved bytes
)

// ReportPlot builds the plot of one replay: reserved, allocated and live
// bytes over the report's samples. X is the trace time in seconds when the
// samples carry increasing timestamps, else the event count. When
// pytorchReserved is given (PyTorchTrace.ReservedCurve) and X is time, it
// is added as PyTorch's own reserved curve for comparison.
//
// Lines are drawn widest first and the upper ones dashed or dotted, so a
// curve that coincides with another (allocated with live, reserved with
// PyTorch's) still shows at its edges and through the gaps.
func ReportPlot(title string, r *Report, pytorchReserved []trace.Point) Plot {
	name := "reserved"
	if r.Policy != "" {
		name += " (" + r.Policy + ")"
	}
	p := Plot{Title: title, XLabel: "events"}
	xs, useTime := sampleX([]*Report{r})
	if useTime {
		p.XLabel = "trace time (s)"
	}
	res := Curve{Name: name, X: xs, Color: palette[0], Width: 5}
	alloc := Curve{Name: "allocated", X: xs, Color: palette[2], Dash: "7 4", Width: 2.5}
	live := Curve{Name: "live (requested)", X: xs, Color: colorLive, Dash: "2 3", Width: 1.2}
	for _, s := range r.Samples {
		res.Y = append(res.Y, float64(s.Reserved))
		alloc.Y = append(alloc.Y, float64(s.Allocated))
		live.Y = append(live.Y, float64(s.Live))
	}
	p.Curves = []Curve{res}
	if useTime && len(pytorchReserved) > 0 {
		p.Curves = append(p.Curves, pytorchCurve(pytorchReserved, 3.5, "12 5"))
	}
	p.Curves = append(p.Curves, alloc, live)
	return p
}

// ComparePlot overlays the reserved bytes of several replays of one trace
// (a Compare or a one-trace Sweep), each policy in its colour and dash
// pattern, widest first, with the trace's live bytes and, when X is time,
// PyTorch's recorded reserved curve.
func ComparePlot(title string, reports []*Report, pytorchReserved []trace.Point) Plot {
	p := Plot{Title: title, XLabel: "events"}
	if len(reports) == 0 {
		return p
	}
	xs, useTime := sampleX(reports[:1])
	if useTime {
		p.XLabel = "trace time (s)"
	}
	n := len(reports)
	top := defaultWidth + 1.2*float64(n-1)
	if useTime && len(pytorchReserved) > 0 {
		p.Curves = append(p.Curves, pytorchCurve(pytorchReserved, top+1.5, ""))
	}
	for i, r := range reports {
		rx := sampleEvents(r)
		if useTime {
			rx = sampleTimes(r)
		}
		c := Curve{Name: "reserved: " + reportName(r), X: rx, Color: palette[i%len(palette)],
			Dash: dashes[i%len(dashes)], Width: top - 1.2*float64(i)}
		for _, s := range r.Samples {
			c.Y = append(c.Y, float64(s.Reserved))
		}
		p.Curves = append(p.Curves, c)
	}
	live := Curve{Name: "live (requested)", X: xs, Color: colorLive, Dash: "2 3", Width: 1.2}
	for _, s := range reports[0].Samples {
		live.Y = append(live.Y, float64(s.Live))
	}
	p.Curves = append(p.Curves, live)
	return p
}

func reportName(r *Report) string {
	if r.Policy != "" {
		return r.Policy
	}
	return r.Config
}

// sampleX returns the abscissae of the first report's samples: trace
// seconds when they carry increasing timestamps, else event counts.
func sampleX(reports []*Report) ([]float64, bool) {
	r := reports[0]
	useTime := len(r.Samples) > 1 && r.Samples[len(r.Samples)-1].TimeNs > r.Samples[0].TimeNs
	if useTime {
		return sampleTimes(r), true
	}
	return sampleEvents(r), false
}

func sampleEvents(r *Report) []float64 {
	xs := make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		xs[i] = float64(s.Event)
	}
	return xs
}

func sampleTimes(r *Report) []float64 {
	xs := make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		xs[i] = float64(s.TimeNs) / 1e9
	}
	return xs
}

func pytorchCurve(pts []trace.Point, width float64, dash string) Curve {
	c := Curve{Name: "PyTorch reserved (recorded)", Step: true, Color: colorPyTorch, Width: width, Dash: dash}
	for _, pt := range pts {
		c.X = append(c.X, float64(pt.TimeNs)/1e9)
		c.Y = append(c.Y, float64(pt.Bytes))
	}
	return c
}

// axis is one scale: data range [lo, hi] mapped onto ticks every step.
type axis struct {
	lo, hi, step float64
	unit         float64 // tick labels are value/unit
	unitName     string  // appended to tick labels ("GiB"); empty for plain numbers
}

// byteAxis spans [0, ymax] in the binary unit of ymax, with 1-2-5 ticks.
func byteAxis(ymax float64) axis {
	if !(ymax > 0) {
		ymax = 1
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	a := axis{unit: 1, unitName: units[0]}
	for u := 1; u < len(units) && ymax/a.unit >= 1024; u++ {
		a.unit *= 1024
		a.unitName = units[u]
	}
	a.step = niceStep(ymax/a.unit/5) * a.unit
	a.hi = math.Ceil(ymax/a.step) * a.step
	return a
}

// plainAxis spans [lo, hi] (widened to nice multiples of its step); pad
// adds a share of the range on both sides first (for markers).
func plainAxis(lo, hi, pad float64) axis {
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	if hi <= lo {
		d := math.Max(math.Abs(lo)*0.05, 0.5)
		lo, hi = lo-d, hi+d
	}
	nonNeg := lo >= 0
	d := (hi - lo) * pad
	lo, hi = lo-d, hi+d
	step := niceStep((hi - lo) / 6)
	a := axis{lo: math.Floor(lo/step) * step, hi: math.Ceil(hi/step) * step, step: step, unit: 1}
	if nonNeg && a.lo < 0 {
		a.lo = 0 // counts and ratios do not go below zero
	}
	return a
}

// label formats the tick at v.
func (a axis) label(v float64) string {
	step := a.step
	if v > 0 && v < step {
		step = v // a log axis below 1
	}
	s := tickNum(v/a.unit, step/a.unit)
	if a.unitName != "" {
		s += " " + a.unitName
	}
	return s
}

// WriteSVG renders p as a standalone SVG document. Curves with more points
// than the plot has room for are decimated, keeping each bucket's minimum
// and maximum so peaks survive. Curves whose X and Y lengths differ are
// an error.
func (p Plot) WriteSVG(w io.Writer) error {
	markers := false
	for _, c := range p.Curves {
		if len(c.X) != len(c.Y) {
			return fmt.Errorf("%w: curve %q has %d x and %d y values", ErrInvalidOptions, c.Name, len(c.X), len(c.Y))
		}
		markers = markers || c.Marker != MarkerNone
	}
	// fx maps X onto the axis: itself, or its log10 with LogX (NaN, and
	// so not drawn, for X ≤ 0).
	fx := func(x float64) float64 { return x }
	if p.LogX {
		fx = func(x float64) float64 {
			if x <= 0 {
				return math.NaN()
			}
			return math.Log10(x)
		}
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, c := range p.Curves {
		for i := range c.X {
			if x := fx(c.X[i]); finite(x) && finite(c.Y[i]) {
				xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
				ymin, ymax = math.Min(ymin, c.Y[i]), math.Max(ymax, c.Y[i])
			}
		}
	}
	var xa, ya axis
	switch {
	case p.LogX:
		xa = logAxis(xmin, xmax)
	case markers:
		xa = plainAxis(xmin, xmax, 0.05)
	default:
		if math.IsInf(xmin, 1) {
			xmin, xmax = 0, 1
		}
		if !(xmax > xmin) {
			xmax = xmin + 1
		}
		xa = axis{lo: xmin, hi: xmax, step: niceStep((xmax - xmin) / 8), unit: 1}
	}
	ylabel := p.YLabel
	if ylabel == "" {
		ylabel = "memory"
		ya = byteAxis(ymax)
	} else {
		pad := 0.0
		if markers {
			pad = 0.05
		}
		ya = plainAxis(ymin, ymax, pad)
	}

	iw, ih := float64(plotW-marginL-marginR), float64(plotH-marginT-marginB)
	sx := func(x float64) float64 { return marginL + (fx(x)-xa.lo)/(xa.hi-xa.lo)*iw }
	sy := func(y float64) float64 { return marginT + ih - (y-ya.lo)/(ya.hi-ya.lo)*ih }

	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotW, plotH, plotW, plotH)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(bw, `<text x="%d" y="%d" font-size="16" text-anchor="middle">%s</text>`+"\n", plotW/2, marginT/2+4, html.EscapeString(clip(p.Title, maxTitle)))
	// Grid and y ticks.
	for k := math.Ceil(ya.lo/ya.step - 1e-9); k*ya.step <= ya.hi+ya.step*1e-9; k++ {
		y := k * ya.step
		py := sy(y)
		fmt.Fprintf(bw, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e0e0e0"/>`+"\n", marginL, py, plotW-marginR, py)
		fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, py+4, html.EscapeString(ya.label(y)))
	}
	// x ticks.
	for _, x := range xa.ticks(p.LogX) {
		px := sx(x)
		fmt.Fprintf(bw, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>`+"\n", px, marginT, px, plotH-marginB)
		fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px, plotH-marginB+16, xa.label(x))
	}
	fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", marginL, marginT, iw, ih)
	fmt.Fprintf(bw, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`+"\n", marginL+iw/2, plotH-16, html.EscapeString(p.XLabel))
	fmt.Fprintf(bw, `<text x="16" y="%.0f" text-anchor="middle" transform="rotate(-90 16 %.0f)">%s</text>`+"\n", marginT+ih/2, marginT+ih/2, html.EscapeString(ylabel))
	// Curves, clipped to the data area.
	fmt.Fprintf(bw, `<clipPath id="data"><rect x="%d" y="%d" width="%.0f" height="%.0f"/></clipPath>`+"\n", marginL, marginT, iw, ih)
	fmt.Fprint(bw, `<g clip-path="url(#data)">`+"\n")
	for i, c := range p.Curves {
		st := c.style(i)
		if c.Marker != MarkerNone {
			for j := range c.X {
				if finite(fx(c.X[j])) && finite(c.Y[j]) {
					writeMarker(bw, c.Marker, sx(c.X[j]), sy(c.Y[j]), c.markerRadius(), st.color)
				}
			}
			continue
		}
		xs, ys := decimate(c.X, c.Y, maxPointsPerCurve)
		if len(xs) == 0 {
			continue
		}
		fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s stroke-linejoin="round" points="`, st.color, st.width, st.dashAttr())
		for j := range xs {
			if !finite(fx(xs[j])) || !finite(ys[j]) {
				continue
			}
			if c.Step && j > 0 && finite(ys[j-1]) {
				fmt.Fprintf(bw, "%.1f,%.1f ", sx(xs[j]), sy(ys[j-1]))
			}
			fmt.Fprintf(bw, "%.1f,%.1f ", sx(xs[j]), sy(ys[j]))
		}
		fmt.Fprint(bw, "\"/>\n")
	}
	fmt.Fprint(bw, "</g>\n")
	// Legend, right of the data.
	lx, ly := float64(plotW-marginR+legendPad), float64(marginT)
	for i, c := range p.Curves {
		y := ly + float64(i*legendRow) + 8
		if i == maxLegendRows-1 && len(p.Curves) > maxLegendRows {
			fmt.Fprintf(bw, `<text x="%.0f" y="%.0f">… and %d more</text>`+"\n", lx, y+4, len(p.Curves)-i)
			break
		}
		st := c.style(i)
		if c.Marker != MarkerNone {
			writeMarker(bw, c.Marker, lx+12, y, markerSize, st.color)
		} else {
			fmt.Fprintf(bw, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="%.1f"%s/>`+"\n",
				lx, y, lx+26, y, st.color, min(max(st.width, 2.5), 4), st.dashAttr())
		}
		fmt.Fprintf(bw, `<text x="%.0f" y="%.0f">%s</text>`+"\n", lx+32, y+4, html.EscapeString(clip(c.Name, maxLegendText)))
	}
	fmt.Fprint(bw, "</svg>\n")
	return bw.Flush()
}

// curveStyle is a Curve's resolved stroke.
type curveStyle struct {
	color string
	dash  string
	width float64
}

func (c Curve) style(i int) curveStyle {
	st := curveStyle{color: c.Color, dash: c.Dash, width: c.Width}
	if st.color == "" {
		st.color = palette[i%len(palette)]
	}
	if !(st.width > 0) || !finite(st.width) {
		st.width = defaultWidth
	}
	return st
}

func (st curveStyle) dashAttr() string {
	if st.dash == "" {
		return ""
	}
	return ` stroke-dasharray="` + html.EscapeString(st.dash) + `"`
}

// writeMarker draws shape m centred on (x, y).
// A white outline keeps coinciding markers of decreasing size apart.
func writeMarker(w io.Writer, m Marker, x, y, r float64, color string) {
	const outline = ` stroke="white" stroke-width="0.8"`
	switch m {
	case MarkerSquare:
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"%s/>`+"\n", x-r*0.9, y-r*0.9, 1.8*r, 1.8*r, color, outline)
	case MarkerTriangle:
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"%s/>`+"\n", x, y-1.3*r, x-1.15*r, y+0.8*r, x+1.15*r, y+0.8*r, color, outline)
	case MarkerDiamond:
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"%s/>`+"\n", x, y-1.25*r, x+r, y, x, y+1.25*r, x-r, y, color, outline)
	default:
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"%s/>`+"\n", x, y, r, color, outline)
	}
}

// markerRadius is the curve's marker radius: Width, or markerSize.
func (c Curve) markerRadius() float64 {
	if c.Width > 0 && finite(c.Width) {
		return c.Width
	}
	return markerSize
}

// logAxis spans [lo, hi], given as log10 values, widened to the nearest
// 1, 2 or 5 times a power of ten.
func logAxis(lo, hi float64) axis {
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	a := axis{lo: math.Log10(logBound(math.Pow(10, lo), false)), hi: math.Log10(logBound(math.Pow(10, hi), true)), step: 1, unit: 1}
	if a.hi <= a.lo {
		a.hi = a.lo + 1
	}
	return a
}

// logBound rounds v > 0 down (or up) to 1, 2 or 5 times a power of ten.
func logBound(v float64, up bool) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)+1e-12))
	ms := []float64{1, 2, 5, 10}
	if up {
		for _, m := range ms {
			if m*p >= v*(1-1e-12) {
				return m * p
			}
		}
		return 10 * p
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i]*p <= v*(1+1e-12) {
			return ms[i] * p
		}
	}
	return p
}

// ticks are the values at which the axis is ticked: multiples of the
// step, or with log, 1, 2 and 5 times each power of ten in range (only
// the powers when the axis spans more than three decades).
func (a axis) ticks(log bool) []float64 {
	var out []float64
	if !log {
		for k := math.Ceil(a.lo/a.step - 1e-9); k*a.step <= a.hi+a.step*1e-9; k++ {
			out = append(out, k*a.step)
		}
		return out
	}
	mults := []float64{1, 2, 5}
	if a.hi-a.lo > 3 {
		mults = mults[:1]
	}
	for d := math.Floor(a.lo + 1e-9); d <= a.hi; d++ {
		for _, m := range mults {
			if l := math.Log10(m * math.Pow(10, d)); l >= a.lo-1e-9 && l <= a.hi+1e-9 {
				out = append(out, m*math.Pow(10, d))
			}
		}
	}
	return out
}

// clip shortens s to at most n runes, marking the cut with an ellipsis.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if !(v > 0) || !finite(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// tickNum formats v with enough decimals to tell ticks step apart, and
// thousands separators on whole numbers from 1,000.
func tickNum(v, step float64) string {
	dec := 0
	if step > 0 && step < 1 {
		dec = int(math.Ceil(-math.Log10(step) - 1e-9))
	}
	if math.Abs(v) < step*1e-9 {
		v = 0
	}
	if dec == 0 && math.Abs(v) >= 1000 && math.Abs(v) < 1e18 {
		return humanize.Comma(int64(math.Round(v)))
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// decimate reduces a curve to at most about max points by keeping, per
// bucket of consecutive points, the first point and the minimum and
// maximum (in order).
func decimate(xs, ys []float64, maxPts int) ([]float64, []float64) {
	if len(xs) <= maxPts {
		return xs, ys
	}
	buckets := maxPts / 3
	per := (len(xs) + buckets - 1) / buckets
	ox := make([]float64, 0, 3*buckets+1)
	oy := make([]float64, 0, 3*buckets+1)
	for s := 0; s < len(xs); s += per {
		e := min(s+per, len(xs))
		lo, hi := s, s
		for i := s; i < e; i++ {
			if ys[i] < ys[lo] {
				lo = i
			}
			if ys[i] > ys[hi] {
				hi = i
			}
		}
		idx := []int{s, lo, hi}
		if lo > hi {
			idx[1], idx[2] = hi, lo
		}
		last := -1
		for _, i := range idx {
			if i != last {
				ox, oy = append(ox, xs[i]), append(oy, ys[i])
				last = i
			}
		}
	}
	ox, oy = append(ox, xs[len(xs)-1]), append(oy, ys[len(ys)-1])
	return ox, oy
}
