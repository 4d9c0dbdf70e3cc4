package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
)

// Progress-bar tuning.
const (
	progressDelay    = 500 * time.Millisecond // draw nothing for replays shorter than this
	progressInterval = 100 * time.Millisecond // redraw at most this often
	barWidth         = 30                     // characters of the bar
)

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progress draws a one-line progress bar on a terminal, redrawing it in
// place with a carriage return. It stays silent for the first
// progressDelay, so short replays print nothing.
type progress struct {
	w        io.Writer
	label    string
	fraction func(done int64) float64 // share done in [0,1], or -1 if unknown
	now      func() time.Time
	start    time.Time
	last     time.Time // last draw
	drawn    bool      // something is on the line
}

// newProgress returns a progress bar writing to w, or nil when w is not a
// terminal (a nil *progress does nothing).
func newProgress(w io.Writer, label string, fraction func(int64) float64) *progress {
	if !isTerminal(w) {
		return nil
	}
	return &progress{w: w, label: label, fraction: fraction, now: time.Now, start: time.Now()}
}

// update is the replay's Progress callback.
func (p *progress) update(done int64) {
	if p == nil {
		return
	}
	t := p.now()
	if t.Sub(p.start) < progressDelay || t.Sub(p.last) < progressInterval {
		return
	}
	p.last = t
	fmt.Fprintf(p.w, "\r%s", renderBar(p.label, p.fraction(done), done, t.Sub(p.start)))
	p.drawn = true
}

// done clears the bar's line.
func (p *progress) done() {
	if p == nil || !p.drawn {
		return
	}
	fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 100))
	p.drawn = false
}

// renderBar formats one bar line: label, bar and percentage (when the
// fraction is known), events done and the rate.
func renderBar(label string, frac float64, done int64, elapsed time.Duration) string {
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	v, unit := humanize.ComputeSI(rate)
	tail := fmt.Sprintf("%s events, %.1f %sevents/s", humanize.Comma(done), v, unit)
	if frac < 0 {
		return fmt.Sprintf("%s %s", label, tail)
	}
	frac = min(max(frac, 0), 1)
	n := int(frac * barWidth)
	return fmt.Sprintf("%s [%s%s] %3.0f%% %s", label, strings.Repeat("#", n), strings.Repeat(" ", barWidth-n), frac*100, tail)
}
