package allocator

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
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

// TestMaxBlockSize: the largest block is what one segment tracks, a
// request rounded up to any unit a growth rounds to still fits, never near 2^64, and not
// shrunk by a large expandable_handle_mb or large_segment_size_mb.
func TestMaxBlockSize(t *testing.T) {
	const mib, tib = 1 << 20, 1 << 40
	for _, c := range []struct {
		gran, small, large uint64
		want               uint64
	}{
		{2 * mib, 2 * mib, 20 * mib, 32*tib - 12*mib}, // 32 TiB down to a 20 MiB multiple
		{2 * mib, 2 * mib, 16 * tib, 32 * tib},
		{64 << 10, 2 * mib, 20 * mib, tib - 16*mib},
		{2 * mib, 2 * mib, 2 * mib, 32 * tib},
		{1 << 40, 1 << 40, 1 << 40, 1 << 63},
		{2 * mib, 6 * mib, 20 * mib, 32*tib - 12*mib},
		{1 << 61, 1 << 61, 3 << 61, 3 << 61}, // the cap 2^63 is below 2^24 granules
	} {
		got := maxBlockSize(c.gran, c.small, c.large)
		assert.Equal(t, c.want, got, "%+v", c)
		assert.Zero(t, got%minBlockSize)
		track := uint64(1) << 63
		if c.gran <= track>>24 {
			track = c.gran << 24
		}
		for _, u := range []uint64{c.gran, c.small, c.large, roundLarge} {
			assert.LessOrEqual(t, roundUp(got, u), track, "%+v: rounded up to %d", c, u)
			assert.GreaterOrEqual(t, roundUp(got, u), got, "%+v: no wrap rounding up to %d", c, u)
		}
	}
}

// TestLargeHandleAndPageConfigsStillAllocate: the largest
// expandable_handle_mb and large_segment_size_mb do not shrink the
// largest block (a growth maps its last handle shorter).
func TestLargeHandleAndPageConfigsStillAllocate(t *testing.T) {
	for _, c := range []struct {
		conf     string
		maxBlock uint64
	}{
		{"expandable_handle_mb:16777216", 32<<40 - 12<<20}, // 32 TiB down to a 20 MiB page
		{"expandable_handle_mb:0", 32<<40 - 12<<20},
		{"large_segment_size_mb:1024", 32 << 40},
	} {
		conf := c.conf
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf, emulated.WithCapacity(8<<30))
			assert.Equal(t, c.maxBlock, a.maxBlock)
			for _, n := range []uint64{1, 1 << 20, 100 << 20} {
				p, err := a.Malloc(n, 0)
				require.NoError(t, err, "Malloc(%d)", n)
				require.NoError(t, a.Free(p))
			}
			mustCheck(t, a, e)
		})
	}
}

// TestRandomFaultsLargeHandles: a seeded random workload over two streams
// with 64 and 128 MiB growth handles (and none), the defrag limit and the
// reclaim of idle streams in play, while a random tenth of map, create,
// set-access, unmap, free-handle and synchronize calls fail. After every
// operation the invariants hold and the allocator agrees with the
// emulator; a failed Malloc leaves allocated bytes unchanged; a failed
// Free leaves the block allocated (it is freed again later).
func TestRandomFaultsLargeHandles(t *testing.T) {
	const mib = 1 << 20
	for _, conf := range []string{"", "expandable_handle_mb:128", "expandable_handle_mb:0"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf, emulated.WithCapacity(2<<30))
			s1, err := e.StreamCreate(0)
			require.NoError(t, err)
			streams := []backend.Stream{0, s1}
			for i, op := range []backend.Op{backend.OpMap, backend.OpCreate, backend.OpSetAccess, backend.OpUnmap, backend.OpFree, backend.OpStreamSync} {
				require.NoError(t, e.FailRandom(op, 0.1, uint64(i+1), backend.ErrUnavailable))
			}
			rng := rand.New(rand.NewPCG(1, 2))
			type live struct {
				p uintptr
				n uint64
			}
			var held []live
			var okMallocs, failedMallocs int
			for step := 0; step < 400; step++ {
				switch k := rng.IntN(10); {
				case k < 5 || len(held) == 0:
					n := uint64(rng.IntN(150)+1)*mib - uint64(rng.IntN(4096))
					before := a.MemoryAllocated()
					p, err := a.Malloc(n, streams[rng.IntN(2)])
					if err != nil {
						assert.Equal(t, before, a.MemoryAllocated(), "step %d: a failed Malloc(%d) allocated", step, n)
						assert.Zero(t, p)
						failedMallocs++
						break
					}
					okMallocs++
					held = append(held, live{p, n})
				case k < 9:
					i := rng.IntN(len(held))
					if err := a.Free(held[i].p); err != nil {
						require.ErrorIs(t, err, backend.ErrUnavailable, "step %d", step)
						break
					}
					held = append(held[:i], held[i+1:]...)
				default:
					_ = a.EmptyCache() // may fail on an injected fault; Check says whether anything broke
				}
				require.NoError(t, a.Check(), "step %d", step)
			}
			e.ClearFaults()
			assert.Positive(t, okMallocs)
			assert.Positive(t, failedMallocs, "no injected fault reached a Malloc")
			t.Logf("%d Mallocs, %d failed; %d unmaps and %d syncs failed", okMallocs+failedMallocs, failedMallocs, e.Failures(backend.OpUnmap), e.Failures(backend.OpStreamSync))
			for _, h := range held {
				require.NoError(t, a.Free(h.p))
			}
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, a.MemoryReserved())
			assert.Zero(t, e.Live().Mappings)
			assert.Zero(t, e.Live().Handles)
			mustCheck(t, a, e)
			require.NoError(t, a.ReleaseStream(s1))
			require.NoError(t, e.StreamDestroy(s1))
		})
	}
}
