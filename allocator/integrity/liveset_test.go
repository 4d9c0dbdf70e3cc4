package integrity

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLiveSetOverlap: given live blocks [0x1000,+0x100) and [0x2000,+1),
// adding a block that touches either is refused, naming both tags; blocks
// beside them, and one added again after its remove, are taken.
func TestLiveSetOverlap(t *testing.T) {
	l := &liveSet{m: map[uintptr]block{}}
	require.NoError(t, l.add(block{ptr: 0x1000, size: 0x100, tag: 1}))
	require.NoError(t, l.add(block{ptr: 0x2000, size: 0, tag: 2})) // a 0-byte block holds its address
	for _, c := range []struct {
		b       block
		overlap bool
	}{
		{block{ptr: 0x1000, size: 1, tag: 3}, true},
		{block{ptr: 0x10ff, size: 1, tag: 3}, true},
		{block{ptr: 0xf00, size: 0x101, tag: 3}, true},
		{block{ptr: 0x2000, size: 8, tag: 3}, true},
		{block{ptr: 0xf00, size: 0x100, tag: 3}, false},
		{block{ptr: 0x1100, size: 0xf00, tag: 4}, false},
	} {
		err := l.add(c.b)
		if c.overlap {
			require.Error(t, err, "%#x+%d", c.b.ptr, c.b.size)
			assert.Contains(t, err.Error(), "tag 0x3")
		} else {
			require.NoError(t, err, "%#x+%d", c.b.ptr, c.b.size)
		}
	}
	l.remove(block{ptr: 0x1000})
	assert.NoError(t, l.add(block{ptr: 0x1080, size: 0x80, tag: 5}))
}
