package replay_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// deviceTrace allocates 8 blocks of 64 MiB on two streams, frees them, and
// allocates one more: peak live 512 MiB.
func deviceTrace() []trace.Event {
	var ev []trace.Event
	for i := uint64(1); i <= 8; i++ {
		ev = append(ev, trace.Event{Kind: trace.Alloc, ID: i, Size: 64 << 20, Stream: i % 2})
	}
	ev = append(ev, trace.Event{Kind: trace.RecordStream, ID: 2, Stream: 1}, trace.Event{Kind: trace.Free, ID: 99})
	for i := uint64(1); i <= 8; i++ {
		ev = append(ev, trace.Event{Kind: trace.Free, ID: i})
	}
	ev = append(ev, trace.Event{Kind: trace.StreamSync, Stream: 1}, trace.Event{Kind: trace.EmptyCache},
		trace.Event{Kind: trace.Alloc, ID: 100, Size: 1 << 20})
	return ev
}

func TestRunOnDriver(t *testing.T) {
	for _, c := range []struct {
		name      string
		capacity  uint64
		scale     float64
		wantScale float64
	}{
		{"fits", 4 << 30, 0, 1},
		{"scaled to half of free memory", 512 << 20, 0, 0.5},
		{"explicit scale", 4 << 30, 0.25, 0.25},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := emulated.New(emulated.WithCapacity(c.capacity))
			require.NoError(t, err)
			defer e.Close()
			r, err := replay.RunOnDriver(e, deviceTrace(), replay.DeviceOptions{Scale: c.scale})
			require.NoError(t, err)
			assert.InDelta(t, c.wantScale, r.Scale, 1e-9)
			assert.Equal(t, int64(9), r.Allocs)
			assert.Equal(t, int64(8), r.Frees)
			assert.Zero(t, r.OOMs)
			assert.Equal(t, uint64(8*float64(64<<20)*c.wantScale), r.PeakLive)
			assert.GreaterOrEqual(t, r.PeakReserved, r.PeakLive)
			assert.LessOrEqual(t, r.PeakReserved, c.capacity)
			assert.Equal(t, "emulated", r.Backend)
			assert.Contains(t, r.String(), "peak reserved")
			live := e.Live()
			assert.Zero(t, live.Handles+live.Mappings+live.Reservations, "the replay left memory behind")
		})
	}
	e, err := emulated.New()
	require.NoError(t, err)
	defer e.Close()
	_, err = replay.RunOnDriver(e, nil, replay.DeviceOptions{Fit: 2})
	require.Error(t, err)
}

// TestRunOnDriverPools: a trace's private pools get pools of their own on
// the driver too, and the replay leaves nothing behind.
func TestRunOnDriverPools(t *testing.T) {
	e, err := emulated.New(emulated.WithCapacity(4 << 30))
	require.NoError(t, err)
	defer e.Close()
	graph := trace.PoolID{1, 0}
	ev := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 64 << 20},
		{Kind: trace.Alloc, ID: 2, Size: 32 << 20, Pool: graph},
		{Kind: trace.Alloc, ID: 3, Size: 16 << 20, Pool: graph},
		{Kind: trace.Free, ID: 2},
		{Kind: trace.EmptyCache},
		{Kind: trace.Free, ID: 1},
	}
	r, err := replay.RunOnDriver(e, ev, replay.DeviceOptions{Scale: 1})
	require.NoError(t, err)
	require.Len(t, r.Pools, 2)
	def, g := r.Pools[0], r.Pools[1]
	assert.Equal(t, "default", def.Pool)
	assert.Equal(t, "pool(1,0)", g.Pool)
	assert.Equal(t, [2]uint64{64 << 20, 48 << 20}, [2]uint64{def.PeakLive, g.PeakLive})
	assert.Equal(t, [2]int64{1, 2}, [2]int64{def.Allocs, g.Allocs})
	assert.GreaterOrEqual(t, g.EndReserved, uint64(48<<20), "empty_cache left the graph pool's memory mapped")
	assert.Equal(t, uint64(16<<20), g.EndLive)
	live := e.Live()
	assert.Zero(t, live.Handles+live.Mappings+live.Reservations, "the replay left memory behind")
}
