package replay

import (
	"bytes"
	"context"
	"encoding/csv"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

func sweepGrid() ([]SweepTrace, []Policy) {
	traces := []SweepTrace{{Name: "a", Events: synth(6_000, 21)}, {Name: "b", Events: synth(4_000, 22)}}
	policies := []Policy{{"expandable", ""}, {"classic", "expandable_segments:False"}, {"page2M", "large_segment_size_mb:2"}}
	return traces, policies
}

func TestSweepMatchesSequentialReplays(t *testing.T) {
	traces, policies := sweepGrid()
	var mu sync.Mutex
	var done []int
	runs, err := Sweep(context.Background(), traces, policies, SweepOptions{
		Options:  Options{MinCapacity: true},
		Parallel: 3,
		OnDone: func(r SweepRun) {
			mu.Lock()
			defer mu.Unlock()
			done = append(done, r.Index)
			assert.Equal(t, 6, r.Total)
			assert.NotNil(t, r.Report)
		},
	})
	require.NoError(t, err)
	require.Len(t, runs, len(traces)*len(policies))
	assert.ElementsMatch(t, []int{0, 1, 2, 3, 4, 5}, done, "OnDone once per run")
	for i, r := range runs {
		tr, p := traces[i/len(policies)], policies[i%len(policies)]
		assert.Equal(t, i, r.Index)
		assert.Equal(t, tr.Name, r.Trace)
		assert.Equal(t, p, r.Policy)
		assert.Equal(t, p.Name, r.Report.Policy)
		// The same replay run alone gives the same figures.
		cfg := mustConfig(t, p.Config)
		want, err := Run(sliceOf(tr.Events), Options{Name: p.Name, Config: cfg})
		require.NoError(t, err)
		assert.Equal(t, want.PeakReserved, r.Report.PeakReserved, "%s/%s", tr.Name, p.Name)
		assert.Equal(t, want.DriverCallsTotal, r.Report.DriverCallsTotal, "%s/%s", tr.Name, p.Name)
		mc, err := MinCapacity(tr.Events, cfg, Options{})
		require.NoError(t, err)
		assert.Equal(t, mc, r.Report.MinCapacity, "%s/%s", tr.Name, p.Name)
		assert.GreaterOrEqual(t, r.Report.MinCapacity, r.Report.PeakLive)
	}
}

func TestSweepErrors(t *testing.T) {
	good := synth(3_000, 23)
	bad := append(synth(100, 24), trace.Event{Kind: trace.Kind(200), ID: 1})
	policies := []Policy{{"expandable", ""}}

	t.Run("bad event names its cell and stops the rest", func(t *testing.T) {
		calls := 0
		runs, err := Sweep(context.Background(),
			[]SweepTrace{{"bad", bad}, {"good1", good}, {"good2", good}}, policies,
			SweepOptions{Parallel: 1, OnDone: func(SweepRun) { calls++ }})
		require.ErrorIs(t, err, ErrInvalidEvent)
		assert.Contains(t, err.Error(), `trace "bad", policy "expandable"`)
		assert.Nil(t, runs)
		assert.Zero(t, calls, "with one run at a time, nothing runs after the failure")
	})
	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		calls := 0
		runs, err := Sweep(ctx, []SweepTrace{{"good", good}}, policies, SweepOptions{OnDone: func(SweepRun) { calls++ }})
		require.ErrorIs(t, err, context.Canceled)
		assert.Nil(t, runs)
		assert.Zero(t, calls)
	})
	t.Run("bad policy replays nothing", func(t *testing.T) {
		calls := 0
		_, err := Sweep(context.Background(), []SweepTrace{{"good", good}},
			[]Policy{{"ok", ""}, {"broken", "nope:1"}}, SweepOptions{OnDone: func(SweepRun) { calls++ }})
		require.ErrorIs(t, err, ErrInvalidOptions)
		assert.Contains(t, err.Error(), `policy "broken"`)
		assert.Zero(t, calls)
	})
	t.Run("empty grid", func(t *testing.T) {
		_, err := Sweep(context.Background(), nil, policies, SweepOptions{})
		assert.ErrorIs(t, err, ErrInvalidOptions)
		_, err = Sweep(context.Background(), []SweepTrace{{"good", good}}, nil, SweepOptions{})
		assert.ErrorIs(t, err, ErrInvalidOptions)
	})
}

// cancellingReader cancels its context when the at-th event is read.
type cancellingReader struct {
	trace.EventReader
	n, at  int
	cancel context.CancelFunc
}

func (c *cancellingReader) Next() (trace.Event, error) {
	c.n++
	if c.n == c.at {
		c.cancel()
	}
	return c.EventReader.Next()
}

func TestRunContextStopsMidReplay(t *testing.T) {
	ev := synth(50_000, 25)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &cancellingReader{EventReader: sliceOf(ev), at: 1000, cancel: cancel}
	rep, err := RunContext(ctx, r, Options{})
	require.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, rep)
	assert.Contains(t, err.Error(), "stopped after 4096 events")
	assert.Less(t, r.n, len(ev), "the replay did not read to the end")

	_, err = SearchMinCapacityContext(ctx, ev, mustConfig(t, ""), Options{})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestSweepTables(t *testing.T) {
	traces, policies := sweepGrid()
	runs, err := Sweep(context.Background(), traces[:1], policies[:2], SweepOptions{Options: Options{MinCapacity: true}})
	require.NoError(t, err)

	var md bytes.Buffer
	require.NoError(t, WriteSweepMarkdown(&md, runs))
	lines := strings.Split(strings.TrimRight(md.String(), "\n"), "\n")
	require.Len(t, lines, 2+len(runs))
	assert.Equal(t, "| trace | policy | config | peak live | peak reserved | reserved/live | min capacity | mincap/live | OOMs | driver calls | sim driver time |", lines[0])
	assert.Equal(t, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|", lines[1])
	for i, r := range runs {
		row := lines[2+i]
		assert.True(t, strings.HasPrefix(row, "| a | "+r.Policy.Name+" | `"+PolicyConfig(r.Policy)+"` | "), row)
		assert.Contains(t, row, FormatBytes(r.Report.MinCapacity))
		assert.Contains(t, row, " | "+FormatCount(r.Report.DriverCallsTotal)+" | "+r.Report.SimDriverTime.Round(time.Microsecond).String()+" |")
		assert.Positive(t, r.Report.SimDriverTime)
	}

	var cb bytes.Buffer
	require.NoError(t, WriteSweepCSV(&cb, runs))
	recs, err := csv.NewReader(&cb).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 1+len(runs))
	assert.Equal(t, "min_capacity_bytes", recs[0][6])
	for i, r := range runs {
		assert.Equal(t, []string{"a", r.Policy.Name, r.Policy.Config}, recs[1+i][:3])
		assert.Equal(t, strconv.FormatUint(r.Report.MinCapacity, 10), recs[1+i][6])
		assert.Equal(t, strconv.FormatInt(r.Report.DriverCallsTotal, 10), recs[1+i][9])
	}
	assert.Equal(t, "| a \\| b | x |", "| "+mdCell("a | b")+" | x |")
}

func TestSweepPlot(t *testing.T) {
	traces, policies := sweepGrid()
	var runs []SweepRun
	for ti, tr := range traces {
		for pi, p := range policies {
			runs = append(runs, SweepRun{Trace: tr.Name, Policy: p, Report: &Report{
				DriverCallsTotal: int64(1000 * (pi + 1)), MinCapacity: 1, MinCapacityOverLive: 1 + float64(ti)/10}})
		}
	}
	p := SweepPlot("grid", runs)
	require.Len(t, p.Curves, len(runs))
	assert.Equal(t, "min capacity / peak live", p.YLabel)
	assert.Equal(t, "driver calls", p.XLabel)
	for i, c := range p.Curves {
		r := runs[i]
		assert.Equal(t, r.Policy.Name+" · "+r.Trace, c.Name)
		assert.Equal(t, []float64{float64(r.Report.DriverCallsTotal)}, c.X)
		assert.Equal(t, []float64{r.Report.MinCapacityOverLive}, c.Y)
		assert.Equal(t, palette[i%len(policies)], c.Color, "colour by policy")
		assert.Equal(t, Marker(1+i/len(policies)), c.Marker, "shape by trace")
	}
	var buf bytes.Buffer
	require.NoError(t, p.WriteSVG(&buf))
	els := svgElements(t, buf.Bytes())
	// Trace a is drawn with circles, trace b with squares: one per point
	// and one per legend entry; three more rects are the background, the
	// frame and the clip path.
	assert.Equal(t, 2*len(policies), els["circle"])
	assert.Equal(t, 2*len(policies)+3, els["rect"])
	assert.Zero(t, els["polyline"], "a scatter draws no lines")

	runs[0].Report.MinCapacity = 0
	assert.Equal(t, "min capacity (or peak reserved) / peak live", SweepPlot("x", runs).YLabel)
}

// BenchmarkSweep runs a 2 traces × 3 policies grid with capacity search,
// one run at a time and GOMAXPROCS at once; runs/s is the throughput.
func BenchmarkSweep(b *testing.B) {
	traces, policies := sweepGrid()
	for _, par := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run("parallel="+strconv.Itoa(par), func(b *testing.B) {
			b.ReportAllocs()
			runs := 0
			for b.Loop() {
				rs, err := Sweep(context.Background(), traces, policies, SweepOptions{Options: Options{MinCapacity: true}, Parallel: par})
				if err != nil {
					b.Fatal(err)
				}
				runs += len(rs)
			}
			b.ReportMetric(float64(runs)/b.Elapsed().Seconds(), "runs/s")
		})
	}
}
