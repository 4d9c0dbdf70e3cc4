package segment

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

const (
	mib = uint64(1) << 20
	ps  = 2 * mib // the fake driver's granularity, used as the page size
)

var prop0 = backend.DeviceProp(0)

// newSeg makes an npages-page segment with ps-byte pages on a fresh fake
// driver, with counters and optionally a cache of maxCache handles
// (maxCache < 0: no cache).
func newSeg(t *testing.T, npages, maxCache int) (*fakeDriver, *Segment, *Counters) {
	t.Helper()
	d := newFakeDriver()
	c := new(Counters)
	cfg := Config{Prop: prop0, PageSize: ps, VASize: uint64(npages) * ps, Counters: c}
	if maxCache >= 0 {
		cfg.Cache = NewHandleCache(d, ps, prop0, maxCache, c)
	}
	s, err := New(d, cfg)
	require.NoError(t, err)
	return d, s, c
}

// checkConsistent asserts that the segment's view of its pages is the
// driver's, that nothing was leaked (every live handle is mapped, cached or
// a leftover) and that no driver rule was broken.
func checkConsistent(t *testing.T, d *fakeDriver, s *Segment) {
	t.Helper()
	require.Empty(t, d.ruleViolations(), "driver rules broken")
	var want []uintptr
	for p := range s.NumPages() {
		h := s.Handle(p)
		require.Equal(t, h != 0, s.IsMapped(p))
		if h == 0 {
			continue
		}
		want = append(want, s.va(p))
		m, ok := d.mapping(s.va(p))
		require.True(t, ok, "page %d recorded as mapped but the driver has no mapping", p)
		require.Equal(t, h, m.h, "page %d", p)
		require.Equal(t, s.PageSize(), m.size, "page %d", p)
	}
	require.Equal(t, want, d.mappingsIn(s.Base(), s.Size()))
	require.Len(t, want, s.MappedPages())
	var runBytes uint64
	for i, r := range s.MappedRuns() {
		require.NotZero(t, r.Len)
		if i > 0 {
			prev := s.MappedRuns()[i-1]
			require.Greater(t, r.Off, prev.Off+prev.Len, "runs not maximal")
		}
		for off := r.Off; off < r.Off+r.Len; off += s.PageSize() {
			require.True(t, s.IsMapped(int(off/s.PageSize())))
		}
		runBytes += r.Len
	}
	require.Equal(t, s.MappedBytes(), runBytes)
	cached := 0
	if s.cache != nil {
		cached = s.cache.Len()
		for _, h := range s.cache.handles {
			require.True(t, d.handleLive(h), "cached handle %d not live", h)
		}
	}
	require.Equal(t, s.MappedPages()+cached+s.Leftovers(), d.liveHandles(), "leaked or lost handles")
}

func TestNewConfigErrors(t *testing.T) {
	d := newFakeDriver()
	tests := []struct {
		name string
		drv  backend.Driver
		cfg  Config
		arm  func(d *fakeDriver)
		want []error
	}{
		{"nil driver", nil, Config{Prop: prop0, PageSize: ps, VASize: ps}, nil, []error{ErrInvalidConfig}},
		{"zero page size", d, Config{Prop: prop0, VASize: ps}, nil, []error{ErrInvalidConfig}},
		{"page size not a granularity multiple", d, Config{Prop: prop0, PageSize: 3 * mib, VASize: 6 * mib}, nil, []error{ErrInvalidConfig}},
		{"zero VA size", d, Config{Prop: prop0, PageSize: ps}, nil, []error{ErrInvalidConfig}},
		{"VA size not a page multiple", d, Config{Prop: prop0, PageSize: 4 * mib, VASize: 6 * mib}, nil, []error{ErrInvalidConfig}},
		{"too many pages", d, Config{Prop: prop0, PageSize: ps, VASize: (MaxPages + 1) * ps}, nil, []error{ErrInvalidConfig}},
		{"device mismatch", d, Config{Device: 1, Prop: prop0, PageSize: ps, VASize: ps}, nil, []error{ErrInvalidConfig}},
		{"negative device", d, Config{Device: -1, Prop: backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}}, PageSize: ps, VASize: ps}, nil, []error{ErrInvalidConfig}},
		{"cache size mismatch", d, Config{Prop: prop0, PageSize: ps, VASize: 4 * ps, Cache: NewHandleCache(d, 2*ps, prop0, 1, nil)}, nil, []error{ErrInvalidConfig}},
		{"cache prop mismatch", d, Config{Prop: prop0, PageSize: ps, VASize: 4 * ps, Cache: NewHandleCache(d, ps, backend.PhysicalProp{Location: prop0.Location, Attr: backend.PageNormal}, 1, nil)}, nil, []error{ErrInvalidConfig}},
		{"prop the driver rejects", d, Config{Prop: backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}, Attr: backend.PageHuge1G}, PageSize: ps, VASize: ps}, nil,
			[]error{ErrInvalidConfig, backend.ErrInvalidArgument}},
		{"granularity fails", d, Config{Prop: prop0, PageSize: ps, VASize: ps},
			func(d *fakeDriver) { d.failNth(backend.OpGranularity, 1, backend.ErrUnavailable) },
			[]error{ErrInvalidConfig, backend.ErrUnavailable}},
		{"reserve fails", d, Config{Prop: prop0, PageSize: ps, VASize: ps},
			func(d *fakeDriver) { d.failNth(backend.OpReserve, 1, backend.ErrOutOfMemory) },
			[]error{backend.ErrOutOfMemory}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.arm != nil {
				tt.arm(d)
				defer d.clearFaults()
			}
			s, err := New(tt.drv, tt.cfg)
			require.Error(t, err)
			assert.Nil(t, s)
			for _, w := range tt.want {
				assert.ErrorIs(t, err, w)
			}
			if !errors.Is(err, backend.ErrOutOfMemory) {
				assert.NotErrorIs(t, err, backend.ErrOutOfMemory)
			}
			assert.Zero(t, d.liveReservations())
		})
	}
	assert.Zero(t, d.count(backend.OpCreate))
}

func TestLifecycle(t *testing.T) {
	d, s, c := newSeg(t, 8, -1)
	assert.Equal(t, uint64(8*ps), s.Size())
	assert.Equal(t, ps, s.PageSize())
	assert.Equal(t, 8, s.NumPages())
	assert.Equal(t, 0, s.Device())
	assert.Equal(t, prop0, s.Prop())
	assert.False(t, s.Classic())
	assert.Equal(t, 1, d.liveReservations())
	assert.NotZero(t, s.Base())

	require.NoError(t, s.Map(0, 2*ps))
	require.NoError(t, s.Map(3*ps, ps))
	require.NoError(t, s.Map(7*ps, ps))
	checkConsistent(t, d, s)
	assert.Equal(t, 4, s.MappedPages())
	assert.Equal(t, 4*ps, s.MappedBytes())
	assert.Equal(t, []Run{{0, 2 * ps}, {3 * ps, ps}, {7 * ps, ps}}, s.MappedRuns())
	seen := map[backend.Handle]bool{}
	for _, p := range []int{0, 1, 3, 7} {
		h := s.Handle(p)
		require.NotZero(t, h)
		assert.False(t, seen[h], "handle %d used twice", h)
		seen[h] = true
		m, _ := d.mapping(s.va(p))
		assert.Equal(t, []backend.AccessDesc{{Location: prop0.Location, Flags: backend.AccessReadWrite}}, m.access)
	}
	assert.Zero(t, s.Handle(2))
	assert.Zero(t, s.Handle(-1))
	assert.Zero(t, s.Handle(8))
	assert.Equal(t, Counters{Maps: 4, HandlesCreated: 4}, *c)

	// Fill the hole so 0..3 become one run.
	require.NoError(t, s.Map(2*ps, ps))
	assert.Equal(t, []Run{{0, 4 * ps}, {7 * ps, ps}}, s.MappedRuns())

	require.ErrorIs(t, s.Release(), ErrNotEmpty)
	done, err := s.Unmap(ps, 3*ps)
	require.NoError(t, err)
	assert.Equal(t, 3*ps, done)
	assert.Equal(t, []Run{{0, ps}, {7 * ps, ps}}, s.MappedRuns())
	checkConsistent(t, d, s)
	for _, off := range []uint64{0, 7 * ps} {
		done, err = s.Unmap(off, ps)
		require.NoError(t, err)
		assert.Equal(t, ps, done)
	}
	assert.Nil(t, s.MappedRuns())
	assert.Equal(t, Counters{Maps: 5, Unmaps: 5, HandlesCreated: 5, HandlesFreed: 5}, *c)
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveMappings())

	require.NoError(t, s.Release())
	assert.True(t, s.Released())
	assert.Zero(t, d.liveReservations())
	assert.Empty(t, d.ruleViolations())

	// A dead segment refuses everything and reports nothing mapped.
	assert.ErrorIs(t, s.Map(0, ps), ErrReleased)
	_, err = s.Unmap(0, ps)
	assert.ErrorIs(t, err, ErrReleased)
	assert.ErrorIs(t, s.Release(), ErrReleased)
	assert.ErrorIs(t, s.Destroy(), ErrReleased)
	assert.False(t, s.IsMapped(0))
	assert.Zero(t, s.MappedPages())
	assert.Nil(t, s.MappedRuns())
	assert.Equal(t, 1, d.count(backend.OpRelease))
}

func TestCustomAccess(t *testing.T) {
	d := newFakeDriver()
	access := []backend.AccessDesc{
		{Location: backend.Location{Type: backend.LocationDevice, ID: 0}, Flags: backend.AccessReadWrite},
		{Location: backend.Location{Type: backend.LocationDevice, ID: 1}, Flags: backend.AccessRead},
	}
	s, err := New(d, Config{Prop: prop0, PageSize: 2 * ps, VASize: 4 * ps, Access: access})
	require.NoError(t, err)
	access[1].Flags = backend.AccessNone // the segment keeps its own copy
	require.NoError(t, s.Map(2*ps, 2*ps))
	f, err := d.GetAccess(s.Base()+uintptr(2*ps)+1, access[1].Location)
	require.NoError(t, err)
	assert.Equal(t, backend.AccessRead, f)
	m, ok := d.mapping(s.Base() + uintptr(2*ps))
	require.True(t, ok)
	assert.Equal(t, 2*ps, m.size, "one handle per 4 MiB page")
	checkConsistent(t, d, s)
	require.NoError(t, s.Destroy())
	assert.Zero(t, d.liveHandles())
}

func TestBadRangesChangeNothing(t *testing.T) {
	d, s, c := newSeg(t, 8, 2)
	require.NoError(t, s.Map(2*ps, 2*ps)) // pages 2, 3
	topPage := uint64(math.MaxUint64) / ps * ps
	tests := []struct {
		name  string
		unmap bool
		off   uint64
		n     uint64
		want  error
	}{
		{"map unaligned offset", false, 1, ps, ErrInvalidRange},
		{"map unaligned length", false, 0, ps + 4096, ErrInvalidRange},
		{"map zero length", false, 0, 0, ErrInvalidRange},
		{"map at end", false, 8 * ps, ps, ErrOutOfRange},
		{"map past end", false, 7 * ps, 2 * ps, ErrOutOfRange},
		{"map overflowing range", false, ps, topPage, ErrOutOfRange},
		{"map far offset", false, topPage, ps, ErrOutOfRange},
		{"map mapped page", false, 2 * ps, ps, ErrAlreadyMapped},
		{"map overlapping start", false, ps, 2 * ps, ErrAlreadyMapped},
		{"map overlapping end", false, 3 * ps, 2 * ps, ErrAlreadyMapped},
		{"unmap unaligned offset", true, 2*ps + 512, ps, ErrInvalidRange},
		{"unmap unaligned length", true, 2 * ps, 1, ErrInvalidRange},
		{"unmap zero length", true, 2 * ps, 0, ErrInvalidRange},
		{"unmap past end", true, 2 * ps, 7 * ps, ErrOutOfRange},
		{"unmap overflowing range", true, 2 * ps, topPage, ErrOutOfRange},
		{"unmap unmapped page", true, 0, ps, ErrNotMapped},
		{"unmap partly mapped (end)", true, 3 * ps, 2 * ps, ErrNotMapped},
		{"unmap partly mapped (start)", true, ps, 2 * ps, ErrNotMapped},
	}
	st, err := d.StreamCreate(0)
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]backend.Handle(nil), s.handles...)
			cBefore, logBefore := *c, d.logLen()
			if tt.unmap {
				done, err := s.Unmap(tt.off, tt.n, st)
				require.ErrorIs(t, err, tt.want)
				assert.Zero(t, done)
			} else {
				require.ErrorIs(t, s.Map(tt.off, tt.n), tt.want)
			}
			assert.Equal(t, before, s.handles)
			assert.Equal(t, cBefore, *c)
			assert.Equal(t, logBefore, d.logLen(), "driver called: %v", d.ops(logBefore))
			checkConsistent(t, d, s)
		})
	}
}

type faultStep struct {
	op   backend.Op
	kind error
}

var mapSteps = []faultStep{
	{backend.OpCreate, backend.ErrOutOfMemory},
	{backend.OpMap, backend.ErrUnavailable},
	{backend.OpSetAccess, backend.ErrOutOfMemory}, // PyTorch #188008
}

// TestMapRollback injects a failure at every step of every page of a
// 4-page map, with and without handles waiting in the cache, and checks
// that the call leaves no trace.
func TestMapRollback(t *testing.T) {
	const n = 4
	for _, cached := range []int{0, 2, 4} {
		for _, step := range mapSteps {
			calls := n
			if step.op == backend.OpCreate {
				calls = n - cached
			}
			for k := 1; k <= calls; k++ {
				t.Run(step.op.String()+"/cached="+itoa(cached)+"/call="+itoa(k), func(t *testing.T) {
					d, s, c := newSeg(t, 12, 4)
					require.NoError(t, s.Map(11*ps, ps)) // an unrelated page that must survive
					if cached > 0 {
						require.NoError(t, s.Map(4*ps, uint64(cached)*ps))
						_, err := s.Unmap(4*ps, uint64(cached)*ps)
						require.NoError(t, err)
					}
					cacheBefore := append([]backend.Handle(nil), s.cache.handles...)
					require.Len(t, cacheBefore, cached)
					cBefore := *c
					liveBefore := d.liveHandles()
					page11 := s.Handle(11)

					d.failNth(step.op, k, step.kind)
					err := s.Map(0, n*ps)
					require.Error(t, err)
					assert.ErrorIs(t, err, step.kind)
					var be *backend.Error
					require.ErrorAs(t, err, &be)
					assert.Equal(t, step.op, be.Op)

					assert.Equal(t, 1, s.MappedPages())
					assert.Equal(t, page11, s.Handle(11))
					assert.Equal(t, cacheBefore, s.cache.handles, "cache content or order changed")
					assert.Equal(t, liveBefore, d.liveHandles())
					assert.Equal(t, 1, d.liveMappings())
					assert.Equal(t, cBefore.HandlesReused, c.HandlesReused)
					assert.Equal(t, c.Maps-cBefore.Maps, c.Unmaps-cBefore.Unmaps, "maps not all undone")
					assert.Equal(t, c.HandlesCreated-cBefore.HandlesCreated, c.HandlesFreed-cBefore.HandlesFreed)
					assert.Zero(t, s.Leftovers())
					checkConsistent(t, d, s)

					// The range is usable afterwards.
					require.NoError(t, s.Map(0, n*ps))
					assert.Equal(t, int64(cached), c.HandlesReused-cBefore.HandlesReused)
					require.NoError(t, s.Destroy())
					require.NoError(t, s.cache.Trim(0))
					assert.Zero(t, d.liveHandles())
				})
			}
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestMapRollbackUnmapFails(t *testing.T) {
	// SetAccess fails on page 2; the rollback's first unmap (page 2, undone
	// first) fails too, so page 2 must stay recorded as mapped.
	d, s, _ := newSeg(t, 4, -1)
	d.failNth(backend.OpSetAccess, 3, backend.ErrOutOfMemory)
	d.failNth(backend.OpUnmap, 1, backend.ErrUnavailable)
	err := s.Map(0, 4*ps)
	require.Error(t, err)
	assert.ErrorIs(t, err, backend.ErrOutOfMemory)
	assert.ErrorIs(t, err, backend.ErrUnavailable)
	assert.Equal(t, []Run{{2 * ps, ps}}, s.MappedRuns())
	assert.Equal(t, 1, d.liveHandles())
	checkConsistent(t, d, s)

	done, err := s.Unmap(2*ps, ps)
	require.NoError(t, err)
	assert.Equal(t, ps, done)
	require.NoError(t, s.Release())
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveReservations())
}

func TestMapRollbackFreeFails(t *testing.T) {
	for _, withCache := range []bool{false, true} {
		t.Run(map[bool]string{false: "no cache", true: "cache"}[withCache], func(t *testing.T) {
			maxCache := -1
			if withCache {
				maxCache = 8
			}
			d, s, _ := newSeg(t, 4, maxCache)
			d.failNth(backend.OpCreate, 3, backend.ErrOutOfMemory)
			d.failNth(backend.OpFree, 2, backend.ErrUnavailable)
			err := s.Map(0, 4*ps)
			require.Error(t, err)
			assert.ErrorIs(t, err, backend.ErrOutOfMemory)
			assert.ErrorIs(t, err, ErrHandleNotFreed)
			assert.Zero(t, s.MappedPages())
			assert.Equal(t, 1, d.liveHandles())
			checkConsistent(t, d, s)
			if withCache {
				assert.Equal(t, 1, s.cache.Len())
				assert.Zero(t, s.Leftovers())
				require.NoError(t, s.cache.Trim(0))
			} else {
				assert.Equal(t, 1, s.Leftovers())
			}
			require.NoError(t, s.Release())
			assert.Zero(t, s.Leftovers())
			assert.Zero(t, d.liveHandles())
		})
	}
}

func TestUnmapFailsAtPage(t *testing.T) {
	const n = 4
	for k := 1; k <= n; k++ {
		t.Run("page="+itoa(k), func(t *testing.T) {
			d, s, c := newSeg(t, n, -1)
			require.NoError(t, s.Map(0, n*ps))
			d.failNth(backend.OpUnmap, k, backend.ErrUnavailable)
			done, err := s.Unmap(0, n*ps)
			require.ErrorIs(t, err, backend.ErrUnavailable)
			assert.Equal(t, uint64(k-1)*ps, done)
			for p := range n {
				assert.Equal(t, p >= k-1, s.IsMapped(p), "page %d", p)
			}
			assert.Equal(t, int64(k-1), c.Unmaps)
			assert.Equal(t, int64(k-1), c.HandlesFreed)
			checkConsistent(t, d, s)

			done, err = s.Unmap(done, n*ps-done)
			require.NoError(t, err)
			assert.Equal(t, uint64(n-k+1)*ps, done)
			require.NoError(t, s.Release())
			assert.Zero(t, d.liveHandles())
		})
	}
}

func TestUnmapFreeFailsKeepsHandle(t *testing.T) {
	d, s, c := newSeg(t, 4, -1)
	require.NoError(t, s.Map(0, 3*ps))
	lost := s.Handle(1)
	d.failNth(backend.OpFree, 2, backend.ErrUnavailable)
	done, err := s.Unmap(0, 3*ps)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrHandleNotFreed)
	assert.ErrorIs(t, err, backend.ErrUnavailable)
	assert.Equal(t, 3*ps, done, "the pages are unmapped all the same")
	assert.Zero(t, s.MappedPages())
	assert.Equal(t, 1, s.Leftovers())
	assert.Equal(t, s.leftover, []backend.Handle{lost})
	assert.True(t, d.handleLive(lost))
	assert.Equal(t, int64(2), c.HandlesFreed)
	checkConsistent(t, d, s)

	// Release retries the leftover; while it keeps failing the segment
	// stays alive.
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	require.ErrorIs(t, s.Release(), ErrHandleNotFreed)
	assert.False(t, s.Released())
	assert.Equal(t, 1, d.liveReservations())
	assert.Equal(t, 1, s.Leftovers())

	require.NoError(t, s.Release())
	assert.Zero(t, s.Leftovers())
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveReservations())
	assert.Equal(t, int64(3), c.HandlesFreed)
	assert.Empty(t, d.ruleViolations())
}

func TestReleaseAddressFails(t *testing.T) {
	d, s, _ := newSeg(t, 2, -1)
	d.failNth(backend.OpRelease, 1, backend.ErrUnavailable)
	require.ErrorIs(t, s.Release(), backend.ErrUnavailable)
	assert.False(t, s.Released())
	require.NoError(t, s.Map(0, ps), "still usable")
	_, err := s.Unmap(0, ps)
	require.NoError(t, err)
	require.NoError(t, s.Release())
	assert.Zero(t, d.liveReservations())
}

func TestStreamsSynchronizedBeforeUnmap(t *testing.T) {
	d, s, c := newSeg(t, 4, -1)
	s1, err := d.StreamCreate(0)
	require.NoError(t, err)
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Map(0, 3*ps))

	mark := d.logLen()
	done, err := s.Unmap(0, 2*ps, s1, s2, s1)
	require.NoError(t, err)
	assert.Equal(t, 2*ps, done)
	var got []backend.Op
	var synced []backend.Stream
	for _, call := range d.ops(mark) {
		got = append(got, call.op)
		if call.op == backend.OpStreamSync {
			synced = append(synced, call.stream)
		}
	}
	assert.Equal(t, []backend.Op{backend.OpStreamSync, backend.OpStreamSync,
		backend.OpUnmap, backend.OpFree, backend.OpUnmap, backend.OpFree}, got)
	assert.Equal(t, []backend.Stream{s1, s2}, synced, "each stream once, in order")
	assert.Equal(t, int64(2), c.StreamSyncs)

	// A failed sync unmaps nothing.
	d.failNth(backend.OpStreamSync, 2, backend.ErrUnavailable)
	mark = d.logLen()
	done, err = s.Unmap(2*ps, ps, s1, s2)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	assert.Zero(t, done)
	assert.True(t, s.IsMapped(2))
	assert.Zero(t, countOp(d.ops(mark), backend.OpUnmap))
	assert.Equal(t, int64(3), c.StreamSyncs)
	checkConsistent(t, d, s)

	// No streams: no synchronization.
	mark = d.logLen()
	_, err = s.Unmap(2*ps, ps)
	require.NoError(t, err)
	assert.Zero(t, countOp(d.ops(mark), backend.OpStreamSync))
}

func countOp(calls []fakeCall, op backend.Op) int {
	n := 0
	for _, c := range calls {
		if c.op == op {
			n++
		}
	}
	return n
}

func TestHandleCacheReuse(t *testing.T) {
	d, s, c := newSeg(t, 8, 2)
	hc := s.cache
	require.NoError(t, s.Map(0, 3*ps))
	h0, h1, h2 := s.Handle(0), s.Handle(1), s.Handle(2)
	_, err := s.Unmap(0, 3*ps)
	require.NoError(t, err)
	// Pages 0 and 1 filled the cache; page 2's handle was freed.
	assert.Equal(t, []backend.Handle{h0, h1}, hc.handles)
	assert.False(t, d.handleLive(h2))
	assert.Equal(t, 2, hc.Len())
	assert.Equal(t, 2*ps, hc.Bytes())
	assert.Equal(t, Counters{Maps: 3, Unmaps: 3, HandlesCreated: 3, HandlesFreed: 1}, *c)

	creates := d.count(backend.OpCreate)
	require.NoError(t, s.Map(4*ps, 2*ps))
	assert.Equal(t, creates, d.count(backend.OpCreate), "no CreatePhysical while the cache has handles")
	assert.Equal(t, h1, s.Handle(4), "last cached, first reused")
	assert.Equal(t, h0, s.Handle(5))
	assert.Equal(t, int64(2), c.HandlesReused)
	assert.Zero(t, hc.Len())

	// One cached handle, three pages: one reused, two created.
	_, err = s.Unmap(5*ps, ps)
	require.NoError(t, err)
	require.NoError(t, s.Map(0, 3*ps))
	assert.Equal(t, h0, s.Handle(0))
	assert.Equal(t, creates+2, d.count(backend.OpCreate))
	assert.Equal(t, int64(3), c.HandlesReused)
	checkConsistent(t, d, s)

	require.NoError(t, s.Destroy())
	assert.Equal(t, 2, hc.Len(), "Destroy leaves handles in the shared cache")
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())
	assert.Equal(t, c.HandlesCreated, c.HandlesFreed)
}

func TestHandleCacheTrimAndMax(t *testing.T) {
	d := newFakeDriver()
	c := new(Counters)
	hc := NewHandleCache(d, ps, prop0, 3, c)
	assert.Equal(t, 3, hc.Max())
	assert.Equal(t, ps, hc.Size())
	assert.Equal(t, prop0, hc.Prop())
	s, err := New(d, Config{Prop: prop0, PageSize: ps, VASize: 4 * ps, Cache: hc, Counters: c})
	require.NoError(t, err)
	require.NoError(t, s.Map(0, 4*ps))
	_, err = s.Unmap(0, 4*ps)
	require.NoError(t, err)
	require.Equal(t, 3, hc.Len())

	// A failed free keeps the handle cached.
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	err = hc.Trim(1)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	require.ErrorIs(t, err, ErrHandleNotFreed)
	assert.Equal(t, 3, hc.Len())
	assert.Equal(t, 3, d.liveHandles())

	require.NoError(t, hc.Trim(1))
	assert.Equal(t, 1, hc.Len())
	require.NoError(t, hc.Trim(5), "keeping more than cached frees nothing")
	assert.Equal(t, 1, hc.Len())
	assert.Equal(t, int64(3), c.HandlesFreed)

	// SetMax lowers the limit for later puts; Trim applies it now.
	hc.SetMax(0)
	assert.Equal(t, 0, hc.Max())
	require.NoError(t, s.Map(0, ps))
	assert.Zero(t, hc.Len(), "the cached handle was reused")
	_, err = s.Unmap(0, ps)
	require.NoError(t, err)
	assert.Zero(t, hc.Len(), "a full cache frees at once")
	hc.SetMax(-3)
	assert.Equal(t, 0, hc.Max())

	// A full cache whose free fails keeps the handle beyond its limit.
	require.NoError(t, s.Map(0, ps))
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	_, err = s.Unmap(0, ps)
	require.ErrorIs(t, err, ErrHandleNotFreed)
	assert.Equal(t, 1, hc.Len())
	require.NoError(t, hc.Trim(-1))
	assert.Zero(t, hc.Len())
	require.NoError(t, s.Release())
	assert.Zero(t, d.liveHandles())
	assert.Empty(t, d.ruleViolations())
}

func TestHandleCacheShared(t *testing.T) {
	d := newFakeDriver()
	c := new(Counters)
	hc := NewHandleCache(d, ps, prop0, 4, c)
	a, err := New(d, Config{Prop: prop0, PageSize: ps, VASize: 4 * ps, Cache: hc, Counters: c})
	require.NoError(t, err)
	b, err := New(d, Config{Prop: prop0, PageSize: ps, VASize: 4 * ps, Cache: hc, Counters: c})
	require.NoError(t, err)
	require.NoError(t, a.Map(0, 2*ps))
	ha := []backend.Handle{a.Handle(0), a.Handle(1)}
	require.NoError(t, a.Destroy())
	require.NoError(t, b.Map(ps, 2*ps))
	assert.ElementsMatch(t, ha, []backend.Handle{b.Handle(1), b.Handle(2)})
	assert.Equal(t, int64(2), c.HandlesCreated)
	assert.Equal(t, int64(2), c.HandlesReused)
	require.NoError(t, b.Destroy())
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveReservations())
}

func TestDestroy(t *testing.T) {
	setup := func(t *testing.T) (*fakeDriver, *Segment, *Counters, backend.Stream) {
		d, s, c := newSeg(t, 8, -1)
		st, err := d.StreamCreate(0)
		require.NoError(t, err)
		require.NoError(t, s.Map(0, 3*ps))
		require.NoError(t, s.Map(5*ps, ps))
		return d, s, c, st
	}

	t.Run("clean", func(t *testing.T) {
		d, s, c, st := setup(t)
		mark := d.logLen()
		require.NoError(t, s.Destroy(st))
		calls := d.ops(mark)
		require.NotEmpty(t, calls)
		assert.Equal(t, backend.OpStreamSync, calls[0].op, "sync before any unmap")
		assert.Equal(t, backend.OpRelease, calls[len(calls)-1].op)
		assert.Equal(t, 4, countOp(calls, backend.OpUnmap))
		assert.True(t, s.Released())
		assert.Zero(t, d.liveHandles())
		assert.Zero(t, d.liveMappings())
		assert.Zero(t, d.liveReservations())
		assert.Equal(t, Counters{Maps: 4, Unmaps: 4, HandlesCreated: 4, HandlesFreed: 4, StreamSyncs: 1}, *c)
		assert.Empty(t, d.ruleViolations())
	})
	t.Run("empty segment syncs nothing", func(t *testing.T) {
		d, s, _ := newSeg(t, 2, -1)
		st, err := d.StreamCreate(0)
		require.NoError(t, err)
		require.NoError(t, s.Destroy(st))
		assert.Zero(t, d.count(backend.OpStreamSync))
		assert.Zero(t, d.liveReservations())
	})
	t.Run("sync fails", func(t *testing.T) {
		d, s, _, st := setup(t)
		d.failNth(backend.OpStreamSync, 1, backend.ErrUnavailable)
		require.ErrorIs(t, s.Destroy(st), backend.ErrUnavailable)
		assert.Equal(t, 4, s.MappedPages())
		assert.Zero(t, d.count(backend.OpUnmap))
		checkConsistent(t, d, s)
		require.NoError(t, s.Destroy(st))
		assert.Zero(t, d.liveHandles())
	})
	t.Run("unmap fails", func(t *testing.T) {
		d, s, _, st := setup(t)
		d.failNth(backend.OpUnmap, 2, backend.ErrUnavailable)
		require.ErrorIs(t, s.Destroy(st), backend.ErrUnavailable)
		assert.False(t, s.Released())
		assert.Equal(t, []Run{{ps, ps}}, s.MappedRuns(), "best effort: the other pages went")
		assert.Equal(t, 1, d.liveReservations())
		checkConsistent(t, d, s)
		require.NoError(t, s.Destroy(st))
		assert.True(t, s.Released())
		assert.Zero(t, d.liveHandles())
		assert.Zero(t, d.liveReservations())
	})
	t.Run("free fails", func(t *testing.T) {
		d, s, _, st := setup(t)
		// Frees 1-4 are pages 0, 1, 2, 5; free 5 is the retry of page 5's.
		d.failFrom(backend.OpFree, 4, 2, backend.ErrUnavailable)
		err := s.Destroy(st)
		require.ErrorIs(t, err, ErrHandleNotFreed)
		assert.False(t, s.Released(), "a handle that cannot be freed holds the segment")
		assert.Zero(t, s.MappedPages())
		assert.Equal(t, 1, s.Leftovers())
		checkConsistent(t, d, s)
		require.NoError(t, s.Destroy())
		assert.Zero(t, d.liveHandles())
		assert.Zero(t, d.liveReservations())
	})
	t.Run("release fails", func(t *testing.T) {
		d, s, _, st := setup(t)
		d.failNth(backend.OpRelease, 1, backend.ErrUnavailable)
		require.ErrorIs(t, s.Destroy(st), backend.ErrUnavailable)
		assert.False(t, s.Released())
		assert.Zero(t, s.MappedPages())
		assert.Zero(t, d.liveHandles())
		require.NoError(t, s.Destroy(st))
		assert.Zero(t, d.liveReservations())
	})
}

func TestClassic(t *testing.T) {
	d := newFakeDriver()
	st, err := d.StreamCreate(0)
	require.NoError(t, err)
	s, err := NewClassic(d, 0, 3*mib, prop0)
	require.NoError(t, err)
	assert.True(t, s.Classic())
	assert.Equal(t, 4*mib, s.Size(), "rounded up to the granularity")
	assert.Equal(t, 4*mib, s.PageSize())
	assert.Equal(t, 1, s.NumPages())
	assert.Equal(t, 1, s.MappedPages())
	assert.Equal(t, []Run{{0, 4 * mib}}, s.MappedRuns())
	m, ok := d.mapping(s.Base())
	require.True(t, ok)
	assert.Equal(t, 4*mib, m.size)
	assert.Equal(t, s.Handle(0), m.h)
	assert.Equal(t, []backend.AccessDesc{{Location: prop0.Location, Flags: backend.AccessReadWrite}}, m.access)
	checkConsistent(t, d, s)

	assert.ErrorIs(t, s.Map(0, 4*mib), ErrClassic)
	_, err = s.Unmap(0, 4*mib)
	assert.ErrorIs(t, err, ErrClassic)
	assert.ErrorIs(t, s.Release(), ErrNotEmpty)

	require.NoError(t, s.Destroy(st))
	assert.Equal(t, 1, d.count(backend.OpStreamSync))
	assert.True(t, s.Released())
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveMappings())
	assert.Zero(t, d.liveReservations())
	assert.Empty(t, d.ruleViolations())
}

func TestClassicConfig(t *testing.T) {
	d := newFakeDriver()
	c := new(Counters)
	s, err := NewClassicConfig(d, 2*mib, Config{Device: 1, Prop: backend.DeviceProp(1), Counters: c, PageSize: 2 * mib})
	require.NoError(t, err)
	assert.Equal(t, 1, s.Device())
	assert.Equal(t, Counters{Maps: 1, HandlesCreated: 1}, *c)
	require.NoError(t, s.Destroy())
	assert.Equal(t, Counters{Maps: 1, Unmaps: 1, HandlesCreated: 1, HandlesFreed: 1}, *c)

	bad := []struct {
		name string
		drv  backend.Driver
		size uint64
		cfg  Config
	}{
		{"nil driver", nil, mib, Config{Prop: prop0}},
		{"zero size", d, 0, Config{Prop: prop0}},
		{"huge size", d, math.MaxUint64 - 5, Config{Prop: prop0}},
		{"cache", d, mib, Config{Prop: prop0, Cache: NewHandleCache(d, ps, prop0, 1, nil)}},
		{"page size mismatch", d, 3 * mib, Config{Prop: prop0, PageSize: 2 * mib}},
		{"VA size mismatch", d, 3 * mib, Config{Prop: prop0, VASize: 8 * mib}},
		{"device mismatch", d, mib, Config{Device: 1, Prop: prop0}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewClassicConfig(tt.drv, tt.size, tt.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Nil(t, s)
		})
	}
	assert.Zero(t, d.liveReservations())
	assert.Zero(t, d.liveHandles())
}

func TestClassicRollback(t *testing.T) {
	steps := append([]faultStep{{backend.OpReserve, backend.ErrOutOfMemory}}, mapSteps...)
	for _, step := range steps {
		t.Run(step.op.String(), func(t *testing.T) {
			d := newFakeDriver()
			d.failNth(step.op, 1, step.kind)
			s, err := NewClassic(d, 0, 20*mib, prop0)
			require.ErrorIs(t, err, step.kind)
			assert.Nil(t, s)
			assert.Zero(t, d.liveHandles())
			assert.Zero(t, d.liveMappings())
			assert.Zero(t, d.liveReservations())
			assert.Empty(t, d.ruleViolations())
		})
	}

	// Rollback steps that fail leave a segment to Destroy.
	incomplete := []struct {
		name   string
		arm    func(d *fakeDriver)
		mapped int
	}{
		{"unmap fails", func(d *fakeDriver) {
			d.failNth(backend.OpSetAccess, 1, backend.ErrOutOfMemory)
			d.failNth(backend.OpUnmap, 1, backend.ErrUnavailable)
		}, 1},
		{"free fails", func(d *fakeDriver) {
			d.failNth(backend.OpMap, 1, backend.ErrOutOfMemory)
			d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
		}, 0},
		{"release fails", func(d *fakeDriver) {
			d.failNth(backend.OpCreate, 1, backend.ErrOutOfMemory)
			d.failNth(backend.OpRelease, 1, backend.ErrUnavailable)
		}, 0},
	}
	for _, tt := range incomplete {
		t.Run(tt.name, func(t *testing.T) {
			d := newFakeDriver()
			tt.arm(d)
			s, err := NewClassic(d, 0, 20*mib, prop0)
			require.ErrorIs(t, err, backend.ErrOutOfMemory)
			require.ErrorIs(t, err, backend.ErrUnavailable)
			require.NotNil(t, s)
			assert.Equal(t, tt.mapped, s.MappedPages())
			checkConsistent(t, d, s)
			require.NoError(t, s.Destroy())
			assert.Zero(t, d.liveHandles())
			assert.Zero(t, d.liveMappings())
			assert.Zero(t, d.liveReservations())
		})
	}
}
