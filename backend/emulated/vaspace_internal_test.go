package emulated

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVASpace(t *testing.T) {
	s := newVASpace(0x1000, 0x9000)
	a, ok := s.alloc(0x1000, 0x1000)
	require.True(t, ok)
	assert.Equal(t, uint64(0x1000), a)
	b, ok := s.alloc(0x1000, 0x4000) // aligned: skips to 0x4000
	require.True(t, ok)
	assert.Equal(t, uint64(0x4000), b)
	assert.Equal(t, []vaSpan{{0x2000, 0x4000}, {0x5000, 0x9000}}, s.free)
	c, ok := s.alloc(0x2000, 0x1000) // first fit: the hole before b
	require.True(t, ok)
	assert.Equal(t, uint64(0x2000), c)
	_, ok = s.alloc(0x5000, 0x1000)
	assert.False(t, ok, "only 0x4000 left")

	assert.False(t, s.allocAt(0x4800, 0x1000), "taken")
	assert.False(t, s.allocAt(0x8800, 0x1000), "past the end")
	require.True(t, s.allocAt(0x6000, 0x1000))
	assert.Equal(t, []vaSpan{{0x5000, 0x6000}, {0x7000, 0x9000}}, s.free)

	// Releases coalesce with both neighbours.
	s.release(0x4000, 0x1000)
	assert.Equal(t, []vaSpan{{0x4000, 0x6000}, {0x7000, 0x9000}}, s.free)
	s.release(0x6000, 0x1000)
	assert.Equal(t, []vaSpan{{0x4000, 0x9000}}, s.free)
	s.release(0x1000, 0x1000)
	assert.Equal(t, []vaSpan{{0x1000, 0x2000}, {0x4000, 0x9000}}, s.free)
	s.release(0x2000, 0x2000)
	assert.Equal(t, []vaSpan{{0x1000, 0x9000}}, s.free)
	_, ok = s.alloc(1<<62, 0x1000)
	assert.False(t, ok)
}

func TestAlignUp(t *testing.T) {
	v, ok := alignUp(5, 4)
	assert.True(t, ok)
	assert.Equal(t, uint64(8), v)
	_, ok = alignUp(^uint64(0)-2, 4)
	assert.False(t, ok)
}

func TestIndex(t *testing.T) {
	x := newIndex[string]()
	x.put(10, 20, "a")
	x.put(30, 40, "b")
	for _, c := range []struct {
		a    uint64
		want string
	}{{10, "a"}, {19, "a"}, {20, ""}, {29, ""}, {30, "b"}, {39, "b"}, {40, ""}, {5, ""}} {
		e, ok := x.containing(c.a)
		assert.Equal(t, c.want != "", ok, "%d", c.a)
		assert.Equal(t, c.want, e.v, "%d", c.a)
	}
	assert.True(t, x.overlaps(15, 35))
	assert.True(t, x.overlaps(35, 36))
	assert.False(t, x.overlaps(20, 30))
	assert.False(t, x.overlaps(0, 10))
	_, ok := x.at(11)
	assert.False(t, ok)
	e, ok := x.at(30)
	assert.True(t, ok)
	assert.Equal(t, "b", e.v)
	var seen []string
	x.each(func(e entry[string]) bool { seen = append(seen, e.v); return true })
	assert.Equal(t, []string{"a", "b"}, seen)
	x.del(10)
	assert.Equal(t, 1, x.len())
}
