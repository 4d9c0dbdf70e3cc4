package plan

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The span sets and their cursors are held to a model: a bitmap of the
// addresses below 256.

type bitmap [256]bool

func (m *bitmap) fill(off, end uint64) {
	for a := off; a < end; a++ {
		m[a] = true
	}
}

// lowest is the smallest o such that [o, o+size) holds no set address.
func (m *bitmap) lowest(size uint64) uint64 {
	for o := uint64(0); ; o++ {
		free := true
		for a := o; a < o+size && a < uint64(len(m)); a++ {
			if m[a] {
				free = false
				break
			}
		}
		if free {
			return o
		}
	}
}

func TestSpanSetAddMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for trial := 0; trial < 500; trial++ {
		var s spanSet
		var m bitmap
		for k := r.IntN(40); k > 0; k-- {
			off := r.Uint64N(240)
			end := off + 1 + r.Uint64N(min(16, 256-off-1))
			s.add(off, end)
			m.fill(off, end)
			// Sorted, disjoint, not touching, and exactly the model.
			var got bitmap
			for k, sp := range s {
				require.Less(t, sp.off, sp.end)
				if k > 0 {
					require.Less(t, s[k-1].end, sp.off, "spans %v", s)
				}
				got.fill(sp.off, sp.end)
			}
			require.Equal(t, m, got)
		}
	}
}

// TestLowestFreeMatchesModel: leapfrogging cursors over several sets find
// the lowest free run of the union, from one query to the next (a cursor
// is fresh per query), including runs that need the cursors to gallop.
func TestLowestFreeMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for trial := 0; trial < 2000; trial++ {
		sets := make([]spanSet, 1+r.IntN(5))
		var m bitmap
		for k := range sets {
			for j := r.IntN(30); j > 0; j-- {
				off := r.Uint64N(200)
				end := off + 1 + r.Uint64N(1+r.Uint64N(12))
				sets[k].add(off, end)
				m.fill(off, end)
			}
		}
		size := 1 + r.Uint64N(1+r.Uint64N(20))
		cursors := make([]cursor, len(sets))
		for k := range sets {
			cursors[k] = cursor{set: sets[k]}
		}
		got, steps := lowestFree(cursors, size)
		require.Equal(t, m.lowest(size), got, "trial %d: sets %v size %d", trial, sets, size)
		require.GreaterOrEqual(t, steps, len(sets))
	}
}

// TestCursorSkip: a cursor asked about a higher offset passes every span
// that ends at or below it, and no other.
func TestCursorSkip(t *testing.T) {
	var s spanSet
	for off := uint64(0); off < 200; off += 4 {
		s.add(off, off+2) // [0,2) [4,6) ... [196,198)
	}
	for off := uint64(0); off < 210; off++ {
		c := cursor{set: s}
		c.skip(off)
		want := 0
		for want < len(s) && s[want].end <= off {
			want++
		}
		require.Equal(t, want, c.at, "off %d", off)
		// Skipping further from where it stands agrees too.
		c.skip(off + 7)
		want2 := want
		for want2 < len(s) && s[want2].end <= off+7 {
			want2++
		}
		require.Equal(t, want2, c.at, "off %d then %d", off, off+7)
	}
}
