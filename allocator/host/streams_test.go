package host

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// reusedIDs is the emulator with one stream id, public, that names
// whichever emulator stream the test points it at: a driver that hands a
// destroyed stream's id to a new stream, as CUDA and ACL do (their ids are
// pointers).
type reusedIDs struct {
	*emulated.Emulator
	mu  sync.Mutex
	now backend.Stream // the emulator stream public names, 0: none
}

const public = backend.Stream(1 << 40)

func (r *reusedIDs) real(s backend.Stream) backend.Stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s == public {
		return r.now
	}
	return s
}

func (r *reusedIDs) point(s backend.Stream) { r.mu.Lock(); r.now = s; r.mu.Unlock() }

func (r *reusedIDs) StreamDevice(s backend.Stream) (int, error) {
	return r.Emulator.StreamDevice(r.real(s))
}
func (r *reusedIDs) StreamSynchronize(s backend.Stream) error {
	return r.Emulator.StreamSynchronize(r.real(s))
}
func (r *reusedIDs) EventRecord(ev backend.Event, s backend.Stream) error {
	return r.Emulator.EventRecord(ev, r.real(s))
}

// TestStreamIDReused: a block recorded on a stream whose id the driver has
// since given to a new stream is quarantined, not ordered after the new
// stream's work, once the allocator knows the old stream is gone: because
// RecordStream found the id on another device, or refused it while no
// stream had it.
func TestStreamIDReused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		newDev int
		gap    bool // RecordStream of the id while it names no stream
	}{
		{"on another device", 1, false},
		{"on the same device, refused in between", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r *reusedIDs
			a, e := newHostOver(t, "", func(e *emulated.Emulator) backend.Driver {
				r = &reusedIDs{Emulator: e}
				return r
			}, emulated.WithManualCompletion(), emulated.WithDevices(2))
			old, err := e.StreamCreate(0)
			require.NoError(t, err)
			r.point(old)
			p, err := a.Malloc(8 * kib)
			require.NoError(t, err)
			require.NoError(t, e.Launch(old, p, 8*kib))
			require.NoError(t, a.RecordStream(p, public))
			require.NoError(t, e.StreamDestroy(old))
			q, err := a.Malloc(8 * kib)
			require.NoError(t, err)
			if tc.gap {
				r.point(0)
				require.ErrorIs(t, a.RecordStream(q, public), ErrInvalidStream)
			}
			fresh, err := e.StreamCreate(tc.newDev)
			require.NoError(t, err)
			r.point(fresh)
			require.NoError(t, a.RecordStream(q, public), "the id now names a live stream")

			records := e.Calls(backend.OpEventRecord)
			require.NoError(t, a.Free(p))
			assert.Equal(t, records, e.Calls(backend.OpEventRecord), "no event recorded on the new stream for p")
			assert.Equal(t, int64(1), a.Stats().Quarantined.Current)
			require.NoError(t, a.Free(q))
			assert.Equal(t, records+1, e.Calls(backend.OpEventRecord), "q's event is on the new stream")
			mustCheck(t, a, e)
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, a.Stats().Quarantined.Current)
			mustCheck(t, a, e)
			require.NoError(t, e.StreamDestroy(fresh))
		})
	}
}

// TestFreeFaultOnLiveStream: an injected failure of EventRecord on a live
// stream, even one of kind ErrInvalidArgument, does not make the stream
// look destroyed (the driver is asked): Free waits for that stream and
// caches the block; if that wait fails too, Free returns the error with
// nothing changed and no device-wide wait, and a retry succeeds.
func TestFreeFaultOnLiveStream(t *testing.T) {
	for _, tc := range []struct {
		name     string
		syncFail bool
	}{{"record fails", false}, {"record and wait fail", true}} {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newHost(t, "", emulated.WithManualCompletion())
			s, err := e.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(8 * kib)
			require.NoError(t, err)
			require.NoError(t, e.Launch(s, p, 8*kib))
			require.NoError(t, a.RecordStream(p, s))
			require.NoError(t, e.FailNth(backend.OpEventRecord, 1, backend.ErrInvalidArgument))
			if tc.syncFail {
				require.NoError(t, e.FailNth(backend.OpStreamSync, 1, backend.ErrInvalidArgument))
			}
			before := a.Stats()
			err = a.Free(p)
			assert.Zero(t, e.Calls(backend.OpDeviceSync))
			st := a.Stats()
			assert.Zero(t, st.Quarantined.Allocated, "a live stream is not quarantined")
			assert.Equal(t, int64(1), st.NumSyncFallback)
			if tc.syncFail {
				require.ErrorIs(t, err, backend.ErrInvalidArgument)
				st.NumSyncFallback = before.NumSyncFallback
				st.NumEventsCreate = before.NumEventsCreate // the event went to the idle pool
				assert.Equal(t, before, st, "nothing changed")
				n, err := e.Pending(s)
				require.NoError(t, err)
				assert.Equal(t, 1, n)
				mustCheck(t, a, e)
				require.NoError(t, a.Free(p), "the retry records an event")
				assert.Equal(t, int64(1), a.Stats().Active.Current, "pending on it")
				require.NoError(t, e.Complete(s))
			} else {
				require.NoError(t, err)
				n, err := e.Pending(s)
				require.NoError(t, err)
				assert.Zero(t, n, "Free waited for s")
				assert.Zero(t, st.Active.Current, "cached")
			}
			mustCheck(t, a, e)
			require.NoError(t, e.StreamDestroy(s))
		})
	}
}

// TestQuarantineEnds: each place that ends a quarantine, with and without
// a driver that can wait for a whole device: the blocks are counted until
// then, no device work is cut short (no violation), and the memory comes
// back.
func TestQuarantineEnds(t *testing.T) {
	for _, devSync := range []bool{true, false} {
		for _, where := range []string{"EmptyCache", "out of memory", "Close"} {
			t.Run(fmt.Sprintf("%s/devsync=%v", where, devSync), func(t *testing.T) {
				opts := []emulated.Option{emulated.WithManualCompletion(), emulated.WithHostCapacity(32 * kib)}
				a, e := newHost(t, "", opts...)
				if !devSync {
					a, e = newHostNoDeviceSync(t, "", opts...)
				}
				s, err := e.StreamCreate(0)
				require.NoError(t, err)
				var ps []uintptr
				for range 2 {
					p, err := a.Malloc(8 * kib)
					require.NoError(t, err)
					require.NoError(t, e.Launch(s, p, 8*kib))
					require.NoError(t, a.RecordStream(p, s))
					ps = append(ps, p)
				}
				require.NoError(t, e.StreamDestroy(s))
				for _, p := range ps {
					require.NoError(t, a.Free(p))
				}
				st := a.Stats()
				assert.Equal(t, int64(2), st.Quarantined.Current)
				assert.Equal(t, int64(16*kib), st.QuarantinedBytes.Current)
				assert.Equal(t, int64(16*kib), st.QuarantinedBytes.Peak)
				assert.Equal(t, 2, e.Live().PendingWork)
				mustCheck(t, a, e)
				switch where {
				case "EmptyCache":
					require.NoError(t, a.EmptyCache())
					assert.Zero(t, a.Stats().Segment.Current, "given back")
				case "out of memory":
					big, err := a.Malloc(32 * kib) // fits only once both are back
					require.NoError(t, err)
					assert.Zero(t, a.Stats().NumOOMs)
					require.NoError(t, a.Free(big))
				case "Close":
					require.NoError(t, a.Close())
					assertNothingHeld(t, e)
					require.ErrorIs(t, a.Check(), ErrClosed)
					return
				}
				st = a.Stats()
				assert.Zero(t, st.Quarantined.Current)
				assert.Zero(t, st.QuarantinedBytes.Current)
				assert.Equal(t, int64(2), st.Quarantined.Allocated)
				assert.Equal(t, btoi(devSync), st.NumDeviceSyncs)
				assert.Zero(t, e.Live().PendingWork, "the destroyed stream's work was waited for")
				assert.Empty(t, e.Violations())
				mustCheck(t, a, e)
			})
		}
	}
}

func btoi(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TestConcurrentDestroyedStreams: goroutines allocate, queue work on a
// stream, record it and free, while another destroys streams and makes new
// ones and a third completes work and empties the cache (run with -race).
// No block is handed out while work queued on it is pending (a model
// follows the emulator's queues), RecordStream of a destroyed stream is
// always refused, every Free succeeds, and the quarantine is empty at the
// end.
func TestConcurrentDestroyedStreams(t *testing.T) {
	a, e := newHost(t, "", emulated.WithManualCompletion())
	// The model, guarded by mu: live streams, destroyed ones still
	// followed, each stream's launched blocks oldest first, and per block
	// the work items not known complete.
	var mu sync.Mutex
	var live, dead []backend.Stream
	queued := map[backend.Stream][]uintptr{}
	inUse := map[uintptr]int{}
	for range 3 {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		live = append(live, s)
	}
	// resync drops the items the emulator has completed: a stream's work
	// completes in order, so its first len-pending items are done. mu held.
	resync := func() {
		for s, q := range queued {
			n, err := e.Pending(s)
			if err != nil { // destroyed, and its work done
				n = 0
			}
			for _, p := range q[:len(q)-n] {
				inUse[p]--
			}
			queued[s] = q[len(q)-n:]
		}
	}
	errs := make(chan error, 8)
	stop := make(chan struct{})
	var helpers sync.WaitGroup
	helpers.Add(2)
	go func() { // the device: completes work, now and then empties the cache
		defer helpers.Done()
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			all := append(append([]backend.Stream(nil), live...), dead...)
			_ = e.CompleteN(all[r.IntN(len(all))], 1) // fails when nothing is pending
			if r.IntN(20) == 0 {
				if err := a.EmptyCache(); err != nil {
					errs <- err
				}
			}
			resync()
			mu.Unlock()
		}
	}()
	go func() { // the program: destroys a stream and makes another
		defer helpers.Done()
		r := rand.New(rand.NewPCG(3, 4))
		for i := 0; i < 2000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			j := r.IntN(len(live))
			if err := e.StreamDestroy(live[j]); err != nil {
				errs <- err
			}
			dead = append(dead, live[j])
			s, err := e.StreamCreate(0)
			if err != nil {
				errs <- err
			}
			live[j] = s
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 11))
			for i := 0; i < 300; i++ {
				p, err := a.Malloc(16 * kib)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if n := inUse[p]; n > 0 {
					mu.Unlock()
					errs <- fmt.Errorf("block %#x handed out with %d work items pending", p, n)
					return
				}
				j, recordDead, destroy := r.IntN(len(live)), r.IntN(4) == 0, r.IntN(8) == 0
				s := live[j]
				err = e.Launch(s, p, 16*kib)
				if err == nil {
					inUse[p]++
					queued[s] = append(queued[s], p)
					err = a.RecordStream(p, s) // the stream cannot be destroyed meanwhile
				}
				if err == nil && recordDead && len(dead) > 0 {
					if err = a.RecordStream(p, dead[i%len(dead)]); err == nil {
						err = fmt.Errorf("RecordStream of a destroyed stream succeeded")
					} else if errors.Is(err, ErrInvalidStream) {
						err = nil
					}
				}
				if err == nil && destroy { // destroyed between RecordStream and Free
					if err = e.StreamDestroy(s); err == nil {
						dead = append(dead, s)
						live[j], err = e.StreamCreate(0)
					}
				}
				mu.Unlock()
				if err == nil {
					err = a.Free(p) // its stream may be destroyed by now
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(stop)
	helpers.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, e.CompleteAll())
	require.NoError(t, a.EmptyCache())
	st := a.Stats()
	assert.Positive(t, st.Quarantined.Allocated, "the goroutines' own destroys quarantine blocks")
	assert.Zero(t, st.Quarantined.Current)
	assert.Zero(t, st.Allocation.Current)
	assert.Zero(t, st.Segment.Current)
	mustCheck(t, a, e)
	t.Logf("%d blocks quarantined, %d device synchronizes", st.Quarantined.Allocated, st.NumDeviceSyncs)
}

// TestRecordStreamAllocatesNothing: the steady state of Malloc, RecordStream
// of a known stream (asked about again every time) and Free makes no heap
// allocation.
func TestRecordStreamAllocatesNothing(t *testing.T) {
	a, e := newHost(t, "")
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	cycle := func() {
		p, err := a.Malloc(64 * kib)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s))
		require.NoError(t, a.Free(p))
	}
	cycle() // learns s, creates the event
	assert.Zero(t, testing.AllocsPerRun(100, cycle))
	require.NoError(t, e.StreamDestroy(s))
}
