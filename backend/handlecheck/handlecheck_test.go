package handlecheck_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
)

const g = 2 << 20

func newEmulator(t *testing.T) *emulated.Emulator {
	t.Helper()
	e, err := emulated.New(emulated.WithCapacity(64 << 20))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// reusing hands out, at its next CreatePhysical, the id it is told instead
// of the new handle's, as a driver that recycles ids does (or one that lost
// track of its handles, when the id is live), and translates it back in Map
// and FreePhysical.
type reusing struct {
	*emulated.Emulator
	next  backend.Handle
	alias map[backend.Handle]backend.Handle // id handed out → the emulator's
}

func (r *reusing) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	h, err := r.Emulator.CreatePhysical(size, prop)
	if err != nil || r.next == 0 {
		return h, err
	}
	r.alias[r.next] = h
	h, r.next = r.next, 0
	return h, nil
}

func (r *reusing) real(h backend.Handle) backend.Handle {
	if x, ok := r.alias[h]; ok {
		return x
	}
	return h
}

func (r *reusing) Map(va uintptr, size uint64, h backend.Handle) error {
	return r.Emulator.Map(va, size, r.real(h))
}

func (r *reusing) FreePhysical(h backend.Handle) error {
	err := r.Emulator.FreePhysical(r.real(h))
	if err == nil {
		delete(r.alias, h)
	}
	return err
}

// world is one case's driver: the emulator, the checked driver over it,
// and a reservation of four granules.
type world struct {
	t   *testing.T
	e   *emulated.Emulator
	r   *reusing
	d   backend.Driver
	c   *handlecheck.Checker
	va  uintptr
	ipc backend.IPC
}

func newWorld(t *testing.T) *world {
	e := newEmulator(t)
	r := &reusing{Emulator: e, alias: map[backend.Handle]backend.Handle{}}
	c := handlecheck.New(r)
	w := &world{t: t, e: e, r: r, d: c.Driver(), c: c}
	var err error
	w.va, err = w.d.ReserveAddress(4 * g)
	require.NoError(t, err)
	var ok bool
	w.ipc, ok = w.d.(backend.IPC)
	require.True(t, ok, "the emulator's IPC is forwarded")
	return w
}

func (w *world) create() backend.Handle {
	w.t.Helper()
	h, err := w.d.CreatePhysical(g, backend.DeviceProp(0))
	require.NoError(w.t, err)
	return h
}

// TestViolations runs each refused call against the emulator: the call
// returns a *Violation of its kind (a backend.ErrInvalidArgument), the
// checker records exactly it, and the driver never saw the call.
func TestViolations(t *testing.T) {
	for _, c := range []struct {
		name string
		kind handlecheck.Kind
		op   backend.Op
		run  func(w *world) (backend.Handle, error)
		// after checks the emulator's state: the refused call changed nothing.
		after func(t *testing.T, w *world, h backend.Handle)
	}{
		{"map twice at once", handlecheck.MappedTwice, backend.OpMap, func(w *world) (backend.Handle, error) {
			h := w.create()
			require.NoError(w.t, w.d.Map(w.va, g, h))
			return h, w.d.Map(w.va+g, g, h)
		}, func(t *testing.T, w *world, h backend.Handle) {
			require.Len(t, w.e.Mappings(), 1)
			assert.Equal(t, w.va, w.e.Mappings()[0].VA)
		}},
		{"map after free", handlecheck.MappedAfterFree, backend.OpMap, func(w *world) (backend.Handle, error) {
			h := w.create()
			require.NoError(w.t, w.d.FreePhysical(h))
			return h, w.d.Map(w.va, g, h)
		}, func(t *testing.T, w *world, h backend.Handle) {
			assert.Empty(t, w.e.Mappings())
		}},
		{"map of a handle never created", handlecheck.MappedAfterFree, backend.OpMap, func(w *world) (backend.Handle, error) {
			return 12345, w.d.Map(w.va, g, 12345)
		}, func(t *testing.T, w *world, h backend.Handle) {
			assert.Empty(t, w.e.Mappings())
		}},
		{"export after free", handlecheck.ExportedAfterFree, backend.OpExport, func(w *world) (backend.Handle, error) {
			h := w.create()
			require.NoError(w.t, w.d.FreePhysical(h))
			_, err := w.ipc.Export(h, backend.ShareDisablePidValidation)
			return h, err
		}, func(t *testing.T, w *world, h backend.Handle) {
			assert.Empty(t, w.e.Handles())
		}},
		{"free while mapped", handlecheck.FreedWhileMapped, backend.OpFree, func(w *world) (backend.Handle, error) {
			h := w.create()
			require.NoError(w.t, w.d.Map(w.va, g, h))
			return h, w.d.FreePhysical(h)
		}, func(t *testing.T, w *world, h backend.Handle) {
			hs := w.e.Handles()
			require.Len(t, hs, 1)
			assert.Equal(t, 1, hs[0].Refs, "the driver never saw the free")
		}},
		{"free twice", handlecheck.FreedTwice, backend.OpFree, func(w *world) (backend.Handle, error) {
			h := w.create()
			require.NoError(w.t, w.d.FreePhysical(h))
			return h, w.d.FreePhysical(h)
		}, func(t *testing.T, w *world, h backend.Handle) {
			assert.Empty(t, w.e.Handles())
		}},
		{"create returns a live id", handlecheck.ReusedWhileLive, backend.OpCreate, func(w *world) (backend.Handle, error) {
			h := w.create()
			w.r.next = h
			got, err := w.d.CreatePhysical(g, backend.DeviceProp(0))
			assert.Zero(w.t, got, "the reused id is not handed out")
			return h, err
		}, func(t *testing.T, w *world, h backend.Handle) {
			assert.Len(t, w.e.Handles(), 2, "the driver's new handle stays with the driver")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			h, err := c.run(w)
			var v *handlecheck.Violation
			require.ErrorAs(t, err, &v)
			assert.ErrorIs(t, err, backend.ErrInvalidArgument)
			assert.Equal(t, handlecheck.Violation{Kind: c.kind, Op: c.op, Handle: h, VA: v.VA, At: v.At}, *v)
			assert.Equal(t, []handlecheck.Violation{*v}, w.c.Violations())
			assert.Equal(t, 1, w.c.Count())
			require.Error(t, w.c.Err())
			assert.Contains(t, w.c.Err().Error(), c.kind.String())
			assert.ErrorAs(t, w.c.Err(), &v)
			c.after(t, w, h)
		})
	}
}

// TestViolationAddresses: the violations name where the handle is mapped.
func TestViolationAddresses(t *testing.T) {
	w := newWorld(t)
	h := w.create()
	require.NoError(t, w.d.Map(w.va+g, g, h))
	err := w.d.Map(w.va+2*g, g, h)
	var v *handlecheck.Violation
	require.ErrorAs(t, err, &v)
	assert.Equal(t, w.va+2*g, v.VA)
	assert.Equal(t, w.va+g, v.At)
	require.ErrorAs(t, w.d.FreePhysical(h), &v)
	assert.Equal(t, handlecheck.FreedWhileMapped, v.Kind)
	assert.Equal(t, w.va+g, v.At)
	assert.Len(t, w.c.Violations(), 2)
}

// TestLegalLives: what a correct caller does passes without a violation:
// map, unmap and map again; a retained reference freed while mapped; an
// import; a freed id the driver hands out again.
func TestLegalLives(t *testing.T) {
	w := newWorld(t)
	h := w.create()
	for range 3 {
		require.NoError(t, w.d.Map(w.va, g, h))
		require.NoError(t, w.d.Unmap(w.va, g))
	}
	require.NoError(t, w.d.Map(w.va, g, h))
	r, err := w.d.RetainHandle(w.va)
	require.NoError(t, err)
	require.Equal(t, h, r)
	require.NoError(t, w.d.FreePhysical(r), "a retained reference may go while mapped")
	sh, err := w.ipc.Export(h, backend.ShareDisablePidValidation)
	require.NoError(t, err)
	require.NoError(t, w.d.Unmap(w.va, g))
	require.NoError(t, w.d.FreePhysical(h))

	// Another process imports what this one exported.
	other, err := w.e.Process(w.e.Pid() + 1)
	require.NoError(t, err)
	defer other.Close()
	oc := handlecheck.New(other)
	oi := oc.Driver().(backend.IPC)
	h2 := w.create()
	sh, err = w.ipc.Export(h2, backend.ShareDisablePidValidation)
	require.NoError(t, err)
	ih, err := oi.Import(sh, 0)
	require.NoError(t, err)
	require.NoError(t, oc.Driver().FreePhysical(ih))
	require.ErrorIs(t, oc.Driver().FreePhysical(ih), backend.ErrInvalidArgument, "the import was freed")
	assert.Len(t, oc.Violations(), 1)
	require.NoError(t, w.d.FreePhysical(h2))

	// The driver hands a freed id out again: a new handle, not a reuse.
	h3 := w.create()
	require.NoError(t, w.d.FreePhysical(h3))
	w.r.next = h3
	h4 := w.create()
	assert.Equal(t, h3, h4)
	require.NoError(t, w.d.Map(w.va, g, h4))
	require.NoError(t, w.d.Unmap(w.va, g))
	require.NoError(t, w.d.FreePhysical(h4))
	require.NoError(t, w.d.ReleaseAddress(w.va, 4*g))
	assert.NoError(t, w.c.Err())
	assert.Empty(t, w.c.Violations())
	assert.Empty(t, w.e.Handles())
}

// TestDriverErrorsChangeNothing: a call the driver refuses leaves the
// checker's record as it was: a failed Map does not count as a mapping, a
// failed FreePhysical keeps the reference.
func TestDriverErrorsChangeNothing(t *testing.T) {
	w := newWorld(t)
	h := w.create()
	require.NoError(t, w.e.FailNth(backend.OpMap, 1, backend.ErrOutOfMemory))
	require.ErrorIs(t, w.d.Map(w.va, g, h), backend.ErrOutOfMemory)
	require.NoError(t, w.d.Map(w.va, g, h), "the failed Map left it unmapped")
	require.NoError(t, w.d.Unmap(w.va, g))
	require.NoError(t, w.e.FailNth(backend.OpFree, 1, backend.ErrUnavailable))
	require.ErrorIs(t, w.d.FreePhysical(h), backend.ErrUnavailable)
	require.NoError(t, w.d.FreePhysical(h), "the failed free kept the reference")
	assert.Empty(t, w.c.Violations())
}

// TestConcurrent: goroutines creating, mapping, unmapping and freeing
// their own handles see no violation (run with -race).
func TestConcurrent(t *testing.T) {
	e := newEmulator(t)
	c := handlecheck.New(e)
	d := c.Driver()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			va, err := d.ReserveAddress(g)
			if !assert.NoError(t, err) {
				return
			}
			for range 50 {
				h, err := d.CreatePhysical(g, backend.DeviceProp(0))
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, d.Map(va, g, h))
				assert.NoError(t, d.Unmap(va, g))
				assert.NoError(t, d.FreePhysical(h))
			}
			assert.NoError(t, d.ReleaseAddress(va, g))
		}()
	}
	wg.Wait()
	assert.NoError(t, c.Err())
}

// optional lists every optional interface of package backend, by name.
var optional = map[string]func(backend.Driver) bool{
	"IPC":                func(d backend.Driver) bool { _, ok := d.(backend.IPC); return ok },
	"HostMemory":         func(d backend.Driver) bool { _, ok := d.(backend.HostMemory); return ok },
	"Copier":             func(d backend.Driver) bool { _, ok := d.(backend.Copier); return ok },
	"DeviceSynchronizer": func(d backend.Driver) bool { _, ok := d.(backend.DeviceSynchronizer); return ok },
	"Introspector":       func(d backend.Driver) bool { _, ok := d.(backend.Introspector); return ok },
}

// TestForwardsEveryOptionalInterface: the list above is every interface
// package backend declares besides Driver (so a new one fails here until
// gen.go forwards it), and the checked driver implements exactly the
// optional interfaces of the driver it wraps, for a driver with all of
// them and one with none.
func TestForwardsEveryOptionalInterface(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../backend.go", nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	var declared []string
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok {
			if _, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.Name != "Driver" {
				declared = append(declared, ts.Name.Name)
			}
		}
		return true
	})
	var listed []string
	for name := range optional {
		listed = append(listed, name)
	}
	sort.Strings(declared)
	sort.Strings(listed)
	require.Equal(t, declared, listed, "package backend's optional interfaces")
	assert.ElementsMatch(t, listed, handlecheck.OptionalInterfaces(), "the interfaces gen.go forwards")

	e := newEmulator(t)
	for _, d := range []backend.Driver{e, struct{ backend.Driver }{e}} {
		w := handlecheck.New(d).Driver()
		for name, has := range optional {
			assert.Equal(t, has(d), has(w), "%s of %T", name, d)
		}
	}
	assert.True(t, optional["Copier"](handlecheck.New(e).Driver()))
	assert.False(t, optional["Copier"](handlecheck.New(struct{ backend.Driver }{e}).Driver()))
}

// TestForwarding: the forwarded optional interfaces reach the wrapped
// driver.
func TestForwarding(t *testing.T) {
	w := newWorld(t)
	h := w.create()
	require.NoError(t, w.d.Map(w.va, g, h))
	in := w.d.(backend.Introspector)
	_, maps, handles := in.LiveRanges(0)
	assert.Equal(t, []backend.Range{{Addr: w.va, Size: g}}, maps)
	assert.Equal(t, 1, handles)
	require.NoError(t, w.d.SetAccess(w.va, g, []backend.AccessDesc{{Location: backend.Location{Type: backend.LocationDevice}, Flags: backend.AccessReadWrite}}))
	s, err := w.d.StreamCreate(0)
	require.NoError(t, err)
	assert.ErrorIs(t, w.d.(backend.Copier).Memset(w.va, 7, g, s), backend.ErrNotSupported, "the emulator's answer without real memory")
	require.NoError(t, w.d.(backend.DeviceSynchronizer).DeviceSynchronize(0))
	p, err := w.d.(backend.HostMemory).MallocHost(4096)
	require.NoError(t, err)
	require.NoError(t, w.d.(backend.HostMemory).FreeHost(p))
	assert.Equal(t, w.e.Pid(), w.ipc.Pid())
	assert.Equal(t, w.e.Name(), w.d.Name())
	require.NoError(t, w.d.StreamDestroy(s))
	require.NoError(t, w.d.Unmap(w.va, g))
	require.NoError(t, w.d.FreePhysical(h))
	assert.NoError(t, w.c.Err())
}

// BenchmarkCycle measures the checker's cost per handle life (create, map,
// unmap, free) over the emulator, beside the emulator alone.
func BenchmarkCycle(b *testing.B) {
	for _, checked := range []bool{false, true} {
		name := "emulator"
		if checked {
			name = "checked"
		}
		b.Run(name, func(b *testing.B) {
			e, err := emulated.New(emulated.WithCapacity(64 << 20))
			require.NoError(b, err)
			defer e.Close()
			var d backend.Driver = e
			if checked {
				d = handlecheck.New(e).Driver()
			}
			va, err := d.ReserveAddress(g)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				h, err := d.CreatePhysical(g, backend.DeviceProp(0))
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Map(va, g, h); err != nil {
					b.Fatal(err)
				}
				if err := d.Unmap(va, g); err != nil {
					b.Fatal(err)
				}
				if err := d.FreePhysical(h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
