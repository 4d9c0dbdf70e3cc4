package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

// ANSI control sequences of the sweep board.
const (
	ansiNoWrap   = "\x1b[?7l" // lines longer than the terminal are clipped, not wrapped
	ansiWrap     = "\x1b[?7h" // back to wrapping
	ansiEraseDn  = "\x1b[J"   // erase from the cursor to the end of the screen
	ansiUpFormat = "\x1b[%dA" // cursor up n lines
)

// sweepBoard reports the runs of a sweep on stderr.
//
// On a terminal it is a board: one bar line per run in flight (in grid
// order), kept below the one-line summaries of the runs already finished.
// Each frame erases the previous one (cursor up over its lines, erase to
// the end of the screen) and draws the current state with line wrapping
// off, so a line wider than the terminal is clipped and the line count the
// next erase relies on stays right. Frames follow progress reports and a
// ticker (runs in their capacity search report nothing for a while) but
// come at most every progressInterval, and not before progressDelay, so a
// short sweep shows only its summaries. A finished run erases the board,
// prints its summary and redraws the board at once. close erases the
// board: after a cancelled sweep (Ctrl-C) the terminal holds the
// summaries and nothing else.
//
// Elsewhere it prints one summary line per finished run and no escape
// codes.
//
// The methods may be called concurrently.
type sweepBoard struct {
	mu    sync.Mutex // guards every field below
	w     io.Writer
	term  bool             // draw the board (w is a terminal)
	now   func() time.Time // the clock
	start time.Time        // when the board was made
	last  time.Time        // when the last frame was drawn
	runs  map[int]*boardRun
	lines int  // bar lines of the frame on screen, above the cursor
	done  int  // runs finished
	shut  bool // close was called: draw nothing more
}

// boardRun is one run in flight.
type boardRun struct {
	p       replay.SweepProgress // its last report
	stageAt time.Time            // when it entered p.Stage
}

// newSweepBoard returns a board writing to w; term says whether w is a
// terminal and now is the clock.
func newSweepBoard(w io.Writer, term bool, now func() time.Time) *sweepBoard {
	return &sweepBoard{w: w, term: term, now: now, start: now(), runs: map[int]*boardRun{}}
}

// progress is the sweep's OnProgress.
func (b *sweepBoard) progress(p replay.SweepProgress) {
	if !b.term {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.now()
	r := b.runs[p.Index]
	if r == nil || r.p.Stage != p.Stage {
		r = &boardRun{stageAt: t}
		b.runs[p.Index] = r
	}
	r.p = p
	b.drawIfDue(t)
}

// tick redraws the board if a frame is due (the elapsed times move on).
func (b *sweepBoard) tick() {
	if !b.term {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drawIfDue(b.now())
}

// ticks calls tick every d until the returned function is called (which
// waits for the ticking goroutine to end). Off a terminal it does nothing.
func (b *sweepBoard) ticks(d time.Duration) (stop func()) {
	if !b.term {
		return func() {}
	}
	quit, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tk := time.NewTicker(d)
		defer tk.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tk.C:
				b.tick()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-ended
	}
}

// finish is the sweep's OnDone: the run's summary line, above the board.
func (b *sweepBoard) finish(r replay.SweepRun) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done++
	delete(b.runs, r.Index)
	if !b.term {
		fmt.Fprintln(b.w, runLine(r, b.done))
		return
	}
	had := b.lines > 0
	b.erase()
	fmt.Fprintln(b.w, runLine(r, b.done))
	if had && !b.shut {
		b.draw(b.now())
	}
}

// close erases the board for good. It is safe to call more than once.
func (b *sweepBoard) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.erase()
	b.shut = true
}

// drawIfDue draws a frame at t unless it is too early. b.mu is held.
func (b *sweepBoard) drawIfDue(t time.Time) {
	if b.shut || t.Sub(b.start) < progressDelay || t.Sub(b.last) < progressInterval {
		return
	}
	b.erase()
	b.draw(t)
}

// erase removes the frame on screen, leaving the cursor where it began.
// b.mu is held.
func (b *sweepBoard) erase() {
	if b.lines == 0 {
		return
	}
	fmt.Fprintf(b.w, ansiUpFormat+ansiEraseDn, b.lines)
	b.lines = 0
}

// draw writes a frame of the runs in flight, in grid order, with nothing
// on screen below the cursor. b.mu is held.
func (b *sweepBoard) draw(t time.Time) {
	b.last = t
	if len(b.runs) == 0 {
		return
	}
	var s strings.Builder
	s.WriteString(ansiNoWrap)
	for _, idx := range slices.Sorted(maps.Keys(b.runs)) {
		s.WriteString(boardLine(b.runs[idx], t))
		s.WriteByte('\n')
	}
	s.WriteString(ansiWrap)
	_, _ = io.WriteString(b.w, s.String())
	b.lines = len(b.runs)
}

// boardLabelMax bounds the trace × policy label of a bar line, in runes.
const boardLabelMax = 40

// boardLine is the bar line of a run in flight at t: label, then for the
// plain replay a bar, percentage, events and events/s, and for the
// capacity search the time it has taken so far.
func boardLine(r *boardRun, t time.Time) string {
	label := []rune(r.p.Trace + " × " + r.p.Policy)
	if len(label) > boardLabelMax {
		label = append(label[:boardLabelMax-1], '…')
	}
	elapsed := t.Sub(r.stageAt)
	switch r.p.Stage {
	case replay.SweepSearching:
		return fmt.Sprintf("%s %s, %s", string(label), r.p.Stage, elapsed.Round(100*time.Millisecond))
	default:
		frac := -1.0
		if r.p.EventsTotal > 0 {
			frac = float64(r.p.Events) / float64(r.p.EventsTotal)
		}
		return renderBar(string(label), frac, r.p.Events, elapsed)
	}
}
