package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// mapCalls is the MapMem calls the emulator has counted.
func mapCalls(e *emulated.Emulator) int64 { return e.CallCounts()[backend.OpMap] }

// TestAdoptIdleStream: memory another stream freed, whose work has
// completed, is handed over where it is mapped, without a driver map; with
// that stream's work pending, or with defrag_threshold off, it is not.
func TestAdoptIdleStream(t *testing.T) {
	tests := []struct {
		name    string
		conf    string
		pending bool // work on the first stream still uses the block
		adopted bool
	}{
		{"idle stream", "", false, true},
		{"work pending", "", true, false},
		{"defrag off", "defrag_threshold:off", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, tc.conf)
			s1, err := e.StreamCreate(0)
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(40*mib, s1)
			require.NoError(t, err)
			if tc.pending {
				require.NoError(t, e.Hold(s1))
				require.NoError(t, e.Launch(s1, p, 40*mib))
			}
			require.NoError(t, a.Free(p))
			reserved, maps := a.MemoryReserved(), mapCalls(e)
			q, err := a.Malloc(40*mib, s2)
			require.NoError(t, err)
			mustCheck(t, a, e)
			if tc.adopted {
				assert.Equal(t, p, q, "s2 gets s1's idle memory where it is")
				assert.Equal(t, reserved, a.MemoryReserved())
				assert.Equal(t, maps, mapCalls(e), "no map call")
			} else {
				assert.NotEqual(t, p, q)
				assert.Equal(t, reserved+40*mib, a.MemoryReserved())
				assert.Greater(t, mapCalls(e), maps)
			}
			if tc.pending {
				require.NoError(t, e.Resume(s1))
			}
			require.NoError(t, a.Free(q))
			mustCheck(t, a, e)
			assert.Empty(t, e.Violations())
		})
	}
}

// TestReclaimIdleStream: when no single free block of another stream is
// large enough, the free handles of idle streams are unmapped and remapped
// where the heap grows, so reserved memory stays near allocated memory.
func TestReclaimIdleStream(t *testing.T) {
	tests := []struct {
		name     string
		conf     string
		hold     bool
		reserved uint64 // after s2's 40 MiB request
	}{
		// s1 keeps 20 MiB allocated between two free 20 MiB holes; s2's
		// 40 MiB fits neither. Limit after growth: 1.01 × 60 MiB + one
		// 20 MiB page, so one hole is taken back: 60 − 20 + 40.
		{"idle", "", false, 80 * mib},
		{"work pending", "", true, 100 * mib},
		{"defrag off", "defrag_threshold:off", false, 100 * mib},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newAlloc(t, tc.conf)
			s1, err := e.StreamCreate(0)
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			var ps [3]uintptr
			for i := range ps {
				ps[i], err = a.Malloc(20*mib, s1)
				require.NoError(t, err)
			}
			if tc.hold {
				require.NoError(t, e.Hold(s1))
				require.NoError(t, e.Launch(s1, ps[0], 60*mib))
			}
			require.NoError(t, a.Free(ps[0]))
			require.NoError(t, a.Free(ps[2]))
			require.Equal(t, uint64(60*mib), a.MemoryReserved())
			q, err := a.Malloc(40*mib, s2)
			require.NoError(t, err)
			assert.Equal(t, tc.reserved, a.MemoryReserved())
			mustCheck(t, a, e)
			if tc.hold {
				require.NoError(t, e.Resume(s1))
			}
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Free(ps[1]))
			mustCheck(t, a, e)
			assert.Empty(t, e.Violations(), "nothing unmapped under pending work")
		})
	}
}

// TestReclaimNeverUnderPendingWork drives several streams, some of whose
// work is held, with allocations, cross-stream uses (RecordStream), frees
// and partial completions, and checks after every step that memory is
// never handed to another stream while work queued before its free (on its
// stream or a stream recorded on it) is pending, that the emulator records no violation (nothing unmapped or
// freed under pending work) and that the allocator's invariants hold.
func TestReclaimNeverUnderPendingWork(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		a, e := newAlloc(t, "")
		rng := rand.New(rand.NewPCG(seed, 9))
		streams := make([]backend.Stream, 4)
		for i := range streams {
			s, err := e.StreamCreate(0)
			require.NoError(t, err)
			streams[i] = s
			if i%2 == 1 {
				require.NoError(t, e.Hold(s)) // work completes only when the test says
			}
		}
		launched := map[backend.Stream]int{} // work items launched per stream
		launch := func(s backend.Stream, p uintptr, size uint64) {
			require.NoError(t, e.Launch(s, p, size))
			launched[s]++
		}
		// done reports whether the first n work items launched on s have
		// completed (the emulator completes a stream's work in order).
		done := func(s backend.Stream, n int) bool {
			pending, err := e.Pending(s)
			require.NoError(t, err)
			return launched[s]-pending >= n
		}
		type use struct {
			s backend.Stream
			n int // work items launched on s when the block was freed
		}
		type alloc struct {
			p    uintptr
			size uint64
			s    backend.Stream
			uses []backend.Stream
		}
		type freed struct {
			p, end uintptr
			s      backend.Stream
			uses   []use
		}
		var live []alloc
		var gone []freed // freed blocks, until reused by another stream
		for step := 0; step < 600; step++ {
			switch op := rng.IntN(10); {
			case op < 5: // allocate on a stream and launch work on it
				s := streams[rng.IntN(len(streams))]
				size := uint64(1+rng.IntN(48)) * mib
				if rng.IntN(4) == 0 {
					size = uint64(512 + rng.IntN(1<<20))
				}
				p, err := a.Malloc(size, s)
				require.NoError(t, err)
				kept := gone[:0]
				for _, f := range gone {
					if p < f.end && f.p < p+uintptr(size) { // reused: checked, then forgotten
						if f.s != s {
							for _, u := range f.uses {
								require.True(t, done(u.s, u.n), "seed %d step %d: memory freed on stream %d handed to stream %d while work on stream %d queued before the free is pending", seed, step, f.s, s, u.s)
							}
						}
						continue
					}
					kept = append(kept, f)
				}
				gone = kept
				launch(s, p, size)
				x := alloc{p: p, size: size, s: s, uses: []backend.Stream{s}}
				if rng.IntN(3) == 0 { // used on another stream too
					u := streams[rng.IntN(len(streams))]
					require.NoError(t, a.RecordStream(p, u))
					launch(u, p, size)
					x.uses = append(x.uses, u)
				}
				live = append(live, x)
			case op < 8 && len(live) > 0: // free
				i := rng.IntN(len(live))
				x := live[i]
				live = append(live[:i], live[i+1:]...)
				require.NoError(t, a.Free(x.p))
				f := freed{p: x.p, end: x.p + uintptr(x.size), s: x.s}
				for _, u := range x.uses {
					f.uses = append(f.uses, use{u, launched[u]})
				}
				gone = append(gone, f)
			default: // some held work completes
				s := streams[1+2*rng.IntN(len(streams)/2)]
				n, err := e.Pending(s)
				require.NoError(t, err)
				if n > 0 {
					require.NoError(t, e.CompleteN(s, 1+rng.IntN(n)))
				}
			}
			require.Empty(t, e.Violations(), "seed %d step %d", seed, step)
		}
		mustCheck(t, a, e)
		require.NoError(t, e.CompleteAll())
		for _, x := range live {
			require.NoError(t, a.Free(x.p))
		}
		require.NoError(t, a.EmptyCache())
		mustCheck(t, a, e)
		assert.Empty(t, e.Violations())
		assert.Zero(t, a.MemoryReserved())
	}
}

// TestAdoptRunAcrossStreams: adjacent free blocks of two idle streams (which
// never coalesce, being of different streams) together serve a third
// stream's request where they are mapped.
func TestAdoptRunAcrossStreams(t *testing.T) {
	a, e := newAlloc(t, "")
	var s [3]backend.Stream
	for i := range s {
		var err error
		s[i], err = e.StreamCreate(0)
		require.NoError(t, err)
	}
	p1, err := a.Malloc(20*mib, s[0])
	require.NoError(t, err)
	p2, err := a.Malloc(20*mib, s[1])
	require.NoError(t, err)
	require.Equal(t, p1+20*mib, p2, "the heap grows upwards")
	require.NoError(t, a.Free(p1))
	require.NoError(t, a.Free(p2))
	reserved, maps := a.MemoryReserved(), mapCalls(e)
	q, err := a.Malloc(40*mib, s[2])
	require.NoError(t, err)
	assert.Equal(t, p1, q)
	assert.Equal(t, reserved, a.MemoryReserved())
	assert.Equal(t, maps, mapCalls(e), "no map call")
	mustCheck(t, a, e)
	require.NoError(t, a.Free(q))
	mustCheck(t, a, e)
	assert.Empty(t, e.Violations())
}

// TestAdoptExactNearLimit: adopting whole handles may take up to a page
// more than asked; near the memory limit, where that rest would be
// stranded, only runs that fit within a granule are adopted and growth
// cuts handles to size instead. p is mapped in pages while the device has
// room (62 MiB of 128 MiB, below the pressure line of half); r, mapped
// under pressure in granule handles, takes reserved memory past 3/4.
func TestAdoptExactNearLimit(t *testing.T) {
	tests := []struct {
		name     string
		capacity uint64
		adopted  bool
	}{
		{"plenty of memory", 8 << 30, true},
		{"above 3/4 of the device", 128 * mib, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Page handles: growth cuts 20 MiB handles.
			a, e := newAlloc(t, "expandable_handle_mb:0", emulated.WithCapacity(tc.capacity))
			s1, err := e.StreamCreate(0)
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(62*mib, s1) // handles of 20, 20, 20 and 2 MiB
			require.NoError(t, err)
			r, err := a.Malloc(36*mib, s1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			maps := mapCalls(e)
			q, err := a.Malloc(30*mib, s2) // the top 2+20+20 MiB would leave 12 MiB stranded
			require.NoError(t, err)
			if tc.adopted {
				assert.Equal(t, p+20*mib, q, "the fewest whole handles from the run's high end")
				assert.Equal(t, maps, mapCalls(e))
				assert.Equal(t, uint64(98*mib), a.MemoryReserved())
			} else {
				assert.Greater(t, mapCalls(e), maps, "handles cut to size")
				// Reclaim unmaps s1's top 20+2 MiB of p, enough to stay
				// within 1.01 × the 98 MiB high water mark plus a page;
				// the growth maps exactly 30 MiB: 98 − 22 + 30.
				assert.Equal(t, uint64(106*mib), a.MemoryReserved())
			}
			mustCheck(t, a, e)
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Free(r))
			mustCheck(t, a, e)
			assert.Empty(t, e.Violations())
		})
	}
}

// TestAdoptProbeFails: when the probes of the other stream fail (event
// record or query), none of its memory is taken and the request is served
// by growth.
func TestAdoptProbeFails(t *testing.T) {
	for _, op := range []backend.Op{backend.OpEventRecord, backend.OpEventQuery} {
		t.Run(op.String(), func(t *testing.T) {
			a, e := newAlloc(t, "")
			s1, err := e.StreamCreate(0)
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(40*mib, s1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			// Both probes fail: the adoption's and the reclaim's.
			require.NoError(t, e.FailNth(op, 1, backend.ErrUnavailable))
			require.NoError(t, e.FailNth(op, 2, backend.ErrUnavailable))
			q, err := a.Malloc(40*mib, s2)
			require.NoError(t, err)
			assert.Equal(t, int64(2), e.Failures(op))
			assert.NotEqual(t, p, q, "not adopted without a successful probe")
			assert.Equal(t, uint64(80*mib), a.MemoryReserved())
			mustCheck(t, a, e)
			require.NoError(t, a.Free(q))
			mustCheck(t, a, e)
		})
	}
}

// TestReclaimForgetsDestroyedStreams: a growth that meets the free memory
// of streams destroyed behind the allocator's back probes each of them
// once and marks it vanished; later growths make no driver call for them,
// so the work of a growth does not keep growing with the streams ever
// used.
func TestReclaimForgetsDestroyedStreams(t *testing.T) {
	a, e := newAlloc(t, "")
	const n = 50
	for range n {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		p, err := a.Malloc(4096, s)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, e.StreamDestroy(s))
	}
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(1<<20, s) // grows: meets the destroyed streams' blocks
	require.NoError(t, err)
	assert.Len(t, a.vanished, n, "every destroyed stream probed once and marked vanished")
	records := e.Calls(backend.OpEventRecord)
	var ps []uintptr
	for range 4 { // 1 MiB each: growths again
		q, err := a.Malloc(1<<20, s)
		require.NoError(t, err)
		ps = append(ps, q)
	}
	assert.Equal(t, records, e.Calls(backend.OpEventRecord), "no stream probed again")
	mustCheck(t, a, e)
	for _, q := range append(ps, p) {
		require.NoError(t, a.Free(q))
	}
	require.NoError(t, a.ReleaseStream(s))
	require.NoError(t, e.StreamDestroy(s))
}
