package segment

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

const (
	mib = uint64(1) << 20
	gr  = 2 * mib // the fake driver's granularity, the default granule
)

var prop0 = backend.DeviceProp(0)

// newSeg makes a segment of npages pages of pageSize bytes (granule gr) on
// a fresh fake driver, with counters and optionally a cache of maxCache
// handles (maxCache < 0: no cache).
func newSeg(t *testing.T, pageSize uint64, npages, maxCache int) (*fakeDriver, *Segment, *Counters) {
	t.Helper()
	d := newFakeDriver()
	c := new(Counters)
	cfg := Config{Prop: prop0, PageSize: pageSize, VASize: uint64(npages) * pageSize, Counters: c}
	if maxCache >= 0 {
		cfg.Cache = NewHandleCache(d, pageSize, prop0, maxCache, c)
	}
	s, err := New(d, cfg)
	require.NoError(t, err)
	require.Equal(t, gr, s.Granule())
	return d, s, c
}

// handleAt is the handle mapped over byte offset off, 0 if none.
func handleAt(s *Segment, off uint64) backend.Handle {
	start, _, ok := s.HandleRange(off)
	if !ok {
		return 0
	}
	return s.hnd[start/s.gran]
}

// snapshot copies the segment's per-granule state.
type snapshot struct {
	span []int32
	hnd  []backend.Handle
}

func snap(s *Segment) snapshot {
	return snapshot{slices.Clone(s.span), slices.Clone(s.hnd)}
}

// runsMiB writes runs as [lo, hi) pairs in MiB, for readable assertions.
func runsMiB(runs []Run) [][2]uint64 {
	var out [][2]uint64
	for _, r := range runs {
		out = append(out, [2]uint64{r.Off / mib, (r.Off + r.Len) / mib})
	}
	return out
}

// checkConsistent asserts that the segment's per-granule table is well
// formed, that its view of its handles is the driver's, that every query
// agrees with the table, that nothing was leaked (every live handle is
// mapped, cached or a leftover) and that no driver rule was broken.
func checkConsistent(t *testing.T, d *fakeDriver, s *Segment) {
	t.Helper()
	require.Empty(t, d.ruleViolations(), "driver rules broken")
	if s.released {
		require.Nil(t, s.Handles())
		require.Nil(t, s.MappedRuns())
		require.Zero(t, s.HandleCount())
		require.Zero(t, s.MappedBytes())
		return
	}
	g := s.gran
	require.Len(t, s.span, int(s.size/g))
	require.Len(t, s.hnd, len(s.span))

	// The table, granule by granule.
	var handles []Run
	var total uint64
	for i := 0; i < len(s.span); {
		sp := int(s.span[i])
		require.GreaterOrEqual(t, sp, 0, "granule %d: walk landed inside a handle", i)
		if sp == 0 {
			require.Zero(t, s.hnd[i], "unmapped granule %d has a handle", i)
			i++
			continue
		}
		require.NotZero(t, s.hnd[i], "handle at granule %d", i)
		require.LessOrEqual(t, i+sp, len(s.span))
		for d := 1; d < sp; d++ {
			require.Equal(t, int32(-d), s.span[i+d], "granule %d of the handle at %d", i+d, i)
			require.Zero(t, s.hnd[i+d])
		}
		r := s.run(i, i+sp)
		require.LessOrEqual(t, r.Len, s.maxHandle, "handle larger than a page or MapLarge piece")
		if s.cut == CutAtPageGrid {
			require.Equal(t, r.Off/s.pageSize, (r.Off+r.Len-1)/s.pageSize, "handle %v crosses a page boundary", r)
		}
		handles = append(handles, r)
		total += r.Len
		i += sp
	}
	require.Equal(t, handles, s.Handles())
	require.Len(t, handles, s.HandleCount())
	require.Equal(t, total, s.MappedBytes())

	// The driver's view.
	var want []uintptr
	for _, r := range handles {
		va := s.Base() + uintptr(r.Off)
		want = append(want, va)
		m, ok := d.mapping(va)
		require.True(t, ok, "handle %v recorded as mapped but the driver has no mapping", r)
		require.Equal(t, s.hnd[r.Off/g], m.h, "handle %v", r)
		require.Equal(t, r.Len, m.size, "handle %v", r)
		if m.access != nil { // nil: SetAccess failed and so did the rollback's unmap
			require.Equal(t, s.access, m.access, "handle %v", r)
		}
	}
	require.Equal(t, want, d.mappingsIn(s.Base(), s.Size()))

	// Queries agree with the table.
	hi := 0
	for off := uint64(0); off < s.size; off += g {
		start, size, ok := s.HandleRange(off + g/2)
		require.Equal(t, s.span[off/g] != 0, ok, "offset %#x", off)
		require.Equal(t, ok, s.IsMappedAt(off))
		if ok {
			for hi < len(handles) && handles[hi].Off+handles[hi].Len <= off {
				hi++
			}
			require.Equal(t, handles[hi], Run{start, size}, "offset %#x", off)
		}
	}
	var merged []Run
	for _, r := range handles {
		if n := len(merged); n > 0 && merged[n-1].Off+merged[n-1].Len == r.Off {
			merged[n-1].Len += r.Len
		} else {
			merged = append(merged, r)
		}
	}
	require.Equal(t, merged, s.MappedRuns())

	// Handles are accounted for.
	cached := 0
	if s.cache != nil {
		cached = s.cache.Len()
		for _, h := range s.cache.handles {
			require.True(t, d.handleLive(h), "cached handle %d not live", h)
			require.Equal(t, s.pageSize, d.handleSize(h), "cached handle %d not full-size", h)
		}
	}
	for _, h := range s.leftover {
		require.True(t, d.handleLive(h), "leftover handle %d not live", h)
	}
	require.Equal(t, s.HandleCount()+cached+s.Leftovers(), d.liveHandles(), "leaked or lost handles")
}

func TestNewConfigErrors(t *testing.T) {
	d := newFakeDriver()
	zeroGran := newFakeDriver()
	zeroGran.gran = 0
	tests := []struct {
		name string
		drv  backend.Driver
		cfg  Config
		arm  func(d *fakeDriver)
		want []error
	}{
		{"nil driver", nil, Config{Prop: prop0, PageSize: gr, VASize: gr}, nil, []error{ErrInvalidConfig}},
		{"driver reports zero granularity", zeroGran, Config{Prop: prop0, PageSize: gr, VASize: gr}, nil, []error{ErrInvalidConfig}},
		{"zero page size", d, Config{Prop: prop0, VASize: gr}, nil, []error{ErrInvalidConfig}},
		{"page size not a granularity multiple", d, Config{Prop: prop0, PageSize: 3 * mib, VASize: 6 * mib}, nil, []error{ErrInvalidConfig}},
		{"granule not a granularity multiple", d, Config{Prop: prop0, Granule: 3 * mib, PageSize: 6 * mib, VASize: 6 * mib}, nil, []error{ErrInvalidConfig}},
		{"page size not a granule multiple", d, Config{Prop: prop0, Granule: 4 * mib, PageSize: 6 * mib, VASize: 12 * mib}, nil, []error{ErrInvalidConfig}},
		{"zero VA size", d, Config{Prop: prop0, PageSize: gr}, nil, []error{ErrInvalidConfig}},
		{"VA size not a page multiple", d, Config{Prop: prop0, PageSize: 4 * mib, VASize: 6 * mib}, nil, []error{ErrInvalidConfig}},
		{"too many granules", d, Config{Prop: prop0, PageSize: gr, VASize: (MaxGranules + 1) * gr}, nil, []error{ErrInvalidConfig}},
		{"device mismatch", d, Config{Device: 1, Prop: prop0, PageSize: gr, VASize: gr}, nil, []error{ErrInvalidConfig}},
		{"negative device", d, Config{Device: -1, Prop: backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}}, PageSize: gr, VASize: gr}, nil, []error{ErrInvalidConfig}},
		{"cache size mismatch", d, Config{Prop: prop0, PageSize: gr, VASize: 4 * gr, Cache: NewHandleCache(d, 2*gr, prop0, 1, nil)}, nil, []error{ErrInvalidConfig}},
		{"cache size is the granule, not the page", d, Config{Prop: prop0, PageSize: 4 * gr, VASize: 4 * gr, Cache: NewHandleCache(d, gr, prop0, 1, nil)}, nil, []error{ErrInvalidConfig}},
		{"cache prop mismatch", d, Config{Prop: prop0, PageSize: gr, VASize: 4 * gr, Cache: NewHandleCache(d, gr, backend.PhysicalProp{Location: prop0.Location, Attr: backend.PageNormal}, 1, nil)}, nil, []error{ErrInvalidConfig}},
		{"prop the driver rejects", d, Config{Prop: backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}, Attr: backend.PageHuge1G}, PageSize: gr, VASize: gr}, nil,
			[]error{ErrInvalidConfig, backend.ErrInvalidArgument}},
		{"granularity fails", d, Config{Prop: prop0, PageSize: gr, VASize: gr},
			func(d *fakeDriver) { d.failNth(backend.OpGranularity, 1, backend.ErrUnavailable) },
			[]error{ErrInvalidConfig, backend.ErrUnavailable}},
		{"reserve fails", d, Config{Prop: prop0, PageSize: gr, VASize: gr},
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

func TestNewGranule(t *testing.T) {
	tests := []struct {
		name     string
		granule  uint64
		pageSize uint64
		want     uint64
	}{
		{"default is the driver's", 0, 20 * mib, gr},
		{"explicit driver granule", gr, 20 * mib, gr},
		{"coarser granule", 4 * mib, 20 * mib, 4 * mib},
		{"granule equals page", 8 * mib, 8 * mib, 8 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newFakeDriver()
			s, err := New(d, Config{Prop: prop0, Granule: tt.granule, PageSize: tt.pageSize, VASize: 2 * tt.pageSize})
			require.NoError(t, err)
			assert.Equal(t, tt.want, s.Granule())
			assert.Equal(t, tt.pageSize, s.PageSize())
			assert.Equal(t, 2*tt.pageSize, s.Size())
			assert.Len(t, s.span, int(2*tt.pageSize/tt.want))
			// A map on the granule grid works; off the grid it is refused.
			require.NoError(t, s.Map(tt.want, tt.want))
			if tt.want > gr {
				assert.ErrorIs(t, s.Map(tt.want+gr, gr), ErrInvalidRange)
			}
			checkConsistent(t, d, s)
			require.NoError(t, s.Destroy())
			assert.Zero(t, d.liveHandles())
		})
	}
}

func TestLifecycle(t *testing.T) {
	d, s, c := newSeg(t, gr, 8, -1)
	assert.Equal(t, uint64(8*gr), s.Size())
	assert.Equal(t, gr, s.PageSize())
	assert.Equal(t, 0, s.Device())
	assert.Equal(t, prop0, s.Prop())
	assert.False(t, s.Classic())
	assert.Equal(t, 1, d.liveReservations())
	assert.NotZero(t, s.Base())

	require.NoError(t, s.Map(0, 2*gr))
	require.NoError(t, s.Map(3*gr, gr))
	require.NoError(t, s.Map(7*gr, gr))
	checkConsistent(t, d, s)
	assert.Equal(t, 4, s.HandleCount())
	assert.Equal(t, 4*gr, s.MappedBytes())
	assert.Equal(t, []Run{{0, 2 * gr}, {3 * gr, gr}, {7 * gr, gr}}, s.MappedRuns())
	assert.Equal(t, []Run{{0, gr}, {gr, gr}, {3 * gr, gr}, {7 * gr, gr}}, s.Handles())
	seen := map[backend.Handle]bool{}
	for _, off := range []uint64{0, gr, 3 * gr, 7 * gr} {
		h := handleAt(s, off)
		require.NotZero(t, h)
		assert.False(t, seen[h], "handle %d used twice", h)
		seen[h] = true
		m, _ := d.mapping(s.Base() + uintptr(off))
		assert.Equal(t, []backend.AccessDesc{{Location: prop0.Location, Flags: backend.AccessReadWrite}}, m.access)
	}
	assert.False(t, s.IsMappedAt(2*gr))
	assert.True(t, s.IsMappedAt(3*gr+12345))
	assert.Equal(t, Counters{Maps: 4, HandlesCreated: 4}, *c)

	// Fill the hole so 0..3 become one run (of four handles).
	require.NoError(t, s.Map(2*gr, gr))
	assert.Equal(t, []Run{{0, 4 * gr}, {7 * gr, gr}}, s.MappedRuns())
	assert.Equal(t, 5, s.HandleCount())

	require.ErrorIs(t, s.Release(), ErrNotEmpty)
	done, err := s.Unmap(gr, 3*gr)
	require.NoError(t, err)
	assert.Equal(t, 3*gr, done)
	assert.Equal(t, []Run{{0, gr}, {7 * gr, gr}}, s.MappedRuns())
	checkConsistent(t, d, s)
	for _, off := range []uint64{0, 7 * gr} {
		done, err = s.Unmap(off, gr)
		require.NoError(t, err)
		assert.Equal(t, gr, done)
	}
	assert.Nil(t, s.MappedRuns())
	assert.Nil(t, s.Handles())
	assert.Equal(t, Counters{Maps: 5, Unmaps: 5, HandlesCreated: 5, HandlesFreed: 5}, *c)
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveMappings())

	require.NoError(t, s.Release())
	assert.True(t, s.Released())
	assert.Zero(t, d.liveReservations())
	assert.Empty(t, d.ruleViolations())

	// A dead segment refuses everything and reports nothing mapped.
	assert.ErrorIs(t, s.Map(0, gr), ErrReleased)
	_, err = s.Unmap(0, gr)
	assert.ErrorIs(t, err, ErrReleased)
	assert.ErrorIs(t, s.Release(), ErrReleased)
	assert.ErrorIs(t, s.Destroy(), ErrReleased)
	assert.False(t, s.IsMappedAt(0))
	_, _, ok := s.HandleRange(0)
	assert.False(t, ok)
	lo, hi := s.WholeHandles(0, gr, math.MaxUint64)
	assert.Equal(t, lo, hi)
	assert.Zero(t, s.HandleCount())
	assert.Nil(t, s.MappedRuns())
	checkConsistent(t, d, s)
	assert.Equal(t, 1, d.count(backend.OpRelease))
}

func TestQueriesOutOfRange(t *testing.T) {
	_, s, _ := newSeg(t, 4*gr, 2, -1)
	require.NoError(t, s.Map(gr, 3*gr)) // [2, 8) MiB: [2, 8)
	tests := []struct {
		off        uint64
		mapped     bool
		start, len uint64
	}{
		{0, false, 0, 0},
		{gr - 1, false, 0, 0},
		{gr, true, gr, 3 * gr},
		{4*gr - 1, true, gr, 3 * gr},
		{4 * gr, false, 0, 0},
		{s.Size() - 1, false, 0, 0},
		{s.Size(), false, 0, 0},
		{math.MaxUint64, false, 0, 0},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.mapped, s.IsMappedAt(tt.off), "offset %#x", tt.off)
		start, n, ok := s.HandleRange(tt.off)
		assert.Equal(t, tt.mapped, ok, "offset %#x", tt.off)
		assert.Equal(t, tt.start, start, "offset %#x", tt.off)
		assert.Equal(t, tt.len, n, "offset %#x", tt.off)
	}
}

func TestCustomAccess(t *testing.T) {
	d := newFakeDriver()
	access := []backend.AccessDesc{
		{Location: backend.Location{Type: backend.LocationDevice, ID: 0}, Flags: backend.AccessReadWrite},
		{Location: backend.Location{Type: backend.LocationDevice, ID: 1}, Flags: backend.AccessRead},
	}
	s, err := New(d, Config{Prop: prop0, PageSize: 2 * gr, VASize: 4 * gr, Access: access})
	require.NoError(t, err)
	access[1].Flags = backend.AccessNone // the segment keeps its own copy
	require.NoError(t, s.Map(gr, 3*gr))  // [2, 4) odd, [4, 8) full
	for _, off := range []uint64{gr, 2 * gr} {
		f, err := d.GetAccess(s.Base()+uintptr(off)+1, access[1].Location)
		require.NoError(t, err)
		assert.Equal(t, backend.AccessRead, f, "offset %#x", off)
	}
	m, ok := d.mapping(s.Base() + uintptr(2*gr))
	require.True(t, ok)
	assert.Equal(t, 2*gr, m.size, "one full handle per 4 MiB page")
	checkConsistent(t, d, s)
	require.NoError(t, s.Destroy())
	assert.Zero(t, d.liveHandles())
}

// TestMapCutsAtPageBoundaries maps ranges of a segment with 20 MiB pages
// and 2 MiB granules, with two full-size handles waiting in the cache, and
// checks the handles created: one per piece between page boundaries, full
// ones from the cache first, odd ones fresh.
func TestMapCutsAtPageBoundaries(t *testing.T) {
	const page = 20 * mib
	tests := []struct {
		name    string
		cut     CutPolicy
		off, n  uint64      // MiB
		handles [][2]uint64 // [lo, hi) in MiB
	}{
		{"head, page, tail", CutAtPageGrid, 6, 50, [][2]uint64{{6, 20}, {20, 40}, {40, 56}}},
		{"aligned pages", CutAtPageGrid, 0, 40, [][2]uint64{{0, 20}, {20, 40}}},
		{"inside one page", CutAtPageGrid, 4, 10, [][2]uint64{{4, 14}}},
		{"one granule", CutAtPageGrid, 20, 2, [][2]uint64{{20, 22}}},
		{"one granule at the end", CutAtPageGrid, 98, 2, [][2]uint64{{98, 100}}},
		{"straddles a page boundary", CutAtPageGrid, 18, 4, [][2]uint64{{18, 20}, {20, 22}}},
		{"aligned start, odd tail", CutAtPageGrid, 20, 30, [][2]uint64{{20, 40}, {40, 50}}},
		{"odd head, aligned end", CutAtPageGrid, 10, 30, [][2]uint64{{10, 20}, {20, 40}}},
		{"odd head and tail, three pages", CutAtPageGrid, 2, 96, [][2]uint64{{2, 20}, {20, 40}, {40, 60}, {60, 80}, {80, 98}}},
		{"whole segment", CutAtPageGrid, 0, 100, [][2]uint64{{0, 20}, {20, 40}, {40, 60}, {60, 80}, {80, 100}}},
	}
	// CutFromStart: full handles from the start of the range, one odd tail.
	fromStart := []struct {
		name    string
		off, n  uint64
		handles [][2]uint64
	}{
		{"from start: pages, tail", 6, 50, [][2]uint64{{6, 26}, {26, 46}, {46, 56}}},
		{"from start: aligned pages", 0, 40, [][2]uint64{{0, 20}, {20, 40}}},
		{"from start: inside one page", 4, 10, [][2]uint64{{4, 14}}},
		{"from start: straddles the grid", 18, 4, [][2]uint64{{18, 22}}},
		{"from start: odd tail", 2, 96, [][2]uint64{{2, 22}, {22, 42}, {42, 62}, {62, 82}, {82, 98}}},
	}
	for _, f := range fromStart {
		tests = append(tests, struct {
			name    string
			cut     CutPolicy
			off, n  uint64
			handles [][2]uint64
		}{f.name, CutFromStart, f.off, f.n, f.handles})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, s, c := newSeg(t, page, 5, 4)
			s.cut = tt.cut
			require.NoError(t, s.Map(0, 2*page))
			cachedBefore := []backend.Handle{handleAt(s, 0), handleAt(s, page)}
			_, err := s.Unmap(0, 2*page)
			require.NoError(t, err)
			require.Equal(t, cachedBefore, s.cache.handles)
			cBefore := *c

			require.NoError(t, s.Map(tt.off*mib, tt.n*mib))
			assert.Equal(t, tt.handles, runsMiB(s.Handles()))
			full, reused := 0, 0
			for _, r := range s.Handles() {
				h := handleAt(s, r.Off)
				assert.Equal(t, r.Len, d.handleSize(h))
				fromCache := slices.Contains(cachedBefore, h)
				if r.Len == page {
					full++
					// Last cached, first reused.
					if full <= len(cachedBefore) {
						assert.Equal(t, cachedBefore[len(cachedBefore)-full], h, "full handle %d", full)
						reused++
					}
				} else {
					assert.False(t, fromCache, "odd handle %v came from the cache", r)
				}
			}
			assert.Equal(t, cachedBefore[:len(cachedBefore)-reused], s.cache.handles, "handles left in the cache")
			assert.Equal(t, Counters{
				Maps:           int64(len(tt.handles)),
				HandlesCreated: int64(len(tt.handles) - reused),
				HandlesReused:  int64(reused),
			}, Counters{
				Maps:           c.Maps - cBefore.Maps,
				HandlesCreated: c.HandlesCreated - cBefore.HandlesCreated,
				HandlesReused:  c.HandlesReused - cBefore.HandlesReused,
			})
			assert.Equal(t, tt.n*mib, s.MappedBytes())
			checkConsistent(t, d, s)

			require.NoError(t, s.Destroy())
			require.NoError(t, s.cache.Trim(0))
			assert.Zero(t, d.liveHandles())
		})
	}
}

// TestUnmapWholeHandles unmaps handle-aligned ranges of [6, 56) MiB mapped
// as [6, 20) [20, 40) [40, 56): the full-size handle goes to the cache, the
// odd ones back to the driver.
func TestUnmapWholeHandles(t *testing.T) {
	const page = 20 * mib
	tests := []struct {
		name   string
		off, n uint64      // MiB
		left   [][2]uint64 // handles still mapped, MiB
		cached int         // handles in the cache afterwards
	}{
		{"odd head", 6, 14, [][2]uint64{{20, 40}, {40, 56}}, 0},
		{"full middle", 20, 20, [][2]uint64{{6, 20}, {40, 56}}, 1},
		{"odd tail", 40, 16, [][2]uint64{{6, 20}, {20, 40}}, 0},
		{"head and middle", 6, 34, [][2]uint64{{40, 56}}, 1},
		{"middle and tail", 20, 36, [][2]uint64{{6, 20}}, 1},
		{"all", 6, 50, nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, s, c := newSeg(t, page, 5, 4)
			require.NoError(t, s.Map(6*mib, 50*mib))
			before := map[uint64]backend.Handle{}
			for _, r := range s.Handles() {
				before[r.Off] = handleAt(s, r.Off)
			}
			done, err := s.Unmap(tt.off*mib, tt.n*mib)
			require.NoError(t, err)
			assert.Equal(t, tt.n*mib, done)
			assert.Equal(t, tt.left, runsMiB(s.Handles()))
			assert.Equal(t, tt.cached, s.cache.Len())
			for off, h := range before {
				gone := off >= tt.off*mib && off < (tt.off+tt.n)*mib
				switch {
				case !gone:
					assert.Equal(t, h, handleAt(s, off))
				case off == 20*mib:
					assert.Equal(t, []backend.Handle{h}, s.cache.handles, "full handle cached")
				default:
					assert.False(t, d.handleLive(h), "odd handle at %d MiB not freed", off/mib)
				}
			}
			assert.Equal(t, int64(len(before)-len(tt.left)), c.Unmaps)
			assert.Equal(t, int64(len(before)-len(tt.left)-tt.cached), c.HandlesFreed)
			checkConsistent(t, d, s)
		})
	}
}

func TestBadRangesChangeNothing(t *testing.T) {
	// 8 MiB pages; [6, 20) MiB is mapped as [6, 8) [8, 16) [16, 20).
	d, s, c := newSeg(t, 4*gr, 4, 2)
	require.NoError(t, s.Map(3*gr, 7*gr))
	require.Equal(t, [][2]uint64{{6, 8}, {8, 16}, {16, 20}}, runsMiB(s.Handles()))
	topGran := uint64(math.MaxUint64) / gr * gr
	tests := []struct {
		name   string
		unmap  bool
		off, n uint64
		want   error
	}{
		{"map unaligned offset", false, 1, gr, ErrInvalidRange},
		{"map unaligned length", false, 0, gr + 4096, ErrInvalidRange},
		{"map zero length", false, 0, 0, ErrInvalidRange},
		{"map at end", false, 16 * gr, gr, ErrOutOfRange},
		{"map past end", false, 15 * gr, 2 * gr, ErrOutOfRange},
		{"map overflowing range", false, gr, topGran, ErrOutOfRange},
		{"map far offset", false, topGran, gr, ErrOutOfRange},
		{"map mapped granule", false, 4 * gr, gr, ErrAlreadyMapped},
		{"map overlapping start", false, 2 * gr, 2 * gr, ErrAlreadyMapped},
		{"map overlapping end", false, 9 * gr, 2 * gr, ErrAlreadyMapped},
		{"map covering the mapping", false, 0, 16 * gr, ErrAlreadyMapped},
		{"unmap unaligned offset", true, 3*gr + 512, gr, ErrInvalidRange},
		{"unmap unaligned length", true, 3 * gr, 1, ErrInvalidRange},
		{"unmap zero length", true, 3 * gr, 0, ErrInvalidRange},
		{"unmap past end", true, 3 * gr, 14 * gr, ErrOutOfRange},
		{"unmap overflowing range", true, 3 * gr, topGran, ErrOutOfRange},
		{"unmap unmapped granule", true, 0, gr, ErrNotMapped},
		{"unmap partly mapped (end)", true, 8 * gr, 3 * gr, ErrNotMapped},
		{"unmap partly mapped (start)", true, 2 * gr, 2 * gr, ErrNotMapped},
		{"unmap start inside a handle", true, 5 * gr, 3 * gr, ErrInvalidRange},
		{"unmap end inside a handle", true, 3 * gr, 2 * gr, ErrInvalidRange},
		{"unmap both inside a handle", true, 5 * gr, gr, ErrInvalidRange},
		{"unmap end inside the full handle", true, 4 * gr, gr, ErrInvalidRange},
		{"unmap end inside the tail handle", true, 8 * gr, gr, ErrInvalidRange},
		{"unmap whole handles, then inside", true, 3 * gr, 6 * gr, ErrInvalidRange},
		{"unmap whole handles, then unmapped", true, 3 * gr, 8 * gr, ErrNotMapped},
	}
	st, err := d.StreamCreate(0)
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snap(s)
			cBefore, logBefore := *c, d.logLen()
			if tt.unmap {
				done, err := s.Unmap(tt.off, tt.n, st)
				require.ErrorIs(t, err, tt.want)
				assert.Zero(t, done)
			} else {
				require.ErrorIs(t, s.Map(tt.off, tt.n), tt.want)
			}
			assert.Equal(t, before, snap(s))
			assert.Equal(t, cBefore, *c)
			assert.Equal(t, logBefore, d.logLen(), "driver called: %v", d.ops(logBefore))
			checkConsistent(t, d, s)
		})
	}
}

func TestWholeHandles(t *testing.T) {
	// 20 MiB pages; [6, 100) MiB mapped as
	// [6, 20) [20, 40) [40, 56) [56, 60) [60, 80) [80, 100).
	_, s, _ := newSeg(t, 20*mib, 5, -1)
	require.NoError(t, s.Map(6*mib, 50*mib))
	require.NoError(t, s.Map(56*mib, 4*mib))
	require.NoError(t, s.Map(60*mib, 40*mib))
	require.Equal(t, [][2]uint64{{6, 20}, {20, 40}, {40, 56}, {56, 60}, {60, 80}, {80, 100}}, runsMiB(s.Handles()))
	const all = math.MaxUint64
	tests := []struct {
		name          string
		off, n, limit uint64 // bytes
		lo, hi        uint64 // MiB, or none
		none          bool
	}{
		{"inside one handle", 22 * mib, 10 * mib, all, 0, 0, true},
		{"inside one handle, unaligned", 21*mib + 512, 4096, all, 0, 0, true},
		{"one whole handle", 20 * mib, 20 * mib, all, 20, 40, false},
		{"two whole handles and parts of others", 10 * mib, 48 * mib, all, 20, 56, false},
		{"unaligned ends", 6*mib + 512, 50 * mib, all, 20, 56, false},
		{"every handle", 6 * mib, 94 * mib, all, 6, 100, false},
		{"limit trims from the low side", 6 * mib, 94 * mib, 30 * mib, 60, 100, false},
		{"limit equal to a suffix", 6 * mib, 94 * mib, 40 * mib, 60, 100, false},
		{"limit of one byte", 6 * mib, 94 * mib, 1, 80, 100, false},
		{"limit reaching an odd handle", 6 * mib, 54 * mib, 10 * mib, 40, 60, false},
		{"limit above the whole", 6 * mib, 94 * mib, 1000 * mib, 6, 100, false},
		{"limit equal to the whole", 6 * mib, 94 * mib, 94 * mib, 6, 100, false},
		{"zero limit", 6 * mib, 94 * mib, 0, 0, 0, true},
		{"zero length", 20 * mib, 0, all, 0, 0, true},
		{"past the end is clamped", 80 * mib, 1 << 40, all, 80, 100, false},
		{"offset out of range", 100 * mib, mib, all, 0, 0, true},
		{"unmapped head skipped", 0, 30 * mib, all, 6, 20, false},
		{"nothing mapped", 0, 6 * mib, all, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lo, hi := s.WholeHandles(tt.off, tt.n, tt.limit)
			if tt.none {
				assert.Equal(t, [2]uint64{tt.off, tt.off}, [2]uint64{lo, hi})
				return
			}
			assert.Equal(t, [2]uint64{tt.lo * mib, tt.hi * mib}, [2]uint64{lo, hi})
		})
	}

	// A hole stops the run: the result is always a valid Unmap range.
	done, err := s.Unmap(56*mib, 4*mib)
	require.NoError(t, err)
	require.Equal(t, 4*mib, done)
	lo, hi := s.WholeHandles(6*mib, 94*mib, all)
	assert.Equal(t, [2]uint64{6 * mib, 56 * mib}, [2]uint64{lo, hi})
	lo, hi = s.WholeHandles(50*mib, 50*mib, all)
	assert.Equal(t, [2]uint64{60 * mib, 100 * mib}, [2]uint64{lo, hi})
	done, err = s.Unmap(lo, hi-lo)
	require.NoError(t, err)
	assert.Equal(t, 40*mib, done)
}

func TestLargeHandles(t *testing.T) {
	// 20 MiB pages; [6, 100) MiB mapped as
	// [6, 20) [20, 40) [40, 56) [56, 60) [60, 80) [80, 100).
	_, s, _ := newSeg(t, 20*mib, 5, -1)
	require.NoError(t, s.Map(6*mib, 50*mib))
	require.NoError(t, s.Map(56*mib, 4*mib))
	require.NoError(t, s.Map(60*mib, 40*mib))
	tests := []struct {
		name         string
		off, n, size uint64 // bytes
		lo, hi       uint64 // MiB, or none
		none         bool
	}{
		{"pages over 16 MiB, whole range", 6 * mib, 94 * mib, 16 * mib, 20, 100, false},
		{"handles between large ones come along", 30 * mib, 70 * mib, 16 * mib, 60, 100, false},
		{"over 14 MiB from the start", 6 * mib, 50 * mib, 14 * mib, 20, 56, false},
		{"over 13 MiB takes the odd head", 6 * mib, 50 * mib, 13 * mib, 6, 56, false},
		{"none larger", 6 * mib, 94 * mib, 20 * mib, 0, 0, true},
		{"only small whole handles", 50 * mib, 12 * mib, 3 * mib, 56, 60, false},
		{"large handle cut by the range", 25 * mib, 30 * mib, 16 * mib, 0, 0, true},
		{"empty", 20 * mib, 0, 0, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lo, hi := s.LargeHandles(tt.off, tt.n, tt.size)
			if tt.none {
				assert.Equal(t, [2]uint64{tt.off, tt.off}, [2]uint64{lo, hi})
				return
			}
			assert.Equal(t, [2]uint64{tt.lo * mib, tt.hi * mib}, [2]uint64{lo, hi})
		})
	}
}

// TestWholeHandlesMany checks WholeHandles over thousands of handles
// against a brute-force answer.
func TestWholeHandlesMany(t *testing.T) {
	const pages = 4096
	_, s, _ := newSeg(t, 4*gr, pages, -1)
	// Every 4 pages: [0, 2) and [2, 8) MiB odd, then three full pages.
	for off := uint64(0); off < s.Size(); off += 16 * gr {
		require.NoError(t, s.Map(off, gr))
		require.NoError(t, s.Map(off+gr, 15*gr))
	}
	require.Equal(t, s.Size(), s.MappedBytes())
	handles := s.Handles()
	require.Equal(t, pages/4*5, len(handles))
	for _, tt := range []struct{ off, n, limit uint64 }{
		{0, s.Size(), math.MaxUint64},
		{gr / 2, s.Size() - gr, math.MaxUint64},
		{3 * gr, s.Size() - 5*gr, 1000 * gr},
		{777 * gr, 5000 * gr, 3*gr + 1},
		{0, s.Size(), 1},
	} {
		lo, hi := s.WholeHandles(tt.off, tt.n, tt.limit)
		wlo, whi := bruteWholeHandles(handles, tt.off, tt.n, tt.limit)
		assert.Equal(t, [2]uint64{wlo, whi}, [2]uint64{lo, hi}, "%+v", tt)
	}
}

// bruteWholeHandles is WholeHandles computed from the handle list: the first
// run of adjacent handles wholly inside [off, off+n), trimmed from the low
// side to the smallest suffix of at least limit bytes.
func bruteWholeHandles(handles []Run, off, n, limit uint64) (lo, hi uint64) {
	end := off + n
	if end < off {
		end = math.MaxUint64
	}
	var run []Run
	for _, h := range handles {
		inside := h.Off >= off && h.Off+h.Len <= end
		switch {
		case inside && (len(run) == 0 || run[len(run)-1].Off+run[len(run)-1].Len == h.Off):
			run = append(run, h)
		case len(run) > 0:
			goto done
		}
	}
done:
	if len(run) == 0 {
		return off, off
	}
	hi = run[len(run)-1].Off + run[len(run)-1].Len
	lo = run[0].Off
	if limit < hi-lo {
		if limit == 0 {
			return off, off
		}
		for i := len(run) - 1; i >= 0; i-- {
			if hi-run[i].Off >= limit {
				lo = run[i].Off
				break
			}
		}
	}
	return lo, hi
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

// TestMapRollback injects a failure at every step of every handle of a map
// cut into an odd head, two full pages and an odd tail, with and without
// full handles waiting in the cache, and checks that the call leaves no
// trace.
func TestMapRollback(t *testing.T) {
	const page = 2 * gr // 4 MiB pages
	const pieces = 4    // [2, 4) [4, 8) [8, 12) [12, 14) MiB
	for _, cached := range []int{0, 1, 2} {
		for _, step := range mapSteps {
			calls := pieces
			if step.op == backend.OpCreate {
				calls = pieces - cached
			}
			for k := 1; k <= calls; k++ {
				t.Run(step.op.String()+"/cached="+itoa(cached)+"/call="+itoa(k), func(t *testing.T) {
					d, s, c := newSeg(t, page, 12, 4)
					require.NoError(t, s.Map(11*page, page)) // an unrelated handle that must survive
					if cached > 0 {
						require.NoError(t, s.Map(6*page, uint64(cached)*page))
						_, err := s.Unmap(6*page, uint64(cached)*page)
						require.NoError(t, err)
					}
					cacheBefore := slices.Clone(s.cache.handles)
					require.Len(t, cacheBefore, cached)
					cBefore := *c
					liveBefore := d.liveHandles()
					last := handleAt(s, 11*page)
					before := snap(s)

					d.failNth(step.op, k, step.kind)
					err := s.Map(gr, 6*gr)
					require.Error(t, err)
					assert.ErrorIs(t, err, step.kind)
					var be *backend.Error
					require.ErrorAs(t, err, &be)
					assert.Equal(t, step.op, be.Op)

					assert.Equal(t, before, snap(s))
					assert.Equal(t, 1, s.HandleCount())
					assert.Equal(t, last, handleAt(s, 11*page))
					assert.Equal(t, cacheBefore, s.cache.handles, "cache content or order changed")
					assert.Equal(t, liveBefore, d.liveHandles())
					assert.Equal(t, 1, d.liveMappings())
					assert.Equal(t, cBefore.HandlesReused, c.HandlesReused)
					assert.Equal(t, c.Maps-cBefore.Maps, c.Unmaps-cBefore.Unmaps, "maps not all undone")
					assert.Equal(t, c.HandlesCreated-cBefore.HandlesCreated, c.HandlesFreed-cBefore.HandlesFreed)
					assert.Zero(t, s.Leftovers())
					checkConsistent(t, d, s)

					// The range is usable afterwards.
					require.NoError(t, s.Map(gr, 6*gr))
					assert.Equal(t, int64(cached), c.HandlesReused-cBefore.HandlesReused)
					assert.Equal(t, [][2]uint64{{2, 4}, {4, 8}, {8, 12}, {12, 14}, {44, 48}}, runsMiB(s.Handles()))
					require.NoError(t, s.Destroy())
					require.NoError(t, s.cache.Trim(0))
					assert.Zero(t, d.liveHandles())
				})
			}
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestMapRollbackUnmapFails makes a map fail at SetAccess and then the
// rollback's unmap of one handle fail: that handle must stay recorded as
// mapped, with its handle, and the rest be undone.
func TestMapRollbackUnmapFails(t *testing.T) {
	const page = 2 * gr // Map(2 MiB, 12 MiB) is [2, 4) [4, 8) [8, 12) [12, 14)
	tests := []struct {
		name         string
		cached       int
		setAccessNth int // SetAccess call that fails
		unmapNth     int // rollback Unmap call that fails (undone last first)
		stays        [2]uint64
		reused       int64 // HandlesReused afterwards
		cacheLeft    int
	}{
		{"full handle stays", 0, 3, 1, [2]uint64{8, 12}, 0, 0},
		{"odd head stays", 0, 4, 4, [2]uint64{2, 4}, 0, 0},
		{"odd tail stays", 0, 4, 1, [2]uint64{12, 14}, 0, 0},
		{"cached handle stays", 2, 3, 1, [2]uint64{8, 12}, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, s, c := newSeg(t, page, 6, 4)
			if tt.cached > 0 {
				require.NoError(t, s.Map(4*page, uint64(tt.cached)*page))
				_, err := s.Unmap(4*page, uint64(tt.cached)*page)
				require.NoError(t, err)
			}
			d.failNth(backend.OpSetAccess, tt.setAccessNth, backend.ErrOutOfMemory)
			d.failNth(backend.OpUnmap, tt.unmapNth, backend.ErrUnavailable)
			err := s.Map(gr, 6*gr)
			require.Error(t, err)
			assert.ErrorIs(t, err, backend.ErrOutOfMemory)
			assert.ErrorIs(t, err, backend.ErrUnavailable)
			assert.Equal(t, [][2]uint64{tt.stays}, runsMiB(s.Handles()))
			assert.Equal(t, tt.reused, c.HandlesReused)
			assert.Equal(t, tt.cacheLeft, s.cache.Len())
			assert.Zero(t, s.Leftovers())
			checkConsistent(t, d, s)

			done, err := s.Unmap(tt.stays[0]*mib, (tt.stays[1]-tt.stays[0])*mib)
			require.NoError(t, err)
			assert.Equal(t, (tt.stays[1]-tt.stays[0])*mib, done)
			require.NoError(t, s.Release())
			require.NoError(t, s.cache.Trim(0))
			assert.Zero(t, d.liveHandles())
			assert.Zero(t, d.liveReservations())
		})
	}
}

// TestMapRollbackFreeFails makes a map fail creating a handle and then the
// rollback's free of a created handle fail: an odd handle is kept as a
// leftover, a full one in the cache when there is one.
func TestMapRollbackFreeFails(t *testing.T) {
	// Map(2 MiB, 12 MiB) creates [2, 4), [4, 8), then fails on [8, 12); the
	// rollback frees [2, 4) (free 1) and [4, 8) (free 2).
	tests := []struct {
		name      string
		withCache bool
		freeNth   int
		leftovers int
		cached    int
	}{
		{"odd, no cache", false, 1, 1, 0},
		{"odd, cache", true, 1, 1, 0},
		{"full, no cache", false, 2, 1, 0},
		{"full, cache", true, 2, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			maxCache := -1
			if tt.withCache {
				maxCache = 8
			}
			d, s, _ := newSeg(t, 2*gr, 4, maxCache)
			d.failNth(backend.OpCreate, 3, backend.ErrOutOfMemory)
			d.failNth(backend.OpFree, tt.freeNth, backend.ErrUnavailable)
			err := s.Map(gr, 6*gr)
			require.Error(t, err)
			assert.ErrorIs(t, err, backend.ErrOutOfMemory)
			assert.ErrorIs(t, err, ErrHandleNotFreed)
			assert.Zero(t, s.HandleCount())
			assert.Equal(t, 1, d.liveHandles())
			assert.Equal(t, tt.leftovers, s.Leftovers())
			if tt.withCache {
				assert.Equal(t, tt.cached, s.cache.Len())
			}
			checkConsistent(t, d, s)
			if tt.withCache {
				require.NoError(t, s.cache.Trim(0))
			}
			require.NoError(t, s.Release())
			assert.Zero(t, s.Leftovers())
			assert.Zero(t, d.liveHandles())
		})
	}
}

// TestUnmapFailsAtHandle makes the driver's Unmap fail at each handle of
// [2, 4) [4, 8) [8, 12) [12, 14) MiB in turn: done must end at that
// handle, which stays mapped with those after it.
func TestUnmapFailsAtHandle(t *testing.T) {
	bounds := []uint64{2 * mib, 4 * mib, 8 * mib, 12 * mib, 14 * mib}
	for k := 1; k < len(bounds); k++ {
		t.Run("handle="+itoa(k), func(t *testing.T) {
			d, s, c := newSeg(t, 2*gr, 4, -1)
			require.NoError(t, s.Map(gr, 6*gr))
			before := snap(s)
			d.failNth(backend.OpUnmap, k, backend.ErrUnavailable)
			done, err := s.Unmap(gr, 6*gr)
			require.ErrorIs(t, err, backend.ErrUnavailable)
			assert.Equal(t, bounds[k-1]-gr, done)
			for i := range bounds[:len(bounds)-1] {
				assert.Equal(t, i >= k-1, s.IsMappedAt(bounds[i]), "handle %d", i+1)
			}
			from := bounds[k-1] / gr
			assert.Equal(t, before.span[from:], s.span[from:], "the rest is as it was")
			assert.Equal(t, before.hnd[from:], s.hnd[from:])
			assert.Equal(t, int64(k-1), c.Unmaps)
			assert.Equal(t, int64(k-1), c.HandlesFreed)
			checkConsistent(t, d, s)

			rest := 6*gr - done
			done, err = s.Unmap(gr+done, rest)
			require.NoError(t, err)
			assert.Equal(t, rest, done)
			require.NoError(t, s.Release())
			assert.Zero(t, d.liveHandles())
		})
	}
}

// TestUnmapFreeThenUnmapFails makes a FreePhysical fail and then a later
// driver Unmap of the same call: done ends before the handle whose unmap
// failed, and the error reports both failures.
func TestUnmapFreeThenUnmapFails(t *testing.T) {
	d, s, _ := newSeg(t, 2*gr, 4, -1)
	require.NoError(t, s.Map(gr, 6*gr)) // [2, 4) [4, 8) [8, 12) [12, 14)
	head := handleAt(s, gr)
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	d.failNth(backend.OpUnmap, 3, backend.ErrOutOfMemory)
	done, err := s.Unmap(gr, 6*gr)
	assert.ErrorIs(t, err, ErrHandleNotFreed)
	assert.ErrorIs(t, err, backend.ErrUnavailable)
	assert.ErrorIs(t, err, backend.ErrOutOfMemory)
	assert.Equal(t, 3*gr, done, "[2, 8) unmapped")
	assert.Equal(t, [][2]uint64{{8, 12}, {12, 14}}, runsMiB(s.Handles()))
	assert.Equal(t, []backend.Handle{head}, s.leftover)
	checkConsistent(t, d, s)
	require.NoError(t, s.Destroy())
	assert.Zero(t, d.liveHandles())
}

// TestUnmapFreeFailsKeepsHandle makes one FreePhysical of an Unmap fail:
// every handle is unmapped all the same, and the handle is kept: an odd
// one as a leftover, a full one in the cache when there is one.
func TestUnmapFreeFailsKeepsHandle(t *testing.T) {
	// Map(2 MiB, 6 MiB) is [2, 4) odd and [4, 8) full. With a cache of
	// limit 0 every handle is freed at once, so frees 1, 2 are the handles'.
	tests := []struct {
		name      string
		maxCache  int
		freeNth   int
		lostOff   uint64
		leftovers int
		cached    int
	}{
		{"odd, no cache", -1, 1, gr, 1, 0},
		{"full, no cache", -1, 2, 2 * gr, 1, 0},
		{"odd, full cache", 0, 1, gr, 1, 0},
		{"full, full cache", 0, 2, 2 * gr, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, s, c := newSeg(t, 2*gr, 4, tt.maxCache)
			require.NoError(t, s.Map(gr, 3*gr))
			lost := handleAt(s, tt.lostOff)
			d.failNth(backend.OpFree, tt.freeNth, backend.ErrUnavailable)
			done, err := s.Unmap(gr, 3*gr)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrHandleNotFreed)
			assert.ErrorIs(t, err, backend.ErrUnavailable)
			assert.Equal(t, 3*gr, done, "the handles are unmapped all the same")
			assert.Zero(t, s.HandleCount())
			assert.Equal(t, tt.leftovers, s.Leftovers())
			if tt.leftovers > 0 {
				assert.Equal(t, []backend.Handle{lost}, s.leftover)
			}
			if tt.cached > 0 {
				assert.Equal(t, []backend.Handle{lost}, s.cache.handles)
			}
			assert.True(t, d.handleLive(lost))
			assert.Equal(t, int64(1), c.HandlesFreed)
			checkConsistent(t, d, s)

			if tt.cached > 0 {
				require.NoError(t, s.cache.Trim(0))
			} else {
				// Release retries the leftover; while it keeps failing
				// the segment stays alive.
				d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
				require.ErrorIs(t, s.Release(), ErrHandleNotFreed)
				assert.False(t, s.Released())
				assert.Equal(t, 1, d.liveReservations())
				assert.Equal(t, 1, s.Leftovers())
			}
			require.NoError(t, s.Release())
			assert.Zero(t, s.Leftovers())
			assert.Zero(t, d.liveHandles())
			assert.Zero(t, d.liveReservations())
			assert.Equal(t, int64(2), c.HandlesFreed)
			assert.Empty(t, d.ruleViolations())
		})
	}
}

func TestReleaseAddressFails(t *testing.T) {
	d, s, _ := newSeg(t, gr, 2, -1)
	d.failNth(backend.OpRelease, 1, backend.ErrUnavailable)
	require.ErrorIs(t, s.Release(), backend.ErrUnavailable)
	assert.False(t, s.Released())
	require.NoError(t, s.Map(0, gr), "still usable")
	_, err := s.Unmap(0, gr)
	require.NoError(t, err)
	require.NoError(t, s.Release())
	assert.Zero(t, d.liveReservations())
}

func TestStreamsSynchronizedBeforeUnmap(t *testing.T) {
	d, s, c := newSeg(t, 2*gr, 4, -1)
	s1, err := d.StreamCreate(0)
	require.NoError(t, err)
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Map(gr, 5*gr)) // [2, 4) [4, 8) [8, 12)

	mark := d.logLen()
	done, err := s.Unmap(gr, 3*gr, s1, s2, s1)
	require.NoError(t, err)
	assert.Equal(t, 3*gr, done)
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
	done, err = s.Unmap(4*gr, 2*gr, s1, s2)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	assert.Zero(t, done)
	assert.True(t, s.IsMappedAt(4*gr))
	assert.Zero(t, countOp(d.ops(mark), backend.OpUnmap))
	assert.Equal(t, int64(3), c.StreamSyncs)
	checkConsistent(t, d, s)

	// No streams: no synchronization.
	mark = d.logLen()
	_, err = s.Unmap(4*gr, 2*gr)
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
	d, s, c := newSeg(t, gr, 8, 2)
	hc := s.cache
	require.NoError(t, s.Map(0, 3*gr))
	h0, h1, h2 := handleAt(s, 0), handleAt(s, gr), handleAt(s, 2*gr)
	_, err := s.Unmap(0, 3*gr)
	require.NoError(t, err)
	// Handles 0 and 1 filled the cache; handle 2 was freed.
	assert.Equal(t, []backend.Handle{h0, h1}, hc.handles)
	assert.False(t, d.handleLive(h2))
	assert.Equal(t, 2, hc.Len())
	assert.Equal(t, 2*gr, hc.Bytes())
	assert.Equal(t, Counters{Maps: 3, Unmaps: 3, HandlesCreated: 3, HandlesFreed: 1}, *c)

	creates := d.count(backend.OpCreate)
	require.NoError(t, s.Map(4*gr, 2*gr))
	assert.Equal(t, creates, d.count(backend.OpCreate), "no CreatePhysical while the cache has handles")
	assert.Equal(t, h1, handleAt(s, 4*gr), "last cached, first reused")
	assert.Equal(t, h0, handleAt(s, 5*gr))
	assert.Equal(t, int64(2), c.HandlesReused)
	assert.Zero(t, hc.Len())

	// One cached handle, three handles: one reused, two created.
	_, err = s.Unmap(5*gr, gr)
	require.NoError(t, err)
	require.NoError(t, s.Map(0, 3*gr))
	assert.Equal(t, h0, handleAt(s, 0))
	assert.Equal(t, creates+2, d.count(backend.OpCreate))
	assert.Equal(t, int64(3), c.HandlesReused)
	checkConsistent(t, d, s)

	require.NoError(t, s.Destroy())
	assert.Equal(t, 2, hc.Len(), "Destroy leaves handles in the shared cache")
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())
	assert.Equal(t, c.HandlesCreated, c.HandlesFreed)
}

// TestHandleCacheFullHandlesOnly checks that only full-size handles enter
// and leave the cache: odd ones are freed on Unmap and created on Map.
func TestHandleCacheFullHandlesOnly(t *testing.T) {
	const page = 20 * mib
	d, s, c := newSeg(t, page, 5, 4)
	require.NoError(t, s.Map(6*mib, 50*mib)) // [6, 20) [20, 40) [40, 56)
	odd := []backend.Handle{handleAt(s, 6*mib), handleAt(s, 40*mib)}
	full := handleAt(s, 20*mib)
	_, err := s.Unmap(6*mib, 50*mib)
	require.NoError(t, err)
	assert.Equal(t, []backend.Handle{full}, s.cache.handles)
	for _, h := range odd {
		assert.False(t, d.handleLive(h), "odd handle %d not freed", h)
	}
	assert.Equal(t, Counters{Maps: 3, Unmaps: 3, HandlesCreated: 3, HandlesFreed: 2}, *c)

	// The same range again: the full handle is reused, the odd ones made.
	require.NoError(t, s.Map(6*mib, 50*mib))
	assert.Equal(t, full, handleAt(s, 20*mib))
	assert.Equal(t, Counters{Maps: 6, Unmaps: 3, HandlesCreated: 5, HandlesFreed: 2, HandlesReused: 1}, *c)
	assert.Zero(t, s.cache.Len())

	// An odd-size range never touches the cache, even when it holds handles.
	_, err = s.Unmap(20*mib, 20*mib)
	require.NoError(t, err)
	require.Equal(t, 1, s.cache.Len())
	require.NoError(t, s.Map(60*mib, 10*mib))
	assert.Equal(t, 1, s.cache.Len())
	assert.Equal(t, int64(6), c.HandlesCreated)
	checkConsistent(t, d, s)
	require.NoError(t, s.Destroy())
	require.NoError(t, s.cache.Trim(0))
	assert.Zero(t, d.liveHandles())
}

func TestHandleCacheTrimAndMax(t *testing.T) {
	d := newFakeDriver()
	c := new(Counters)
	hc := NewHandleCache(d, gr, prop0, 3, c)
	assert.Equal(t, 3, hc.Max())
	assert.Equal(t, gr, hc.Size())
	assert.Equal(t, prop0, hc.Prop())
	s, err := New(d, Config{Prop: prop0, PageSize: gr, VASize: 4 * gr, Cache: hc, Counters: c})
	require.NoError(t, err)
	require.NoError(t, s.Map(0, 4*gr))
	_, err = s.Unmap(0, 4*gr)
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
	require.NoError(t, s.Map(0, gr))
	assert.Zero(t, hc.Len(), "the cached handle was reused")
	_, err = s.Unmap(0, gr)
	require.NoError(t, err)
	assert.Zero(t, hc.Len(), "a full cache frees at once")
	hc.SetMax(-3)
	assert.Equal(t, 0, hc.Max())

	// A full cache whose free fails keeps the handle beyond its limit.
	require.NoError(t, s.Map(0, gr))
	d.failNth(backend.OpFree, 1, backend.ErrUnavailable)
	_, err = s.Unmap(0, gr)
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
	hc := NewHandleCache(d, gr, prop0, 4, c)
	a, err := New(d, Config{Prop: prop0, PageSize: gr, VASize: 4 * gr, Cache: hc, Counters: c})
	require.NoError(t, err)
	b, err := New(d, Config{Prop: prop0, PageSize: gr, VASize: 4 * gr, Cache: hc, Counters: c})
	require.NoError(t, err)
	require.NoError(t, a.Map(0, 2*gr))
	ha := []backend.Handle{handleAt(a, 0), handleAt(a, gr)}
	require.NoError(t, a.Destroy())
	require.NoError(t, b.Map(gr, 2*gr))
	assert.ElementsMatch(t, ha, []backend.Handle{handleAt(b, gr), handleAt(b, 2*gr)})
	assert.Equal(t, int64(2), c.HandlesCreated)
	assert.Equal(t, int64(2), c.HandlesReused)
	require.NoError(t, b.Destroy())
	require.NoError(t, hc.Trim(0))
	assert.Zero(t, d.liveHandles())
	assert.Zero(t, d.liveReservations())
}

func TestDestroy(t *testing.T) {
	// 4 MiB pages; handles [0, 4) [4, 6) [10, 12) [12, 14).
	setup := func(t *testing.T) (*fakeDriver, *Segment, *Counters, backend.Stream) {
		d, s, c := newSeg(t, 2*gr, 4, -1)
		st, err := d.StreamCreate(0)
		require.NoError(t, err)
		require.NoError(t, s.Map(0, 3*gr))
		require.NoError(t, s.Map(5*gr, 2*gr))
		require.Equal(t, [][2]uint64{{0, 4}, {4, 6}, {10, 12}, {12, 14}}, runsMiB(s.Handles()))
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
		d, s, _ := newSeg(t, gr, 2, -1)
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
		assert.Equal(t, 4, s.HandleCount())
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
		assert.Equal(t, []Run{{4 * mib, 2 * mib}}, s.Handles(), "best effort: the other handles went")
		assert.Equal(t, 1, d.liveReservations())
		checkConsistent(t, d, s)
		require.NoError(t, s.Destroy(st))
		assert.True(t, s.Released())
		assert.Zero(t, d.liveHandles())
		assert.Zero(t, d.liveReservations())
	})
	t.Run("free fails", func(t *testing.T) {
		d, s, _, st := setup(t)
		// Frees 1-4 are the four handles'; free 5 is the retry of the last.
		d.failFrom(backend.OpFree, 4, 2, backend.ErrUnavailable)
		err := s.Destroy(st)
		require.ErrorIs(t, err, ErrHandleNotFreed)
		assert.False(t, s.Released(), "a handle that cannot be freed holds the segment")
		assert.Zero(t, s.HandleCount())
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
		assert.Zero(t, s.HandleCount())
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
	assert.Equal(t, gr, s.Granule())
	assert.Equal(t, 1, s.HandleCount())
	assert.Equal(t, []Run{{0, 4 * mib}}, s.MappedRuns())
	assert.Equal(t, []Run{{0, 4 * mib}}, s.Handles())
	start, size, ok := s.HandleRange(3 * mib)
	assert.True(t, ok)
	assert.Equal(t, [2]uint64{0, 4 * mib}, [2]uint64{start, size})
	lo, hi := s.WholeHandles(0, 4*mib, math.MaxUint64)
	assert.Equal(t, [2]uint64{0, 4 * mib}, [2]uint64{lo, hi})
	m, ok := d.mapping(s.Base())
	require.True(t, ok)
	assert.Equal(t, 4*mib, m.size)
	assert.Equal(t, handleAt(s, 0), m.h)
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

	// A coarser granule rounds the size to it.
	s, err = NewClassicConfig(d, 5*mib, Config{Prop: prop0, Granule: 4 * mib})
	require.NoError(t, err)
	assert.Equal(t, 8*mib, s.Size())
	assert.Equal(t, 4*mib, s.Granule())
	assert.Equal(t, []Run{{0, 8 * mib}}, s.Handles())
	checkConsistent(t, d, s)
	require.NoError(t, s.Destroy())

	bad := []struct {
		name string
		drv  backend.Driver
		size uint64
		cfg  Config
	}{
		{"nil driver", nil, mib, Config{Prop: prop0}},
		{"zero size", d, 0, Config{Prop: prop0}},
		{"huge size", d, math.MaxUint64 - 5, Config{Prop: prop0}},
		{"too many granules", d, (MaxGranules + 1) * gr, Config{Prop: prop0}},
		{"cache", d, mib, Config{Prop: prop0, Cache: NewHandleCache(d, gr, prop0, 1, nil)}},
		{"page size mismatch", d, 3 * mib, Config{Prop: prop0, PageSize: 2 * mib}},
		{"VA size mismatch", d, 3 * mib, Config{Prop: prop0, VASize: 8 * mib}},
		{"device mismatch", d, mib, Config{Device: 1, Prop: prop0}},
		{"granule not a granularity multiple", d, mib, Config{Prop: prop0, Granule: 3 * mib}},
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
		name    string
		arm     func(d *fakeDriver)
		handles int
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
			assert.Equal(t, tt.handles, s.HandleCount())
			checkConsistent(t, d, s)
			require.NoError(t, s.Destroy())
			assert.Zero(t, d.liveHandles())
			assert.Zero(t, d.liveMappings())
			assert.Zero(t, d.liveReservations())
		})
	}
}
