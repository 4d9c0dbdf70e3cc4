package replay

import (
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

const mib = 1 << 20

func alloc(id, size, stream uint64) trace.Event {
	return trace.Event{Kind: trace.Alloc, ID: id, Size: size, Stream: stream}
}
func free(id uint64) trace.Event { return trace.Event{Kind: trace.Free, ID: id} }

func mustConfig(t testing.TB, s string) allocator.Config {
	t.Helper()
	c, err := allocator.ParseConfig(s)
	require.NoError(t, err)
	return c
}

func TestRunAppliesEveryKind(t *testing.T) {
	ev := []trace.Event{
		alloc(1, 3*mib, 0),
		alloc(2, 100, 2),
		{Kind: trace.RecordStream, ID: 1, Stream: 2},
		{Kind: trace.RecordStream, ID: 99, Stream: 2}, // not live: skipped
		free(1),
		free(1),  // already freed: skipped
		free(42), // never allocated: skipped
		{Kind: trace.StreamSync, Stream: 2},
		alloc(3, 0, 0),  // zero bytes: a null pointer
		alloc(2, 10, 0), // id 2 still live: skipped
		alloc(7, 5*mib, 3),
		{Kind: trace.Mark, ID: 1},
		{Kind: trace.EmptyCache},
		free(3),
		free(2),
	}
	rep, err := Run(trace.NewSliceReader(ev), Options{Check: true})
	require.NoError(t, err)
	assert.Equal(t, int64(len(ev)), rep.Events)
	assert.True(t, rep.Complete)
	assert.Equal(t, int64(5), rep.Allocs)
	assert.Equal(t, int64(5), rep.Frees)
	assert.Equal(t, int64(2), rep.RecordStreams)
	assert.Equal(t, int64(1), rep.StreamSyncs)
	assert.Equal(t, int64(1), rep.EmptyCaches)
	assert.Equal(t, int64(1), rep.Marks)
	assert.Equal(t, 2, rep.Streams, "trace streams 2 and 3 became emulator streams")
	assert.Equal(t, int64(2), rep.SkippedFrees)
	assert.Equal(t, int64(1), rep.SkippedRecords)
	assert.Equal(t, int64(1), rep.DuplicateAllocs)
	assert.Equal(t, int64(1), rep.ZeroAllocs)
	assert.Zero(t, rep.OOMs)
	assert.Equal(t, int64(-1), rep.FirstOOMEvent)
	assert.Equal(t, uint64(5*mib+100), rep.PeakLive, "ids 2 and 7")
	assert.Equal(t, uint64(5*mib), rep.EndLive, "id 7 is never freed")
	assert.Equal(t, uint64(5*mib), rep.EndAllocated)
	assert.GreaterOrEqual(t, rep.PeakAllocated, rep.PeakLive)
	assert.GreaterOrEqual(t, rep.PeakReserved, rep.PeakAllocated)
	assert.GreaterOrEqual(t, rep.ReservedOverLive, 1.0)
	assert.Positive(t, rep.DriverCalls["MapMem"])
	assert.Positive(t, rep.DriverCalls["MallocPhysical"])
	var sum int64
	for _, n := range rep.DriverCalls {
		sum += n
	}
	assert.Equal(t, sum, rep.DriverCallsTotal)
	assert.Positive(t, int64(rep.SimDriverTime))
	assert.Equal(t, DefaultCapacity, rep.Capacity)
	assert.Equal(t, allocator.DefaultConfig().String(), rep.Config)
	require.NotEmpty(t, rep.Samples)
	assert.Equal(t, rep.Events, rep.Samples[len(rep.Samples)-1].Event)
	assert.Equal(t, uint64(5*mib), rep.Samples[len(rep.Samples)-1].Live)
}

func TestRunOutOfMemory(t *testing.T) {
	// 64 MiB device: the third 30 MiB allocation cannot fit.
	ev := []trace.Event{alloc(1, 30*mib, 0), alloc(2, 30*mib, 0), alloc(3, 30*mib, 0), alloc(4, 1*mib, 0), free(3), free(1), free(2), free(4)}
	for _, cfg := range []string{"", "expandable_segments:False"} {
		t.Run("counted/"+cfg, func(t *testing.T) {
			rep, err := Run(trace.NewSliceReader(ev), Options{Config: mustConfig(t, cfg), Capacity: 64 * mib, Check: true})
			require.NoError(t, err)
			assert.True(t, rep.Complete)
			assert.Equal(t, int64(8), rep.Events)
			assert.Equal(t, int64(1), rep.OOMs)
			assert.Equal(t, int64(2), rep.FirstOOMEvent)
			assert.Equal(t, int64(1), rep.FailedFrees)
			assert.Zero(t, rep.SkippedFrees)
			assert.Equal(t, uint64(91*mib), rep.PeakLive, "demand counts the failed allocation")
			assert.LessOrEqual(t, rep.PeakReserved, uint64(64*mib))
			assert.Zero(t, rep.EndLive)
			assert.Zero(t, rep.EndAllocated)
		})
		t.Run("stop/"+cfg, func(t *testing.T) {
			rep, err := Run(trace.NewSliceReader(ev), Options{Config: mustConfig(t, cfg), Capacity: 64 * mib, StopOnOOM: true})
			require.NoError(t, err)
			assert.False(t, rep.Complete)
			assert.Equal(t, int64(3), rep.Events)
			assert.Equal(t, int64(1), rep.OOMs)
			assert.Equal(t, int64(2), rep.FirstOOMEvent)
		})
	}
	t.Run("larger than the device", func(t *testing.T) {
		rep, err := Run(trace.NewSliceReader([]trace.Event{alloc(1, 128*mib, 0), free(1)}), Options{Capacity: 64 * mib})
		require.NoError(t, err)
		assert.Equal(t, int64(1), rep.OOMs)
		assert.Equal(t, int64(1), rep.FailedFrees)
	})
}

// errReader fails after yielding its events.
type errReader struct {
	events []trace.Event
	err    error
}

func (r *errReader) Next() (trace.Event, error) {
	if len(r.events) == 0 {
		return trace.Event{}, r.err
	}
	e := r.events[0]
	r.events = r.events[1:]
	return e, nil
}

func TestRunErrors(t *testing.T) {
	bad := allocator.DefaultConfig()
	bad.LargeSegmentSize = 3 * mib // not a multiple of the 2 MiB granularity
	cost := emulated.CostModel{}
	tests := []struct {
		name   string
		r      trace.EventReader
		opts   Options
		target error
	}{
		{"nil reader", nil, Options{}, ErrInvalidOptions},
		{"invalid config", trace.NewSliceReader(nil), Options{Config: allocator.Config{LargeSegmentSize: 1}}, ErrInvalidOptions},
		{"config the driver rejects", trace.NewSliceReader(nil), Options{Config: bad}, allocator.ErrInvalidConfig},
		{"few samples", trace.NewSliceReader(nil), Options{MaxSamples: 3, CostModel: &cost}, ErrInvalidOptions},
		{"invalid kind", trace.NewSliceReader([]trace.Event{{Kind: 0}}), Options{}, ErrInvalidEvent},
		{"read error", &errReader{events: []trace.Event{alloc(1, 10, 0)}, err: trace.ErrCorrupt}, Options{}, trace.ErrCorrupt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(tc.r, tc.opts)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.target)
			assert.Nil(t, rep)
		})
	}
}

func TestRunEmptyTrace(t *testing.T) {
	rep, err := Run(trace.NewSliceReader(nil), Options{})
	require.NoError(t, err)
	assert.Zero(t, rep.Events)
	assert.Zero(t, rep.PeakLive)
	assert.Zero(t, rep.ReservedOverLive)
	assert.Len(t, rep.Samples, 1)
}

func TestRunSparseIDs(t *testing.T) {
	big := uint64(1) << 40
	ev := []trace.Event{alloc(big, 4*mib, 0), alloc(denseIDs-1, 1*mib, 0), alloc(5, 2*mib, 0),
		free(big), free(denseIDs - 1), free(big), free(5)}
	rep, err := Run(trace.NewSliceReader(ev), Options{Check: true})
	require.NoError(t, err)
	assert.Equal(t, uint64(7*mib), rep.PeakLive)
	assert.Equal(t, int64(1), rep.SkippedFrees)
	assert.Zero(t, rep.EndLive)
	assert.Zero(t, rep.EndAllocated)

	// An id far beyond the slice goes to the map; when sequential ids grow
	// the slice past it, it moves into the slice and is still found.
	far := uint64(3 * initialDense)
	ev = []trace.Event{alloc(far, 1000, 0)}
	for id := uint64(1); id < far+initialDense; id++ {
		if id != far {
			ev = append(ev, alloc(id, 512, 0))
		}
	}
	ev = append(ev, free(far))
	for id := uint64(1); id < far+initialDense; id++ {
		if id != far {
			ev = append(ev, free(id))
		}
	}
	rep, err = Run(trace.NewSliceReader(ev), Options{})
	require.NoError(t, err)
	assert.Zero(t, rep.SkippedFrees)
	assert.Zero(t, rep.EndLive)
	assert.Zero(t, rep.EndAllocated)
	assert.Equal(t, uint64(1000+512*(far+initialDense-2)), rep.PeakLive)
}

func TestSamplesBounded(t *testing.T) {
	ev := synth(50_000, 3)
	for _, maxS := range []int{16, 17, 100} {
		rep, err := Run(trace.NewSliceReader(ev), Options{MaxSamples: maxS})
		require.NoError(t, err)
		s := rep.Samples
		require.LessOrEqual(t, len(s), maxS+1)
		require.GreaterOrEqual(t, len(s), maxS/2)
		assert.Equal(t, int64(0), s[0].Event)
		assert.Equal(t, rep.Events, s[len(s)-1].Event)
		stride := s[1].Event
		for i := 1; i < len(s)-1; i++ {
			assert.Equal(t, int64(i)*stride, s[i].Event, "uniform stride")
			assert.GreaterOrEqual(t, s[i].Reserved, s[i].Allocated)
			assert.GreaterOrEqual(t, s[i].Allocated, s[i].Live)
			f := s[i].Fragmentation()
			assert.True(t, f >= 0 && f <= 1, "fragmentation %v", f)
		}
		assert.LessOrEqual(t, rep.MeanFragmentation, rep.MaxFragmentation)
	}
	rep, err := Run(trace.NewSliceReader(ev), Options{MaxSamples: -1})
	require.NoError(t, err)
	assert.Nil(t, rep.Samples)
}

func TestProgress(t *testing.T) {
	ev := synth(progressEvery*2+10, 4)
	var calls []int64
	rep, err := Run(trace.NewSliceReader(ev), Options{Progress: func(n int64) { calls = append(calls, n) }})
	require.NoError(t, err)
	assert.Equal(t, []int64{progressEvery, 2 * progressEvery, rep.Events}, calls)
}

func TestSampleFragmentation(t *testing.T) {
	assert.Zero(t, Sample{}.Fragmentation())
	assert.InDelta(t, 0.25, Sample{Allocated: 3, Reserved: 4}.Fragmentation(), 1e-12)
}

// TestRunDeterministic: the same trace replays to the same figures.
func TestRunDeterministic(t *testing.T) {
	ev := synth(20_000, 5)
	a, err := Run(trace.NewSliceReader(ev), Options{})
	require.NoError(t, err)
	b, err := Run(trace.NewSliceReader(ev), Options{})
	require.NoError(t, err)
	assert.Equal(t, a.PeakReserved, b.PeakReserved)
	assert.Equal(t, a.DriverCalls, b.DriverCalls)
	assert.Equal(t, a.SimDriverTime, b.SimDriverTime)
	assert.Equal(t, a.Samples, b.Samples)
}

func TestReadErrorIsWrapped(t *testing.T) {
	_, err := Run(&errReader{err: io.ErrUnexpectedEOF}, Options{})
	require.Error(t, err)
	assert.True(t, errors.Is(err, io.ErrUnexpectedEOF))
	assert.Contains(t, err.Error(), "reading event 0")
}

func TestSteadyDriverCalls(t *testing.T) {
	mark := func(id uint64) trace.Event { return trace.Event{Kind: trace.Mark, ID: id} }
	// Step 1 grows the heap; step 2 reuses it; the last Mark closes the run.
	ev := []trace.Event{
		mark(1), alloc(1, 30*mib, 0), free(1),
		mark(2), alloc(2, 30*mib, 0), free(2),
		mark(3),
	}
	cases := []struct {
		from      uint64
		steps     int64
		zeroCalls bool
	}{
		{0, 0, true}, // off
		{1, 2, false},
		{2, 1, true},
		{9, 0, true}, // never seen
	}
	for _, c := range cases {
		rep, err := Run(trace.NewSliceReader(ev), Options{SteadyFromMark: c.from})
		require.NoError(t, err)
		assert.Equal(t, c.steps, rep.SteadySteps, "from %d", c.from)
		if c.zeroCalls {
			assert.Zero(t, rep.SteadyDriverCalls, "from %d", c.from)
		} else {
			// Growth: the segment's granularity query and reservation, then
			// create, map and set access for a 20 MiB and a 10 MiB handle.
			assert.Equal(t, int64(8), rep.SteadyDriverCalls, "from %d", c.from)
		}
	}
}
