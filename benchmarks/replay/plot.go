package replay

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// Curve is one line of a Plot: Y (bytes) against X. With Step set the line
// holds each Y until the next X (a step function, as PyTorch's reserved
// curve is); otherwise points are joined by straight segments.
type Curve struct {
	Name string    // legend text
	X    []float64 // abscissae, ascending
	Y    []float64 // bytes; len(Y) == len(X)
	Step bool      // draw as a step function
	Dash bool      // draw dashed
}

// Plot is a line chart of memory over time that WriteSVG renders.
type Plot struct {
	Title  string
	XLabel string // axis label for X ("trace time (s)" or "events")
	Curves []Curve
}

// Plot geometry, in SVG user units.
const (
	plotW, plotH         = 960, 540
	marginL, marginR     = 90, 30
	marginT, marginB     = 50, 60
	maxPointsPerCurve    = 4 * (plotW - marginL - marginR)
	legendRow, legendPad = 18, 10
	maxTitle             = 110 // runes of the title shown
)

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// ReportPlot builds the plot of one replay: reserved, allocated and live
// bytes over the report's samples. X is the trace time in seconds when the
// samples carry increasing timestamps, else the event count. When
// pytorchReserved is given (PyTorchTrace.ReservedCurve) and X is time, it
// is added as PyTorch's own reserved curve for comparison.
func ReportPlot(title string, r *Report, pytorchReserved []trace.Point) Plot {
	p := Plot{Title: title, XLabel: "events"}
	useTime := len(r.Samples) > 1 && r.Samples[len(r.Samples)-1].TimeNs > r.Samples[0].TimeNs
	if useTime {
		p.XLabel = "trace time (s)"
	}
	n := len(r.Samples)
	res := Curve{Name: "reserved (" + r.Policy + ")", X: make([]float64, n), Y: make([]float64, n)}
	if r.Policy == "" {
		res.Name = "reserved"
	}
	alloc := Curve{Name: "allocated", X: make([]float64, n), Y: make([]float64, n)}
	live := Curve{Name: "live (requested)", X: make([]float64, n), Y: make([]float64, n), Dash: true}
	for i, s := range r.Samples {
		x := float64(s.Event)
		if useTime {
			x = float64(s.TimeNs) / 1e9
		}
		res.X[i], alloc.X[i], live.X[i] = x, x, x
		res.Y[i], alloc.Y[i], live.Y[i] = float64(s.Reserved), float64(s.Allocated), float64(s.Live)
	}
	p.Curves = []Curve{res, alloc, live}
	if useTime && len(pytorchReserved) > 0 {
		c := Curve{Name: "PyTorch reserved (recorded)", Step: true}
		for _, pt := range pytorchReserved {
			c.X = append(c.X, float64(pt.TimeNs)/1e9)
			c.Y = append(c.Y, float64(pt.Bytes))
		}
		p.Curves = append(p.Curves, c)
	}
	return p
}

// WriteSVG renders p as a standalone SVG document. Curves with more points
// than the plot has room for are decimated, keeping each bucket's minimum
// and maximum so peaks survive. Curves whose X and Y lengths differ are
// an error.
func (p Plot) WriteSVG(w io.Writer) error {
	for _, c := range p.Curves {
		if len(c.X) != len(c.Y) {
			return fmt.Errorf("%w: curve %q has %d x and %d y values", ErrInvalidOptions, c.Name, len(c.X), len(c.Y))
		}
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymax := 0.0
	for _, c := range p.Curves {
		for i := range c.X {
			if finite(c.X[i]) {
				xmin, xmax = math.Min(xmin, c.X[i]), math.Max(xmax, c.X[i])
			}
			if finite(c.Y[i]) {
				ymax = math.Max(ymax, c.Y[i])
			}
		}
	}
	if !(xmax > xmin) {
		if math.IsInf(xmin, 1) {
			xmin = 0
		}
		xmax = xmin + 1
	}
	ystep := niceStep(ymax / 5)
	if ymax <= 0 {
		ymax, ystep = 1, 0.2
	}
	ytop := math.Ceil(ymax/ystep) * ystep
	xstep := niceStep((xmax - xmin) / 8)

	iw, ih := float64(plotW-marginL-marginR), float64(plotH-marginT-marginB)
	sx := func(x float64) float64 { return marginL + (x-xmin)/(xmax-xmin)*iw }
	sy := func(y float64) float64 { return marginT + ih - y/ytop*ih }

	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotW, plotH, plotW, plotH)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(bw, `<text x="%d" y="%d" font-size="16" text-anchor="middle">%s</text>`+"\n", plotW/2, marginT/2+4, html.EscapeString(clip(p.Title, maxTitle)))
	// Grid and y ticks.
	for k := 0; float64(k)*ystep <= ytop*(1+1e-9); k++ {
		y := float64(k) * ystep
		py := sy(y)
		fmt.Fprintf(bw, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e0e0e0"/>`+"\n", marginL, py, plotW-marginR, py)
		fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, py+4, html.EscapeString(tickBytes(y, ystep, ytop)))
	}
	// x ticks.
	for k := math.Ceil(xmin / xstep); k*xstep <= xmax+xstep*1e-9; k++ {
		x := k * xstep
		px := sx(x)
		fmt.Fprintf(bw, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>`+"\n", px, marginT, px, plotH-marginB)
		fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px, plotH-marginB+16, tickNum(x, xstep))
	}
	fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", marginL, marginT, iw, ih)
	fmt.Fprintf(bw, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`+"\n", marginL+iw/2, plotH-16, html.EscapeString(p.XLabel))
	fmt.Fprintf(bw, `<text x="16" y="%.0f" text-anchor="middle" transform="rotate(-90 16 %.0f)">memory</text>`+"\n", marginT+ih/2, marginT+ih/2)
	// Curves.
	for i, c := range p.Curves {
		color := palette[i%len(palette)]
		xs, ys := decimate(c.X, c.Y, maxPointsPerCurve)
		if len(xs) == 0 {
			continue
		}
		dash := ""
		if c.Dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="`, color, dash)
		for j := range xs {
			if !finite(xs[j]) || !finite(ys[j]) {
				continue
			}
			if c.Step && j > 0 {
				fmt.Fprintf(bw, "%.1f,%.1f ", sx(xs[j]), sy(ys[j-1]))
			}
			fmt.Fprintf(bw, "%.1f,%.1f ", sx(xs[j]), sy(ys[j]))
		}
		fmt.Fprint(bw, "\"/>\n")
	}
	// Legend.
	lx, ly := float64(marginL+legendPad), float64(marginT+legendPad)
	for i, c := range p.Curves {
		color := palette[i%len(palette)]
		y := ly + float64(i*legendRow) + 8
		fmt.Fprintf(bw, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", lx, y, lx+24, y, color)
		fmt.Fprintf(bw, `<text x="%.0f" y="%.0f">%s</text>`+"\n", lx+30, y+4, html.EscapeString(c.Name))
	}
	fmt.Fprint(bw, "</svg>\n")
	return bw.Flush()
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

// tickBytes labels a byte tick of an axis whose top is top, in the SI
// unit of top, with as many decimals as the step needs.
func tickBytes(v, step, top float64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB"}
	u := 0
	for u < len(units)-1 && top >= 1000 {
		v, step, top = v/1000, step/1000, top/1000
		u++
	}
	return tickNum(v, step) + " " + units[u]
}

// tickNum formats v with enough decimals to tell ticks step apart.
func tickNum(v, step float64) string {
	dec := 0
	if step > 0 && step < 1 {
		dec = int(math.Ceil(-math.Log10(step)))
	}
	if math.Abs(v) < step*1e-9 {
		v = 0
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
