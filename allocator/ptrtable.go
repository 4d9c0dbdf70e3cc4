package allocator

import "github.com/vmmalloc/vmmalloc/arena"

// ptrTable maps the address of every allocated block to its header: an
// open-addressing hash table with linear probing and backward-shift
// deletion. Keys are nonzero multiples of 512: 0 marks an empty slot, so
// Get and Take of 0 report absence without probing (a probe for 0 would
// match the first empty slot) and Put of 0 is refused. It grows (doubling) when
// more than half full and never shrinks, so the steady-state Malloc/Free
// path neither allocates nor rehashes. Guarded by the allocator's mutex.
type ptrTable struct {
	keys  []uintptr      // 0 = empty slot
	vals  []*arena.Block // vals[i] belongs to keys[i]
	n     int            // occupied slots
	shift uint           // 64 − log2(len(keys))
}

const ptrTableMinSize = 1024

func (t *ptrTable) slot(key uintptr) int {
	return int((uint64(key>>9) * 0x9E3779B97F4A7C15) >> t.shift)
}

func (t *ptrTable) init(size int) {
	t.keys = make([]uintptr, size)
	t.vals = make([]*arena.Block, size)
	t.n = 0
	t.shift = 64
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
}

// Len is the number of entries.
func (t *ptrTable) Len() int { return t.n }

// Get returns the block at key, or nil.
func (t *ptrTable) Get(key uintptr) *arena.Block {
	if t.keys == nil || key == 0 {
		return nil
	}
	mask := len(t.keys) - 1
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case key:
			return t.vals[i]
		case 0:
			return nil
		}
	}
}

// Put inserts or replaces key. Key 0 (the empty-slot mark) is ignored:
// it can never be stored.
func (t *ptrTable) Put(key uintptr, b *arena.Block) {
	if key == 0 {
		return
	}
	if t.keys == nil {
		t.init(ptrTableMinSize)
	}
	if 2*(t.n+1) > len(t.keys) {
		t.grow()
	}
	mask := len(t.keys) - 1
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case key:
			t.vals[i] = b
			return
		case 0:
			t.keys[i], t.vals[i] = key, b
			t.n++
			return
		}
	}
}

// Delete removes key if present.
func (t *ptrTable) Delete(key uintptr) { t.Take(key) }

// Take removes key and returns its block, or returns nil if key is absent.
func (t *ptrTable) Take(key uintptr) *arena.Block {
	if t.keys == nil || key == 0 {
		return nil
	}
	mask := len(t.keys) - 1
	i := t.slot(key)
	for t.keys[i] != key {
		if t.keys[i] == 0 {
			return nil
		}
		i = (i + 1) & mask
	}
	b := t.vals[i]
	// Backward-shift: move later entries of the probe run into the hole.
	for j := (i + 1) & mask; t.keys[j] != 0; j = (j + 1) & mask {
		home := t.slot(t.keys[j])
		// Move j to i if its home is not in the cyclic range (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i], t.vals[i] = 0, nil
	t.n--
	return b
}

func (t *ptrTable) grow() {
	keys, vals := t.keys, t.vals
	t.init(2 * len(keys))
	for i, k := range keys {
		if k != 0 {
			t.Put(k, vals[i])
		}
	}
}

// Reset empties the table.
func (t *ptrTable) Reset() { *t = ptrTable{} }
