package fuzz

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// stressBlock is one goroutine's live block.
type stressBlock struct {
	ptr  uintptr
	size uint64
}

// stressWorker is the model one goroutine keeps of its own blocks.
type stressWorker struct {
	dev          int
	rng          *rand.Rand
	live         []stressBlock
	mallocs      int64 // successful Mallocs
	requested    int64 // nbytes asked by them
	ooms         int64
	errs         []error // unexpected errors, reported by the main goroutine
	launches     int64
	recordFrees  int64
	cacheEmptied int64
}

// TestConcurrencyStress: 16 goroutines, 8 per device, run thousands of
// random operations each on two allocators (one per device of a 2-device
// emulator) across 4 streams per device, two of them held so that work
// stays pending. Between rounds, with every goroutine stopped, each
// allocator must pass Check, match the emulator, and count exactly the
// blocks and bytes the goroutines' models hold; at the end the
// accumulated counts must add up.
func TestConcurrencyStress(t *testing.T) {
	const (
		devices    = 2
		goroutines = 16
		perDevice  = 4 // streams
	)
	rounds, opsPerRound := 6, 1000
	if testing.Short() {
		rounds, opsPerRound = 3, 500
	}
	e, err := emulated.New(emulated.WithDevices(devices), emulated.WithCapacity(384*mib))
	require.NoError(t, err)
	var allocs [devices]*allocator.Allocator
	var streams [devices][]backend.Stream
	confs := [devices]string{"large_segment_size_mb:4,handle_cache_mb:32,release_threshold_mb:16", "expandable_segments:False,max_split_size_mb:32"}
	for d := 0; d < devices; d++ {
		cfg, err := allocator.ParseConfig(confs[d])
		require.NoError(t, err)
		cfg.Device = d
		allocs[d], err = allocator.New(e, cfg)
		require.NoError(t, err)
		streams[d] = append(streams[d], allocs[d].DefaultStream())
		for i := 1; i < perDevice; i++ {
			s, err := e.StreamCreate(d)
			require.NoError(t, err)
			streams[d] = append(streams[d], s)
		}
		for _, s := range streams[d][2:] {
			require.NoError(t, e.Hold(s))
		}
	}
	workers := make([]*stressWorker, goroutines)
	for g := range workers {
		workers[g] = &stressWorker{dev: g % devices, rng: rand.New(rand.NewPCG(uint64(g), 99))}
	}

	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Add(1)
			go func(w *stressWorker) {
				defer wg.Done()
				w.run(e, allocs[w.dev], streams[w.dev], opsPerRound, round == rounds-1)
			}(w)
		}
		wg.Wait()
		for g, w := range workers {
			require.Empty(t, w.errs, "goroutine %d", g)
		}
		// Quiescent point.
		var mapped uint64
		var nres, nmaps, cached int
		for d, a := range allocs {
			require.NoError(t, a.Check(), "device %d after round %d", d, round)
			var live, mallocs, requested, liveReq int64
			for _, w := range workers {
				if w.dev != d {
					continue
				}
				live += int64(len(w.live))
				mallocs += w.mallocs
				requested += w.requested
				for _, b := range w.live {
					liveReq += int64(b.size)
				}
			}
			st := a.Stats()
			all := stats.AllPools
			require.Equal(t, live, st.Allocation[all].Current, "device %d allocation.current", d)
			require.Equal(t, mallocs, st.Allocation[all].Allocated, "device %d allocation.allocated", d)
			require.Equal(t, requested, st.RequestedBytes[all].Allocated, "device %d requested_bytes.allocated", d)
			require.GreaterOrEqual(t, st.RequestedBytes[all].Current, liveReq, "device %d requested_bytes.current", d)
			for _, sa := range []*stats.StatArray{&st.Allocation, &st.AllocatedBytes, &st.RequestedBytes, &st.Active, &st.ReservedBytes, &st.Segment} {
				for k, s := range sa {
					require.Equal(t, s.Current, s.Allocated-s.Freed, "device %d stat %v: %+v", d, stats.PoolKind(k), s)
				}
			}
			mapped += uint64(st.ReservedBytes[all].Current)
			r, m, c := a.Footprint()
			nres, nmaps, cached = nres+len(r), nmaps+len(m), cached+c
		}
		live := e.Live()
		require.Equal(t, nres, live.Reservations)
		require.Equal(t, nmaps, live.Mappings)
		require.Equal(t, nmaps+cached, live.Handles)
		require.Equal(t, mapped, live.MappedBytes)
		require.Empty(t, e.Violations())
	}

	var total, ooms, launches, recordFrees int64
	for _, w := range workers {
		require.Empty(t, w.live, "the last round frees everything")
		total += w.mallocs
		ooms += w.ooms
		launches += w.launches
		recordFrees += w.recordFrees
	}
	t.Logf("%d mallocs (%d out of memory), %d launches, %d frees after RecordStream", total, ooms, launches, recordFrees)
	require.NoError(t, e.CompleteAll())
	for d, a := range allocs {
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.Check())
		st := a.Stats()
		all := stats.AllPools
		assert.Zero(t, st.Allocation[all].Current, "device %d", d)
		assert.Zero(t, st.Active[all].Current, "device %d", d)
		assert.Zero(t, st.AllocatedBytes[all].Current, "device %d", d)
		assert.Zero(t, st.RequestedBytes[all].Current, "device %d", d)
		assert.Zero(t, st.ReservedBytes[all].Current, "device %d", d)
		assert.Equal(t, st.Allocation[all].Allocated, st.Allocation[all].Freed, "device %d", d)
		assert.Equal(t, st.RequestedBytes[all].Allocated, st.RequestedBytes[all].Freed, "device %d", d)
		require.NoError(t, a.Close())
	}
	live := e.Live()
	assert.Zero(t, live.Handles)
	assert.Zero(t, live.Mappings)
	assert.Zero(t, live.Reservations)
	assert.Zero(t, live.Events)
	assert.Empty(t, e.Violations())
}

// run performs n random operations; if last, it then frees everything.
func (w *stressWorker) run(e *emulated.Emulator, a *allocator.Allocator, streams []backend.Stream, n int, last bool) {
	fail := func(format string, args ...any) { w.errs = append(w.errs, fmt.Errorf(format, args...)) }
	free := func(i int) {
		b := w.live[i]
		if err := a.Free(b.ptr); err != nil {
			fail("Free(%#x): %v", b.ptr, err)
		}
		w.live[i] = w.live[len(w.live)-1]
		w.live = w.live[:len(w.live)-1]
	}
	for i := 0; i < n && len(w.errs) == 0; i++ {
		s := streams[w.rng.IntN(len(streams))]
		switch r := w.rng.IntN(100); {
		case r < 50 && len(w.live) < 48:
			size := uint64(w.rng.IntN(64*kib) + 1)
			if w.rng.IntN(8) == 0 {
				size = uint64(w.rng.IntN(24*mib) + 1)
			}
			p, err := a.Malloc(size, s)
			if err != nil {
				if !errors.Is(err, allocator.ErrOutOfMemory) {
					fail("Malloc(%d): %v", size, err)
				}
				w.ooms++
				continue
			}
			w.live = append(w.live, stressBlock{p, size})
			w.mallocs++
			w.requested += int64(size)
			if w.rng.IntN(4) == 0 {
				if err := e.Launch(s, p, size); err != nil {
					fail("Launch: %v", err)
				}
				w.launches++
			}
		case r < 85 && len(w.live) > 0:
			free(w.rng.IntN(len(w.live)))
		case r < 93 && len(w.live) > 0:
			// Another stream uses the block, then it is freed.
			i := w.rng.IntN(len(w.live))
			b := w.live[i]
			if err := a.RecordStream(b.ptr, s); err != nil {
				fail("RecordStream: %v", err)
			}
			if err := e.Launch(s, b.ptr, b.size); err != nil {
				fail("Launch: %v", err)
			}
			w.launches++
			free(i)
			w.recordFrees++
		case r < 96:
			if err := a.Synchronize(s); err != nil {
				fail("Synchronize(%d): %v", s, err)
			}
		case r < 97:
			if err := a.EmptyCache(); err != nil {
				fail("EmptyCache: %v", err)
			}
			w.cacheEmptied++
		default:
			if err := e.Complete(s); err != nil {
				fail("Complete(%d): %v", s, err)
			}
		}
	}
	if last {
		for len(w.live) > 0 {
			free(len(w.live) - 1)
		}
	}
}
