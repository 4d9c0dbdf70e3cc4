package fuzz

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// spy wraps the emulator and counts, per stream, the synchronisations and
// event records one allocator makes.
type spy struct {
	*emulated.Emulator
	mu      sync.Mutex
	syncs   map[backend.Stream]int // StreamSynchronize per stream
	records map[backend.Stream]int // EventRecord per stream
}

func newSpy(e *emulated.Emulator) *spy {
	return &spy{Emulator: e, syncs: map[backend.Stream]int{}, records: map[backend.Stream]int{}}
}

// StreamSynchronize counts the call and forwards it.
func (s *spy) StreamSynchronize(st backend.Stream) error {
	s.mu.Lock()
	s.syncs[st]++
	s.mu.Unlock()
	return s.Emulator.StreamSynchronize(st)
}

// EventRecord counts the call and forwards it.
func (s *spy) EventRecord(ev backend.Event, st backend.Stream) error {
	s.mu.Lock()
	s.records[st]++
	s.mu.Unlock()
	return s.Emulator.EventRecord(ev, st)
}

var streamModes = []struct{ name, conf string }{
	{"expandable", "large_segment_size_mb:2,handle_cache_mb:16"},
	{"expandable_big_pages", ""},
	{"classic", "expandable_segments:False"},
}

// newHeld makes an allocator over an emulator whose streams are all held,
// and two more streams on device 0.
func newHeld(t *testing.T, conf string, capacity uint64) (*allocator.Allocator, *emulated.Emulator, backend.Stream, backend.Stream) {
	t.Helper()
	a, e := newPlain(t, conf, emulated.WithCapacity(capacity), emulated.WithManualCompletion())
	s1, err := e.StreamCreate(0)
	require.NoError(t, err)
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	return a, e, s1, s2
}

func pending(t *testing.T, e *emulated.Emulator, s backend.Stream) int {
	t.Helper()
	n, err := e.Pending(s)
	require.NoError(t, err)
	return n
}

// TestFreedBlockWaitsForOtherStream: a block used by another stream
// (RecordStream) and freed is not handed out again, to any stream, until
// that stream's work completes — neither by Malloc, nor after Synchronize
// of the allocation stream — and it is reused once the work completes.
func TestFreedBlockWaitsForOtherStream(t *testing.T) {
	for _, m := range streamModes {
		t.Run(m.name, func(t *testing.T) {
			a, e, s1, s2 := newHeld(t, m.conf, 1*gib)
			s0 := a.DefaultStream()
			const n = 3 * mib
			p, err := a.Malloc(n, s0)
			require.NoError(t, err)
			require.NoError(t, e.Launch(s0, p, n))
			require.NoError(t, a.RecordStream(p, s1))
			require.NoError(t, e.Launch(s1, p, n)) // s1's kernel reads p
			require.NoError(t, a.Free(p))
			require.NoError(t, e.Complete(s0)) // the allocation stream is idle now

			overlaps := func(q uintptr, size uint64) bool { return q < p+n && p < q+uintptr(size) }
			var got []uintptr
			for i, size := range []uint64{n, n, 512, 1 * mib, n, 2 * n, 20 * mib} {
				s := []backend.Stream{s0, s2}[i%2]
				q, err := a.Malloc(size, s)
				require.NoError(t, err)
				require.False(t, overlaps(q, size), "block handed to stream %d while stream %d still uses it", s, s1)
				got = append(got, q)
			}
			require.NoError(t, a.Synchronize(s0))
			q, err := a.Malloc(n, s0)
			require.NoError(t, err)
			require.False(t, overlaps(q, n), "Synchronize of the allocation stream released the block early")
			got = append(got, q)
			require.Equal(t, 1, pending(t, e, s1), "the allocator waited for stream %d", s1)
			require.Equal(t, int64(len(got)+1), a.Stats().Active[0].Current, "the freed block stays active")
			require.NoError(t, a.Check())

			require.NoError(t, e.Complete(s1))
			for _, q := range got {
				require.NoError(t, a.Free(q))
			}
			q, err = a.Malloc(n, s0) // processes the completed event
			require.NoError(t, err)
			require.Equal(t, int64(1), a.Stats().Active[0].Current,
				"the block is free once stream %d's work completed", s1)
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Check())
			require.Empty(t, e.Violations())
		})
	}
}

// TestEmptyCacheNeverUnmapsBusyMemory: blocks freed while work on their
// own stream or on a recorded stream still touches them are unmapped by
// EmptyCache only after that work is complete.
func TestEmptyCacheNeverUnmapsBusyMemory(t *testing.T) {
	for _, m := range streamModes {
		t.Run(m.name, func(t *testing.T) {
			a, e, s1, s2 := newHeld(t, m.conf, 1*gib)
			s0 := a.DefaultStream()
			for i, size := range []uint64{4 * kib, 700 * kib, 3 * mib, 25 * mib, 64 * mib} {
				for j, s := range []backend.Stream{s0, s1} {
					p, err := a.Malloc(size, s)
					require.NoError(t, err)
					require.NoError(t, e.Launch(s, p, size))
					if (i+j)%2 == 0 {
						require.NoError(t, a.RecordStream(p, s2))
						require.NoError(t, e.Launch(s2, p, size))
					}
					require.NoError(t, a.Free(p))
				}
			}
			require.NotZero(t, pending(t, e, s0)+pending(t, e, s1)+pending(t, e, s2))
			require.NoError(t, a.EmptyCache())
			require.Empty(t, e.Violations(), "EmptyCache unmapped memory a busy stream touches")
			require.Zero(t, a.MemoryReserved())
			require.Zero(t, e.Live().Mappings)
			require.NoError(t, a.Check())
		})
	}
}

// TestOutOfMemoryPathNeverUnmapsBusyMemory: when a request on one stream
// needs memory another stream has cached (freed, its work still pending),
// the out-of-memory ladder waits for that work before unmapping.
func TestOutOfMemoryPathNeverUnmapsBusyMemory(t *testing.T) {
	for _, m := range streamModes {
		t.Run(m.name, func(t *testing.T) {
			a, e, s1, s2 := newHeld(t, m.conf, 512*mib)
			s0 := a.DefaultStream()
			var ptrs []uintptr
			for i := 0; i < 7; i++ {
				p, err := a.Malloc(64*mib, s0)
				require.NoError(t, err)
				require.NoError(t, e.Launch(s0, p, 64*mib))
				if i%3 == 0 {
					require.NoError(t, a.RecordStream(p, s2))
					require.NoError(t, e.Launch(s2, p, 64*mib))
				}
				ptrs = append(ptrs, p)
			}
			for _, p := range ptrs {
				require.NoError(t, a.Free(p))
			}
			require.NotZero(t, pending(t, e, s0))
			q, err := a.Malloc(400*mib, s1)
			require.NoError(t, err, "the ladder must release the other stream's cache")
			require.Empty(t, e.Violations(), "the out-of-memory ladder unmapped memory a busy stream touches")
			require.Zero(t, pending(t, e, s0), "stream %d was synchronised before its pages were unmapped", s0)
			require.Positive(t, a.Stats().NumAllocRetries)
			require.NoError(t, e.Launch(s1, q, 400*mib))
			require.Empty(t, e.Violations())
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Check())
		})
	}
}

// TestDevicesNeverSynchroniseEachOther: two allocators on a two-device
// emulator, each with busy streams; whatever one does (growth, the
// out-of-memory ladder, EmptyCache, Synchronize, RecordStream frees), it
// never synchronises, records on or completes the other device's streams,
// and it rejects them as ErrInvalidStream.
func TestDevicesNeverSynchroniseEachOther(t *testing.T) {
	e, err := emulated.New(emulated.WithDevices(2), emulated.WithCapacity(512*mib), emulated.WithManualCompletion())
	require.NoError(t, err)
	var (
		spies  [2]*spy
		allocs [2]*allocator.Allocator
		extra  [2]backend.Stream
	)
	for d := 0; d < 2; d++ {
		spies[d] = newSpy(e)
		cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
		require.NoError(t, err)
		cfg.Device = d
		allocs[d], err = allocator.New(spies[d], cfg)
		require.NoError(t, err)
		extra[d], err = e.StreamCreate(d)
		require.NoError(t, err)
	}
	defer func() {
		for _, a := range allocs {
			_ = a.Close()
		}
	}()
	streamsOf := func(d int) []backend.Stream { return []backend.Stream{allocs[d].DefaultStream(), extra[d]} }

	// Device 1 has work pending on both its streams, touching its memory.
	var keep []uintptr
	for _, s := range streamsOf(1) {
		p, err := allocs[1].Malloc(8*mib, s)
		require.NoError(t, err)
		require.NoError(t, e.Launch(s, p, 8*mib))
		keep = append(keep, p)
	}
	pend1 := []int{pending(t, e, streamsOf(1)[0]), pending(t, e, streamsOf(1)[1])}

	// Device 0 does everything that synchronises.
	a := allocs[0]
	s0, s1 := streamsOf(0)[0], streamsOf(0)[1]
	var ptrs []uintptr
	for i := 0; i < 6; i++ {
		p, err := a.Malloc(64*mib, s0)
		require.NoError(t, err)
		require.NoError(t, e.Launch(s0, p, 64*mib))
		require.NoError(t, a.RecordStream(p, s1))
		require.NoError(t, e.Launch(s1, p, 64*mib))
		ptrs = append(ptrs, p)
	}
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.Synchronize(s0))
	big, err := a.Malloc(480*mib, s1) // the out-of-memory ladder
	require.NoError(t, err)
	require.NoError(t, a.Free(big))
	require.NoError(t, a.EmptyCache())
	_, err = a.Malloc(1, streamsOf(1)[1])
	require.ErrorIs(t, err, allocator.ErrInvalidStream)
	q, err := a.Malloc(1, s0)
	require.NoError(t, err)
	require.ErrorIs(t, a.RecordStream(q, streamsOf(1)[0]), allocator.ErrInvalidStream)
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Check())

	for _, s := range streamsOf(1) {
		assert.Zero(t, spies[0].syncs[s], "device 0's allocator synchronised device 1's stream %d", s)
		assert.Zero(t, spies[0].records[s], "device 0's allocator recorded an event on device 1's stream %d", s)
	}
	assert.Positive(t, spies[0].syncs[s0]+spies[0].syncs[s1], "device 0 did synchronise its own streams")
	assert.Equal(t, pend1, []int{pending(t, e, streamsOf(1)[0]), pending(t, e, streamsOf(1)[1])},
		"device 1's work completed while only device 0 was used")
	assert.Empty(t, e.Violations())

	// And the other way round.
	require.NoError(t, e.CompleteAll())
	for _, p := range keep {
		require.NoError(t, allocs[1].Free(p))
	}
	require.NoError(t, allocs[1].EmptyCache())
	require.NoError(t, allocs[1].Synchronize(0))
	for _, s := range streamsOf(0) {
		assert.Zero(t, spies[1].syncs[s], "device 1's allocator synchronised device 0's stream %d", s)
		assert.Zero(t, spies[1].records[s])
	}
	require.NoError(t, allocs[1].Check())
}
