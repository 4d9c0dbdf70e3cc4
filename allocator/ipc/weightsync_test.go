package ipc_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// weightBytes is one step's weight copy: 256 MiB.
const weightBytes = 256 << 20

// probeBytes is how much of each end of a weight copy is written and read
// back (touching all of it would make the test a memcpy benchmark).
const probeBytes = 4 << 10

// syncRig is the weight-sync pattern of RL frameworks on one exporting
// allocator and one importer: each step allocates a weight copy, exports
// it, the importer imports and reads it and closes its mapping, and the
// exporter closes the export, frees the copy and empties the cache.
type syncRig struct {
	a   *allocator.Allocator
	x   *ipc.Exporter
	exp backend.Copier // the exporter's driver
	s   backend.Stream // the exporter's stream
	// imp imports on device 0 (nil for an importer in another process,
	// which step does not drive).
	imp   backend.Driver
	is    backend.Stream // imp's stream
	pids  []int32        // whitelisted importers
	used  func() uint64  // device memory in use, as the driver counts it, nbytes
	alloc uint64         // nbytes per step
}

// stepOrder is the order in which the exporter lets go of a weight copy.
type stepOrder int

const (
	closeThenFree stepOrder = iota // Export.Close, Free, EmptyCache
	freeThenClose                  // Free, EmptyCache (memory held by the exporter), Export.Close
)

// step runs step i in order and returns the most device memory the driver
// counted in use during it. After it, every byte is back with the driver
// and the Exporter holds nothing.
func (r *syncRig) step(t testing.TB, i int, order stepOrder) uint64 {
	p, err := r.a.Malloc(r.alloc, r.s)
	require.NoError(t, err, "step %d", i)
	head, tail := pattern(probeBytes, byte(i)), pattern(probeBytes, byte(i)+101)
	tailAt := uintptr(r.alloc - probeBytes)
	require.NoError(t, r.exp.CopyHtoD(p, head, r.s))
	require.NoError(t, r.exp.CopyHtoD(p+tailAt, tail, r.s))
	x, err := r.x.Export(p, ipc.ExportOptions{Pids: r.pids})
	require.NoError(t, err, "step %d", i)
	m, err := ipc.Import(r.imp, x.Descriptor, 0)
	require.NoError(t, err, "step %d", i)
	got := make([]byte, probeBytes)
	cp := r.imp.(backend.Copier)
	require.NoError(t, cp.CopyDtoH(got, m.Ptr, r.is))
	require.True(t, bytes.Equal(head, got), "step %d: the importer reads this step's weights", i)
	require.NoError(t, cp.CopyDtoH(got, m.Ptr+tailAt, r.is))
	require.True(t, bytes.Equal(tail, got), "step %d: the importer reads this step's weights", i)
	peak := r.used()
	require.NoError(t, m.Close())
	switch order {
	case closeThenFree:
		require.NoError(t, x.Close())
		require.NoError(t, r.a.Free(p))
		require.NoError(t, r.a.EmptyCache())
	case freeThenClose:
		require.NoError(t, r.a.Free(p))
		require.NoError(t, r.a.EmptyCache())
		st := r.a.Stats()
		require.Equal(t, int64(r.alloc), st.ExporterHeldBytes, "step %d: the open export holds the copy", i)
		require.Equal(t, st.ExportedBytes, st.ExporterHeldBytes)
		require.Zero(t, r.a.MemoryReserved())
		require.Equal(t, r.alloc, r.used(), "step %d: the copy lives while its export is open", i)
		require.NoError(t, x.Close())
	}
	require.Zero(t, r.x.Exported(), "step %d: the Exporter still holds handles", i)
	require.Zero(t, r.used(), "step %d: device memory left in use", i)
	st := r.a.Stats()
	require.Zero(t, st.ExportedHandles+st.ExportedBytes+st.ExporterHeldHandles+st.ExporterHeldBytes, "step %d: %+v", i, st)
	return peak
}

// run runs steps steps, alternating the two orders, checking after each
// that device memory stayed within two weight copies, and the allocator
// after every 100th.
func (r *syncRig) run(t *testing.T, steps int) {
	for i := 0; i < steps; i++ {
		peak := r.step(t, i, stepOrder(i%2))
		require.LessOrEqual(t, peak, 2*r.alloc, "step %d: %d bytes in use", i, peak)
		require.GreaterOrEqual(t, peak, r.alloc, "step %d", i)
		if i%100 == 99 {
			require.NoError(t, r.a.Check(), "step %d", i)
		}
	}
}

// syncConfigs are the allocator configurations the weight-sync tests run.
var syncConfigs = []struct{ name, conf string }{
	{"expandable", ""}, // 64 MiB handles (expandable_handle_mb)
	{"classic", "expandable_segments:False"},
}

// TestWeightSyncEmulated is the regression test of the exporter that kept
// a weight copy per step: 1,000 steps of 256 MiB on a 2 GiB device (it
// used to fail at step 8 with an OutOfMemoryError claiming 0 bytes
// held), with the driver's memory in use at most two copies during a
// step and none after it, and the Exporter holding nothing.
func TestWeightSyncEmulated(t *testing.T) {
	for _, c := range syncConfigs {
		t.Run(c.name, func(t *testing.T) {
			e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(2<<30))
			require.NoError(t, err)
			defer e.Close()
			imp, err := e.Process(2000)
			require.NoError(t, err)
			r := emulatedRig(t, e, imp, c.conf)
			r.run(t, 1000)
			require.NoError(t, r.x.Close())
			require.NoError(t, r.a.Close())
			for _, p := range []*emulated.Emulator{e, imp} {
				l := p.Live()
				assert.Zero(t, l.Handles+l.Mappings+l.Exports+l.Imports, "pid %d holds %+v", p.Pid(), l)
			}
		})
	}
}

// emulatedRig builds a syncRig over emulator e (the exporter) and its
// process imp (the importer).
func emulatedRig(t testing.TB, e, imp *emulated.Emulator, conf string) *syncRig {
	cfg, err := allocator.ParseConfig(conf)
	require.NoError(t, err)
	a, err := allocator.New(e, cfg)
	require.NoError(t, err)
	x, err := ipc.NewExporter(a)
	require.NoError(t, err)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	is, err := imp.StreamCreate(0)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = x.Close()
		_ = a.Close()
		_ = e.StreamDestroy(s)
		_ = imp.StreamDestroy(is)
	})
	return &syncRig{a: a, x: x, exp: e, s: s, imp: imp, is: is, pids: []int32{imp.Pid()}, alloc: weightBytes,
		used: func() uint64 { return e.Live().Devices[0].Physical }}
}

// TestReexportStillMapped exports a second allocation that lies in a
// handle the allocator still maps after the first allocation's Export was
// closed (the R15 path: the driver would refuse a second export of the
// handle, so the Exporter keeps the shareable while the allocator maps
// it), then frees everything: the handle goes back to the driver at once.
func TestReexportStillMapped(t *testing.T) {
	w := newWorld(t)
	p1, err := w.a.Malloc(4<<10, w.s)
	require.NoError(t, err)
	p2, err := w.a.Malloc(4<<10, w.s)
	require.NoError(t, err)
	_, s1, err := w.a.Spans(p1)
	require.NoError(t, err)
	_, s2, err := w.a.Spans(p2)
	require.NoError(t, err)
	require.Equal(t, s1, s2, "both in one handle")
	require.NoError(t, w.e.CopyHtoD(p2, []byte("second"), w.s))

	x1, err := w.x.Export(p1, ipc.ExportOptions{Pids: []int32{2000}})
	require.NoError(t, err)
	m1, err := ipc.Import(w.b, x1.Descriptor, 0)
	require.NoError(t, err)
	require.NoError(t, m1.Close())
	require.NoError(t, x1.Close())
	require.NoError(t, w.a.Free(p1))
	require.NoError(t, w.a.EmptyCache())
	assert.Equal(t, 1, w.x.Exported(), "the allocator still maps the handle: its shareable stays cached")
	assert.Equal(t, 1, w.e.Live().Exports)

	x2, err := w.x.Export(p2, ipc.ExportOptions{Pids: []int32{2000}})
	require.NoError(t, err, "a re-export of the still-mapped handle reuses its shareable")
	assert.Equal(t, x1.Handles[0].Shareable, x2.Handles[0].Shareable)
	m2, err := ipc.Import(w.b, x2.Descriptor, 0)
	require.NoError(t, err)
	sb, err := w.b.StreamCreate(0)
	require.NoError(t, err)
	got := make([]byte, 6)
	require.NoError(t, w.b.CopyDtoH(got, m2.Ptr, sb))
	assert.Equal(t, "second", string(got))
	require.NoError(t, w.b.StreamDestroy(sb))
	require.NoError(t, m2.Close())
	require.NoError(t, x2.Close())
	require.NoError(t, w.a.Free(p2))
	require.NoError(t, w.a.Check())
	require.NoError(t, w.a.EmptyCache())
	assert.Zero(t, w.x.Exported())
	assert.Zero(t, w.e.Live().Exports)
	free, total, err := w.e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, total, free, "the handle went back to the driver, not to the handle cache")
	require.NoError(t, w.a.Check())
	w.done(t)
}

// TestExporterHeldCounted leaves an Export open while the allocator frees
// and empties its cache, so that only the exporter holds the memory, then
// drives the device out of memory: Stats, Summary, Check and the
// OutOfMemoryError all count what the exporter holds, and closing the
// Export gives it back.
func TestExporterHeldCounted(t *testing.T) {
	e, err := emulated.New(emulated.WithCapacity(1 << 30))
	require.NoError(t, err)
	defer e.Close()
	imp, err := e.Process(2000)
	require.NoError(t, err)
	r := emulatedRig(t, e, imp, "")
	const held = 768 << 20
	p, err := r.a.Malloc(held, r.s)
	require.NoError(t, err)
	x, err := r.x.Export(p, ipc.ExportOptions{Pids: r.pids})
	require.NoError(t, err)
	// 64 MiB growth handles while the device has room; granules when the
	// growth takes reserved memory past half the device (the pressure rule).
	n := len(x.Handles)
	require.NotZero(t, n)
	var sum uint64
	for _, h := range x.Handles {
		sum += h.Size
	}
	require.Equal(t, uint64(held), sum, "the handles cover the allocation exactly")
	st := r.a.Stats()
	assert.Equal(t, int64(n), st.ExportedHandles)
	assert.Equal(t, int64(held), st.ExportedBytes)
	assert.Zero(t, st.ExporterHeldBytes, "the allocator maps it: reserved, not held by the exporter")

	require.NoError(t, r.a.Free(p))
	require.NoError(t, r.a.EmptyCache())
	require.NoError(t, r.a.Check(), "the registry and the driver agree on the held handles")
	st = r.a.Stats()
	assert.Equal(t, int64(held), st.ExporterHeldBytes)
	assert.Equal(t, int64(n), st.ExporterHeldHandles)
	assert.Zero(t, st.ReservedBytes[0].Current)
	assert.Contains(t, r.a.Summary(), "| Held by exporters       |    768 MiB |")
	assert.Contains(t, r.a.Summary(), fmt.Sprintf("| Exported handles         | %10d |", n))

	_, err = r.a.Malloc(512<<20, r.s)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, uint64(held), oom.ExporterHeld)
	assert.Equal(t, n, oom.ExporterHeldHandles)
	assert.Contains(t, err.Error(), fmt.Sprintf("768 MiB in %d physical handles is held by IPC exporters for open exports", n))
	require.NoError(t, r.a.Check())

	require.NoError(t, x.Close())
	assert.Zero(t, r.x.Exported())
	assert.Zero(t, r.a.Stats().ExporterHeldBytes)
	assert.Zero(t, e.Live().Devices[0].Physical)
	q, err := r.a.Malloc(512<<20, r.s)
	require.NoError(t, err, "closing the export gave the memory back")
	require.NoError(t, r.a.Free(q))
	require.NoError(t, r.a.Check())
}

// TestWeightSyncFaults fails, one at a time, each driver call of the
// exporter's side of a step that frees or exports (FreePhysical, Export,
// RetainHandle, SetPids) at its n-th occurrence: the failing call reports
// the injected error, Check stays consistent, and once the step is
// retried and the memory released again no byte and no handle is left.
func TestWeightSyncFaults(t *testing.T) {
	const size = 7 << 20 // four 2 MiB handles
	// A step makes 4 retains, exports and whitelistings, and 8 frees (the
	// Exporter's reference and the allocator's of each handle).
	for _, f := range []struct {
		op    backend.Op
		calls int
	}{{backend.OpFree, 8}, {backend.OpExport, 4}, {backend.OpRetain, 4}, {backend.OpSetPids, 4}} {
		op := f.op
		for n := 1; n <= f.calls; n++ {
			for _, order := range []stepOrder{closeThenFree, freeThenClose} {
				t.Run(fmt.Sprintf("%v#%d/order%d", op, n, order), func(t *testing.T) {
					e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(1<<30))
					require.NoError(t, err)
					defer e.Close()
					imp, err := e.Process(2000)
					require.NoError(t, err)
					r := emulatedRig(t, e, imp, "large_segment_size_mb:2,expandable_handle_mb:0")
					r.alloc = size
					require.NoError(t, e.FailNth(op, n, backend.ErrUnavailable))
					faultyStep(t, r, order)
					require.Equal(t, int64(1), e.Failures(op), "the fault fired")
					require.NoError(t, r.a.Check())
					// The fault is spent; a clean step, then everything released.
					r.step(t, 1, order)
					require.NoError(t, r.a.Check())
					require.NoError(t, r.x.Close())
					require.NoError(t, r.a.Close())
					for _, p := range []*emulated.Emulator{e, imp} {
						l := p.Live()
						assert.Zero(t, l.Handles+l.Mappings+l.Exports+l.Imports, "pid %d holds %+v", p.Pid(), l)
					}
					assert.Zero(t, e.Live().Devices[0].Physical)
				})
			}
		}
	}
}

// faultyStep runs one step with a fault armed: any call may fail with
// the injected error, which it retries once (a release retried is how a
// program recovers); it returns with the step's memory released or, where
// the fault left something held, held and counted consistently.
func faultyStep(t *testing.T, r *syncRig, order stepOrder) {
	retry := func(f func() error) {
		if err := f(); err != nil {
			require.ErrorIs(t, err, backend.ErrUnavailable)
			require.NoError(t, r.a.Check())
			require.NoError(t, f(), "retried")
		}
	}
	p, err := r.a.Malloc(r.alloc, r.s)
	require.NoError(t, err) // the ops armed are not used by a growth
	var x *ipc.Export
	retry(func() error { x, err = r.x.Export(p, ipc.ExportOptions{Pids: r.pids}); return err })
	m, err := ipc.Import(r.imp, x.Descriptor, 0)
	require.NoError(t, err)
	require.NoError(t, m.Close()) // the importer's own frees are not faulted
	switch order {
	case closeThenFree:
		retry(x.Close)
		require.NoError(t, r.a.Free(p))
		retry(r.a.EmptyCache)
	case freeThenClose:
		require.NoError(t, r.a.Free(p))
		retry(r.a.EmptyCache)
		retry(x.Close)
	}
	require.NoError(t, r.a.Check())
	retry(r.a.EmptyCache) // retries whatever a failed free kept
	assert.Zero(t, r.x.Exported())
	st := r.a.Stats()
	assert.Zero(t, st.ExportedHandles+st.ExporterHeldBytes, "%+v", st)
	assert.Zero(t, r.used())
}

// benchSync runs one weight-sync step per iteration, alternating the two
// orders, and reports the most device memory the driver counted during
// any step, in bytes and in weight copies (the bound is 2).
func benchSync(b *testing.B, r *syncRig) {
	b.ReportAllocs()
	var peak uint64
	i := 0
	for b.Loop() {
		peak = max(peak, r.step(b, i, stepOrder(i%2)))
		i++
	}
	b.ReportMetric(float64(peak), "peak-device-B/step")
	b.ReportMetric(float64(peak)/float64(r.alloc), "peak-copies/step")
}

// BenchmarkWeightSyncEmulated: steps of 256 MiB over the emulator (real
// memory), importer in another emulated process.
func BenchmarkWeightSyncEmulated(b *testing.B) {
	for _, c := range syncConfigs {
		b.Run(c.name, func(b *testing.B) {
			e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(2<<30))
			require.NoError(b, err)
			defer e.Close()
			imp, err := e.Process(2000)
			require.NoError(b, err)
			benchSync(b, emulatedRig(b, e, imp, c.conf))
		})
	}
}

// TestOOMLadderReleasesExporterHeld: a handle whose exporter reference
// could not be freed when the allocator unmapped it stays held and
// counted; the OOM ladder asks the exporter again, so a Malloc that needs
// that memory succeeds instead of failing.
func TestOOMLadderReleasesExporterHeld(t *testing.T) {
	e, err := emulated.New(emulated.WithCapacity(1 << 30))
	require.NoError(t, err)
	defer e.Close()
	imp, err := e.Process(2000)
	require.NoError(t, err)
	// Synchronize releases the free memory (release_threshold_mb:0)
	// without asking exporters again, as EmptyCache would.
	r := emulatedRig(t, e, imp, "release_threshold_mb:0")
	p, err := r.a.Malloc(768<<20, r.s)
	require.NoError(t, err)
	x, err := r.x.Export(p, ipc.ExportOptions{Pids: r.pids})
	require.NoError(t, err)
	require.NoError(t, x.Close())
	require.NoError(t, r.a.Free(p))
	require.NoError(t, e.FailNth(backend.OpFree, 1, backend.ErrUnavailable)) // the Exporter's first free
	require.NoError(t, r.a.Synchronize(r.s))
	require.Equal(t, int64(1), e.Failures(backend.OpFree))
	require.Zero(t, r.a.MemoryReserved())
	st := r.a.Stats()
	require.Equal(t, int64(x.Handles[0].Size), st.ExporterHeldBytes, "the handle whose free failed stays held, counted")
	require.Equal(t, 1, r.x.Exported())
	require.NoError(t, r.a.Check())

	q, err := r.a.Malloc(1<<30, r.s)
	require.NoError(t, err, "the ladder got the held handle back")
	assert.Zero(t, r.x.Exported())
	assert.Zero(t, r.a.Stats().ExporterHeldBytes)
	assert.Equal(t, int64(1), r.a.Stats().NumAllocRetries)
	require.NoError(t, r.a.Free(q))
	require.NoError(t, r.a.Check())
}

// TestAllocatorCloseWithOpenExport closes the allocator while an Export
// is open and a peer maps it: the memory lives on for both; closing the
// Export frees the exporter's reference (ReleaseShared works after the
// allocator's Close), and the peer's Close frees the memory.
func TestAllocatorCloseWithOpenExport(t *testing.T) {
	w := newWorld(t)
	p, err := w.a.Malloc(7<<20, w.s)
	require.NoError(t, err)
	require.NoError(t, w.e.CopyHtoD(p, []byte("kept"), w.s))
	x, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
	require.NoError(t, err)
	m, err := ipc.Import(w.b, x.Descriptor, 0)
	require.NoError(t, err)
	require.NoError(t, w.a.Close())
	assert.Equal(t, 4, w.x.Exported(), "the open Export holds the handles")
	assert.Equal(t, 4, w.e.Live().Handles)

	require.NoError(t, x.Close())
	assert.Zero(t, w.x.Exported())
	assert.Zero(t, w.e.Live().Handles, "the exporting process holds nothing")
	sb, err := w.b.StreamCreate(0)
	require.NoError(t, err)
	got := make([]byte, 4)
	require.NoError(t, w.b.CopyDtoH(got, m.Ptr, sb))
	assert.Equal(t, "kept", string(got), "the peer's mapping keeps the memory (R3)")
	require.NoError(t, w.b.StreamDestroy(sb))
	require.NoError(t, m.Close())
	w.done(t)
}

// TestExportConcurrent runs weight-sync steps of small allocations, which
// share handles, from several goroutines on one Exporter while another
// empties the cache, each goroutine with its own importer process: no
// deadlock between the allocator's and the Exporter's locks, every import
// reads its own bytes, and everything goes back at the end.
func TestExportConcurrent(t *testing.T) {
	w := newWorld(t)
	const workers, steps = 4, 200
	errs := make(chan error, workers+1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				errs <- nil
				return
			default:
			}
			if err := w.a.EmptyCache(); err != nil {
				errs <- err
				return
			}
		}
	}()
	for g := 0; g < workers; g++ {
		go func(g int) {
			errs <- func() error {
				imp, err := w.e.Process(int32(4000 + g))
				if err != nil {
					return err
				}
				s, err := w.e.StreamCreate(0)
				if err != nil {
					return err
				}
				is, err := imp.StreamCreate(0)
				if err != nil {
					return err
				}
				got := make([]byte, 8)
				for i := 0; i < steps; i++ {
					p, err := w.a.Malloc(uint64(64<<10*(1+i%4)), s)
					if err != nil {
						return err
					}
					want := []byte(fmt.Sprintf("g%d s%04d", g, i))[:8]
					if err := w.e.CopyHtoD(p, want, s); err != nil {
						return err
					}
					x, err := w.x.Export(p, ipc.ExportOptions{DisablePidValidation: true})
					if err != nil {
						return fmt.Errorf("export: %w", err)
					}
					m, err := ipc.Import(imp, x.Descriptor, 0)
					if err != nil {
						return fmt.Errorf("import: %w", err)
					}
					if err := imp.CopyDtoH(got, m.Ptr, is); err != nil {
						return err
					}
					if !bytes.Equal(want, got) {
						return fmt.Errorf("worker %d step %d read %q", g, i, got)
					}
					if err := m.Close(); err != nil {
						return err
					}
					if i%2 == 0 {
						err = errors.Join(x.Close(), w.a.Free(p))
					} else {
						err = errors.Join(w.a.Free(p), x.Close())
					}
					if err != nil {
						return err
					}
				}
				return errors.Join(imp.StreamDestroy(is), w.e.StreamDestroy(s))
			}()
		}(g)
	}
	for g := 0; g < workers; g++ {
		require.NoError(t, <-errs)
	}
	close(stop)
	require.NoError(t, <-errs)
	require.NoError(t, w.a.Check())
	require.NoError(t, w.a.EmptyCache())
	assert.Zero(t, w.x.Exported())
	st := w.a.Stats()
	assert.Zero(t, st.ExportedHandles+st.ExporterHeldBytes, "%+v", st)
	require.NoError(t, w.a.Check())
	w.done(t)
}
