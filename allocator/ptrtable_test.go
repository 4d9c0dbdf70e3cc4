package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/arena"
)

// TestPtrTableAgainstMap drives ptrTable and a Go map with the same random
// operations, with clustered keys that collide in the probe sequence.
func TestPtrTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tab ptrTable
	ref := map[uintptr]*arena.Block{}
	var keys []uintptr
	for i := 0; i < 100_000; i++ {
		switch {
		case rng.IntN(3) != 0 || len(keys) == 0:
			k := uintptr(rng.IntN(1<<14)+1) * 512
			if rng.IntN(2) == 0 {
				k = uintptr(rng.Uint64N(1<<40)+1) * 512
			}
			b := &arena.Block{Addr: k}
			if _, ok := ref[k]; !ok {
				keys = append(keys, k)
			}
			tab.Put(k, b)
			ref[k] = b
		default:
			j := rng.IntN(len(keys))
			k := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			require.Same(t, ref[k], tab.Take(k))
			delete(ref, k)
		}
		if i%10_000 == 0 {
			require.Equal(t, len(ref), tab.Len())
			for k, v := range ref {
				require.Same(t, v, tab.Get(k))
			}
			assert.Nil(t, tab.Get(1<<50), "never inserted")
		}
	}
	// Every entry is found (and Len rules out any extra one).
	require.Equal(t, len(ref), tab.Len())
	for k, v := range ref {
		assert.Same(t, v, tab.Get(k))
	}
	tab.Delete(1 << 50) // absent: no-op
	assert.Equal(t, len(ref), tab.Len())
}

// TestPtrTableZeroKey is the regression test for issue 7 §1: 0 marks an
// empty slot, and a Take(0) used to match the first empty slot, shift the
// probe run and decrement the count, so the table believed it was emptier
// than it was and a later Put probed forever.
func TestPtrTableZeroKey(t *testing.T) {
	var tab ptrTable
	assert.Nil(t, tab.Take(0), "empty table")
	assert.Nil(t, tab.Get(0), "empty table")
	blocks := map[uintptr]*arena.Block{}
	for i := uintptr(1); i <= 600; i++ {
		k := i * 512
		blocks[k] = &arena.Block{Addr: k}
		tab.Put(k, blocks[k])
	}
	for range 5000 {
		require.Nil(t, tab.Take(0))
		require.Nil(t, tab.Get(0))
		tab.Delete(0)
	}
	tab.Put(0, &arena.Block{}) // refused: 0 can never be a key
	assert.Nil(t, tab.Get(0))
	require.Equal(t, len(blocks), tab.Len(), "count unchanged")
	for k, b := range blocks {
		require.Same(t, b, tab.Get(k), "key %#x", k)
	}
	// The table still fills and grows normally (this Put used to spin).
	for i := uintptr(601); i <= 5000; i++ {
		tab.Put(i*512, &arena.Block{Addr: i * 512})
	}
	assert.Equal(t, 5000, tab.Len())
}
