package allocator

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// oomOf returns err's *OutOfMemoryError, failing the test if it has none,
// and checks what every such error keeps: one line, the advice last.
func oomOf(t *testing.T, err error) *OutOfMemoryError {
	t.Helper()
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	msg := oom.Error()
	assert.NotContains(t, msg, "\n", "the message is one line")
	require.NotEmpty(t, oom.Advice)
	assert.True(t, strings.HasSuffix(msg, oom.Advice), "the message ends with the advice: %s", msg)
	return oom
}

// TestOutOfMemoryErrorTellsFragmentationFromExhaustion: the error's
// figures and advice for a classic heap of split segments (fragmented),
// an expandable heap whose free memory is stranded in handles that hold
// allocations (fragmented), a full device, a memory fraction, and free
// memory another stream caches.
func TestOutOfMemoryErrorTellsFragmentationFromExhaustion(t *testing.T) {
	t.Run("classic fragmented", func(t *testing.T) {
		// Three 20 MiB segments of five 4 MiB blocks; every second
		// block freed: 24 MiB free, none of it a 12 MiB block, and
		// no segment wholly free to release.
		a, e := newAlloc(t, "expandable_segments:False", emulated.WithCapacity(60*mib))
		var ps []uintptr
		for i := 0; i < 15; i++ {
			p, err := a.Malloc(4*mib, 0)
			require.NoError(t, err)
			ps = append(ps, p)
		}
		for i := 1; i < 15; i += 2 {
			require.NoError(t, a.Free(ps[i]))
		}
		_, err := a.Malloc(12*mib, 0)
		oom := oomOf(t, err)
		assert.Equal(t, uint64(12*mib), oom.Rounded)
		assert.Equal(t, uint64(4*mib), oom.Largest)
		assert.Equal(t, uint64(28*mib), oom.Unusable, "7 free 4 MiB blocks")
		assert.Zero(t, oom.OtherStreamsFree)
		assert.Zero(t, oom.OtherPoolsFree)
		assert.Zero(t, oom.Room())
		assert.True(t, oom.Fragmented())
		assert.Contains(t, oom.Advice, "expandable_segments:True")
		assert.Contains(t, oom.Error(), "the largest free block this request (12 MiB) could use is 4.0 MiB; 28 MiB is free but unusable for this size (fragmentation)")
		mustCheck(t, a, e)
	})
	t.Run("expandable stranded", func(t *testing.T) {
		// 3 MiB blocks in 2 MiB handles; every second one freed: the
		// ladder unmaps the whole handles they hold, and the MiB of
		// each that shares a handle with an allocated block stays.
		a, e := newAlloc(t, "expandable_segments:True,large_segment_size_mb:2,expandable_handle_mb:0,defrag_threshold:off", emulated.WithCapacity(64*mib))
		var ps []uintptr
		for i := 0; i < 20; i++ {
			p, err := a.Malloc(3*mib, 0)
			require.NoError(t, err)
			ps = append(ps, p)
		}
		for i := 1; i < 20; i += 2 {
			require.NoError(t, a.Free(ps[i]))
		}
		_, err := a.Malloc(30*mib, 0)
		oom := oomOf(t, err)
		assert.Equal(t, uint64(30*mib), oom.Rounded)
		assert.Less(t, oom.Largest, oom.Rounded)
		assert.Equal(t, oom.Reserved-oom.Allocated, oom.Unusable, "all the free memory left is stranded")
		assert.NotZero(t, oom.Unusable)
		assert.Less(t, oom.Room(), oom.Rounded)
		assert.True(t, oom.Fragmented())
		assert.Contains(t, oom.Advice, "expandable_handle_mb")
		mustCheck(t, a, e)
	})
	t.Run("device full", func(t *testing.T) {
		a, e := newAlloc(t, "", emulated.WithCapacity(64*mib))
		p, err := a.Malloc(60*mib, 0)
		require.NoError(t, err)
		_, err = a.Malloc(8*mib, 0)
		oom := oomOf(t, err)
		assert.Equal(t, uint64(8*mib), oom.Rounded)
		assert.Zero(t, oom.Largest)
		assert.Zero(t, oom.Unusable)
		assert.Equal(t, uint64(4*mib), oom.Room())
		assert.False(t, oom.Fragmented())
		assert.Contains(t, oom.Advice, "the device has too little free memory")
		mustCheck(t, a, e)
		require.NoError(t, a.Free(p))
	})
	t.Run("memory fraction", func(t *testing.T) {
		a, e := newAlloc(t, "per_process_memory_fraction:0.5", emulated.WithCapacity(64*mib))
		p, err := a.Malloc(30*mib, 0)
		require.NoError(t, err)
		_, err = a.Malloc(8*mib, 0)
		oom := oomOf(t, err)
		assert.Equal(t, uint64(32*mib), oom.Allowed)
		assert.Equal(t, uint64(2*mib), oom.Room(), "the fraction's room, not the device's")
		assert.False(t, oom.Fragmented())
		assert.Contains(t, oom.Advice, "per_process_memory_fraction")
		mustCheck(t, a, e)
		require.NoError(t, a.Free(p))
	})
	t.Run("other stream's cache", func(t *testing.T) {
		// Stream s2 keeps 16 MiB free in a classic segment that holds
		// an allocation, which the default stream cannot take.
		a, e := newAlloc(t, "expandable_segments:False", emulated.WithCapacity(60*mib))
		s2, err := e.StreamCreate(0)
		require.NoError(t, err)
		defer func() { _ = a.ReleaseStream(s2); _ = e.StreamDestroy(s2) }()
		var held, own []uintptr
		for i := 0; i < 5; i++ {
			p, err := a.Malloc(4*mib, s2)
			require.NoError(t, err)
			held = append(held, p)
		}
		for _, p := range held[1:] {
			require.NoError(t, a.Free(p))
		}
		for i := 0; i < 10; i++ {
			p, err := a.Malloc(4*mib, 0)
			require.NoError(t, err)
			own = append(own, p)
		}
		_, err = a.Malloc(12*mib, 0)
		oom := oomOf(t, err)
		assert.Equal(t, uint64(16*mib), oom.OtherStreamsFree)
		assert.Zero(t, oom.Unusable)
		assert.False(t, oom.Fragmented())
		assert.Contains(t, oom.Advice, "RecordStream")
		assert.Contains(t, oom.Error(), "16 MiB is free in other streams' caches")
		mustCheck(t, a, e)
		for _, p := range append(own, held[0]) {
			require.NoError(t, a.Free(p))
		}
	})
}

// TestOutOfMemoryErrorPoolLimit: a pool at its limit reports the pool's
// figures, the room its limit leaves, and the limit as the advice.
func TestOutOfMemoryErrorPoolLimit(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(256*mib))
	p, err := a.NewPool(PoolOptions{Name: "capped", MemoryLimit: 32 * mib})
	require.NoError(t, err)
	x, err := p.Malloc(24*mib, 0)
	require.NoError(t, err)
	_, err = p.Malloc(12*mib, 0)
	oom := oomOf(t, err)
	assert.Equal(t, uint64(32*mib), oom.PoolLimit)
	assert.Equal(t, "capped", oom.PoolName)
	assert.Equal(t, uint64(12*mib), oom.Rounded)
	assert.Equal(t, uint64(8*mib), oom.Room(), "the limit's room, not the device's")
	assert.False(t, oom.Fragmented())
	assert.Contains(t, oom.Advice, "MemoryLimit")
	assert.True(t, errors.Is(err, ErrOutOfMemory))
	mustCheck(t, a, e)
	require.NoError(t, a.Free(x))
}

// TestOutOfMemoryErrorWake: a Wake the device has no room for reports
// what it needs (handles, not a block: no Rounded) and what other pools
// cache.
func TestOutOfMemoryErrorWake(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(64*mib))
	roll, err := a.NewPool(PoolOptions{Name: "rollout"})
	require.NoError(t, err)
	w, err := roll.Malloc(32*mib, 0)
	require.NoError(t, err)
	require.NoError(t, roll.Sleep(SleepOptions{Mode: Discard}))
	g, err := a.Malloc(48*mib, 0)
	require.NoError(t, err)

	oom := oomOf(t, roll.Wake())
	assert.Equal(t, roll.ID(), oom.Pool)
	assert.Equal(t, "rollout", oom.PoolName)
	assert.Zero(t, oom.Rounded)
	assert.Equal(t, uint64(32*mib), oom.Tried)
	assert.Zero(t, oom.Largest)
	assert.Zero(t, oom.Unusable)
	assert.False(t, oom.Fragmented())
	assert.Equal(t, uint64(16*mib), oom.Room())
	assert.Contains(t, oom.Advice, "too little free memory")
	assert.NotContains(t, oom.Error(), "largest free block", "a Wake needs no block")
	mustCheck(t, a, e)
	require.NoError(t, a.Free(g))
	require.NoError(t, roll.Wake())
	require.NoError(t, a.Free(w))
}
