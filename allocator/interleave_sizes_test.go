package allocator

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// TestSizesNearTwoTo64: on devices whose capacity is near 2^64, sizes whose
// rounding to 512 bytes (or to a roundup_power2_divisions step) wraps
// past 2^64 are refused with a typed error, through the cache-hit path
// (a free block cached on the stream used last) and the general path
// alike, and change nothing.
func TestSizesNearTwoTo64(t *testing.T) {
	sizes := []uint64{
		math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64 - 510, math.MaxUint64 - 511,
		math.MaxUint64 - 512, 1 << 63, 1<<63 + 1, math.MaxUint64 >> 1,
	}
	for _, conf := range []string{"", "roundup_power2_divisions:4", "expandable_segments:False"} {
		for _, capacity := range []uint64{1 << 63, math.MaxUint64} {
			t.Run(fmt.Sprintf("%s/%d", conf, capacity), func(t *testing.T) {
				e := newEmu(t, emulated.WithCapacity(capacity))
				cfg, err := ParseConfig(conf)
				require.NoError(t, err)
				a, err := New(e, cfg)
				if err != nil {
					require.ErrorIs(t, err, ErrInvalidConfig)
					return
				}
				defer func() { require.NoError(t, a.Close()); assertNoDriverState(t, e) }()
				// A cached free block on the default stream, used last:
				// the cache-hit path is tried first.
				warm, err := a.Malloc(8<<20, 0)
				require.NoError(t, err)
				require.NoError(t, a.Free(warm))
				before := a.Stats()
				// Every size here is beyond what one segment holds (32 TiB
				// at 2 MiB granules): a typed error, nothing counted.
				for _, n := range append(sizes, a.maxBlock+1) {
					p, err := a.Malloc(n, 0)
					require.ErrorIs(t, err, ErrInvalidSize, "Malloc(%#x)", n)
					assert.Zero(t, p)
					var oom *OutOfMemoryError
					assert.False(t, errors.As(err, &oom), "no OOM ladder for a size no segment holds")
				}
				require.NoError(t, a.Check())
				after := a.Stats()
				assert.Equal(t, before.AllocatedBytes[stats.AllPools].Current, after.AllocatedBytes[stats.AllPools].Current)
				assert.Equal(t, before.Allocation[stats.AllPools].Current, after.Allocation[stats.AllPools].Current)
				assert.Equal(t, before.Allocation[stats.AllPools].Allocated, after.Allocation[stats.AllPools].Allocated, "no allocation counted")
				require.NoError(t, a.Check())
			})
		}
	}
}

// TestMaxBlockSize: the largest block leaves room for every rounding and
// never wraps, whatever the granule and page sizes.
func TestMaxBlockSize(t *testing.T) {
	for _, c := range []struct {
		gran, small, large, handle uint64
		want                       uint64
	}{
		{2 << 20, 2 << 20, 20 << 20, 64 << 20, 32<<40 - 128<<20},
		{64 << 10, 2 << 20, 20 << 20, 64 << 20, 1<<40 - 128<<20},
		{2 << 20, 2 << 20, 20 << 20, 0, 32<<40 - 40<<20},
		{1 << 40, 1 << 40, 1 << 40, 1 << 40, 0xfffffdfffffffe00}, // track saturates at 2^64-1
		{1 << 62, 1 << 62, 1 << 62, 1 << 62, 0x7ffffffffffffe00},
		{1 << 63, 1 << 63, 1 << 63, math.MaxUint64, 0},
	} {
		got := maxBlockSize(c.gran, c.small, c.large, c.handle)
		assert.Equal(t, c.want, got, "%+v", c)
		assert.Zero(t, got%minBlockSize)
	}
}
