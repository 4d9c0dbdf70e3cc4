package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

type sliceReader struct {
	ev  []trace.Event
	err error // returned after the events instead of io.EOF
}

func (r *sliceReader) Next() (trace.Event, error) {
	if len(r.ev) == 0 {
		if r.err != nil {
			return trace.Event{}, r.err
		}
		return trace.Event{}, io.EOF
	}
	e := r.ev[0]
	r.ev = r.ev[1:]
	return e, nil
}

func small() []trace.Event {
	return []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 1 << 20},
		{Kind: trace.Alloc, ID: 2, Size: 3 << 20, Stream: 1},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Free, ID: 2},
	}
}

// TestRunMisuse: bad options, readers and contexts give typed errors, not
// panics or hangs.
func TestRunMisuse(t *testing.T) {
	bad := allocator.DefaultConfig()
	bad.MaxSegmentsPerPool = -3
	readErr := errors.New("disk gone")
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		r    trace.EventReader
		o    replay.Options
		want error
	}{
		{"nil reader", context.Background(), nil, replay.Options{}, replay.ErrInvalidOptions},
		{"capacity above MaxSearchCapacity", context.Background(), &sliceReader{ev: small()}, replay.Options{Capacity: replay.MaxSearchCapacity + 1}, replay.ErrInvalidOptions},
		{"capacity 2^64-1", context.Background(), &sliceReader{ev: small()}, replay.Options{Capacity: math.MaxUint64}, replay.ErrInvalidOptions},
		{"invalid config", context.Background(), &sliceReader{ev: small()}, replay.Options{Config: bad}, allocator.ErrInvalidConfig},
		{"negative device", context.Background(), &sliceReader{ev: small()}, replay.Options{Config: func() allocator.Config { c := allocator.DefaultConfig(); c.Device = -1; return c }()}, replay.ErrInvalidOptions},
		{"huge device", context.Background(), &sliceReader{ev: small()}, replay.Options{Config: func() allocator.Config { c := allocator.DefaultConfig(); c.Device = math.MaxInt32; return c }()}, replay.ErrInvalidOptions},
		{"negative snapshot entries", context.Background(), &sliceReader{ev: small()}, replay.Options{Snapshot: io.Discard, SnapshotEntries: -1}, replay.ErrInvalidOptions},
		{"reader error", context.Background(), &sliceReader{ev: small(), err: readErr}, replay.Options{}, readErr},
		{"canceled", canceled, &sliceReader{ev: small()}, replay.Options{}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := replay.RunContext(tc.ctx, tc.r, tc.o)
			require.ErrorIs(t, err, tc.want)
			_ = rep
		})
	}
}

// TestRunHostileEvents: events that cannot be applied are skipped or
// counted as out of memory, never a panic.
func TestRunHostileEvents(t *testing.T) {
	ev := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 0},
		{Kind: trace.Alloc, ID: 2, Size: math.MaxUint64},
		{Kind: trace.Alloc, ID: 3, Size: math.MaxUint64 - 4095},
		{Kind: trace.Alloc, ID: 4, Size: 1 << 20, Stream: math.MaxUint64},
		{Kind: trace.Alloc, ID: 4, Size: 1 << 20}, // a live id again
		{Kind: trace.RecordStream, ID: 4, Stream: math.MaxUint64},
		{Kind: trace.RecordStream, ID: 99},
		{Kind: trace.StreamSync, Stream: math.MaxUint64},
		{Kind: trace.Free, ID: 12345},
		{Kind: trace.Free, ID: 4},
		{Kind: trace.Free, ID: 4},
		{Kind: trace.Kind(0)},
		{Kind: trace.Kind(200)},
		{Kind: trace.EmptyCache},
		{Kind: trace.Mark, ID: math.MaxUint64},
	}
	done := make(chan struct{})
	var rep *replay.Report
	var err error
	go func() {
		defer close(done)
		rep, err = replay.Run(&sliceReader{ev: ev}, replay.Options{Check: true, Capacity: 1 << 30})
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Minute): // a last guard, for a loaded machine under -race
		t.Fatal("replay hung")
	}
	if err != nil {
		require.ErrorIs(t, err, replay.ErrInvalidEvent)
		return
	}
	require.NotNil(t, rep)
	assert.Zero(t, rep.EndAllocated)
}

// TestSweepMisuse: bad sweeps are refused with a sentinel.
func TestSweepMisuse(t *testing.T) {
	tr := []replay.SweepTrace{{Name: "t", Events: small()}}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		traces   []replay.SweepTrace
		policies []replay.Policy
		o        replay.SweepOptions
		want     error
	}{
		{"no traces", context.Background(), nil, replay.DefaultPolicies(), replay.SweepOptions{}, replay.ErrInvalidOptions},
		{"no policies", context.Background(), tr, nil, replay.SweepOptions{}, replay.ErrInvalidOptions},
		{"bad policy config", context.Background(), tr, []replay.Policy{{Name: "x", Config: "nonsense:1"}}, replay.SweepOptions{}, allocator.ErrInvalidConfig},
		{"duplicate policy", context.Background(), tr, []replay.Policy{{Name: "x"}, {Name: "x"}}, replay.SweepOptions{}, replay.ErrInvalidOptions},
		{"duplicate trace", context.Background(), append(tr, tr[0]), replay.DefaultPolicies()[:1], replay.SweepOptions{}, replay.ErrInvalidOptions},
		{"canceled", canceled, tr, replay.DefaultPolicies()[:1], replay.SweepOptions{}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs, err := replay.Sweep(tc.ctx, tc.traces, tc.policies, tc.o)
			require.ErrorIs(t, err, tc.want)
			assert.Nil(t, runs)
		})
	}
}

type brokenWriter struct{}

func (brokenWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestRunSnapshotWriteFails: a snapshot writer that fails fails the replay
// with its error (not a silent, truncated snapshot).
func TestRunSnapshotWriteFails(t *testing.T) {
	rep, err := replay.Run(&sliceReader{ev: small()}, replay.Options{Snapshot: brokenWriter{}})
	require.ErrorContains(t, err, "disk full")
	assert.Nil(t, rep)
}

// TestDamagedRealTrace: a real PyTorch snapshot cut short or with bytes
// flipped either fails to import with an error, or imports and replays
// (with the invariant check) without a panic. Skipped without the traces.
func TestDamagedRealTrace(t *testing.T) {
	dir, err := trace.SharedDir()
	if err != nil {
		t.Skip(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "tts_inference_server.pickle"))
	if err != nil {
		t.Skipf("shared traces unavailable: %v", err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 48 {
		d := append([]byte(nil), data...)
		var name string
		if i%2 == 0 {
			n := rng.IntN(len(d))
			d, name = d[:n], fmt.Sprintf("cut at %d", n)
		} else {
			at := rng.IntN(len(d))
			d[at] ^= byte(1 + rng.IntN(255))
			name = fmt.Sprintf("byte %d flipped", at)
		}
		t.Run(name, func(t *testing.T) {
			var tr *trace.PyTorchTrace
			require.NotPanics(t, func() { tr, err = trace.ImportPyTorchSnapshot(bytes.NewReader(d), 0) })
			if err != nil {
				return
			}
			require.NotPanics(t, func() {
				_, err = replay.Run(tr.Reader(), replay.Options{Check: true, Capacity: 1 << 30})
			})
			if err != nil {
				assert.ErrorIs(t, err, replay.ErrInvalidEvent)
			}
		})
	}
}
