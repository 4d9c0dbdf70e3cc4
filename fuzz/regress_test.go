package fuzz

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// newPlain makes an allocator over a fresh accounting emulator.
func newPlain(t *testing.T, conf string, opts ...emulated.Option) (*allocator.Allocator, *emulated.Emulator) {
	t.Helper()
	e, err := emulated.New(opts...)
	require.NoError(t, err)
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(t, err)
	a, err := allocator.New(e, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a, e
}

// TestRegression_ClassicSegmentSmallerThanRequest: in classic mode a
// request between large_segment_size_mb and 10 MiB got a segment of
// large_segment_size_mb bytes, smaller than the request, and Malloc
// panicked in arena.Split (found by FuzzRealMemory's seed corpus).
func TestRegression_ClassicSegmentSmallerThanRequest(t *testing.T) {
	for _, large := range []string{"2", "4", "8"} {
		t.Run(large, func(t *testing.T) {
			a, e := newPlain(t, "expandable_segments:False,large_segment_size_mb:"+large, emulated.WithCapacity(1*gib))
			p, err := a.Malloc(9*mib, 0)
			require.NoError(t, err)
			require.NoError(t, a.Check())
			snap := a.Snapshot()
			require.Len(t, snap.Segments, 1)
			require.GreaterOrEqual(t, snap.Segments[0].TotalSize, uint64(9*mib))
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Close())
			require.Zero(t, e.Live().Mappings)
		})
	}
}

// TestRegression_EmptyCacheRetriesFailedRelease: when ReleaseAddress of an
// emptied expandable segment fails, EmptyCache swallowed the error and no
// later EmptyCache released the segment: its reservation stayed until
// Close (found by FuzzAllocator).
func TestRegression_EmptyCacheRetriesFailedRelease(t *testing.T) {
	a, e := newPlain(t, "", emulated.WithCapacity(512*mib))
	p, err := a.Malloc(49, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, e.FailNth(backend.OpRelease, 1, backend.ErrOutOfMemory))
	err = a.EmptyCache()
	e.ClearFaults()
	if err != nil {
		require.ErrorIs(t, err, backend.ErrOutOfMemory)
	}
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Check())
	require.Zero(t, e.Live().Reservations, "EmptyCache left an empty segment reserved")
	res, _, _ := a.Footprint()
	require.Empty(t, res)
}

// TestRegression_MapRollbackUnmapFailure: growth maps a page, SetAccess
// fails, and the rollback's Unmap fails too, so the segment keeps the page
// mapped; the allocator still listed the page as unmapped, Check failed and
// the next Malloc returned segment.ErrAlreadyMapped, an error wrapping no
// allocator or backend sentinel (found by FuzzAllocator).
func TestRegression_MapRollbackUnmapFailure(t *testing.T) {
	for _, op := range []backend.Op{backend.OpSetAccess, backend.OpMap} {
		t.Run(op.String(), func(t *testing.T) {
			// 2 MiB pages: 3 MiB maps two pages.
			a, e := newPlain(t, "large_segment_size_mb:2,handle_cache_mb:64", emulated.WithCapacity(512*mib))
			n := 1
			if op == backend.OpMap {
				n = 2 // the second page's map fails; rolling back the first fails
			}
			require.NoError(t, e.FailNth(backend.OpUnmap, 1, backend.ErrUnavailable))
			require.NoError(t, e.FailNth(op, n, backend.ErrUnavailable))
			q, err := a.Malloc(3*mib, 0)
			require.Error(t, err, "the injected fault did not fire")
			require.Zero(t, q)
			require.True(t, typed(err), "untyped error: %v", err)
			require.NoError(t, a.Check())
			e.ClearFaults()
			p, err := a.Malloc(3*mib, 0)
			require.NoError(t, err)
			require.NoError(t, a.Check())
			require.NoError(t, a.Free(p))
			require.NoError(t, a.EmptyCache())
			require.NoError(t, a.Check())
			require.Zero(t, e.Live().Mappings)
		})
	}
}

// TestRegression_ClassicReleaseFailureKeepsFreeBlock: releasing a free
// classic segment (segment.Destroy) unmaps it and then fails in
// ReleaseAddress, or fails to free its handle (Destroy then still
// releases the segment but returns the error); either way the allocator
// kept the segment and its free block in the free list although the
// memory was no longer mapped (Check: "free block lies in unmapped page
// 0"), so a later Malloc could hand out unmapped memory (found by
// TestFaultSweep).
func TestRegression_ClassicReleaseFailureKeepsFreeBlock(t *testing.T) {
	for _, op := range []backend.Op{backend.OpRelease, backend.OpFree} {
		t.Run(op.String(), func(t *testing.T) {
			a, e := newPlain(t, "expandable_segments:False", emulated.WithCapacity(512*mib), emulated.WithManualCompletion())
			p, err := a.Malloc(30*mib, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.NoError(t, e.FailNth(op, 1, backend.ErrUnavailable))
			err = a.EmptyCache()
			e.ClearFaults()
			if err != nil {
				require.ErrorIs(t, err, backend.ErrUnavailable)
			}
			require.NoError(t, a.Check())
			q, err := a.Malloc(30*mib, 0)
			require.NoError(t, err)
			require.NoError(t, e.Launch(a.DefaultStream(), q, 30*mib))
			require.Empty(t, e.Violations(), "Malloc handed out unmapped memory")
			require.NoError(t, a.Free(q))
			require.NoError(t, a.EmptyCache())
			require.NoError(t, a.Check())
			require.Zero(t, e.Live().Reservations)
			require.NoError(t, a.Close())
		})
	}
}

// TestRegression_LeftoverHandleInFootprint: when FreePhysical of an
// odd-size handle fails after its unmap, the segment keeps the handle in
// its leftover list; Footprint did not count it (the emulator held one
// handle more than the allocator reported) and EmptyCache never retried
// freeing it while the segment stayed in use (found by TestFaultSweep).
func TestRegression_LeftoverHandleInFootprint(t *testing.T) {
	a, e := newPlain(t, "handle_cache_mb:0", emulated.WithCapacity(512*mib))
	keep, err := a.Malloc(30*mib, 0) // [0, 30 MiB): a full and an odd handle
	require.NoError(t, err)
	p, err := a.Malloc(3*mib, 0) // an odd handle after it
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, e.FailNth(backend.OpFree, 1, backend.ErrUnavailable))
	err = a.EmptyCache()
	require.Equal(t, int64(1), e.Failures(backend.OpFree), "the fault fired")
	e.ClearFaults()
	if err != nil {
		require.ErrorIs(t, err, backend.ErrUnavailable)
	}
	require.NoError(t, a.Check())
	_, maps, cached := a.Footprint()
	require.Equal(t, e.Live().Handles, len(maps)+cached, "Footprint omits a handle the allocator holds")
	require.NoError(t, a.EmptyCache())
	require.Equal(t, len(maps), e.Live().Handles, "EmptyCache did not retry freeing the leftover handle")
	require.NoError(t, a.Free(keep))
	require.NoError(t, a.Close())
	require.Zero(t, e.Live().Handles)
}

// TestRegression_ZombieMemoryInReserved: a classic segment whose creation
// failed (SetAccess) and whose rollback failed too (Unmap) is kept as a
// zombie that still maps device memory; reserved_bytes (memory_reserved)
// did not count it, so the statistics, the out-of-memory report and the
// per_process_memory_fraction cap all ignored device memory the allocator
// holds until the next EmptyCache (found by FuzzAllocatorConfig).
func TestRegression_ZombieMemoryInReserved(t *testing.T) {
	a, e := newPlain(t, "expandable_segments:False", emulated.WithCapacity(512*mib))
	require.NoError(t, e.FailNth(backend.OpSetAccess, 1, backend.ErrUnavailable))
	require.NoError(t, e.FailNth(backend.OpUnmap, 1, backend.ErrUnavailable))
	_, err := a.Malloc(1*mib+1, 0)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	e.ClearFaults()
	require.NoError(t, a.Check())
	_, maps, _ := a.Footprint()
	var held uint64
	for _, m := range maps {
		held += m.Size
	}
	require.Equal(t, uint64(20*mib), e.Live().MappedBytes, "the failed creation still maps its memory")
	require.Equal(t, e.Live().MappedBytes, held, "Footprint lists it")
	require.Equal(t, held, a.MemoryReserved(), "reserved_bytes counts it")
	require.NoError(t, a.EmptyCache())
	require.Zero(t, e.Live().MappedBytes, "EmptyCache tears the zombie down")
}

// TestRegression_PointerSpace runs the pointer_space program: pointers
// drawn from the whole address space (a fuzzer that frees only pointers
// it was handed cannot find Free(0) corrupting the pointer table). Every rejected call is checked by rejectedOp; here the trace
// shows that each kind was drawn and rejected.
func TestRegression_PointerSpace(t *testing.T) {
	h := newHarness(t, harnessConfig{conf: "handle_cache_mb:64", capacity: 512 * mib, streams: 3, manual: true})
	h.maxOps, h.keepTrace = 1000, true
	h.run(seedProgs()["pointer_space"])
	h.finish()
	joined := strings.Join(h.trace, "\n")
	for _, what := range []string{"[null]", "[one]", "[top]", "[near a live block]", "[freed]",
		"[around a reservation or mapping]", "[deep in a reservation]", "[another allocator's]"} {
		assert.Contains(t, joined, what)
	}
	assert.Contains(t, joined, "pointer was not allocated by this allocator")
	assert.Contains(t, joined, "pointer is inside an allocation")
}

// TestRegression_StreamLifecycle runs the stream_lifecycle program:
// streams released and destroyed behind the allocator's back with blocks
// live and work pending on them.
func TestRegression_StreamLifecycle(t *testing.T) {
	for _, real := range []bool{false, true} {
		h := newHarness(t, harnessConfig{conf: "handle_cache_mb:64", capacity: 512 * mib, streams: 3, manual: true, real: real})
		h.keepTrace = true
		h.run(seedProgs()["stream_lifecycle"])
		joined := strings.Join(h.trace, "\n")
		assert.Contains(t, joined, "ReleaseStream(")
		assert.Contains(t, joined, "without ReleaseStream")
		assert.Positive(t, h.e.Calls(backend.OpDeviceSync), "a destroyed stream was waited for with a device synchronize")
		h.finish()
	}
}
