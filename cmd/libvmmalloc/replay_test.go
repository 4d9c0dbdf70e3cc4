package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/pluggable"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// replayCapacity is the double's device memory in the replays: an 80 GiB
// device, so that the trace runs unscaled.
const replayCapacity = 80 << 30

// cEvent is one record of testdata/replay.c's input (struct event).
type cEvent struct {
	Kind   uint8
	_      [3]uint8
	Stream uint32
	ID     uint64
	Size   uint64
}

// replayResult is what a replay measured.
type replayResult struct {
	Events        int     `json:"events"`
	Calls         int64   `json:"calls"`
	Allocs        int64   `json:"allocs"`
	Frees         int64   `json:"frees"`
	ReplayNs      float64 `json:"replay_ns"`
	PeakLive      uint64  `json:"peak_live"`
	PeakReserved  int64   `json:"peak_reserved"`
	PeakAllocated int64   `json:"peak_allocated"`
	Loop          int64   `json:"loop"`
	LoopNs        float64 `json:"loop_ns"`
}

// denseEvents keeps the events a framework's allocator sees (alloc, free,
// record_stream, empty_cache) with allocation ids made dense.
func denseEvents(events []trace.Event) []cEvent {
	ids := map[uint64]uint64{}
	var out []cEvent
	for _, e := range events {
		switch e.Kind {
		case trace.Alloc, trace.Free, trace.RecordStream, trace.EmptyCache:
		default:
			continue
		}
		id, ok := ids[e.ID]
		if !ok {
			id = uint64(len(ids))
			ids[e.ID] = id
		}
		out = append(out, cEvent{Kind: uint8(e.Kind), Stream: uint32(e.Stream), ID: id, Size: e.Size})
	}
	return out
}

// callGo replays events through a Go allocation API, the way replay.c does
// through the C one, and measures it the same way.
type goAPI struct {
	alloc  func(size uint64, s backend.Stream) (uintptr, error)
	free   func(p uintptr) error
	record func(p uintptr, s backend.Stream) error
	empty  func() error
	stats  func() (reserved, allocated int64)
}

func replayGo(t *testing.T, api goAPI, events []cEvent, streams []backend.Stream, loop int64) replayResult {
	t.Helper()
	var ids uint64
	for _, e := range events {
		ids = max(ids, e.ID+1)
	}
	ptr := make([]uintptr, ids)
	size := make([]uint64, ids)
	r := replayResult{Events: len(events), Loop: loop}
	var live uint64
	start := time.Now()
	for _, e := range events {
		switch e.Kind {
		case uint8(trace.Alloc):
			if ptr[e.ID] != 0 || e.Size == 0 {
				continue
			}
			p, err := api.alloc(e.Size, streams[e.Stream])
			require.NoError(t, err)
			r.Calls++
			ptr[e.ID], size[e.ID] = p, e.Size
			live += e.Size
			r.PeakLive = max(r.PeakLive, live)
			r.Allocs++
		case uint8(trace.Free):
			if ptr[e.ID] == 0 {
				continue
			}
			require.NoError(t, api.free(ptr[e.ID]))
			r.Calls++
			ptr[e.ID] = 0
			live -= size[e.ID]
			r.Frees++
		case uint8(trace.RecordStream):
			if ptr[e.ID] != 0 {
				require.NoError(t, api.record(ptr[e.ID], streams[e.Stream]))
			}
			r.Calls++
		case uint8(trace.EmptyCache):
			require.NoError(t, api.empty())
			r.Calls++
		}
	}
	r.ReplayNs = float64(time.Since(start).Nanoseconds())
	r.PeakReserved, r.PeakAllocated = api.stats()
	for _, p := range ptr {
		if p != 0 {
			require.NoError(t, api.free(p))
		}
	}
	p, err := api.alloc(4096, streams[0])
	require.NoError(t, err)
	require.NoError(t, api.free(p))
	// The best of 5 rounds, as replay.c measures.
	for round := 0; round < 5; round++ {
		start = time.Now()
		for i := int64(0); i < loop/5; i++ {
			p, err := api.alloc(4096, streams[0])
			if err != nil {
				require.NoError(t, err)
			}
			if err := api.free(p); err != nil {
				require.NoError(t, err)
			}
		}
		ns := float64(time.Since(start).Nanoseconds()) * 5
		if round == 0 || ns < r.LoopNs {
			r.LoopNs = ns
		}
	}
	return r
}

func TestReplayThroughCABI(t *testing.T) {
	lib, cc := buildLibrary(t)
	dir, err := trace.SharedDir()
	if err != nil {
		t.Skip(err)
	}
	f, err := os.Open(filepath.Join(dir, "cs336_ctx128_fullstep.pickle"))
	if err != nil {
		t.Skipf("trace not available: %v", err)
	}
	tr, err := trace.ImportPyTorchSnapshot(f, 0)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	events := denseEvents(tr.Events)
	var nstreams uint32 = 1
	for _, e := range events {
		nstreams = max(nstreams, e.Stream+1)
	}
	loop := int64(200000)
	if testing.Short() || raceEnabled {
		loop = 20000
	}

	// Through the C ABI, in a C program.
	work := t.TempDir()
	var buf bytes.Buffer
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, events))
	evPath := filepath.Join(work, "events.bin")
	require.NoError(t, os.WriteFile(evPath, buf.Bytes(), 0o644))
	prog := compile(t, cc, work, "replay.c")
	dbl := double(t, cc, "cuda")
	cmd := exec.Command(prog, evPath, strconv.FormatUint(replayCapacity, 10), strconv.FormatInt(loop, 10))
	cmd.Env = env(lib, dbl, "cuda")
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "%s", stderr)
	var viaC replayResult
	require.NoError(t, json.Unmarshal(out, &viaC), "%s", out)

	// Through the Go API, in this process, over another copy of the double.
	path, err := cudatest.Build(t.TempDir())
	require.NoError(t, err)
	ctl, err := cudatest.Open(path)
	require.NoError(t, err)
	drv, err := cuda.Open(cuda.WithLibrary(path))
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	// After the first call: the double sets its defaults then.
	require.NoError(t, ctl.SetCapacity(-1, replayCapacity))
	streams := make([]backend.Stream, nstreams)
	for i := 1; i < int(nstreams); i++ {
		streams[i], err = drv.StreamCreate(0)
		require.NoError(t, err)
	}

	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	viaGo := replayGo(t, goAPI{
		alloc: a.Malloc, free: a.Free, record: a.RecordStream, empty: a.EmptyCache,
		stats: func() (int64, int64) {
			st := a.Stats()
			return st.ReservedBytes[0].Peak, st.AllocatedBytes[0].Peak
		},
	}, events, streams, loop)
	require.NoError(t, a.Close())

	// Through the Library the C entry points call, without cgo.
	pl := pluggable.New(pluggable.Options{Driver: drv})
	nopool := allocator.PoolID{}
	viaLib := replayGo(t, goAPI{
		alloc: func(n uint64, s backend.Stream) (uintptr, error) { return pl.Alloc(n, 0, uintptr(s), nopool) },
		free:  func(p uintptr) error { return pl.Free(p, 0) },
		record: func(p uintptr, s backend.Stream) error {
			return pl.RecordStream(p, uintptr(s))
		},
		empty: func() error { return pl.EmptyCache(0) },
		stats: func() (int64, int64) {
			st, err := pl.Stats(0)
			require.NoError(t, err)
			return st.ReservedBytes[0].Peak, st.AllocatedBytes[0].Peak
		},
	}, events, streams, loop)
	require.NoError(t, pl.Close())
	// The project's Go replay (benchmarks/replay) over the same driver.
	rep, err := replay.RunOnDriver(drv, tr.Events, replay.DeviceOptions{Scale: 1})
	require.NoError(t, err)
	for _, s := range streams[1:] {
		require.NoError(t, drv.StreamDestroy(s))
	}

	// The same allocator decisions whichever way it is called.
	assert.Equal(t, viaGo.Allocs, viaC.Allocs)
	assert.Equal(t, viaGo.Frees, viaC.Frees)
	assert.Equal(t, viaGo.PeakLive, viaC.PeakLive)
	assert.Equal(t, viaGo.PeakReserved, viaC.PeakReserved)
	assert.Equal(t, viaGo.PeakAllocated, viaC.PeakAllocated)
	assert.Equal(t, viaGo.PeakReserved, viaLib.PeakReserved)
	assert.Equal(t, uint64(viaC.PeakReserved), rep.PeakReserved)
	assert.Equal(t, viaC.PeakLive, rep.PeakLive)
	assert.Greater(t, viaC.PeakReserved, int64(viaC.PeakLive))

	per := func(r replayResult) (float64, float64) {
		return r.ReplayNs / float64(r.Calls), r.LoopNs / float64(2*r.Loop)
	}
	cReplay, cLoop := per(viaC)
	goReplay, goLoop := per(viaGo)
	libReplay, libLoop := per(viaLib)
	t.Logf("%s: %d events, %d calls (%d allocs, %d frees); peak live %d, peak reserved %d (%.3f× live), peak allocated %d — identical through C and Go (benchmarks/replay.RunOnDriver: peak reserved %d, peak live %d)",
		filepath.Base(f.Name()), viaC.Events, viaC.Calls, viaC.Allocs, viaC.Frees, viaC.PeakLive, viaC.PeakReserved,
		float64(viaC.PeakReserved)/float64(viaC.PeakLive), viaC.PeakAllocated, rep.PeakReserved, rep.PeakLive)
	t.Logf("replay ns/call: C ABI %.0f, Go pluggable.Library %.0f, Go allocator %.0f (C boundary: %+.0f ns/call)",
		cReplay, libReplay, goReplay, cReplay-libReplay)
	t.Logf("cache-hit alloc/free ns/call (%d pairs): C ABI %.0f, Go pluggable.Library %.0f, Go allocator %.0f (C boundary: %+.0f ns/call)",
		loop, cLoop, libLoop, goLoop, cLoop-libLoop)
	if raceEnabled {
		t.Logf("(the Go figures are under the race detector; the C library is built without it)")
	}
}
