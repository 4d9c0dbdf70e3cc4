package ipc_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// world is an exporting process (pid 1000, an allocator with 2 MiB pages
// over real memory), an importer (pid 2000) and a stranger (pid 3000).
type world struct {
	e, b, c *emulated.Emulator
	a       *allocator.Allocator
	x       *ipc.Exporter
	s       backend.Stream // exporter's stream
}

func newWorld(t *testing.T) *world {
	t.Helper()
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(1<<30), emulated.WithDevices(2))
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	b, err := e.Process(2000)
	require.NoError(t, err)
	c, err := e.Process(3000)
	require.NoError(t, err)
	cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
	require.NoError(t, err)
	a, err := allocator.New(e, cfg)
	require.NoError(t, err)
	x, err := ipc.NewExporter(a)
	require.NoError(t, err)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	w := &world{e: e, b: b, c: c, a: a, x: x, s: s}
	t.Cleanup(func() {
		_ = x.Close()
		_ = a.Close()
		_ = e.StreamDestroy(s)
	})
	return w
}

// done closes the exporter side and checks that no process holds
// anything: every byte went back to the device.
func (w *world) done(t *testing.T) {
	t.Helper()
	require.NoError(t, w.x.Close())
	if err := w.a.Close(); !errors.Is(err, allocator.ErrClosed) {
		require.NoError(t, err)
	}
	require.NoError(t, w.e.StreamDestroy(w.s))
	for _, p := range []*emulated.Emulator{w.e, w.b, w.c} {
		l := p.Live()
		assert.Zero(t, l.Handles+l.Mappings+l.Reservations+l.Exports+l.Imports, "pid %d holds %+v", p.Pid(), l)
	}
	free, total, err := w.e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, total, free, "device memory left in use")
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    uint64
		handles int
	}{
		{"small block in a shared page", 4 << 10, 1},
		{"one page", 2 << 20, 1},
		{"seven MiB over four pages", 7 << 20, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			p, err := w.a.Malloc(tc.size, w.s)
			require.NoError(t, err)
			want := pattern(int(tc.size), 3)
			require.NoError(t, w.e.CopyHtoD(p, want, w.s))

			x, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{w.b.Pid()}})
			require.NoError(t, err)
			require.Len(t, x.Handles, tc.handles)
			assert.Equal(t, int32(1000), x.Pid)

			m, err := ipc.Import(w.b, x.Descriptor, 0)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, m.Size, tc.size)
			sb, err := w.b.StreamCreate(0)
			require.NoError(t, err)
			got := make([]byte, tc.size)
			require.NoError(t, w.b.CopyDtoH(got, m.Ptr, sb))
			assert.True(t, bytes.Equal(want, got), "the importer reads the exporter's bytes")
			back := pattern(int(tc.size), 101)
			require.NoError(t, w.b.CopyHtoD(m.Ptr, back, sb))
			require.NoError(t, w.b.StreamDestroy(sb))

			require.NoError(t, w.e.CopyDtoH(got, p, w.s))
			assert.True(t, bytes.Equal(back, got), "the exporter sees the importer's bytes")

			// The stranger is not whitelisted and gets nothing.
			_, err = ipc.Import(w.c, x.Descriptor, 0)
			require.ErrorIs(t, err, backend.ErrNotPermitted)
			assert.Zero(t, w.c.Live().Reservations+w.c.Live().Handles)

			require.NoError(t, m.Close())
			require.NoError(t, m.Close(), "Close is idempotent")
			require.NoError(t, x.Close())
			require.NoError(t, w.a.Free(p))
			w.done(t)
		})
	}
}

// TestSharedHandleExportedOnce exports two allocations that lie in one
// handle: the handle is exported and retained once, the shareable reused.
func TestSharedHandleExportedOnce(t *testing.T) {
	w := newWorld(t)
	p1, err := w.a.Malloc(4<<10, w.s)
	require.NoError(t, err)
	p2, err := w.a.Malloc(4<<10, w.s)
	require.NoError(t, err)
	x1, err := w.x.Export(p1, ipc.ExportOptions{DisablePidValidation: true})
	require.NoError(t, err)
	x2, err := w.x.Export(p2, ipc.ExportOptions{DisablePidValidation: true})
	require.NoError(t, err)
	require.Equal(t, x1.Handles[0].Shareable, x2.Handles[0].Shareable)
	assert.Equal(t, 1, w.x.Exported())
	assert.Equal(t, 1, w.e.Live().Exports)
	assert.NotEqual(t, x1.Offset, x2.Offset)

	// The other flag on the same handle is refused, and changes nothing.
	_, err = w.x.Export(p1, ipc.ExportOptions{Pids: []int32{2000}})
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	assert.Equal(t, 1, w.x.Exported())

	require.ErrorIs(t, w.x.Close(), backend.ErrInvalidArgument, "open exports")
	require.NoError(t, x1.Close())
	require.NoError(t, x2.Close())
	require.NoError(t, w.a.Free(p1))
	require.NoError(t, w.a.Free(p2))
	w.done(t)
}

// TestFreeWhileMapped frees the allocation and closes the exporter
// entirely while the importer maps the memory: the bytes stay until the
// importer lets go (R3), then every byte returns to the device.
func TestFreeWhileMapped(t *testing.T) {
	w := newWorld(t)
	p, err := w.a.Malloc(2<<20, w.s)
	require.NoError(t, err)
	want := pattern(2<<20, 9)
	require.NoError(t, w.e.CopyHtoD(p, want, w.s))
	x, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
	require.NoError(t, err)
	m, err := ipc.Import(w.b, x.Descriptor, 1) // another device of the importer (R17 allows it)
	require.NoError(t, err)
	require.NoError(t, x.Close())
	require.NoError(t, w.a.Free(p))
	require.NoError(t, w.x.Close())
	require.NoError(t, w.a.Close())
	assert.Zero(t, w.e.Live().Handles, "the exporter holds nothing")

	sb, err := w.b.StreamCreate(1)
	require.NoError(t, err)
	got := make([]byte, len(want))
	require.NoError(t, w.b.CopyDtoH(got, m.Ptr, sb))
	assert.True(t, bytes.Equal(want, got), "memory freed by the exporter lives while imported")
	require.NoError(t, w.b.StreamDestroy(sb))
	free, total, err := w.e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Less(t, free, total)
	require.NoError(t, m.Close())
	w.done(t)
}

// TestExporterLifetime: a closed Exporter refuses exports, and a second
// Exporter cannot export a handle the allocator still maps after the
// first exported it (R15; one Exporter per allocator).
func TestExporterLifetime(t *testing.T) {
	w := newWorld(t)
	p, err := w.a.Malloc(2<<20, w.s)
	require.NoError(t, err)
	x, err := w.x.Export(p, ipc.ExportOptions{DisablePidValidation: true})
	require.NoError(t, err)
	require.NoError(t, x.Close())
	require.NoError(t, x.Close(), "Close is idempotent")
	require.ErrorIs(t, x.Allow(2000), ipc.ErrClosed)
	require.NoError(t, w.x.Close())
	_, err = w.x.Export(p, ipc.ExportOptions{})
	require.ErrorIs(t, err, ipc.ErrClosed)

	x2, err := ipc.NewExporter(w.a)
	require.NoError(t, err)
	refs0, _ := refs(w.e)
	_, err = x2.Export(p, ipc.ExportOptions{DisablePidValidation: true})
	require.ErrorIs(t, err, backend.ErrInvalidArgument)
	refs1, _ := refs(w.e)
	assert.Equal(t, refs0, refs1, "the failed export kept a reference")
	require.NoError(t, x2.Close())
	require.NoError(t, w.a.Free(p))
	w.done(t)
}

// TestNewExporterNeedsIPC: a driver without backend.IPC cannot export.
func TestNewExporterNeedsIPC(t *testing.T) {
	e, err := emulated.New()
	require.NoError(t, err)
	defer e.Close()
	a, err := allocator.New(noIPC{e}, allocator.DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	_, err = ipc.NewExporter(a)
	require.ErrorIs(t, err, backend.ErrNotSupported)
	_, err = ipc.Import(noIPC{e}, validDescriptor(), 0)
	require.ErrorIs(t, err, backend.ErrNotSupported)
}

// noIPC hides the emulator's optional capabilities.
type noIPC struct{ backend.Driver }

// TestSpans checks allocator.Spans, which Export is built on: the handles
// under an allocation in address order, and the errors of Free for
// pointers that are not live allocations.
func TestSpans(t *testing.T) {
	w := newWorld(t)
	p, err := w.a.Malloc(7<<20, w.s)
	require.NoError(t, err)
	size, spans, err := w.a.Spans(p)
	require.NoError(t, err)
	assert.Equal(t, uint64(7<<20), size)
	require.Len(t, spans, 4)
	var total uint64
	for i, sp := range spans {
		assert.Zero(t, sp.Size%w.a.Granularity(), "handle %d: %d bytes", i, sp.Size)
		total += sp.Size
		if i > 0 {
			assert.Equal(t, spans[i-1].VA+uintptr(spans[i-1].Size), sp.VA, "handles in address order, back to back")
		}
	}
	assert.GreaterOrEqual(t, total, size)
	assert.LessOrEqual(t, spans[0].VA, p)
	assert.Greater(t, spans[3].VA+uintptr(spans[3].Size), p+uintptr(size-1))

	_, _, err = w.a.Spans(p + 512)
	require.ErrorIs(t, err, allocator.ErrInteriorPointer)
	_, _, err = w.a.Spans(0)
	require.ErrorIs(t, err, allocator.ErrUnknownPointer)
	require.NoError(t, w.a.Free(p))
	_, _, err = w.a.Spans(p)
	require.ErrorIs(t, err, allocator.ErrDoubleFree)
	_, err = w.x.Export(p, ipc.ExportOptions{})
	require.ErrorIs(t, err, allocator.ErrDoubleFree)
	assert.Zero(t, w.x.Exported())
	w.done(t)
}
