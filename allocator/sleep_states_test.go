package allocator

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestSleepStates runs every call of a pool in every state of the sleep
// state machine (awake, asleep in each mode, closed): each succeeds or
// answers its typed error, Check passes after it, and the pool is never
// left part mapped: its live blocks are all mapped (awake) or none is
// (asleep). A duplicate Sleep or Wake changes nothing, and the offloaded
// contents survive it (vllm-omni#4473: garbage after a duplicate wake).
func TestSleepStates(t *testing.T) {
	type env struct {
		a    *Allocator
		e    *emulated.Emulator
		p    *Pool
		live []patterned
		host *pinnedHost
	}
	states := []struct {
		name string
		mode SleepMode
		to   func(t *testing.T, v *env) // from awake with live blocks
	}{
		{"awake", 0, func(*testing.T, *env) {}},
		{"asleep/discard", Discard, nil},
		{"asleep/offload", Offload, nil},
		{"asleep/memset", Memset, nil},
		{"closed", 0, func(t *testing.T, v *env) {
			for _, b := range v.live {
				require.NoError(t, v.a.Free(b.p))
			}
			require.NoError(t, v.p.Close())
		}},
	}
	// want: the error each call answers in each state ("" ok), by state
	// name prefix: awake, asleep, closed.
	calls := []struct {
		name string
		call func(v *env) error
		want map[string]error
	}{
		{"Malloc", func(v *env) error { _, err := v.p.Malloc(1<<20, 0); return err },
			map[string]error{"awake": nil, "asleep": ErrPoolAsleep, "closed": ErrClosed}},
		{"Free", func(v *env) error { return v.a.Free(v.live[0].p) },
			map[string]error{"awake": nil, "asleep": nil, "closed": ErrUnknownPointer}},
		{"RecordStream", func(v *env) error { return v.a.RecordStream(v.live[0].p, v.a.DefaultStream()) },
			map[string]error{"awake": nil, "asleep": ErrPoolAsleep, "closed": ErrUnknownPointer}},
		{"Sleep(discard)", func(v *env) error { return v.p.Sleep(SleepOptions{Mode: Discard}) },
			map[string]error{"awake": nil, "asleep": ErrPoolAsleep, "closed": ErrClosed}},
		{"Sleep(offload)", func(v *env) error { return v.p.Sleep(SleepOptions{Mode: Offload, Host: v.host}) },
			map[string]error{"awake": nil, "asleep": ErrPoolAsleep, "closed": ErrClosed}},
		{"Sleep(memset)", func(v *env) error { return v.p.Sleep(SleepOptions{Mode: Memset}) },
			map[string]error{"awake": nil, "asleep": ErrPoolAsleep, "closed": ErrClosed}},
		{"Wake", func(v *env) error { return v.p.Wake() },
			map[string]error{"awake": ErrPoolAwake, "asleep": nil, "closed": ErrClosed}},
		{"Close", func(v *env) error { return v.p.Close() }, // live blocks: refused
			map[string]error{"awake": ErrPoolBusy, "asleep": ErrPoolAsleep, "closed": ErrClosed}},
		{"EmptyCache", func(v *env) error { return v.p.EmptyCache() },
			map[string]error{"awake": nil, "asleep": nil, "closed": ErrClosed}},
		{"Allocator.EmptyCache", func(v *env) error { return v.a.EmptyCache() },
			map[string]error{"awake": nil, "asleep": nil, "closed": nil}},
		{"Stats", func(v *env) error {
			st := v.p.Stats()
			if v.p.SleepState() == Asleep && st.AsleepBytes == 0 {
				return fmt.Errorf("asleep with no AsleepBytes")
			}
			return nil
		}, map[string]error{"awake": nil, "asleep": nil, "closed": nil}},
	}
	prefix := func(state string) string {
		for _, p := range []string{"awake", "asleep", "closed"} {
			if len(state) >= len(p) && state[:len(p)] == p {
				return p
			}
		}
		return state
	}
	for _, st := range states {
		for _, c := range calls {
			t.Run(st.name+"/"+c.name, func(t *testing.T) {
				a, e := newAlloc(t, "large_segment_size_mb:2,small_segment_size_mb:2", emulated.WithRealMemory(), emulated.WithCapacity(64<<20))
				p, err := a.NewPool(PoolOptions{Name: "weights"})
				require.NoError(t, err)
				var live []patterned
				for i, n := range []int{700, 64 << 10, 2<<20 + 4096, 2000} {
					ptr, err := p.Malloc(uint64(n), 0)
					require.NoError(t, err)
					live = append(live, fill(t, e, a.DefaultStream(), ptr, n, uint64(i+1)))
				}
				v := &env{a: a, e: e, p: p, live: live, host: newPinnedHost(e)}
				if st.to != nil {
					st.to(t, v)
				} else {
					require.NoError(t, p.Sleep(SleepOptions{Mode: st.mode, Host: v.host}))
				}
				before := p.SleepState()
				err = c.call(v)
				want := c.want[prefix(st.name)]
				if want == nil {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, want)
				}
				mustCheck(t, a, e)
				// Never part mapped.
				state := p.SleepState()
				if st.name == "closed" {
					return
				}
				if err != nil {
					assert.Equal(t, before, state, "a refused call changes no state")
				}
				freed := c.name == "Free" && err == nil
				ms := e.Mappings()
				isMapped := func(va uintptr) bool {
					for _, m := range ms {
						if va >= m.VA && va < m.VA+uintptr(m.Size) {
							return true
						}
					}
					return false
				}
				mapped := 0
				for i, b := range live {
					if freed && i == 0 {
						continue
					}
					if isMapped(b.p) {
						mapped++
					}
				}
				n := len(live)
				if freed {
					n--
				}
				switch state {
				case Awake:
					assert.Equal(t, n, mapped, "awake: every live block mapped")
				case Asleep:
					assert.Zero(t, mapped, "asleep: no live block mapped")
				default:
					t.Fatalf("left %s", state)
				}
				// Contents survive: an Offload sleep and its Wake, or a
				// duplicate Sleep or Wake.
				if state == Asleep {
					require.NoError(t, p.Wake())
				}
				if st.mode == Offload || st.name == "awake" && c.name != "Sleep(discard)" && c.name != "Sleep(memset)" {
					if freed {
						live = live[1:]
					}
					verify(t, e, a.DefaultStream(), live)
				}
				mustCheck(t, a, e)
			})
		}
	}
}
