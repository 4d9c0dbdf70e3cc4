package memviz_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/stats"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// TestWriteMisuse: bad writers and hostile snapshots fail with a typed
// error and write nothing; none panics or runs away with the output.
func TestWriteMisuse(t *testing.T) {
	huge := fixture()
	huge.Index = 1 << 40 // used to emit 2^40 empty trace lists
	wrap := memviz.Device{Segments: []stats.SegmentInfo{{
		Address: ^uintptr(0) - 4095, TotalSize: 8192,
		Blocks: []stats.BlockInfo{
			{Address: ^uintptr(0) - 4095, Size: 4096, State: stats.BlockInactive},
			{Address: 0, Size: 4096, State: stats.BlockInactive}, // wrapped past the top
		},
	}}}
	overflow := memviz.Device{Segments: []stats.SegmentInfo{{
		Address: 0x1000, TotalSize: 0x1000,
		Blocks: []stats.BlockInfo{
			{Address: 0x1000, Size: 1 << 63, State: stats.BlockInactive},
			{Address: 0x1000 + 1<<63, Size: 1<<63 + 0x1000, State: stats.BlockInactive}, // sizes wrap to TotalSize
		},
	}}}
	for _, tc := range []struct {
		name string
		s    memviz.Snapshot
		want error
	}{
		{"device index beyond MaxDevices", memviz.Snapshot{Devices: []memviz.Device{huge}}, memviz.ErrInvalidSnapshot},
		{"segment wraps the address space", memviz.Snapshot{Devices: []memviz.Device{wrap}}, memviz.ErrInvalidSnapshot},
		{"block sizes overflow", memviz.Snapshot{Devices: []memviz.Device{overflow}}, memviz.ErrInvalidSnapshot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.ErrorIs(t, memviz.Write(&buf, tc.s), tc.want)
			assert.Zero(t, buf.Len())
			require.ErrorIs(t, memviz.WriteHTML(&buf, tc.s), tc.want)
			assert.Zero(t, buf.Len())
		})
	}
	t.Run("nil writer", func(t *testing.T) {
		require.ErrorIs(t, memviz.Write(nil, memviz.Snapshot{Devices: []memviz.Device{fixture()}}), memviz.ErrNilWriter)
		require.ErrorIs(t, memviz.WriteHTML(nil, memviz.Snapshot{}), memviz.ErrNilWriter)
		require.ErrorIs(t, memviz.EmbedHTML(nil, []byte{0x80}), memviz.ErrNilWriter)
	})
	t.Run("largest valid device index", func(t *testing.T) {
		d := fixture()
		d.Index = memviz.MaxDevices - 1
		var buf bytes.Buffer
		require.NoError(t, memviz.Write(&buf, memviz.Snapshot{Devices: []memviz.Device{d}}))
		assert.Positive(t, buf.Len())
	})
}
