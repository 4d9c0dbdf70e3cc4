package ipc_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// benchSizes are allocations over one and over eight 2 MiB handles.
var benchSizes = []struct {
	name string
	size uint64
}{{"handles=1", 2 << 20}, {"handles=8", 16 << 20}}

// benchShare measures, over exporter drv (its allocator a) and importer
// imp: Export+Export.Close of an allocation whose handles are exported
// already (the Exporter's cache), and Import+Mapping.Close.
func benchShare(b *testing.B, a *allocator.Allocator, imp backend.Driver, s backend.Stream, size uint64) {
	x, err := ipc.NewExporter(a)
	require.NoError(b, err)
	p, err := a.Malloc(size, s)
	require.NoError(b, err)
	exp, err := x.Export(p, ipc.ExportOptions{DisablePidValidation: true})
	require.NoError(b, err)
	b.Run("export", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e, err := x.Export(p, ipc.ExportOptions{DisablePidValidation: true})
			if err != nil {
				b.Fatal(err)
			}
			_ = e.Close()
		}
	})
	b.Run("import+close", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := ipc.Import(imp, exp.Descriptor, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Close(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(exp.Handles)), "handles")
	})
	require.NoError(b, exp.Close())
	require.NoError(b, a.Free(p))
	require.NoError(b, x.Close())
}

func BenchmarkShareEmulated(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e, err := emulated.New(emulated.WithCapacity(1 << 30))
			require.NoError(b, err)
			defer e.Close()
			imp, err := e.Process(2000)
			require.NoError(b, err)
			cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
			require.NoError(b, err)
			a, err := allocator.New(e, cfg)
			require.NoError(b, err)
			defer a.Close()
			s, err := e.StreamCreate(0)
			require.NoError(b, err)
			benchShare(b, a, imp, s, sz.size)
		})
	}
}

// BenchmarkExportFirstEmulated measures the first export of an
// allocation's handles (retain, export, whitelist one pid per handle),
// each iteration over a fresh emulator, allocator and allocation (set up
// and torn down outside the timer).
func BenchmarkExportFirstEmulated(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				e, err := emulated.New(emulated.WithCapacity(1 << 30))
				require.NoError(b, err)
				cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
				require.NoError(b, err)
				a, err := allocator.New(e, cfg)
				require.NoError(b, err)
				s, err := e.StreamCreate(0)
				require.NoError(b, err)
				p, err := a.Malloc(sz.size, s)
				require.NoError(b, err)
				x, err := ipc.NewExporter(a)
				require.NoError(b, err)
				b.StartTimer()
				exp, err := x.Export(p, ipc.ExportOptions{Pids: []int32{2000}})
				b.StopTimer()
				require.NoError(b, err)
				require.NoError(b, exp.Close())
				require.NoError(b, x.Close())
				require.NoError(b, a.Close())
				require.NoError(b, e.Close())
				b.StartTimer()
			}
		})
	}
}
