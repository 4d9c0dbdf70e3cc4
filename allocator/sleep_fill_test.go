package allocator

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// TestSleepWakeFill: Memset zero-fills the pool's memory at Wake, and
// Poison fills what the sleep discarded with PoisonByte: in Discard the
// whole memory, in Offload all but the restored bytes (the free cache
// here). A failing fill rolls the Wake back, and a retry fills.
func TestSleepWakeFill(t *testing.T) {
	tests := []struct {
		name     string
		opts     SleepOptions
		live     byte // what the live blocks read after Wake; 1: their contents
		freeFill byte // what the free cache reads after Wake
	}{
		{"memset", SleepOptions{Mode: Memset}, 0, 0},
		{"discard+poison", SleepOptions{Mode: Discard, Poison: true}, PoisonByte, PoisonByte},
		{"offload+poison", SleepOptions{Mode: Offload, Poison: true}, 1, PoisonByte},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, e, p, live := sleepSetup(t, "large_segment_size_mb:2,small_segment_size_mb:2")
			s := a.DefaultStream()
			// The free cache: a block freed before the sleep, its bytes set.
			f, err := p.Malloc(2<<20, 0)
			require.NoError(t, err)
			fill(t, e, s, f, 2<<20, 99)
			require.NoError(t, a.Free(f))
			for n := 0; n < 2; n++ {
				require.NoError(t, p.Sleep(tc.opts))
				if n == 0 {
					require.NoError(t, e.FailNth(backend.OpMemset, 2, backend.ErrUnavailable))
					err := p.Wake()
					e.ClearFaults()
					require.ErrorIs(t, err, backend.ErrUnavailable)
					assert.Equal(t, Asleep, p.SleepState(), "a failed fill leaves the pool asleep")
					mustCheck(t, a, e)
				}
				require.NoError(t, p.Wake())
				mustCheck(t, a, e)
				for _, b := range live {
					got := make([]byte, len(b.data))
					require.NoError(t, e.CopyDtoH(got, b.p, s))
					if tc.live == 1 {
						require.True(t, bytes.Equal(b.data, got), "block %#x lost its contents", b.p)
					} else {
						require.Equal(t, bytes.Repeat([]byte{tc.live}, len(got)), got, "block %#x", b.p)
					}
				}
				got := make([]byte, 2<<20)
				require.NoError(t, e.CopyDtoH(got, f, s))
				require.Equal(t, bytes.Repeat([]byte{tc.freeFill}, len(got)), got, "the free cache at %#x", f)
				for _, b := range live { // write again for the next round
					require.NoError(t, e.CopyHtoD(b.p, b.data, s))
				}
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		a, e, p, _ := sleepSetup(t, "")
		assert.ErrorIs(t, p.Sleep(SleepOptions{Mode: Memset, Poison: true}), ErrInvalidConfig)
		assert.ErrorIs(t, p.Sleep(SleepOptions{Mode: 3}), ErrInvalidConfig)
		assert.Equal(t, Awake, p.SleepState())
		assert.Equal(t, "memset", Memset.String())
		mustCheck(t, a, e)
	})
}
