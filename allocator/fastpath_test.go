package allocator

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestFitLimitsMatchBestFitRules checks that the bounds the cache-hit path
// hands arena.Heap.AllocFit say what bestFit and shouldSplit say, for every
// policy, pool, request and block size on a grid around the thresholds.
func TestFitLimitsMatchBestFitRules(t *testing.T) {
	confs := []string{
		"",
		"expandable_segments:False",
		"expandable_segments:False,max_split_size_mb:20",
		"expandable_segments:False,max_split_size_mb:64,max_non_split_rounding_mb:0",
		"expandable_segments:True,max_split_size_mb:20",
	}
	var sizes []uint64
	for _, base := range []uint64{minBlockSize, smallSize, 2 * mib, 20 * mib, 40 * mib, 64 * mib, 84 * mib} {
		for _, d := range []int64{-2 * minBlockSize, -minBlockSize, 0, minBlockSize, 2 * minBlockSize, smallSize, smallSize + minBlockSize} {
			if v := int64(base) + d; v >= minBlockSize {
				sizes = append(sizes, uint64(v))
			}
		}
	}
	for _, conf := range confs {
		t.Run(conf, func(t *testing.T) {
			a, _ := newAlloc(t, conf)
			checked := 0
			for _, rounded := range sizes {
				p := a.classFor(rounded)
				maxSize, minSplit := a.fitLimits(a.def.expandable, p, rounded)
				require.NotZero(t, minSplit)
				for _, bsize := range sizes {
					if bsize < rounded {
						continue
					}
					mss, mnsr := a.cfg.MaxSplitSize, a.cfg.MaxNonSplitRounding
					refused := mss != 0 && !a.cfg.ExpandableSegments &&
						(rounded < mss && bsize >= mss || rounded >= mss && bsize >= rounded+mnsr)
					what := fmt.Sprintf("request %d, block %d", rounded, bsize)
					assert.Equal(t, refused, bsize > maxSize, "refused: "+what)
					rem := bsize - rounded
					split := rem >= minBlockSize
					if p.idx != smallIdx && !a.cfg.ExpandableSegments {
						split = (mss == 0 || rounded < mss) && rem > smallSize
					}
					assert.Equal(t, split, rem >= minSplit, "split: "+what)
					assert.Equal(t, split, a.shouldSplit(a.def.expandable, p, bsize, rounded), "shouldSplit: "+what)
					checked++
				}
			}
			assert.Greater(t, checked, 500)
		})
	}
}

// TestFastPathsAgreeWithSlowPaths runs the same sequence of Malloc and
// Free calls on two allocators, one of which always takes the general
// path (history on: it records every call), and compares addresses,
// statistics and Check.
func TestFastPathsAgreeWithSlowPaths(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False,max_split_size_mb:20"} {
		t.Run(conf, func(t *testing.T) {
			fast, _ := newAlloc(t, conf)
			slow, _ := newAlloc(t, conf)
			require.NoError(t, slow.RecordHistory(HistoryOptions{MaxEntries: 1}))
			sizes := []uint64{512, 700, 4096, 1 << 20, 3 << 20, 25 << 20, 70 << 20, 1000}
			var fastP, slowP []uintptr
			for i := 0; i < 400; i++ {
				if i%3 == 2 && len(fastP) > 0 {
					k := (i * 7) % len(fastP)
					require.NoError(t, fast.Free(fastP[k]))
					require.NoError(t, slow.Free(slowP[k]))
					fastP = append(fastP[:k], fastP[k+1:]...)
					slowP = append(slowP[:k], slowP[k+1:]...)
					continue
				}
				n := sizes[(i*5)%len(sizes)] + uint64(i%4)*512
				pf, err := fast.Malloc(n, 0)
				require.NoError(t, err)
				ps, err := slow.Malloc(n, 0)
				require.NoError(t, err)
				require.Equal(t, ps-slowBase(slow), pf-slowBase(fast), "call %d", i)
				fastP, slowP = append(fastP, pf), append(slowP, ps)
			}
			fs, ss := fast.Stats(), slow.Stats()
			assert.Equal(t, ss.Allocation, fs.Allocation)
			assert.Equal(t, ss.AllocatedBytes, fs.AllocatedBytes)
			assert.Equal(t, ss.Active, fs.Active)
			assert.Equal(t, ss.ActiveBytes, fs.ActiveBytes)
			assert.Equal(t, ss.RequestedBytes, fs.RequestedBytes)
			assert.Equal(t, ss.InactiveSplit, fs.InactiveSplit)
			assert.Equal(t, ss.InactiveSplitBytes, fs.InactiveSplitBytes)
			assert.Equal(t, ss.OversizeAllocations, fs.OversizeAllocations)
			assert.Equal(t, ss.ReservedBytes, fs.ReservedBytes)
			require.NoError(t, fast.Check())
			require.NoError(t, slow.Check())
		})
	}
}

// slowBase is the base of a's lowest segment, so that two allocators'
// addresses compare as offsets.
func slowBase(a *Allocator) uintptr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.segs) == 0 {
		return 0
	}
	return a.segs[0].base
}

// TestPlainRoundIsRoundSize checks the cache hit's shortcut for rounding:
// without roundup_power2_divisions, roundSize rounds up to 512 bytes.
func TestPlainRoundIsRoundSize(t *testing.T) {
	for _, c := range []struct {
		conf  string
		plain bool
	}{
		{"", true},
		{"roundup_power2_divisions:1", true},
		{"roundup_power2_divisions:4", false},
		{"roundup_power2_divisions:[256:1,512:2,>:1]", false},
	} {
		a, _ := newAlloc(t, c.conf)
		assert.Equal(t, c.plain, a.plainRound, c.conf)
		if !a.plainRound {
			continue
		}
		for _, n := range []uint64{1, 511, 512, 513, 1<<20 - 1, 1 << 20, 1<<20 + 1, 300<<20 + 7, 1<<30 + 3} {
			assert.Equal(t, a.roundSize(n), (n+minBlockSize-1)&^(minBlockSize-1), "%s %d", c.conf, n)
		}
	}
}

// TestHitOffFollowsItsFields checks that the cache hit's guard byte says
// what the fields it summarises say after each operation that changes
// one of them, and that Check reports a guard that does not.
func TestHitOffFollowsItsFields(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithManualCompletion())
	bits := func() hitBits {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.hitOff
	}
	require.Zero(t, bits())

	s0 := a.DefaultStream()
	s1, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(8192, s0)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s1, p, 8192))
	require.NoError(t, a.RecordStream(p, s1))
	assert.Equal(t, hitUses, bits(), "a recorded use")
	require.NoError(t, a.Free(p))
	assert.Equal(t, hitPending, bits(), "the use became an event: pending free")
	mustCheck(t, a, e)
	require.NoError(t, e.Complete(s1))
	q, err := a.Malloc(8192, s0) // processes the completed event
	require.NoError(t, err)
	assert.Zero(t, bits(), "event processed")
	require.NoError(t, a.Free(q))

	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 16}))
	assert.Equal(t, hitHistory, bits(), "history on")
	require.NoError(t, a.RecordHistory(HistoryOptions{}))
	assert.Zero(t, bits(), "history off")

	pool, err := a.NewPool(PoolOptions{Name: "sleeper"})
	require.NoError(t, err)
	require.NoError(t, pool.Sleep(SleepOptions{Mode: Discard}))
	assert.Equal(t, hitAnyAsleep, bits(), "a private pool asleep")
	mustCheck(t, a, e)
	require.NoError(t, a.DefaultPool().Sleep(SleepOptions{Mode: Discard}))
	assert.Equal(t, hitAsleep|hitAnyAsleep, bits(), "both asleep")
	require.NoError(t, pool.Wake())
	assert.Equal(t, hitAsleep|hitAnyAsleep, bits(), "the default pool still asleep")
	require.NoError(t, a.DefaultPool().Wake())
	assert.Zero(t, bits(), "both awake")
	mustCheck(t, a, e)

	a.mu.Lock()
	a.hitOff = hitHistory // stale: history is off
	a.mu.Unlock()
	require.ErrorIs(t, a.Check(), ErrCorrupt, "a stale guard")
	a.mu.Lock()
	a.setHitOff()
	a.mu.Unlock()
	mustCheck(t, a, e)

	require.NoError(t, a.Close())
	assert.Equal(t, hitClosed, bits(), "closed")
}
