package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// vtScreen plays out on a minimal terminal what the board writes (text,
// newlines, cursor up, erase down, autowrap off/on) and returns the lines
// left on screen. It fails the test on anything else, on a cursor moved
// above the first line, and on wrapping left off.
func vtScreen(t *testing.T, out string) []string {
	t.Helper()
	var rows []string
	row, wrap := 0, true
	var cur strings.Builder
	for i := 0; i < len(out); {
		switch {
		case strings.HasPrefix(out[i:], "\x1b["):
			j := i + 2
			for j < len(out) && (out[j] == '?' || (out[j] >= '0' && out[j] <= '9')) {
				j++
			}
			require.Less(t, j, len(out), "truncated escape at %d", i)
			require.Zero(t, cur.Len(), "escape in mid-line at %d", i)
			param := out[i+2 : j]
			switch out[j] {
			case 'A':
				n, err := strconv.Atoi(param)
				require.NoError(t, err)
				row -= n
				require.GreaterOrEqual(t, row, 0, "cursor above the screen at %d", i)
			case 'J':
				require.Empty(t, param)
				rows = rows[:row]
			case 'l', 'h':
				require.Equal(t, "?7", param)
				wrap = out[j] == 'h'
			default:
				require.Failf(t, "unexpected escape", "%q at %d", out[i:j+1], i)
			}
			i = j + 1
		case out[i] == '\n':
			if row < len(rows) {
				rows[row] = cur.String()
			} else {
				rows = append(rows, cur.String())
			}
			cur.Reset()
			row++
			i++
		default:
			cur.WriteByte(out[i])
			i++
		}
	}
	require.Zero(t, cur.Len(), "an unterminated line")
	assert.True(t, wrap, "line wrapping left off")
	return rows[:row]
}

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time        { return c.t }
func (c *fakeClock) at(d time.Duration)    { c.t = time.Unix(1000, 0).Add(d) }
func newFakeClock() *fakeClock             { return &fakeClock{t: time.Unix(1000, 0)} }
func (c *fakeClock) since0() time.Duration { return c.t.Sub(time.Unix(1000, 0)) }
func ms(n int) time.Duration               { return time.Duration(n) * time.Millisecond }
func frame(lines ...string) string         { return ansiNoWrap + strings.Join(lines, "\n") + "\n" + ansiWrap }
func up(n int) string                      { return "\x1b[" + strconv.Itoa(n) + "A" + ansiEraseDn }
func doneRun(idx int, pol string) replay.SweepRun {
	return replay.SweepRun{Trace: "a", Policy: replay.Policy{Name: pol}, Index: idx, Total: 2, Wall: 1500 * time.Millisecond,
		Report: &replay.Report{MinCapacity: 3 << 20, MinCapacityOverLive: 1.5, PeakLive: 2 << 20, DriverCallsTotal: 1234, SimDriverTime: 56789 * time.Microsecond}}
}

// TestSweepBoardFrames drives a board over a 1×2 grid with a fake clock
// and checks every byte it draws.
func TestSweepBoardFrames(t *testing.T) {
	var buf bytes.Buffer
	clk := newFakeClock()
	b := newSweepBoard(&buf, true, clk.now)
	p0 := replay.SweepProgress{Trace: "a", Policy: "classic", Index: 0, Total: 2, EventsTotal: 1000}
	p1 := p0
	p1.Policy, p1.Index = "expandable", 1

	b.progress(p0)
	b.progress(p1)
	clk.at(ms(300))
	b.tick()
	assert.Empty(t, buf.String(), "nothing before progressDelay")

	clk.at(ms(500))
	p0.Events = 500
	b.progress(p0)
	f1 := frame(
		"a × classic [###############               ]  50% 500 events, 1.0 kevents/s",
		"a × expandable [                              ]   0% 0 events, 0.0 events/s")
	require.Equal(t, f1, buf.String())

	clk.at(ms(550))
	p1.Events = 100
	b.progress(p1)
	b.tick()
	require.Equal(t, f1, buf.String(), "throttled to one frame per progressInterval")

	clk.at(ms(600))
	p1.Stage, p1.Events = replay.SweepSearching, 1000
	b.progress(p1)
	f2 := up(2) + frame(
		"a × classic [###############               ]  50% 500 events, 833.3 events/s",
		"a × expandable min-capacity search, 0s")
	require.Equal(t, f1+f2, buf.String())

	clk.at(ms(700))
	b.tick()
	f3 := up(2) + frame(
		"a × classic [###############               ]  50% 500 events, 714.3 events/s",
		"a × expandable min-capacity search, 100ms")
	require.Equal(t, f1+f2+f3, buf.String())

	clk.at(ms(720))
	b.finish(doneRun(0, "classic"))
	summary := "[1/2] a × classic: min capacity 3.00 MiB (1.5000× peak live 2.00 MiB), 1,234 driver calls (56.789ms simulated), 1.5s"
	f4 := up(2) + summary + "\n" + frame("a × expandable min-capacity search, 100ms")
	require.Equal(t, f1+f2+f3+f4, buf.String(), "a finished run collapses into its summary at once")

	clk.at(ms(900))
	b.finish(doneRun(1, "expandable"))
	summary2 := strings.Replace(strings.Replace(summary, "[1/2]", "[2/2]", 1), "classic", "expandable", 1)
	f5 := up(1) + summary2 + "\n"
	require.Equal(t, f1+f2+f3+f4+f5, buf.String(), "no empty frame")

	b.close()
	b.close()
	clk.at(ms(2000))
	b.tick()
	require.Equal(t, f1+f2+f3+f4+f5, buf.String(), "nothing after close")
	assert.Equal(t, []string{summary, summary2}, vtScreen(t, buf.String()))
}

func TestSweepBoardCloseErases(t *testing.T) {
	var buf bytes.Buffer
	clk := newFakeClock()
	b := newSweepBoard(&buf, true, clk.now)
	clk.at(time.Second)
	b.progress(replay.SweepProgress{Trace: "t", Policy: "p", Total: 1, EventsTotal: 10, Events: 5})
	require.NotEmpty(t, buf.String())
	b.close()
	assert.True(t, strings.HasSuffix(buf.String(), up(1)), "%q", buf.String())
	assert.Empty(t, vtScreen(t, buf.String()))
}

// TestSweepBoardOffTerminal: one summary line per finished run, no
// escape codes, no ticker.
func TestSweepBoardOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	clk := newFakeClock()
	b := newSweepBoard(&buf, false, clk.now)
	stop := b.ticks(time.Millisecond)
	clk.at(time.Hour)
	b.progress(replay.SweepProgress{Trace: "a", Policy: "classic", Total: 2, EventsTotal: 10, Events: 5})
	b.tick()
	b.finish(doneRun(1, "expandable"))
	b.finish(doneRun(0, "classic"))
	stop()
	b.close()
	assert.Equal(t, "[1/2] a × expandable: min capacity 3.00 MiB (1.5000× peak live 2.00 MiB), 1,234 driver calls (56.789ms simulated), 1.5s\n"+
		"[2/2] a × classic: min capacity 3.00 MiB (1.5000× peak live 2.00 MiB), 1,234 driver calls (56.789ms simulated), 1.5s\n", buf.String())
}

func TestBoardLineClipsLongLabels(t *testing.T) {
	r := &boardRun{p: replay.SweepProgress{Trace: strings.Repeat("x", 50), Policy: "p", Stage: replay.SweepSearching}}
	assert.Equal(t, strings.Repeat("x", 39)+"… min-capacity search, 0s", boardLine(r, time.Time{}))
	r.p = replay.SweepProgress{Trace: "t", Policy: "p", Events: 7}
	assert.Equal(t, "t × p 7 events, 0.0 events/s", boardLine(r, time.Time{}), "no bar without a total")
}

// steppingClock advances a second at every reading, so every report is
// due for a frame; safe for concurrent use.
type steppingClock struct{ n atomic.Int64 }

func (c *steppingClock) now() time.Time { return time.Unix(c.n.Add(1), 0) }

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func boardGrid(t *testing.T) ([]replay.SweepTrace, []replay.Policy) {
	t.Helper()
	var traces []replay.SweepTrace
	for _, name := range []string{"multistream", "training"} {
		ev, _, err := workload.Generate(name, 1)
		require.NoError(t, err)
		traces = append(traces, replay.SweepTrace{Name: name, Events: ev})
	}
	return traces, []replay.Policy{{Name: "expandable"}, {Name: "classic", Config: "expandable_segments:False"}}
}

// TestRunSweepBoardConcurrent runs a real sweep, runs in parallel and the
// ticker going, with a board on a (fake) terminal: frames are drawn, and
// what is left on screen is exactly one summary per run.
func TestRunSweepBoardConcurrent(t *testing.T) {
	traces, policies := boardGrid(t)
	var out lockedBuffer
	clk := &steppingClock{}
	b := newSweepBoard(&out, true, clk.now)
	runs, err := runSweep(context.Background(), traces, policies, replay.SweepOptions{Options: replay.Options{MinCapacity: true}, Parallel: 3}, b)
	require.NoError(t, err)
	require.Len(t, runs, 4)
	s := out.String()
	assert.Contains(t, s, ansiNoWrap, "frames were drawn")
	screen := vtScreen(t, s)
	require.Len(t, screen, 4, "%q", s)
	for i, l := range screen {
		assert.Regexp(t, `^\[`+strconv.Itoa(i+1)+`/4\] (multistream|training) × (expandable|classic): min capacity `, l)
	}
}

// cancelOnFrame cancels a context when the first frame is written.
type cancelOnFrame struct {
	lockedBuffer
	cancel context.CancelFunc
}

func (c *cancelOnFrame) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(ansiNoWrap)) {
		c.cancel()
	}
	return c.lockedBuffer.Write(p)
}

// TestRunSweepBoardCancelled: a sweep cancelled (as by Ctrl-C) while bars
// are drawn leaves no bar and wrapping on.
func TestRunSweepBoardCancelled(t *testing.T) {
	traces, policies := boardGrid(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOnFrame{cancel: cancel}
	b := newSweepBoard(out, true, (&steppingClock{}).now)
	_, err := runSweep(ctx, traces, policies, replay.SweepOptions{Options: replay.Options{MinCapacity: true}, Parallel: 2}, b)
	require.ErrorIs(t, err, context.Canceled)
	s := out.String()
	require.Contains(t, s, ansiNoWrap)
	for _, l := range vtScreen(t, s) {
		assert.Regexp(t, `^\[\d/4\] `, l, "only summaries of runs that finished")
	}
}
