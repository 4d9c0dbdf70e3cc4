//go:build linux

package ipc_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
)

// BenchmarkShareCUDADouble is BenchmarkShareEmulated over the cuda binding
// and its C test double: the importer is a second Driver of this process,
// which opens the exporter's fds as another process would.
func BenchmarkShareCUDADouble(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			d, _, lib := cudaDouble(b)
			defer d.Close()
			imp, err := cuda.Open(cuda.WithLibrary(lib))
			require.NoError(b, err)
			defer imp.Close()
			cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
			require.NoError(b, err)
			a, err := allocator.New(d, cfg)
			require.NoError(b, err)
			defer a.Close()
			s, err := d.StreamCreate(0)
			require.NoError(b, err)
			defer d.StreamDestroy(s)
			benchShare(b, a, imp, s, sz.size)
		})
	}
}
