package allocator

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// TestFreeZeroKeepsTableIntact: Free(0) is ErrInvalidPointer and leaves the
// pointer table intact. Without the guard Free(0) matched an empty slot of the pointer table, so after one call
// Check reported a corrupt live map and after ~2,000 the next Malloc spun
// forever holding the mutex.
func TestFreeZeroKeepsTableIntact(t *testing.T) {
	a, e := newAlloc(t, "")
	var live []uintptr
	for range 300 {
		p, err := a.Malloc(4096, 0)
		require.NoError(t, err)
		live = append(live, p)
	}
	before := a.Stats()
	for range 3000 {
		require.ErrorIs(t, a.Free(0), ErrUnknownPointer)
		require.ErrorIs(t, a.RecordStream(0, 0), ErrUnknownPointer)
	}
	require.NoError(t, a.Check())
	assert.Equal(t, before, a.Stats())
	for range 2000 { // the Malloc that used to hang
		p, err := a.Malloc(4096, 0)
		require.NoError(t, err)
		live = append(live, p)
	}
	for _, p := range live {
		require.NoError(t, a.Free(p))
	}
	mustCheck(t, a, e)
}

// TestBadInputTable: every bad input fails with its sentinel and changes
// neither the statistics, the snapshot, Check's verdict, nor the driver
// (the bad-input contract). The pointers cover the whole address space: 0, 1, ^0,
// unaligned, interior, freed, never handed out inside a reservation (mapped
// or not), just before and after each reservation, another allocator's.
func TestBadInputTable(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithDevices(2))
	cfg := DefaultConfig()
	cfg.Device = 1
	b, err := New(e, cfg) // another allocator over the same driver
	require.NoError(t, err)
	foreignDrv := newEmu(t, emulated.WithDevices(2))
	foreign, err := foreignDrv.StreamCreate(0)
	require.NoError(t, err)
	dev1, err := e.StreamCreate(1)
	require.NoError(t, err)
	p, err := a.Malloc(8192, 0)
	require.NoError(t, err)
	q, err := a.Malloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(q))
	big, err := a.Malloc(64<<20, 0) // large pool: its own reservation
	require.NoError(t, err)
	theirs, err := b.Malloc(4096, 0)
	require.NoError(t, err)
	destroyed, err := e.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.StreamDestroy(destroyed))

	res, maps, _ := a.Footprint()
	require.Len(t, res, 2)
	lastMapped := maps[len(maps)-1]
	before, snap, calls := a.Stats(), a.Snapshot(), e.CallCounts()
	require.NotEqual(t, p, theirs)

	type row struct {
		name string
		op   func() error
		want error
	}
	rows := []row{
		{"Malloc zero size", func() error { _, err := a.Malloc(0, 0); return err }, ErrInvalidSize},
		{"Malloc larger than device", func() error { _, err := a.Malloc(81*gib, 0); return err }, ErrInvalidSize},
		{"Malloc max size", func() error { _, err := a.Malloc(^uint64(0), 0); return err }, ErrInvalidSize},
		{"Malloc unknown stream", func() error { _, err := a.Malloc(1, backend.Stream(987654)); return err }, ErrInvalidStream},
		{"Malloc another driver's stream", func() error { _, err := a.Malloc(1, foreign+1000); return err }, ErrInvalidStream},
		{"Malloc other device's stream", func() error { _, err := a.Malloc(1, dev1); return err }, ErrInvalidStream},
		{"RecordStream other device's stream", func() error { return a.RecordStream(p, dev1) }, ErrInvalidStream},
		{"Malloc destroyed stream", func() error { _, err := a.Malloc(1, destroyed); return err }, ErrInvalidStream},
		{"Malloc idle owner's id", func() error { _, err := a.Malloc(1, idleStream); return err }, ErrInvalidStream},
		{"Free double", func() error { return a.Free(q) }, ErrDoubleFree},
		{"Free interior", func() error { return a.Free(p + 512) }, ErrInteriorPointer},
		{"Free unaligned interior", func() error { return a.Free(p + 1) }, ErrInteriorPointer},
		{"RecordStream unaligned interior", func() error { return a.RecordStream(p+7, 0) }, ErrInteriorPointer},
		{"Free interior of large", func() error { return a.Free(big + 32<<20) }, ErrInteriorPointer},
		{"Free other allocator's", func() error { return a.Free(theirs) }, ErrUnknownPointer},
		{"RecordStream unknown stream", func() error { return a.RecordStream(p, backend.Stream(987654)) }, ErrInvalidStream},
		{"RecordStream destroyed stream", func() error { return a.RecordStream(p, destroyed) }, ErrInvalidStream},
		{"RecordStream interior", func() error { return a.RecordStream(p+512, 0) }, ErrInteriorPointer},
		{"RecordStream freed", func() error { return a.RecordStream(q, 0) }, ErrDoubleFree},
		{"Synchronize unknown stream", func() error { return a.Synchronize(backend.Stream(987654)) }, ErrInvalidStream},
		{"Synchronize destroyed stream", func() error { return a.Synchronize(destroyed) }, ErrInvalidStream},
		{"ReleaseStream default", func() error { return a.ReleaseStream(0) }, ErrInvalidStream},
		{"ReleaseStream default by id", func() error { return a.ReleaseStream(a.DefaultStream()) }, ErrInvalidStream},
		{"ReleaseStream unknown", func() error { return a.ReleaseStream(backend.Stream(987654)) }, ErrInvalidStream},
		{"ReleaseStream destroyed", func() error { return a.ReleaseStream(destroyed) }, ErrInvalidStream},
	}
	// Pointers that were never handed out.
	never := map[string]uintptr{
		"0":                             0,
		"1":                             1,
		"^0":                            ^uintptr(0),
		"^0 aligned":                    ^uintptr(0) &^ 511,
		"unaligned in free memory":      q + 3,
		"past the mapped part":          lastMapped.Addr + uintptr(lastMapped.Size),
		"deep in a reservation":         res[0].Addr + uintptr(res[0].Size/2),
		"last byte of a reservation":    res[1].Addr + uintptr(res[1].Size) - 1,
		"last granule of a reservation": res[1].Addr + uintptr(res[1].Size) - 2<<20,
		"just before a reservation":     res[0].Addr - 512,
		"just after a reservation":      res[1].Addr + uintptr(res[1].Size),
	}
	for name, ptr := range never {
		rows = append(rows,
			row{"Free " + name, func() error { return a.Free(ptr) }, ErrUnknownPointer},
			row{"RecordStream " + name, func() error { return a.RecordStream(ptr, 0) }, ErrUnknownPointer})
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			err := r.op()
			require.Error(t, err)
			assert.ErrorIs(t, err, r.want)
			assert.Equal(t, before, a.Stats(), "statistics changed")
			assert.Equal(t, snap, a.Snapshot(), "blocks changed")
			require.NoError(t, a.Check())
		})
	}
	assert.Equal(t, calls, e.CallCounts(), "bad input reached the driver")
	for _, x := range []uintptr{p, big} {
		require.NoError(t, a.Free(x))
	}
	require.NoError(t, b.Free(theirs))
	require.NoError(t, b.Close())
	require.NoError(t, e.StreamDestroy(dev1))
	mustCheck(t, a, e)
}

// TestEveryMethodAfterClose: after Close every method that can fail
// returns ErrClosed, checked before any argument (Malloc(0) after Close
// is ErrClosed, not ErrInvalidSize).
func TestEveryMethodAfterClose(t *testing.T) {
	a, e := newAlloc(t, "")
	p, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	assertNoDriverState(t, e)
	before := a.Stats()
	for name, op := range map[string]func() error{
		"Malloc":            func() error { _, err := a.Malloc(1, 0); return err },
		"Malloc zero":       func() error { _, err := a.Malloc(0, 0); return err },
		"Malloc huge":       func() error { _, err := a.Malloc(^uint64(0), 0); return err },
		"Malloc bad stream": func() error { _, err := a.Malloc(1, 987654); return err },
		"Free":              func() error { return a.Free(p) },
		"Free zero":         func() error { return a.Free(0) },
		"RecordStream":      func() error { return a.RecordStream(p, s) },
		"RecordStream zero": func() error { return a.RecordStream(0, 0) },
		"EmptyCache":        a.EmptyCache,
		"Synchronize":       func() error { return a.Synchronize(0) },
		"Synchronize bad":   func() error { return a.Synchronize(987654) },
		"ReleaseStream":     func() error { return a.ReleaseStream(s) },
		"ReleaseStream bad": func() error { return a.ReleaseStream(0) },
		"Check":             a.Check,
		"Close":             a.Close,
	} {
		assert.ErrorIs(t, op(), ErrClosed, name)
	}
	assert.Equal(t, before, a.Stats())
	assert.Zero(t, a.DefaultStream(), "the default stream was destroyed")
	require.NoError(t, e.StreamDestroy(s))
}

// TestDefaultStreamRace: DefaultStream reads under the lock that Close
// writes under (run with -race).
func TestDefaultStreamRace(t *testing.T) {
	a, _ := newAlloc(t, "")
	first := a.DefaultStream()
	require.NotZero(t, first)
	var wg sync.WaitGroup
	seen := make([]backend.Stream, 1000)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range seen {
			seen[i] = a.DefaultStream()
		}
	}()
	require.NoError(t, a.Close())
	wg.Wait()
	for _, s := range seen {
		assert.Contains(t, []backend.Stream{0, first}, s)
	}
	assert.Zero(t, a.DefaultStream())
}

// TestGranularity: the allocator exposes the driver's mapping granularity,
// the unit OutOfMemoryError.Tried and reserved bytes are rounded to.
func TestGranularity(t *testing.T) {
	for _, g := range []uint64{2 << 20, 4 << 20} {
		a, _ := newAlloc(t, "large_segment_size_mb:20,small_segment_size_mb:4", emulated.WithGranularity(g), emulated.WithCapacity(1*gib))
		assert.Equal(t, g, a.Granularity())
		_, err := a.Malloc(2*gib, 0)
		require.ErrorIs(t, err, ErrInvalidSize)
		p, err := a.Malloc(1, 0)
		require.NoError(t, err)
		assert.Zero(t, a.MemoryReserved()%a.Granularity())
		var oom *OutOfMemoryError
		_, err = a.Malloc(1*gib-1, 0)
		require.ErrorAs(t, err, &oom)
		assert.Zero(t, oom.Tried%a.Granularity(), "Tried %d", oom.Tried)
		assert.GreaterOrEqual(t, oom.Tried, uint64(1*gib-1))
		require.NoError(t, a.Free(p))
		assert.Equal(t, int64(0), a.Stats().AllocatedBytes[stats.AllPools].Current)
	}
}
