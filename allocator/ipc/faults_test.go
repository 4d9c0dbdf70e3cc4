package ipc_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// refs sums the references of a process's handles and counts its exported
// handles.
func refs(p *emulated.Emulator) (total, exported int) {
	for _, h := range p.Handles() {
		total += h.Refs
		if h.Shareable != 0 && !h.Imported {
			exported++
		}
	}
	return total, exported
}

// TestExportFaults fails every driver call of an export of an allocation
// over four handles, one at a time: the export fails with the injected
// kind, no reference leaks (the exporter holds one extra reference per
// handle it has exported, no more), and a retry succeeds and imports.
func TestExportFaults(t *testing.T) {
	for _, op := range []backend.Op{backend.OpRetain, backend.OpExport, backend.OpSetPids} {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%v#%d", op, n), func(t *testing.T) {
				w := newWorld(t)
				p, err := w.a.Malloc(7<<20, w.s)
				require.NoError(t, err)
				base, _ := refs(w.e)
				require.NoError(t, w.e.FailNth(op, n, backend.ErrUnavailable))
				_, err = w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
				require.ErrorIs(t, err, backend.ErrUnavailable)
				total, exported := refs(w.e)
				assert.Equal(t, w.x.Exported(), exported, "exported handles the Exporter does not hold")
				assert.Equal(t, base+exported, total, "a retained reference leaked")
				require.NoError(t, w.a.Check())

				x, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
				require.NoError(t, err)
				m, err := ipc.Import(w.b, x.Descriptor, 0)
				require.NoError(t, err)
				require.NoError(t, m.Close())
				require.NoError(t, x.Close())
				require.NoError(t, w.a.Free(p))
				w.done(t)
			})
		}
	}
}

// TestImportFaults fails every driver call of an import of four handles,
// one at a time: the import fails with the injected kind and the importer
// holds nothing; the exporter is untouched and a retry succeeds.
func TestImportFaults(t *testing.T) {
	for _, op := range []backend.Op{backend.OpReserve, backend.OpImport, backend.OpMap, backend.OpSetAccess} {
		for n := 1; n <= 4; n++ {
			if op == backend.OpReserve && n > 1 {
				break // one reservation per import
			}
			t.Run(fmt.Sprintf("%v#%d", op, n), func(t *testing.T) {
				w := newWorld(t)
				p, err := w.a.Malloc(7<<20, w.s)
				require.NoError(t, err)
				x, err := w.x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
				require.NoError(t, err)
				require.Len(t, x.Handles, 4)
				before := held(w.e)
				require.NoError(t, w.b.FailNth(op, n, backend.ErrOutOfMemory))
				_, err = ipc.Import(w.b, x.Descriptor, 0)
				require.ErrorIs(t, err, backend.ErrOutOfMemory)
				assert.Equal(t, [5]int{}, held(w.b), "the failed import left something")
				assert.Equal(t, before, held(w.e))

				m, err := ipc.Import(w.b, x.Descriptor, 0)
				require.NoError(t, err)
				require.NoError(t, m.Close())
				require.NoError(t, x.Close())
				require.NoError(t, w.a.Free(p))
				w.done(t)
			})
		}
	}
}

// TestRollbackFaults fails the rollback itself (an unmap, then a free,
// during the undo of an import whose access setting failed): the error
// reports both, and nothing panics or hangs.
func TestRollbackFaults(t *testing.T) {
	w := newWorld(t)
	p, err := w.a.Malloc(7<<20, w.s)
	require.NoError(t, err)
	x, err := w.x.Export(p, ipc.ExportOptions{DisablePidValidation: true})
	require.NoError(t, err)
	require.NoError(t, w.b.FailNth(backend.OpSetAccess, 1, backend.ErrUnavailable))
	require.NoError(t, w.b.FailNth(backend.OpUnmap, 1, backend.ErrInvalidArgument))
	_, err = ipc.Import(w.b, x.Descriptor, 0)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	require.ErrorIs(t, err, backend.ErrInvalidArgument, "the failed rollback step is reported")
	require.NoError(t, x.Close())
}
