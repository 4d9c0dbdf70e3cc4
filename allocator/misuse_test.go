package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// TestNewMethodsMisuse: the observability and stream-lifecycle methods
// refuse bad input with a sentinel and change nothing.
func TestNewMethodsMisuse(t *testing.T) {
	a, e := newAlloc(t, "")
	p, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 16, Stacks: true}))
	hist, ok := a.History()
	require.True(t, ok)
	before, calls := a.Stats(), e.CallCounts()
	for _, tc := range []struct {
		name string
		op   func() error
		want error
	}{
		{"RecordHistory negative", func() error { return a.RecordHistory(HistoryOptions{MaxEntries: -1}) }, ErrInvalidHistory},
		{"RecordHistory MinInt", func() error { return a.RecordHistory(HistoryOptions{MaxEntries: math.MinInt}) }, ErrInvalidHistory},
		{"RecordHistory MaxInt", func() error { return a.RecordHistory(HistoryOptions{MaxEntries: math.MaxInt, Stacks: true}) }, ErrInvalidHistory},
		{"WriteSnapshot nil writer", func() error { return a.WriteSnapshot(nil) }, memviz.ErrNilWriter},
		{"ReleaseStream ^0", func() error { return a.ReleaseStream(backend.Stream(math.MaxUint64)) }, ErrInvalidStream},
		{"ReleaseStream idle owner's id", func() error { return a.ReleaseStream(idleStream) }, ErrInvalidStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.op(), tc.want)
			assert.Equal(t, before, a.Stats())
			got, ok := a.History()
			require.True(t, ok, "recording goes on")
			assert.Equal(t, hist, got, "history changed")
			require.NoError(t, a.Check())
		})
	}
	assert.Equal(t, calls, e.CallCounts(), "bad input reached the driver")
	require.NoError(t, a.Free(p))
}

// TestClosedBeforeHistoryOptions: after Close RecordHistory returns
// ErrClosed whatever its options, as every other method does.
func TestClosedBeforeHistoryOptions(t *testing.T) {
	a, _ := newAlloc(t, "")
	require.NoError(t, a.Close())
	for _, o := range []HistoryOptions{{MaxEntries: -1}, {MaxEntries: math.MaxInt}, {MaxEntries: 0}, {MaxEntries: 10}} {
		assert.ErrorIs(t, a.RecordHistory(o), ErrClosed, "%+v", o)
	}
	_, ok := a.History()
	assert.False(t, ok)
	_, ok = a.MemProfile()
	assert.False(t, ok)
	assert.Equal(t, uint64(2<<20), a.Granularity(), "a closed allocator still names its unit")
	var buf bytes.Buffer
	require.NoError(t, a.WriteSnapshot(&buf), "the final (empty) state can still be written")
	assert.Positive(t, buf.Len())
}

// TestReleaseStreamDriverFaults: when the synchronize ReleaseStream needs
// fails, the error comes back, the stream keeps its cache and can be
// released later.
func TestReleaseStreamDriverFaults(t *testing.T) {
	for _, kind := range []error{backend.ErrUnavailable, backend.ErrInvalidArgument, backend.ErrNotPermitted} {
		t.Run(kind.Error(), func(t *testing.T) {
			a, e := newAlloc(t, "")
			s, err := e.StreamCreate(0)
			require.NoError(t, err)
			p, err := a.Malloc(4<<20, s)
			require.NoError(t, err)
			require.NoError(t, a.Free(p)) // cached on s
			before := a.Stats()
			require.NoError(t, e.FailNth(backend.OpStreamSync, 1, kind))
			require.ErrorIs(t, a.ReleaseStream(s), kind)
			after := a.Stats()
			assert.Equal(t, before.NumStreamSyncs+1, after.NumStreamSyncs, "the failed call is counted")
			after.NumStreamSyncs = before.NumStreamSyncs
			assert.Equal(t, before, after)
			require.NoError(t, a.Check())
			p2, err := a.Malloc(4<<20, s)
			require.NoError(t, err)
			assert.Equal(t, p, p2, "the stream's cache survived")
			require.NoError(t, a.Free(p2))
			require.NoError(t, a.ReleaseStream(s))
			require.NoError(t, a.ReleaseStream(s), "releasing twice is a no-op")
			require.NoError(t, e.StreamDestroy(s))
			require.ErrorIs(t, a.ReleaseStream(s), ErrInvalidStream, "a destroyed stream")
			mustCheck(t, a, e)
		})
	}
}

// TestObservabilityConcurrency: history, profile and snapshot readers run
// against Malloc, Free, ReleaseStream and RecordHistory restarts (-race),
// and the profile adds up to MemoryAllocated at the end.
func TestObservabilityConcurrency(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(8*gib))
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 256, Stacks: true}))
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.StreamCreate(0)
			if !assert.NoError(t, err) {
				return
			}
			for i := range 200 {
				p, err := a.Malloc(uint64(512*(i+1+w)), s)
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, a.Free(p))
				if i%50 == 49 {
					assert.NoError(t, a.ReleaseStream(s))
				}
			}
			assert.NoError(t, a.ReleaseStream(s))
			assert.NoError(t, e.StreamDestroy(s))
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			_, _ = a.History()
			_, _ = a.MemProfile()
			assert.NoError(t, a.WriteSnapshot(&bytes.Buffer{}))
			if i%10 == 9 {
				assert.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 64 + i, Stacks: i%20 == 9}))
			}
		}
	}()
	wg.Wait()
	p, err := a.Malloc(3<<20, 0)
	require.NoError(t, err)
	recs, ok := a.MemProfile()
	require.True(t, ok)
	var inuse int64
	for i := range recs {
		inuse += recs[i].InUseBytes()
	}
	assert.Equal(t, int64(a.MemoryAllocated()), inuse)
	require.NoError(t, a.Free(p))
	mustCheck(t, a, e)
}

// TestLifecycleUnderEveryFault: with one driver primitive failing on its
// next call, each stream-lifecycle and cache method either succeeds or
// returns an error wrapping the injected kind; either way the allocator's
// invariants hold, the live block keeps its address, and once the fault is
// spent the whole program runs to an empty allocator.
func TestLifecycleUnderEveryFault(t *testing.T) {
	ops := []backend.Op{backend.OpMap, backend.OpUnmap, backend.OpCreate, backend.OpFree, backend.OpSetAccess,
		backend.OpStreamSync, backend.OpEventCreate, backend.OpEventDestroy, backend.OpEventRecord, backend.OpEventQuery,
		backend.OpEventSync, backend.OpDeviceSync, backend.OpReserve, backend.OpRelease, backend.OpMemGetInfo}
	steps := []struct {
		name string
		run  func(a *Allocator, s backend.Stream) error
	}{
		{"ReleaseStream", func(a *Allocator, s backend.Stream) error { return a.ReleaseStream(s) }},
		{"Synchronize", func(a *Allocator, s backend.Stream) error { return a.Synchronize(s) }},
		{"EmptyCache", func(a *Allocator, _ backend.Stream) error { return a.EmptyCache() }},
		{"Malloc", func(a *Allocator, s backend.Stream) error {
			p, err := a.Malloc(40<<20, s)
			if err != nil {
				return err
			}
			return a.Free(p)
		}},
	}
	for _, op := range ops {
		for _, st := range steps {
			t.Run(op.String()+"/"+st.name, func(t *testing.T) {
				a, e := newAlloc(t, "release_threshold_mb:0")
				s, err := e.StreamCreate(0)
				require.NoError(t, err)
				other, err := e.StreamCreate(0)
				require.NoError(t, err)
				keep, err := a.Malloc(3<<20, s)
				require.NoError(t, err)
				for range 3 { // a cache on s, a block used by other pending free
					p, err := a.Malloc(6<<20, s)
					require.NoError(t, err)
					require.NoError(t, a.RecordStream(p, other))
					require.NoError(t, a.Free(p))
				}
				require.NoError(t, e.FailNth(op, 1, backend.ErrUnavailable))
				err = st.run(a, s)
				if err != nil {
					assert.ErrorIs(t, err, backend.ErrUnavailable)
				}
				require.NoError(t, a.Check())
				e.ClearFaults() // the fault may not have been reached
				require.NoError(t, a.Free(keep))
				require.NoError(t, a.ReleaseStream(s))
				require.NoError(t, a.ReleaseStream(other))
				require.NoError(t, a.EmptyCache())
				assert.Zero(t, a.MemoryAllocated())
				mustCheck(t, a, e)
				require.NoError(t, e.StreamDestroy(s))
				require.NoError(t, e.StreamDestroy(other))
			})
		}
	}
}

// TestConcurrentRandomFaults: four goroutines allocate, record, free,
// synchronize and release their streams while every primitive fails at
// random (-race). Every error wraps a sentinel; afterwards, with the faults
// cleared, everything frees and Check holds.
func TestConcurrentRandomFaults(t *testing.T) {
	a, e := newAlloc(t, "release_threshold_mb:0,garbage_collection_threshold:0.5,per_process_memory_fraction:0.5", emulated.WithCapacity(2*gib))
	for op := backend.OpGranularity; op <= backend.OpDeviceSync; op++ {
		if op == backend.OpStreamCreate || op == backend.OpStreamDestroy || op == backend.OpStreamSync {
			continue // the test's own stream handling
		}
		require.NoError(t, e.FailRandom(op, 0.05, uint64(op)+1, backend.ErrUnavailable))
	}
	sentinels := []error{backend.ErrUnavailable, ErrOutOfMemory, ErrInvalidStream}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.StreamCreate(0)
			if !assert.NoError(t, err) {
				return
			}
			var live []uintptr
			for i := range 300 {
				size := uint64(1+(i*7919+w*104729)%(64<<20)) >> (i % 5 * 3)
				p, err := a.Malloc(size+1, s)
				if err == nil {
					live = append(live, p)
				} else {
					assert.True(t, wrapsOneOf(err, sentinels), "Malloc: %v", err)
				}
				if len(live) > 8 || (i%3 == 0 && len(live) > 0) {
					p := live[0]
					if i%2 == 0 {
						if err := a.RecordStream(p, a.DefaultStream()); err != nil {
							assert.True(t, wrapsOneOf(err, sentinels), "RecordStream: %v", err)
						}
					}
					if err := a.Free(p); err != nil {
						assert.True(t, wrapsOneOf(err, sentinels), "Free: %v", err)
						continue // still live: try again later
					}
					live = live[1:]
				}
				if i%37 == 0 {
					if err := a.ReleaseStream(s); err != nil {
						assert.True(t, wrapsOneOf(err, sentinels), "ReleaseStream: %v", err)
					}
				}
				if i%53 == 0 {
					if err := a.EmptyCache(); err != nil {
						assert.True(t, wrapsOneOf(err, sentinels), "EmptyCache: %v", err)
					}
				}
			}
			for len(live) > 0 {
				if err := a.Free(live[0]); err != nil {
					assert.True(t, wrapsOneOf(err, sentinels), "Free: %v", err)
					e.ClearFaults()
					continue
				}
				live = live[1:]
			}
			for a.ReleaseStream(s) != nil {
				e.ClearFaults()
			}
			assert.NoError(t, e.StreamDestroy(s))
		}()
	}
	wg.Wait()
	var failed int64
	for op := backend.OpGranularity; op <= backend.OpDeviceSync; op++ {
		failed += e.Failures(op)
	}
	assert.Greater(t, failed, int64(10), "faults were injected")
	e.ClearFaults()
	require.NoError(t, a.Synchronize(0))
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryAllocated())
	mustCheck(t, a, e)
}

func wrapsOneOf(err error, kinds []error) bool {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// reusingIDs hands out stream ids as CUDA and ACL do (pointers to freed
// stream objects come back): a destroyed stream's id is the next one
// created. It hides the emulator's DeviceSynchronizer, as a driver
// without that capability would.
type reusingIDs struct {
	backend.Driver
	mu    sync.Mutex
	toEmu map[backend.Stream]backend.Stream // id handed out → emulator's id
	free  []backend.Stream                  // ids destroyed, to hand out again
	next  backend.Stream
}

func (r *reusingIDs) StreamCreate(dev int) (backend.Stream, error) {
	s, err := r.Driver.StreamCreate(dev)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var id backend.Stream
	if n := len(r.free); n > 0 {
		id, r.free = r.free[n-1], r.free[:n-1]
	} else {
		r.next++
		id = 1000 + r.next
	}
	r.toEmu[id] = s
	return id, nil
}

func (r *reusingIDs) emu(s backend.Stream) backend.Stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.toEmu[s]; ok {
		return e
	}
	return 1 << 40 // unknown to the emulator
}

func (r *reusingIDs) StreamDestroy(s backend.Stream) error {
	if err := r.Driver.StreamDestroy(r.emu(s)); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.toEmu, s)
	r.free = append(r.free, s)
	return nil
}

func (r *reusingIDs) StreamSynchronize(s backend.Stream) error {
	return r.Driver.StreamSynchronize(r.emu(s))
}

func (r *reusingIDs) StreamDevice(s backend.Stream) (int, error) {
	return r.Driver.StreamDevice(r.emu(s))
}

func (r *reusingIDs) EventRecord(ev backend.Event, s backend.Stream) error {
	return r.Driver.EventRecord(ev, r.emu(s))
}

// TestStreamIDReusedAfterVanishing: a stream destroyed without
// ReleaseStream, found gone, on a driver that cannot synchronize the
// device, stays "vanished" until Close; when the driver hands its id to a
// new stream (CUDA and ACL ids are pointers, and are reused), the new,
// live stream must be usable.
func TestStreamIDReusedAfterVanishing(t *testing.T) {

	e := newEmu(t)
	drv := &reusingIDs{Driver: e, toEmu: map[backend.Stream]backend.Stream{}}
	a, err := New(drv, DefaultConfig())
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()); assertNoDriverState(t, e) }()

	s1, err := drv.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(1<<20, s1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, drv.StreamDestroy(s1)) // without ReleaseStream
	require.ErrorIs(t, a.ReleaseStream(s1), ErrInvalidStream, "found gone; no device synchronize")

	s2, err := drv.StreamCreate(0)
	require.NoError(t, err)
	require.Equal(t, s1, s2, "the driver reused the id")
	q, err := a.Malloc(1<<20, s2) // actual: ErrInvalidStream "stream 1002 was destroyed" (1001 is the default stream)
	require.NoError(t, err)
	require.NoError(t, a.Free(q))
	require.NoError(t, a.ReleaseStream(s2))
	require.NoError(t, drv.StreamDestroy(s2))
}

// TestForeignStreams: streams of another device, or never created by this
// driver, are refused by every method that takes a stream, changing
// nothing.
func TestForeignStreams(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithDevices(2))
	dev1, err := e.StreamCreate(1)
	require.NoError(t, err)
	p, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	before, calls := a.Stats(), e.CallCounts()
	for _, s := range []backend.Stream{dev1, dev1 + 1000, backend.Stream(math.MaxUint64 - 1)} {
		for name, op := range map[string]func() error{
			"Malloc":        func() error { _, err := a.Malloc(1, s); return err },
			"RecordStream":  func() error { return a.RecordStream(p, s) },
			"Synchronize":   func() error { return a.Synchronize(s) },
			"ReleaseStream": func() error { return a.ReleaseStream(s) },
		} {
			require.ErrorIs(t, op(), ErrInvalidStream, "%s(%d)", name, s)
		}
	}
	assert.Equal(t, before, a.Stats())
	c := e.CallCounts()
	assert.Equal(t, calls[backend.OpMap], c[backend.OpMap], "nothing mapped")
	require.NoError(t, a.Free(p))
	require.NoError(t, e.StreamDestroy(dev1))
	mustCheck(t, a, e)
}

// TestHugeDevice: on a device larger than one segment's reservation limit
// (2^24 granules, 32 TiB at 2 MiB), or so large that 9/8 of it overflows
// uint64, the allocator must still serve small requests (clamping each
// reservation), or refuse at New with ErrInvalidConfig — never fail every
// Malloc with an error that wraps none of its sentinels.
func TestHugeDevice(t *testing.T) {

	for _, capacity := range []uint64{64 << 40, 1 << 63, math.MaxUint64} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			e := newEmu(t, emulated.WithCapacity(capacity))
			a, err := New(e, DefaultConfig())
			if err != nil {
				require.ErrorIs(t, err, ErrInvalidConfig)
				return
			}
			defer func() { require.NoError(t, a.Close()); assertNoDriverState(t, e) }()
			for _, n := range []uint64{1, 1 << 20, 3 << 30} {
				p, err := a.Malloc(n, 0) // actual: "segment.New: invalid segment config: … granules exceed the limit of 16777216"
				require.NoError(t, err, "Malloc(%d)", n)
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, a.Check())
		})
	}
}

// TestCloseDuringUse: Close races Malloc, Free, ReleaseStream, Synchronize
// and the history readers (-race). Every call returns nil or ErrClosed, and
// Close leaves the driver holding nothing (newAlloc's cleanup checks).
func TestCloseDuringUse(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			a, e := newAlloc(t, "")
			require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 100, Stacks: round%2 == 0}))
			okOrClosed := func(err error) bool { return err == nil || errors.Is(err, ErrClosed) }
			var wg sync.WaitGroup
			streams := make([]backend.Stream, 3)
			for w := range streams {
				s, err := e.StreamCreate(0)
				require.NoError(t, err)
				streams[w] = s
			}
			for w, s := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 200 {
						p, err := a.Malloc(uint64(1+i)<<14, s)
						if !assert.True(t, okOrClosed(err), "Malloc: %v", err) || err != nil {
							return
						}
						// The next worker may be releasing its stream:
						// ErrInvalidStream until its ReleaseStream returns.
						rerr := a.RecordStream(p, streams[(w+1)%len(streams)])
						assert.True(t, okOrClosed(rerr) || errors.Is(rerr, ErrInvalidStream), "RecordStream: %v", rerr)
						assert.True(t, okOrClosed(a.Free(p)))
						if i%20 == 0 {
							assert.True(t, okOrClosed(a.ReleaseStream(s)))
							assert.True(t, okOrClosed(a.Synchronize(s)))
							_, _ = a.History()
							assert.True(t, okOrClosed(a.WriteSnapshot(&bytes.Buffer{})))
						}
					}
				}()
			}
			for range round * 20 {
				_ = a.MemoryReserved()
			}
			require.NoError(t, a.Close())
			wg.Wait()
			for _, s := range streams {
				require.NoError(t, e.StreamDestroy(s))
			}
		})
	}
}

// TestReservationSize: given a device of total bytes, one expandable
// segment reserves 9/8 of it rounded up to a page, capped at what a
// segment can track, even where 9/8 of it overflows.
func TestReservationSize(t *testing.T) {
	const gran, page = 2 << 20, 20 << 20
	limit := uint64(segment.MaxGranules*gran) / page * page
	for _, tc := range []struct {
		total, want uint64
	}{
		{80 << 30, 90 << 30},
		{1 << 30, 1160 << 20}, // 1152 MiB rounded up to a 20 MiB page
		{64 << 40, limit},
		{1 << 63, limit},
		{math.MaxUint64, limit},
	} {
		assert.Equal(t, tc.want, reservationSize(tc.total, gran, page), "total %d", tc.total)
	}
	assert.Equal(t, uint64(math.MaxUint64)/page*page, reservationSize(math.MaxUint64, 1<<62, page), "granularity so large the granule limit overflows")
}
