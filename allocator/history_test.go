package allocator

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// actions lists the actions of entries, for compact comparisons.
func actions(es []stats.TraceEntry) []stats.TraceAction {
	out := make([]stats.TraceAction, len(es))
	for i, e := range es {
		out[i] = e.Action
	}
	return out
}

// firstFrame resolves the innermost frame of a recorded stack.
func firstFrame(t *testing.T, pcs []uintptr) runtime.Frame {
	t.Helper()
	require.NotEmpty(t, pcs)
	f, _ := runtime.CallersFrames(pcs).Next()
	return f
}

func TestRecordHistoryOptions(t *testing.T) {
	a, _ := newAlloc(t, "")
	for _, n := range []int{-1, stats.MaxHistoryEntries + 1} {
		err := a.RecordHistory(HistoryOptions{MaxEntries: n})
		require.ErrorIs(t, err, ErrInvalidHistory, "MaxEntries %d", n)
	}
	_, on := a.History()
	assert.False(t, on, "bad options must leave recording off")
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 4}))
	_, on = a.History()
	assert.True(t, on)
	require.NoError(t, a.RecordHistory(HistoryOptions{}))
	_, on = a.History()
	assert.False(t, on, "MaxEntries 0 stops recording")
	_, on = a.MemProfile()
	assert.False(t, on)
}

func TestHistoryEntriesExpandable(t *testing.T) {
	a, e := newAlloc(t, "expandable_segments:True")
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 100, Stacks: true}))
	p, err := a.Malloc(3<<20, 0)
	require.NoError(t, err)
	q, err := a.Malloc(1000, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	mustCheck(t, a, e)

	h, on := a.History()
	require.True(t, on)
	ds := a.DefaultStream()
	want := []stats.TraceAction{
		stats.TraceSegmentMap, stats.TraceAlloc, // large pool: 4 MiB mapped, 3 MiB handed out
		stats.TraceSegmentMap, stats.TraceAlloc, // small pool
		stats.TraceFreeRequested, stats.TraceFreeCompleted,
		stats.TraceEmptyCache, stats.TraceSegmentUnmap,
	}
	require.Equal(t, want, actions(h.Entries))
	assert.Equal(t, stats.TraceEntry{Action: stats.TraceAlloc, Addr: p, Size: 3 << 20, Stream: uint64(ds),
		TimeNs: h.Entries[1].TimeNs, Stack: h.Entries[1].Stack}, h.Entries[1])
	assert.Equal(t, uint64(4<<20), h.Entries[0].Size)
	assert.Equal(t, p, h.Entries[0].Addr)
	assert.Equal(t, q, h.Entries[3].Addr)
	assert.Equal(t, uint64(1000), h.Entries[3].Size, "alloc entries carry the requested size")
	assert.Equal(t, uint64(3<<20), h.Entries[5].Size, "free_completed carries the requested size")
	assert.Equal(t, uint64(4<<20), h.Entries[7].Size)
	assert.Equal(t, p, h.Entries[7].Addr)
	for i := 1; i < len(h.Entries); i++ {
		assert.GreaterOrEqual(t, h.Entries[i].TimeNs, h.Entries[i-1].TimeNs)
	}

	// Stacks name the test, not allocator frames.
	require.NotZero(t, h.Entries[1].Stack)
	f := firstFrame(t, h.Stacks[h.Entries[1].Stack-1])
	assert.Equal(t, "github.com/vmmalloc/vmmalloc/allocator.TestHistoryEntriesExpandable", f.Function)
	f = firstFrame(t, h.Stacks[h.Entries[4].Stack-1])
	assert.Equal(t, "github.com/vmmalloc/vmmalloc/allocator.TestHistoryEntriesExpandable", f.Function, "free_requested")
	assert.NotEqual(t, h.Entries[1].Stack, h.Entries[3].Stack, "two call sites, two stacks")
	assert.Zero(t, h.Entries[0].Stack, "segment entries have no stack")

	// The snapshot names the stack of the live block.
	var found bool
	for _, sg := range a.Snapshot().Segments {
		for _, b := range sg.Blocks {
			if b.Address == q {
				found = true
				assert.Equal(t, h.Entries[3].Stack, b.Stack)
			}
		}
	}
	assert.True(t, found)
}

func TestHistoryClassicAndOOM(t *testing.T) {
	a, _ := newAlloc(t, "expandable_segments:False", emulated.WithCapacity(64<<20))
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 100}))
	p, err := a.Malloc(30<<20, 0)
	require.NoError(t, err)
	_, err = a.Malloc(60<<20, 0)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())

	h, _ := a.History()
	want := []stats.TraceAction{
		stats.TraceSegmentAlloc, stats.TraceAlloc, stats.TraceOOM,
		stats.TraceFreeRequested, stats.TraceFreeCompleted, stats.TraceEmptyCache, stats.TraceSegmentFree,
	}
	require.Equal(t, want, actions(h.Entries))
	assert.Equal(t, uint64(30<<20), h.Entries[0].Size)
	assert.Equal(t, uint64(60<<20), h.Entries[2].Size, "oom: the bytes asked for")
	assert.Equal(t, uint64(34<<20), uint64(h.Entries[2].Addr), "oom: the device's free bytes in addr")
	assert.Equal(t, h.Entries[0].Addr, h.Entries[6].Addr)
	assert.Zero(t, h.Entries[1].Stack, "no stacks asked for")
	assert.Empty(t, h.Stacks)
}

func TestHistoryPendingFree(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	other, err := e.StreamCreate(0)
	require.NoError(t, err)
	defer func() { _ = e.StreamDestroy(other) }()
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 100}))
	p, err := a.Malloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, other))
	require.NoError(t, a.Free(p))
	h, _ := a.History()
	require.Equal(t, stats.TraceFreeRequested, h.Entries[len(h.Entries)-1].Action, "free waits for the other stream")

	require.NoError(t, e.CompleteAll())
	require.NoError(t, a.Synchronize(other))
	h, _ = a.History()
	last := h.Entries[len(h.Entries)-1]
	assert.Equal(t, stats.TraceFreeCompleted, last.Action)
	assert.Equal(t, p, last.Addr)
	assert.Equal(t, uint64(4096), last.Size)
}

func TestHistoryRingDrops(t *testing.T) {
	a, _ := newAlloc(t, "")
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 3}))
	for range 5 {
		p, err := a.Malloc(512, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
	}
	h, _ := a.History()
	require.Len(t, h.Entries, 3)
	// 1 segment_map + 5 × (alloc, free_requested, free_completed) = 16.
	assert.Equal(t, int64(13), h.Dropped)
	assert.Equal(t, []stats.TraceAction{stats.TraceAlloc, stats.TraceFreeRequested, stats.TraceFreeCompleted}, actions(h.Entries))
}

func TestMemProfileMatchesAllocated(t *testing.T) {
	a, e := newAlloc(t, "")
	before, err := a.Malloc(5<<20, 0) // allocated before recording
	require.NoError(t, err)
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 16, Stacks: true}))
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	defer func() { _ = e.StreamDestroy(s2) }()
	var live []uintptr
	for i := range 40 {
		s := s2
		if i%2 == 0 {
			s = 0
		}
		p, err := a.Malloc(uint64(1000+i*70000), s)
		require.NoError(t, err)
		live = append(live, p)
	}
	for _, p := range live[:15] {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.Free(before))

	recs, on := a.MemProfile()
	require.True(t, on)
	var inuse, inuseObjs, allocs int64
	sawBefore := false
	for _, r := range recs {
		inuse += r.InUseBytes()
		inuseObjs += r.InUseObjects()
		allocs += r.AllocObjects
		if r.Stack == nil {
			sawBefore = true
			assert.Equal(t, int64(1), r.AllocObjects)
			assert.Equal(t, int64(1), r.FreeObjects)
			continue
		}
		fn := firstFrame(t, r.Stack).Function
		assert.True(t, strings.HasSuffix(fn, "allocator.TestMemProfileMatchesAllocated"), fn)
	}
	assert.True(t, sawBefore, "the block allocated before recording is counted")
	assert.Equal(t, int64(a.MemoryAllocated()), inuse)
	assert.Equal(t, int64(25), inuseObjs)
	assert.Equal(t, int64(41), allocs)
}

// TestHistoryConcurrent reads the history, profile and snapshot while
// other goroutines allocate (run with -race).
func TestHistoryConcurrent(t *testing.T) {
	a, e := newAlloc(t, "")
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 256, Stacks: true}))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p, err := a.Malloc(uint64(512*(1+(i+g)%9)), 0)
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, a.Free(p))
			}
		}()
	}
	for range 20 {
		_, _ = a.History()
		_, _ = a.MemProfile()
		_ = a.MemorySnapshot()
	}
	wg.Wait()
	mustCheck(t, a, e)
	recs, _ := a.MemProfile()
	var allocs, frees int64
	for _, r := range recs {
		allocs += r.AllocObjects
		frees += r.FreeObjects
	}
	assert.Equal(t, int64(800), allocs)
	assert.Equal(t, int64(800), frees)
}

// TestHistoryMatchesState runs random operations, with driver faults and
// out-of-memory, and checks that the recorded history accounts for the
// state exactly: segment entries add up to reserved bytes, and the blocks
// allocated and not freed in the trace are the allocated blocks.
func TestHistoryMatchesState(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False", "release_threshold_mb:0"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf, emulated.WithCapacity(512<<20))
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			defer func() { _ = e.StreamDestroy(s2) }()
			for _, op := range []backend.Op{backend.OpMap, backend.OpCreate, backend.OpUnmap} {
				require.NoError(t, e.FailRandom(op, 0.05, uint64(op)+1, backend.ErrOutOfMemory))
			}
			require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 1 << 16}))
			rng := rand.New(rand.NewPCG(7, uint64(len(conf))))
			var live []uintptr
			for range 3000 {
				switch r := rng.IntN(100); {
				case r < 50:
					s := backend.Stream(0)
					if rng.IntN(2) == 0 {
						s = s2
					}
					p, err := a.Malloc(uint64(1+rng.IntN(48<<20)), s)
					if err == nil {
						live = append(live, p)
					}
				case r < 90 && len(live) > 0:
					i := rng.IntN(len(live))
					if rng.IntN(4) == 0 {
						_ = a.RecordStream(live[i], s2)
					}
					require.NoError(t, a.Free(live[i]))
					live = append(live[:i], live[i+1:]...)
				case r < 95:
					_ = a.Synchronize(s2)
				default:
					_ = a.EmptyCache()
				}
			}
			require.NoError(t, a.Check())
			h, _ := a.History()
			require.Zero(t, h.Dropped)
			var reserved int64
			allocated := map[uintptr]bool{}
			ooms := 0
			for _, en := range h.Entries {
				switch en.Action {
				case stats.TraceSegmentMap, stats.TraceSegmentAlloc:
					reserved += int64(en.Size)
				case stats.TraceSegmentUnmap, stats.TraceSegmentFree:
					reserved -= int64(en.Size)
				case stats.TraceAlloc:
					allocated[en.Addr] = true
				case stats.TraceFreeRequested:
					delete(allocated, en.Addr)
				case stats.TraceOOM:
					ooms++
				}
			}
			assert.Equal(t, int64(a.MemoryReserved()), reserved, "segment entries add up to reserved bytes")
			want := map[uintptr]bool{}
			for _, p := range live {
				want[p] = true
			}
			assert.Equal(t, want, allocated)
			assert.Equal(t, int(a.Stats().NumOOMs), ooms)
			assert.Positive(t, ooms, "the run reaches out-of-memory")
			assert.Positive(t, e.Failures(backend.OpMap)+e.Failures(backend.OpCreate), "faults were injected")
			for _, op := range []backend.Op{backend.OpMap, backend.OpCreate, backend.OpUnmap} {
				require.NoError(t, e.FailRandom(op, 0, 0, backend.ErrOutOfMemory)) // let Close clean up
			}
		})
	}
}

func TestHistoryOOMStack(t *testing.T) {
	a, _ := newAlloc(t, "", emulated.WithCapacity(64<<20))
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 16, Stacks: true}))
	_, err := a.Malloc(60<<20, 0)
	require.NoError(t, err)
	_, err = a.Malloc(60<<20, 0)
	require.ErrorIs(t, err, ErrOutOfMemory)
	h, _ := a.History()
	last := h.Entries[len(h.Entries)-1]
	require.Equal(t, stats.TraceOOM, last.Action)
	require.NotZero(t, last.Stack)
	assert.Equal(t, "github.com/vmmalloc/vmmalloc/allocator.TestHistoryOOMStack", firstFrame(t, h.Stacks[last.Stack-1]).Function)
	assert.Equal(t, uint64(a.DefaultStream()), last.Stream)
}
