package pluggable_test

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/pluggable"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

const mib = 1 << 20

// newLib is a Library over a fresh two-device emulator with real memory.
func newLib(t *testing.T, conf string, opts ...emulated.Option) (*pluggable.Library, *emulated.Emulator, *bytes.Buffer) {
	t.Helper()
	e, err := emulated.New(append([]emulated.Option{emulated.WithDevices(2), emulated.WithCapacity(1 << 30), emulated.WithRealMemory()}, opts...)...)
	require.NoError(t, err)
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(t, err)
	var logged bytes.Buffer
	l := pluggable.New(pluggable.Options{Config: cfg, Driver: e, Log: &logged})
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l, e, &logged
}

func check(t *testing.T, l *pluggable.Library, devs ...int) {
	t.Helper()
	for _, d := range devs {
		a, err := l.Allocator(d)
		require.NoError(t, err)
		require.NoError(t, a.Check())
	}
}

func TestAllocFreeAcrossDevices(t *testing.T) {
	l, e, logged := newLib(t, "")
	s1, err := e.StreamCreate(1)
	require.NoError(t, err)
	p0, err := l.Alloc(3*mib, 0, 0, allocator.PoolID{})
	require.NoError(t, err)
	p1, err := l.Alloc(5000, 1, uintptr(s1), allocator.PoolID{})
	require.NoError(t, err)
	require.NotZero(t, p0)
	require.NotZero(t, p1)

	// Size 0 and NULL: nothing, no error.
	p, err := l.Alloc(0, 0, 0, allocator.PoolID{})
	require.NoError(t, err)
	assert.Zero(t, p)
	require.NoError(t, l.Free(0, 0))

	// Bad input is refused, logged, kept as the last error, and changes
	// nothing.
	cases := []struct {
		name string
		call func() error
		want error
		msg  string
	}{
		{"wrong device", func() error { return l.Free(p1, 0) }, pluggable.ErrWrongDevice, "is of device 1"},
		{"unknown pointer", func() error { return l.Free(0x1234000, 0) }, allocator.ErrUnknownPointer, ""},
		{"interior pointer", func() error { return l.Free(p0+512, 0) }, allocator.ErrInteriorPointer, ""},
		{"device out of range", func() error { _, err := l.Alloc(512, 2, 0, allocator.PoolID{}); return err }, pluggable.ErrInvalidDevice, "device 2 of 2"},
		{"negative device", func() error { return l.Free(p0, -1) }, pluggable.ErrInvalidDevice, ""},
		{"stream of another device", func() error { _, err := l.Alloc(512, 0, uintptr(s1), allocator.PoolID{}); return err }, allocator.ErrInvalidStream, ""},
		{"record on unknown pointer", func() error { return l.RecordStream(12345, 0) }, allocator.ErrUnknownPointer, ""},
		{"record with another device's stream", func() error { return l.RecordStream(p0, uintptr(s1)) }, allocator.ErrInvalidStream, ""},
		{"fraction above 1", func() error { return l.SetMemoryFraction(1.5, 0) }, allocator.ErrInvalidConfig, ""},
		{"wake an awake pool", func() error { return l.WakePool(0, allocator.PoolID{}) }, allocator.ErrPoolAwake, ""},
		{"release the default pool", func() error { return l.ReleasePool(0, allocator.PoolID{}) }, allocator.ErrInvalidPool, ""},
		{"sleep an unknown pool", func() error { return l.SleepPool(0, allocator.PoolID{0, 99}, false, false) }, allocator.ErrInvalidPool, ""},
		{"init with too many devices", func() error { return l.Init(3) }, pluggable.ErrInvalidDevice, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logged.Reset()
			before0, before1 := stat(t, l, 0), stat(t, l, 1)
			err := c.call()
			require.ErrorIs(t, err, c.want)
			assert.Contains(t, err.Error(), c.msg)
			assert.Equal(t, err.Error(), l.LastError())
			assert.Contains(t, logged.String(), "vmmalloc: "+err.Error())
			assert.Equal(t, before0, stat(t, l, 0))
			assert.Equal(t, before1, stat(t, l, 1))
			check(t, l, 0, 1)
		})
	}
	require.NoError(t, l.Free(p0, 0))
	require.NoError(t, l.Free(p1, 1))
	assert.Zero(t, stat(t, l, 0)["allocated_bytes.all.current"])
	assert.Zero(t, stat(t, l, 1)["allocated_bytes.all.current"])
	require.NoError(t, e.StreamDestroy(s1))
}

// stat is device dev's flat statistics through StatsJSON.
func stat(t *testing.T, l *pluggable.Library, dev int) map[string]int64 {
	t.Helper()
	b, err := l.StatsJSON(dev)
	require.NoError(t, err)
	var m map[string]int64
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func TestStatsJSONMatchesAllocations(t *testing.T) {
	l, _, _ := newLib(t, "")
	sizes := []uint64{512, 4096, 1 * mib, 3*mib + 1, 30 * mib}
	var ptrs []uintptr
	var want int64
	for _, n := range sizes {
		p, err := l.Alloc(n, 0, 0, allocator.PoolID{})
		require.NoError(t, err)
		ptrs = append(ptrs, p)
		want += int64(n)
	}
	m := stat(t, l, 0)
	assert.Equal(t, want, m["requested_bytes.all.current"])
	assert.Equal(t, int64(len(sizes)), m["allocation.all.current"])
	a, err := l.Allocator(0)
	require.NoError(t, err)
	assert.Equal(t, int64(a.MemoryAllocated()), m["allocated_bytes.all.current"])
	assert.Equal(t, int64(a.MemoryReserved()), m["reserved_bytes.all.current"])

	b, err := l.StatsJSON(-1)
	require.NoError(t, err)
	var all map[string]map[string]int64
	require.NoError(t, json.Unmarshal(b, &all))
	assert.Equal(t, []string{"0"}, keys(all), "only made devices")
	assert.Equal(t, want, all["0"]["requested_bytes.all.current"])
	for _, p := range ptrs {
		require.NoError(t, l.Free(p, 0))
	}
}

func keys(m map[string]map[string]int64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestMemoryFractionBeforeAndAfterUse(t *testing.T) {
	l, _, _ := newLib(t, "")
	// Device 1 is not made yet: kept for its making.
	require.NoError(t, l.SetMemoryFraction(0.25, 1))
	_, err := l.Alloc(300*mib, 1, 0, allocator.PoolID{})
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, uint64(256*mib), oom.Allowed)
	assert.Contains(t, l.LastError(), "out of memory")
	// Device 0 is made: set on its allocator.
	p, err := l.Alloc(300*mib, 0, 0, allocator.PoolID{})
	require.NoError(t, err)
	require.NoError(t, l.SetMemoryFraction(0.5, 0))
	_, err = l.Alloc(300*mib, 0, 0, allocator.PoolID{})
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, uint64(512*mib), oom.Allowed)
	require.NoError(t, l.Free(p, 0))
	check(t, l, 0, 1)
}

func TestPoolScopeSleepWake(t *testing.T) {
	l, e, _ := newLib(t, "")
	id := allocator.PoolID{0, 7}
	require.NoError(t, l.BeginPool(0, id))
	w, err := l.Alloc(4*mib, 0, 0, id) // weights
	require.NoError(t, err)
	kv, err := l.Alloc(2*mib, 0, 0, allocator.PoolID{}) // default pool: stays awake
	require.NoError(t, err)
	a, err := l.Allocator(0)
	require.NoError(t, err)
	pools := a.Pools()
	require.Len(t, pools, 2)
	assert.Equal(t, uint64(4*mib), pools[1].MemoryAllocated())

	data := bytes.Repeat([]byte("vmmalloc"), 4*mib/8)
	require.NoError(t, e.CopyHtoD(w, data, a.DefaultStream()))
	reserved := a.MemoryReserved()
	require.NoError(t, l.SleepPool(0, id, true, false))
	assert.Less(t, a.MemoryReserved(), reserved)
	_, err = l.Alloc(512, 0, 0, id)
	require.ErrorIs(t, err, allocator.ErrPoolAsleep)
	require.ErrorIs(t, l.SleepPool(0, id, true, false), allocator.ErrPoolAsleep)
	require.NoError(t, l.WakePool(0, id))
	got := make([]byte, len(data))
	require.NoError(t, e.CopyDtoH(got, w, a.DefaultStream()))
	assert.Equal(t, data, got)

	require.ErrorIs(t, l.ReleasePool(0, id), allocator.ErrPoolBusy)
	require.NoError(t, l.Free(w, 0))
	require.NoError(t, l.ReleasePool(0, id))
	assert.Len(t, a.Pools(), 1)
	require.NoError(t, l.Free(kv, 0))
	check(t, l, 0)
}

func TestSnapshotReadsBack(t *testing.T) {
	l, _, _ := newLib(t, "")
	require.NoError(t, l.RecordHistory(-1, 1000))
	p, err := l.Alloc(3*mib, 0, 0, allocator.PoolID{})
	require.NoError(t, err)
	q, err := l.Alloc(1*mib, 1, 0, allocator.PoolID{}) // made after RecordHistory: records too
	require.NoError(t, err)
	require.NoError(t, l.Free(q, 1))
	path := filepath.Join(t.TempDir(), "snap.pickle")
	require.NoError(t, l.WriteSnapshot(path))
	for dev, want := range []int{1, 2} { // device 0: one alloc; device 1: alloc and free
		f, err := os.Open(path)
		require.NoError(t, err)
		tr, err := trace.ImportPyTorchSnapshot(f, dev)
		require.NoError(t, f.Close())
		require.NoError(t, err)
		evs, err := trace.ReadAll(trace.NewSliceReader(tr.Events))
		require.NoError(t, err)
		n := 0
		for _, ev := range evs {
			if ev.Kind == trace.Alloc || ev.Kind == trace.Free {
				n++
			}
		}
		assert.Equal(t, want, n, "device %d", dev)
	}
	require.NoError(t, l.Free(p, 0))
	require.Error(t, l.WriteSnapshot(filepath.Join(t.TempDir(), "no", "such", "dir", "x")))
}

func TestConcurrentCallers(t *testing.T) {
	l, e, _ := newLib(t, "", emulated.WithCapacity(4<<30))
	const workers, rounds = 4, 200
	var streams []backend.Stream
	for i := 0; i < workers; i++ {
		s, err := e.StreamCreate(i % 2)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			dev, s := w%2, uintptr(streams[w])
			var live []uintptr
			for i := 0; i < rounds; i++ {
				n := uint64(512 + (i*7919+w*104729)%(3*mib))
				pool := allocator.PoolID{}
				if i%4 == 1 { // every fourth from the pool the device's workers share
					pool = allocator.PoolID{0, 1}
				}
				p, err := l.Alloc(n, dev, s, pool)
				if err != nil {
					errs <- err
					return
				}
				live = append(live, p)
				if i%3 == 2 {
					if err := l.RecordStream(live[0], 0); err != nil {
						errs <- err
						return
					}
					if err := l.Free(live[0], dev); err != nil {
						errs <- err
						return
					}
					live = live[1:]
				}
			}
			for _, p := range live {
				if err := l.Free(p, dev); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	check(t, l, 0, 1)
	assert.Zero(t, stat(t, l, 0)["allocation.all.current"])
	assert.Zero(t, stat(t, l, 1)["allocation.all.current"])
	for dev := 0; dev < 2; dev++ {
		require.NoError(t, l.ReleasePool(dev, allocator.PoolID{0, 1}))
	}
}

func TestUnavailableDriver(t *testing.T) {
	cfg, err := allocator.ParseConfig("backend:acl")
	require.NoError(t, err)
	t.Setenv("VMMALLOC_LIBASCENDCL", filepath.Join(t.TempDir(), "no-such-lib.so"))
	l := pluggable.New(pluggable.Options{Config: cfg, Log: io.Discard})
	_, err = l.Alloc(512, 0, 0, allocator.PoolID{})
	require.ErrorIs(t, err, pluggable.ErrUnavailable)
	assert.Contains(t, l.LastError(), "backend acl")
	require.ErrorIs(t, l.Init(1), pluggable.ErrUnavailable)
	require.NoError(t, l.Close())
}

// BenchmarkAllocFree is the cache hit through the Library: what a C call
// of vmmalloc_alloc and vmmalloc_free costs before the cgo boundary
// (cmd/libvmmalloc's replay test measures the boundary itself).
func BenchmarkAllocFree(b *testing.B) {
	e, err := emulated.New()
	require.NoError(b, err)
	l := pluggable.New(pluggable.Options{Driver: e, Log: io.Discard})
	defer l.Close()
	s, err := e.StreamCreate(0)
	require.NoError(b, err)
	p, err := l.Alloc(4096, 0, uintptr(s), allocator.PoolID{})
	require.NoError(b, err)
	require.NoError(b, l.Free(p, 0))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := l.Alloc(4096, 0, uintptr(s), allocator.PoolID{})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Free(p, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReleasePoolReturnsMemory: vmmalloc_release_pool of a pool that grew
// and freed everything gives its memory to the driver, handle cache
// included: the device's free memory is back where it was; and a pool
// slept in Memset mode reads zero after the wake.
func TestReleasePoolReturnsMemory(t *testing.T) {
	l, e, _ := newLib(t, "handle_cache_mb:512")
	id := allocator.PoolID{0, 9}
	x, err := l.Alloc(1*mib, 0, 0, allocator.PoolID{}) // makes device 0
	require.NoError(t, err)
	before, _, err := e.MemGetInfo(0)
	require.NoError(t, err)
	require.NoError(t, l.BeginPool(0, id))
	var ps []uintptr
	for _, n := range []uint64{200 * mib, 3 * mib, 100 * mib} {
		p, err := l.Alloc(n, 0, 0, id)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	a, err := l.Allocator(0)
	require.NoError(t, err)
	require.NoError(t, e.Memset(ps[1], 0x5a, 3*mib, a.DefaultStream()))
	require.NoError(t, l.SleepPoolMode(0, id, allocator.Memset, false))
	require.NoError(t, l.WakePool(0, id))
	got := make([]byte, 3*mib)
	require.NoError(t, e.CopyDtoH(got, ps[1], a.DefaultStream()))
	assert.Equal(t, make([]byte, 3*mib), got, "zero after a Memset wake")
	for _, p := range ps {
		require.NoError(t, l.Free(p, 0))
	}
	require.NoError(t, l.ReleasePool(0, id))
	after, _, err := e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, before, after, "device free memory after release_pool")
	require.NoError(t, l.Free(x, 0))
	check(t, l, 0)
}
