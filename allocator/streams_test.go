package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// noDeviceSync hides the emulator's optional capabilities (DeviceSynchronizer
// among them): a driver that cannot synchronize a whole device.
type noDeviceSync struct{ backend.Driver }

// newAllocNoDevSync makes an allocator over an emulator seen through
// noDeviceSync.
func newAllocNoDevSync(t *testing.T, opts ...emulated.Option) (*Allocator, *emulated.Emulator) {
	t.Helper()
	e := newEmu(t, opts...)
	a, err := New(noDeviceSync{e}, DefaultConfig())
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close(); _ = e.Close() })
	return a, e
}

func reserved(a *Allocator) int64 { return a.Stats().ReservedBytes[stats.AllPools].Current }

// TestReleaseStreamReturnsMemory: ReleaseStream waits for the stream,
// unmaps its free handles, forgets its state, and the stream once
// destroyed is an invalid stream.
func TestReleaseStreamReturnsMemory(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(3<<20, s)
	require.NoError(t, err)
	q, err := a.Malloc(40<<20, s)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, p, 3<<20))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	require.Positive(t, reserved(a))
	require.Len(t, a.streams, 2)

	require.NoError(t, a.ReleaseStream(s))
	n, err := e.Pending(s)
	require.NoError(t, err)
	assert.Zero(t, n, "ReleaseStream waited for the stream")
	assert.Zero(t, reserved(a), "free memory of the stream unmapped")
	assert.Len(t, a.streams, 1, "only the default stream is known")
	mustCheck(t, a, e)
	require.NoError(t, e.StreamDestroy(s))
	_, err = a.Malloc(1, s)
	assert.ErrorIs(t, err, ErrInvalidStream)
	assert.ErrorIs(t, a.ReleaseStream(s), ErrInvalidStream)
	assert.ErrorIs(t, a.Synchronize(s), ErrInvalidStream)
	mustCheck(t, a, e)
}

// TestReleaseStreamWithLiveBlocks: blocks still allocated on a released
// stream stay valid, are freed as usual, and their memory is returned when
// they are; work recorded on the released stream is waited for first.
func TestReleaseStreamWithLiveBlocks(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	mine, err := a.Malloc(1<<20, s)
	require.NoError(t, err)
	rest, err := a.Malloc(4096, s) // shares the handle of mine
	require.NoError(t, err)
	shared, err := a.Malloc(8192, 0) // default stream, used on s too
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, shared, 8192))
	require.NoError(t, a.RecordStream(shared, s))
	require.NoError(t, a.Free(shared))
	require.Equal(t, 1, a.pending, "waits for s")

	require.NoError(t, a.ReleaseStream(s))
	assert.Zero(t, a.pending, "the event recorded on s completed")
	mustCheck(t, a, e)
	before := reserved(a)
	require.NoError(t, a.Free(rest))
	assert.Equal(t, before, reserved(a), "the handle is still shared with mine")
	require.NoError(t, a.Free(mine))
	assert.Less(t, reserved(a), before, "its last block freed, the handle is unmapped")
	mustCheck(t, a, e)
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, reserved(a))
	mustCheck(t, a, e)
}

// TestReleaseStreamFailureChangesNothing: if waiting for the stream fails,
// ReleaseStream returns the error and the stream is still in use.
func TestReleaseStreamFailureChangesNothing(t *testing.T) {
	a, e := newAlloc(t, "")
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(4096, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	before, snap := a.Stats(), a.Snapshot()
	require.NoError(t, e.FailNth(backend.OpStreamSync, 1, backend.ErrUnavailable))
	assert.ErrorIs(t, a.ReleaseStream(s), backend.ErrUnavailable)
	before.NumStreamSyncs++
	assert.Equal(t, before, a.Stats())
	assert.Equal(t, snap, a.Snapshot())
	q, err := a.Malloc(4096, s)
	require.NoError(t, err)
	assert.Equal(t, p, q, "still served from the stream's cache")
	require.NoError(t, a.Free(q))
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, e.StreamDestroy(s))
	mustCheck(t, a, e)
}

// TestManyShortLivedStreamsBounded: streams used once and released leave
// no per-stream state behind.
func TestManyShortLivedStreamsBounded(t *testing.T) {
	a, e := newAlloc(t, "")
	for i := range 2000 {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		p, err := a.Malloc(uint64(4096*(i%7+1)), s)
		require.NoError(t, err)
		if i%3 == 0 {
			require.NoError(t, a.RecordStream(p, a.DefaultStream()))
		}
		require.NoError(t, a.Free(p))
		require.NoError(t, a.ReleaseStream(s))
		require.NoError(t, e.StreamDestroy(s))
	}
	assert.Len(t, a.streams, 1)
	assert.Empty(t, a.vanished)
	assert.Empty(t, a.busy)
	mustCheck(t, a, e)
}

// TestDestroyedStreamEmptyCache: a stream destroyed without ReleaseStream
// no longer fails EmptyCache for every stream; its memory is released after
// a device synchronize.
func TestDestroyedStreamEmptyCache(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	live, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8<<20, s)
	require.NoError(t, err)
	q, err := a.Malloc(8<<20, live)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, p, 8<<20))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	require.NoError(t, e.StreamDestroy(s)) // its work is still pending
	syncs := e.Calls(backend.OpDeviceSync)

	require.NoError(t, a.EmptyCache())
	assert.Zero(t, reserved(a), "both streams' memory released")
	assert.Equal(t, syncs+1, e.Calls(backend.OpDeviceSync), "waited with a device synchronize")
	assert.Zero(t, a.Stats().StrandedBytes)
	mustCheck(t, a, e) // no unmap-in-use violation
	_, err = a.Malloc(1, s)
	assert.ErrorIs(t, err, ErrInvalidStream)
	require.NoError(t, a.Synchronize(live))
	require.NoError(t, e.StreamDestroy(live))
}

// TestDestroyedStreamOOMLadderRetries: a Malloc on a live stream that needs
// the memory cached by a destroyed stream goes down the ladder, releases
// it, and retries (rather than failing with the driver's "unknown
// stream").
func TestDestroyedStreamOOMLadderRetries(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(1*gib))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(700<<20, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, e.StreamDestroy(s))
	q, err := a.Malloc(700<<20, 0)
	require.NoError(t, err, "the destroyed stream's cache was released and the allocation retried")
	assert.Equal(t, int64(1), a.Stats().NumAllocRetries)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(q))
}

// TestOOMLadderRetriesAfterPartialRelease: a release error on one stream
// does not stop the ladder from retrying with what the others freed.
// Taking idle streams' memory before growth (reclaim.go) would serve the
// request without the ladder, so it is off here.
func TestOOMLadderRetriesAfterPartialRelease(t *testing.T) {
	a, e := newAlloc(t, "defrag_threshold:off", emulated.WithCapacity(1*gib))
	s1, err := e.StreamCreate(0)
	require.NoError(t, err)
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	p1, err := a.Malloc(100<<20, s1)
	require.NoError(t, err)
	p2, err := a.Malloc(700<<20, s2)
	require.NoError(t, err)
	require.NoError(t, a.Free(p1))
	require.NoError(t, a.Free(p2))
	// The first stream synchronisation of the ladder (s1's, streams go in
	// order) fails; s2's succeeds and frees enough.
	require.NoError(t, e.FailNth(backend.OpStreamSync, 1, backend.ErrUnavailable))
	q, err := a.Malloc(700<<20, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), a.Stats().NumAllocRetries, "served by the ladder's retry")
	mustCheck(t, a, e)
	require.NoError(t, a.Free(q))
	for _, s := range []backend.Stream{s1, s2} {
		require.NoError(t, a.ReleaseStream(s))
		require.NoError(t, e.StreamDestroy(s))
	}
}

// TestRecordedOnDestroyedStreamIsFreeable: a block recorded on a stream
// that is later destroyed can be freed (recording its event cannot
// fail Free). Free does not wait for the device (a synchronize there
// would wait for every stream's work): the block is stranded, counted and not
// reused until EmptyCache's device synchronize frees it.
func TestRecordedOnDestroyedStreamIsFreeable(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, e.Launch(s, p, 8192))
	require.NoError(t, e.StreamDestroy(s))
	syncs := e.Calls(backend.OpDeviceSync)
	require.NoError(t, a.Free(p))
	assert.Equal(t, syncs, e.Calls(backend.OpDeviceSync), "Free made no device-wide wait")
	assert.Equal(t, 1, a.pending, "stranded: pending until the device is idle")
	assert.Equal(t, int64(8192), a.Stats().StrandedBytes)
	n, err := e.Pending(s)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the destroyed stream's work is still pending")
	q, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "stranded memory is not reused")
	mustCheck(t, a, e)
	require.NoError(t, a.Free(q))

	require.NoError(t, a.EmptyCache())
	assert.Equal(t, syncs+1, e.Calls(backend.OpDeviceSync), "one device synchronize")
	assert.Zero(t, a.pending)
	assert.Zero(t, a.Stats().StrandedBytes)
	_, err = e.Pending(s)
	assert.Error(t, err, "the destroyed stream's work completed")
	r, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	assert.Contains(t, []uintptr{p, q}, r, "reused")
	assert.Empty(t, e.Violations())
	mustCheck(t, a, e)
	require.NoError(t, a.Free(r))
}

// TestDestroyedStreamWithoutDeviceSync: where the driver cannot
// synchronize the device, memory of a destroyed stream is never reused
// early: it is stranded and counted (stats, OutOfMemoryError, Check) until
// Close, and EmptyCache, Synchronize and Close still work for the rest.
func TestDestroyedStreamWithoutDeviceSync(t *testing.T) {
	a, e := newAllocNoDevSync(t, emulated.WithManualCompletion(), emulated.WithCapacity(1*gib))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(100<<20, s)
	require.NoError(t, err)
	shared, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(shared, s))
	require.NoError(t, e.Launch(s, p, 100<<20))
	require.NoError(t, e.Launch(s, shared, 8192))
	require.NoError(t, a.Free(p))
	require.NoError(t, e.StreamDestroy(s))

	require.NoError(t, a.Free(shared), "freeable though its stream is gone")
	assert.Equal(t, 1, a.pending, "stranded: pending until the device is idle")
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Check())
	st := a.Stats()
	assert.Equal(t, int64(100<<20+8192), st.StrandedBytes)
	assert.Equal(t, int64(100<<20+2<<20), st.ReservedBytes[stats.AllPools].Current, "stranded memory stays mapped")
	q, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	assert.NotEqual(t, shared, q, "stranded memory is not reused")
	var oom *OutOfMemoryError
	_, err = a.Malloc(1*gib-10<<20, 0)
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, uint64(100<<20+8192), oom.Stranded)
	assert.Contains(t, oom.Error(), "stranded")
	require.NoError(t, a.Synchronize(0))
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Check())
	require.NoError(t, e.CompleteAll()) // the device finished: Close may unmap
	require.NoError(t, a.Close())
	assert.Empty(t, e.Violations())
	live := e.Live()
	assert.Zero(t, live.Mappings+live.Handles+live.Reservations)
}

// TestSynchronizeDestroyedStream: Synchronize of a stream destroyed behind
// the allocator's back is ErrInvalidStream, and its memory is released.
func TestSynchronizeDestroyedStream(t *testing.T) {
	a, e := newAlloc(t, "")
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(4<<20, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, e.StreamDestroy(s))
	assert.ErrorIs(t, a.Synchronize(s), ErrInvalidStream)
	assert.Zero(t, reserved(a))
	mustCheck(t, a, e)
	assert.ErrorIs(t, a.Synchronize(s), ErrInvalidStream)
	require.NoError(t, a.Synchronize(0))
}

// TestCloseWithDestroyedStreams: Close does not fail because streams were
// destroyed, with work pending on them or not.
func TestCloseWithDestroyedStreams(t *testing.T) {
	for _, devSync := range []bool{true, false} {
		e := newEmu(t, emulated.WithManualCompletion())
		var drv backend.Driver = e
		if !devSync {
			drv = noDeviceSync{e}
		}
		a, err := New(drv, DefaultConfig())
		require.NoError(t, err)
		var ptrs []uintptr
		for range 3 {
			s, err := e.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(1<<20, s)
			require.NoError(t, err)
			require.NoError(t, e.Launch(s, p, 1<<20))
			ptrs = append(ptrs, p)
			require.NoError(t, e.StreamDestroy(s))
		}
		require.NoError(t, a.Free(ptrs[0]))
		if !devSync {
			require.NoError(t, e.CompleteAll())
		}
		require.NoError(t, a.Close(), "devSync %v", devSync)
		assertNoDriverState(t, e)
		require.NoError(t, e.Close())
	}
}

// TestProcessEventsVisitsBusyStreamsOnly: after many streams were used and
// destroyed without ReleaseStream, polling events visits only the streams
// that have events queued, not every stream ever used.
func TestProcessEventsVisitsBusyStreamsOnly(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	for range 500 {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		p, err := a.Malloc(4096, s)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, e.StreamDestroy(s))
	}
	busy, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, e.Launch(busy, p, 4096))
	require.NoError(t, a.RecordStream(p, busy))
	require.NoError(t, a.Free(p))
	require.Len(t, a.busy, 1)
	queries := e.Calls(backend.OpEventQuery)
	for range 10 {
		q, err := a.Malloc(4096, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(q))
	}
	assert.Equal(t, queries+10, e.Calls(backend.OpEventQuery), "one query per Malloc: the busy stream's oldest event")
	require.NoError(t, e.Complete(busy))
	q, err := a.Malloc(4096, 0)
	require.NoError(t, err)
	assert.Empty(t, a.busy)
	require.NoError(t, a.Free(q))
	mustCheck(t, a, e)
	require.NoError(t, a.ReleaseStream(busy))
	require.NoError(t, e.StreamDestroy(busy))
}

// TestReleaseStreamClassic: releasing a stream in classic mode frees its
// whole free segments (the segment's blocks are found while the stream is
// still known) and keeps its split ones for the blocks still live.
func TestReleaseStreamClassic(t *testing.T) {
	a, e := newAlloc(t, "expandable_segments:False", emulated.WithCapacity(1*gib))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	whole, err := a.Malloc(30<<20, s) // a segment of its own
	require.NoError(t, err)
	small1, err := a.Malloc(4096, s)
	require.NoError(t, err)
	small2, err := a.Malloc(4096, s) // same 2 MiB segment
	require.NoError(t, err)
	require.NoError(t, a.Free(whole))
	require.NoError(t, a.Free(small1))
	require.NoError(t, a.ReleaseStream(s))
	assert.Equal(t, int64(2<<20), reserved(a), "the free segment is gone, the split one kept")
	mustCheck(t, a, e)
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, a.Free(small2))
	assert.Zero(t, reserved(a), "its last block freed, the segment is released")
	mustCheck(t, a, e)
}

// TestReleasedStreamKeptAlive: a stream released but not destroyed, still
// named by a block's RecordStream, is learnt again when that block is
// freed, and used again it is a new stream.
func TestReleasedStreamKeptAlive(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, e.Launch(s, p, 8192))
	require.NoError(t, a.Free(p))
	assert.Equal(t, 1, a.pending, "waits for the event recorded on s")
	mustCheck(t, a, e)
	q, err := a.Malloc(4096, s)
	require.NoError(t, err)
	require.NoError(t, e.Complete(s))
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Synchronize(0))
	assert.Zero(t, a.pending)
	mustCheck(t, a, e)
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, e.StreamDestroy(s))
	mustCheck(t, a, e)
}

// TestManyDestroyedStreamsOneDeviceSync: the memory of many streams
// destroyed behind the allocator's back is released with one device
// synchronize, not one per stream.
func TestManyDestroyedStreamsOneDeviceSync(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	for range 50 {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		p, err := a.Malloc(2<<20, s)
		require.NoError(t, err)
		require.NoError(t, e.Launch(s, p, 2<<20))
		require.NoError(t, a.Free(p))
		require.NoError(t, e.StreamDestroy(s))
	}
	require.NoError(t, a.EmptyCache())
	assert.Equal(t, int64(1), e.Calls(backend.OpDeviceSync))
	assert.Zero(t, reserved(a))
	assert.Len(t, a.streams, 1)
	assert.Empty(t, a.vanished)
	mustCheck(t, a, e)
}

// TestEmptyCacheStreamDestroyedWithPools: a stream destroyed without
// ReleaseStream that holds free memory in two pools. EmptyCache finds it
// gone waiting for its first pool's state and releases the other without
// reporting the wait's failure again (FuzzAllocator seed e0216fb71715fb86).
func TestEmptyCacheStreamDestroyedWithPools(t *testing.T) {
	a, e := newAlloc(t, "")
	p, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	x, err := a.Malloc(mib, s)
	require.NoError(t, err)
	y, err := p.Malloc(mib, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(x))
	require.NoError(t, a.Free(y))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryReserved())
	mustCheck(t, a, e)
}
