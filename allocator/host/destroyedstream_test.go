package host_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// streamSubject is one allocator seen through the calls both allocators
// have that take or remember a stream: the device allocator or the host
// allocator, over its own emulator.
type streamSubject struct {
	e          *emulated.Emulator
	invalid    error // the allocator's ErrInvalidStream
	malloc     func() (uintptr, error)
	free       func(uintptr) error
	record     func(uintptr, backend.Stream) error
	emptyCache func() error
	check      func() error
	stats      func() any   // a comparable copy of the statistics
	heldBack   func() int64 // nbytes withheld for destroyed streams: StrandedBytes, QuarantinedBytes
	waiting    func() int64 // blocks freed but not reusable yet: active minus allocated
}

const subjectBlock = 8 << 10 // a block size both allocators serve exactly

func deviceSubject(t *testing.T) streamSubject {
	e, err := emulated.New(emulated.WithManualCompletion())
	require.NoError(t, err)
	a, err := allocator.New(e, allocator.DefaultConfig())
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.CompleteAll())
		require.NoError(t, a.Close())
		assert.Empty(t, e.Violations())
		require.NoError(t, e.Close())
	})
	return streamSubject{
		e:          e,
		invalid:    allocator.ErrInvalidStream,
		malloc:     func() (uintptr, error) { return a.Malloc(subjectBlock, 0) },
		free:       a.Free,
		record:     a.RecordStream,
		emptyCache: a.EmptyCache,
		check:      a.Check,
		stats:      func() any { return a.Stats() },
		heldBack:   func() int64 { return a.Stats().StrandedBytes },
		waiting: func() int64 {
			st := a.Stats()
			return st.Active[stats.AllPools].Current - st.Allocation[stats.AllPools].Current
		},
	}
}

func hostSubject(t *testing.T) streamSubject {
	e, err := emulated.New(emulated.WithManualCompletion())
	require.NoError(t, err)
	// The size-class policy: the emulator's stream work reads MallocHost
	// memory only.
	cfg, err := host.ParseConfig("expandable_segments:False,pinned_budget_mb:0")
	require.NoError(t, err)
	a, err := host.New(e, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.CompleteAll())
		require.NoError(t, a.Close())
		assert.Empty(t, e.Violations())
		assert.Zero(t, e.Live().HostAllocs)
		require.NoError(t, e.Close())
	})
	return streamSubject{
		e:          e,
		invalid:    host.ErrInvalidStream,
		malloc:     func() (uintptr, error) { return a.Malloc(subjectBlock) },
		free:       a.Free,
		record:     a.RecordStream,
		emptyCache: a.EmptyCache,
		check:      a.Check,
		stats:      func() any { return a.Stats() },
		heldBack:   func() int64 { return a.Stats().QuarantinedBytes.Current },
		waiting: func() int64 {
			st := a.Stats()
			return st.Active.Current - st.Allocation.Current
		},
	}
}

// TestDestroyedStreamsBothAllocators runs the same cases against the device
// and the host allocator: every call that takes a stream, or
// frees a block a stream was recorded on, with the stream destroyed before
// the allocator first sees it, after it has seen it, between RecordStream
// and Free, and between two RecordStreams. Both answer alike:
//   - RecordStream of a destroyed stream fails with the allocator's
//     ErrInvalidStream and a *backend.StreamError (StreamUnknown), whether
//     or not the allocator had seen the stream, and changes no statistic;
//   - Free of a block recorded on a stream destroyed since succeeds
//     without waiting for anything (no device synchronize; the other
//     stream's work and the destroyed stream's stay pending), and the block
//     is withheld, counted (StrandedBytes, QuarantinedBytes) and not reused
//     until EmptyCache's single device synchronize ends it;
//   - a block never recorded on the destroyed stream is not withheld.
func TestDestroyedStreamsBothAllocators(t *testing.T) {
	type env struct {
		sub          streamSubject
		p            uintptr        // the block under test
		dead, other  backend.Stream // dead is destroyed by the case; other stays live, with work pending
		wantWithheld bool           // p is recorded on dead, so its Free withholds it
		eventsOnDead int64          // other blocks freed with an event on dead, pending while its work is
		deadWork     int            // work items launched on dead
	}
	refuse := func(t *testing.T, v *env, p uintptr) {
		t.Helper()
		before := v.sub.stats()
		err := v.sub.record(p, v.dead)
		require.ErrorIs(t, err, v.sub.invalid)
		var se *backend.StreamError
		require.True(t, errors.As(err, &se), "%v", err)
		assert.Equal(t, backend.StreamUnknown, se.Reason)
		assert.Equal(t, v.dead, se.Stream)
		assert.Contains(t, err.Error(), "does not exist")
		assert.Equal(t, before, v.sub.stats(), "a refused RecordStream changes nothing")
		require.NoError(t, v.sub.check())
	}
	destroy := func(t *testing.T, v *env) {
		t.Helper()
		require.NoError(t, v.sub.e.Launch(v.dead, v.p, subjectBlock)) // work the device still runs after the destroy
		v.deadWork++
		require.NoError(t, v.sub.e.StreamDestroy(v.dead))
	}
	cases := []struct {
		name string
		run  func(t *testing.T, v *env)
	}{
		{"RecordStream/destroyed before first use", func(t *testing.T, v *env) {
			destroy(t, v)
			refuse(t, v, v.p)
		}},
		{"RecordStream/destroyed after seen", func(t *testing.T, v *env) {
			seen, err := v.sub.malloc()
			require.NoError(t, err)
			require.NoError(t, v.sub.record(seen, v.dead))
			require.NoError(t, v.sub.e.Launch(v.dead, seen, subjectBlock))
			v.deadWork++
			require.NoError(t, v.sub.free(seen)) // an event on dead: its state is kept
			v.eventsOnDead = 1
			destroy(t, v)
			refuse(t, v, v.p)
			refuse(t, v, v.p) // and again, once found gone
		}},
		{"RecordStream/destroyed between two RecordStreams", func(t *testing.T, v *env) {
			require.NoError(t, v.sub.record(v.p, v.dead))
			destroy(t, v)
			refuse(t, v, v.p)
			require.NoError(t, v.sub.record(v.p, v.other), "a live stream is still recorded")
			v.wantWithheld = true
		}},
		{"Free/destroyed between RecordStream and Free", func(t *testing.T, v *env) {
			require.NoError(t, v.sub.record(v.p, v.dead))
			destroy(t, v)
			v.wantWithheld = true
		}},
		{"Free/destroyed between two RecordStreams", func(t *testing.T, v *env) {
			require.NoError(t, v.sub.record(v.p, v.dead))
			destroy(t, v)
			require.NoError(t, v.sub.record(v.p, v.other))
			v.wantWithheld = true
		}},
	}
	for _, tc := range cases {
		for _, sub := range []struct {
			name string
			make func(*testing.T) streamSubject
		}{{"device", deviceSubject}, {"host", hostSubject}} {
			t.Run(tc.name+"/"+sub.name, func(t *testing.T) {
				v := &env{sub: sub.make(t)}
				e := v.sub.e
				var err error
				v.dead, err = e.StreamCreate(0)
				require.NoError(t, err)
				v.other, err = e.StreamCreate(0)
				require.NoError(t, err)
				v.p, err = v.sub.malloc()
				require.NoError(t, err)
				require.NoError(t, e.Launch(v.other, v.p, subjectBlock))
				tc.run(t, v)

				calls := e.CallCounts()
				otherPending, err := e.Pending(v.other)
				require.NoError(t, err)
				require.NoError(t, v.sub.free(v.p), "Free of a block recorded on a destroyed stream succeeds")
				after := e.CallCounts()
				assert.Equal(t, calls[backend.OpDeviceSync], after[backend.OpDeviceSync], "Free waited for the device")
				assert.Equal(t, calls[backend.OpEventSync], after[backend.OpEventSync], "Free waited for an event")
				n, err := e.Pending(v.other)
				require.NoError(t, err)
				assert.Equal(t, otherPending, n, "Free waited for the live stream")
				n, err = e.Pending(v.dead)
				require.NoError(t, err, "the destroyed stream's work is still pending")
				assert.Equal(t, v.deadWork, n)
				require.NoError(t, v.sub.check())

				q, err := v.sub.malloc()
				require.NoError(t, err)
				if !v.wantWithheld {
					assert.Zero(t, v.sub.heldBack())
					assert.Equal(t, v.eventsOnDead, v.sub.waiting(), "p was not withheld")
					require.NoError(t, v.sub.free(q))
					require.NoError(t, e.CompleteAll())
					require.NoError(t, v.sub.emptyCache())
					require.NoError(t, v.sub.check())
					return
				}
				assert.NotEqual(t, v.p, q, "a withheld block is not reused")
				assert.Equal(t, int64(subjectBlock), v.sub.heldBack(), "withheld and counted")
				assert.Equal(t, int64(1), v.sub.waiting())
				require.NoError(t, v.sub.free(q))
				require.NoError(t, v.sub.check())

				syncs := e.Calls(backend.OpDeviceSync)
				require.NoError(t, e.Complete(v.other))
				require.NoError(t, v.sub.emptyCache())
				assert.Equal(t, syncs+1, e.Calls(backend.OpDeviceSync), "EmptyCache ends it with one device synchronize")
				_, err = e.Pending(v.dead)
				assert.Error(t, err, "the destroyed stream's work completed, so the driver forgot it")
				assert.Zero(t, v.sub.heldBack())
				assert.Zero(t, v.sub.waiting())
				assert.Empty(t, e.Violations())
				require.NoError(t, v.sub.check())
			})
		}
	}
}
