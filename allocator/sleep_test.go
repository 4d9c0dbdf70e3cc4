package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

// pinnedHost is a HostAllocator straight over the driver's pinned host
// memory (package host imports this one, so its tests cannot use it).
type pinnedHost struct {
	mu   sync.Mutex
	d    backend.HostMemory
	live map[uintptr]bool
}

func newPinnedHost(d backend.HostMemory) *pinnedHost {
	return &pinnedHost{d: d, live: map[uintptr]bool{}}
}

func (h *pinnedHost) Malloc(n uint64) (uintptr, error) {
	p, err := h.d.MallocHost(n)
	if err == nil {
		h.mu.Lock()
		h.live[p] = true
		h.mu.Unlock()
	}
	return p, err
}

func (h *pinnedHost) Free(p uintptr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.live[p] {
		return fmt.Errorf("pinnedHost: free of %#x, not live", p)
	}
	if err := h.d.FreeHost(p); err != nil {
		return err
	}
	delete(h.live, p)
	return nil
}

func (h *pinnedHost) Live() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.live)
}

// patterned is a live allocation whose bytes the test wrote.
type patterned struct {
	p    uintptr
	data []byte
}

func fill(t testing.TB, c backend.Copier, s backend.Stream, p uintptr, n int, seed uint64) patterned {
	t.Helper()
	data := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 7}).Read(data)
	require.NoError(t, c.CopyHtoD(p, data, s))
	return patterned{p: p, data: data}
}

func verify(t testing.TB, c backend.Copier, s backend.Stream, bs []patterned) {
	t.Helper()
	for _, b := range bs {
		got := make([]byte, len(b.data))
		require.NoError(t, c.CopyDtoH(got, b.p, s))
		require.True(t, bytes.Equal(b.data, got), "block %#x+%d lost its contents", b.p, len(b.data))
	}
}

// sleepSetup makes an allocator over the emulator with real memory and a
// pool with blocks of several size classes, some spanning several
// handles, and some free cache; it returns the live blocks.
func sleepSetup(t *testing.T, conf string, opts ...emulated.Option) (*Allocator, *emulated.Emulator, *Pool, []patterned) {
	t.Helper()
	opts = append([]emulated.Option{emulated.WithRealMemory(), emulated.WithCapacity(256 << 20)}, opts...)
	a, e := newAlloc(t, conf, opts...)
	p, err := a.NewPool(PoolOptions{Name: "weights"})
	require.NoError(t, err)
	s := a.DefaultStream()
	var live []patterned
	for i, n := range []int{700, 300 << 10, 5<<20 + 4096, 1 << 20, 9 << 20, 2000, 3<<20 + 512} {
		ptr, err := p.Malloc(uint64(n), 0)
		require.NoError(t, err)
		live = append(live, fill(t, e, s, ptr, n, uint64(i+1)))
	}
	// Free cache inside the pool's handles.
	require.NoError(t, a.Free(live[3].p))
	live = append(live[:3], live[4:]...)
	return a, e, p, live
}

func TestSleepWakeOffloadKeepsContents(t *testing.T) {
	for _, conf := range []string{"", "large_segment_size_mb:2,small_segment_size_mb:2", "expandable_handle_mb:4,large_segment_size_mb:2"} {
		for _, keep := range []bool{false, true} {
			t.Run(fmt.Sprintf("%q/keep=%v", conf, keep), func(t *testing.T) {
				a, e, p, live := sleepSetup(t, conf)
				s := a.DefaultStream()
				host := newPinnedHost(e)
				other, err := a.Malloc(1<<20, 0) // the default pool stays awake
				require.NoError(t, err)
				for cycle := 0; cycle < 3; cycle++ {
					reserved := p.MemoryReserved()
					freeBefore, _, err := e.MemGetInfo(0)
					require.NoError(t, err)
					require.NoError(t, p.Sleep(SleepOptions{Mode: Offload, Host: host, KeepHostBuffers: keep}))
					assert.Equal(t, Asleep, p.SleepState())
					mustCheck(t, a, e)
					freeAsleep, _, err := e.MemGetInfo(0)
					require.NoError(t, err)
					assert.Equal(t, freeBefore+reserved, freeAsleep, "device free memory rises by the pool's reserved bytes")
					st := p.Stats()
					assert.Equal(t, int64(reserved), st.AsleepBytes)
					assert.Zero(t, st.ReservedBytes[0].Current)
					var want int64
					for _, b := range live {
						want += int64(len(b.data))
					}
					assert.GreaterOrEqual(t, st.HostBackupBytes, want)
					assert.Equal(t, int64(reserved), a.Stats().AsleepBytes)

					_, err = p.Malloc(4096, 0)
					assert.ErrorIs(t, err, ErrPoolAsleep)
					assert.ErrorIs(t, a.RecordStream(live[0].p, s), ErrPoolAsleep)
					assert.ErrorIs(t, p.Sleep(SleepOptions{}), ErrPoolAsleep)
					_, _, err = a.Spans(live[0].p)
					assert.ErrorIs(t, err, ErrPoolAsleep)
					assert.ErrorIs(t, p.Close(), ErrPoolAsleep)
					// The default pool works while the pool sleeps.
					q, err := a.Malloc(3<<20, 0)
					require.NoError(t, err)
					require.NoError(t, a.Free(q))

					if cycle == 1 { // a block freed while asleep
						require.NoError(t, a.Free(live[1].p))
						live = append(live[:1], live[2:]...)
						mustCheck(t, a, e)
					}
					require.NoError(t, p.Wake())
					assert.Equal(t, Awake, p.SleepState())
					assert.ErrorIs(t, p.Wake(), ErrPoolAwake)
					mustCheck(t, a, e)
					verify(t, e, s, live)
					assert.Equal(t, reserved, p.MemoryReserved(), "the same handles come back, free cache included")
					st = p.Stats()
					assert.Zero(t, st.AsleepBytes)
					if keep {
						assert.Positive(t, st.HostBackupBytes)
						assert.Positive(t, host.Live())
					} else {
						assert.Zero(t, st.HostBackupBytes)
						assert.Zero(t, host.Live())
					}
					// The pool allocates again, into its cache.
					x, err := p.Malloc(100<<10, 0)
					require.NoError(t, err)
					live = append(live, fill(t, e, s, x, 100<<10, uint64(100+cycle)))
				}
				require.NoError(t, a.Free(other))
				for _, b := range live {
					require.NoError(t, a.Free(b.p))
				}
				require.NoError(t, p.Close())
				assert.Zero(t, host.Live(), "Close gives kept buffers back")
				mustCheck(t, a, e)
			})
		}
	}
}

func TestSleepDefaultPoolDiscard(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithRealMemory(), emulated.WithCapacity(128<<20))
	d := a.DefaultPool()
	var ptrs []uintptr
	for _, n := range []uint64{1 << 20, 30 << 20, 4096} {
		p, err := a.Malloc(n, 0)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
	}
	reserved := a.MemoryReserved()
	require.NoError(t, d.Sleep(SleepOptions{Mode: Discard}))
	assert.Zero(t, a.MemoryReserved())
	assert.Equal(t, int64(reserved), a.Stats().AsleepBytes)
	assert.Zero(t, a.Stats().HostBackupBytes)
	_, err := a.Malloc(512, 0)
	assert.ErrorIs(t, err, ErrPoolAsleep)
	mustCheck(t, a, e)
	require.NoError(t, d.Wake())
	assert.Equal(t, reserved, a.MemoryReserved())
	// Discarded, but mapped and writable at the same addresses.
	for i, p := range ptrs {
		verify(t, e, a.DefaultStream(), []patterned{fill(t, e, a.DefaultStream(), p, 4096, uint64(i))})
		require.NoError(t, a.Free(p))
	}
	mustCheck(t, a, e)
}

func TestSleepRefusals(t *testing.T) {
	t.Run("classic", func(t *testing.T) {
		a, _ := newAlloc(t, "", emulated.WithCapacity(gib))
		p, err := a.NewPool(PoolOptions{Segments: SegmentsClassic})
		require.NoError(t, err)
		assert.ErrorIs(t, p.Sleep(SleepOptions{}), ErrInvalidPool)
		assert.ErrorIs(t, p.Wake(), ErrPoolAwake)
		assert.Equal(t, Awake, p.SleepState())
	})
	t.Run("bad options", func(t *testing.T) {
		a, _ := newAlloc(t, "", emulated.WithCapacity(gib))
		assert.ErrorIs(t, a.DefaultPool().Sleep(SleepOptions{Mode: 7}), ErrInvalidConfig)
		// Offload needs a Copier: the emulator without real memory has
		// one, but its copies fail, and the sleep rolls back.
		p, err := a.Malloc(1<<20, 0)
		require.NoError(t, err)
		err = a.DefaultPool().Sleep(SleepOptions{Mode: Offload})
		assert.ErrorIs(t, err, backend.ErrNotSupported)
		assert.Equal(t, Awake, a.DefaultPool().SleepState())
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Check())
	})
	t.Run("exported", func(t *testing.T) {
		a, e := newAlloc(t, "", emulated.WithCapacity(gib))
		p, err := a.NewPool(PoolOptions{})
		require.NoError(t, err)
		x, err := p.Malloc(4<<20, 0)
		require.NoError(t, err)
		r := newRefHolder(e)
		r.share(t, a, x)
		assert.ErrorIs(t, p.Sleep(SleepOptions{}), ErrPoolExported)
		assert.Equal(t, Awake, p.SleepState())
		require.NoError(t, a.Free(x))
		require.NoError(t, a.EmptyCache()) // the holder lets its references go
		require.NoError(t, a.Check())
	})
	t.Run("closed", func(t *testing.T) {
		a, _ := newAlloc(t, "", emulated.WithCapacity(gib))
		p, err := a.NewPool(PoolOptions{})
		require.NoError(t, err)
		require.NoError(t, p.Close())
		assert.ErrorIs(t, p.Sleep(SleepOptions{}), ErrClosed)
		require.NoError(t, a.Close())
		assert.ErrorIs(t, a.DefaultPool().Wake(), ErrClosed)
	})
}

// TestSleepWakeOOM: a pool's sleep frees memory another pool uses at
// once; its wake takes back the other pool's free cache through the
// ladder, or, while the other pool holds the memory, fails with an
// *OutOfMemoryError and stays asleep with its backups intact.
func TestSleepWakeOOM(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithRealMemory(), emulated.WithCapacity(128<<20))
	s := a.DefaultStream()
	host := newPinnedHost(e)
	roll, err := a.NewPool(PoolOptions{Name: "rollout"})
	require.NoError(t, err)
	train, err := a.NewPool(PoolOptions{Name: "train"})
	require.NoError(t, err)
	w, err := roll.Malloc(80<<20, 0)
	require.NoError(t, err)
	weights := []patterned{fill(t, e, s, w, 80<<20, 42)}
	_, err = train.Malloc(80<<20, 0)
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom, "the device cannot hold both")

	require.NoError(t, roll.Sleep(SleepOptions{Mode: Offload, Host: host}))
	g, err := train.Malloc(80<<20, 0)
	require.NoError(t, err, "the sleeping pool's memory is free at once")
	_, err = train.Malloc(60<<20, 0)
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, uint64(80<<20), oom.AsleepAllocated, "the rollout pool's weights are allocated, not mapped")
	assert.Contains(t, oom.Error(), "80 MiB of the allocated memory is in pools asleep")
	assert.Contains(t, oom.Error(), "0 B is reserved by vmmalloc but unallocated", "reserved minus the mapped allocations")

	err = roll.Wake()
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, roll.ID(), oom.Pool)
	assert.Equal(t, Asleep, roll.SleepState())
	mustCheck(t, a, e)

	require.NoError(t, a.Free(g)) // free cache of the training pool
	assert.Positive(t, train.MemoryReserved())
	require.NoError(t, roll.Wake(), "the ladder takes back the other pool's cache")
	assert.Zero(t, train.MemoryReserved())
	verify(t, e, s, weights)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(w))
}

// sleepOps and wakeOps are the driver calls Sleep and Wake make.
var (
	sleepOps = []backend.Op{backend.OpStreamSync, backend.OpMallocHost, backend.OpMemcpy, backend.OpUnmap, backend.OpFree, backend.OpFreeHost, backend.OpEventQuery}
	wakeOps  = []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess, backend.OpMemcpy, backend.OpFreeHost, backend.OpMemGetInfo, backend.OpUnmap, backend.OpFree}
)

// TestSleepWakeFaultSweep fails every driver call of Sleep and of Wake
// once, one call index at a time: each failure leaves the pool in the
// state before the call with its contents intact (or, for a handle whose
// free failed, asleep with the handle kept), and nothing leaks.
func TestSleepWakeFaultSweep(t *testing.T) {
	for _, phase := range []string{"sleep", "wake"} {
		ops := sleepOps
		if phase == "wake" {
			ops = wakeOps
		}
		for _, op := range ops {
			for _, kind := range []error{backend.ErrUnavailable, backend.ErrOutOfMemory} {
				t.Run(fmt.Sprintf("%s/%v/%v", phase, op, kind), func(t *testing.T) {
					a, e, p, live := sleepSetup(t, "large_segment_size_mb:2,small_segment_size_mb:2")
					s := a.DefaultStream()
					host := newPinnedHost(e)
					opts := SleepOptions{Mode: Offload, Host: host}
					reserved := p.MemoryReserved()
					fired := 0
					for n := 1; ; n++ {
						if phase == "wake" {
							require.NoError(t, p.Sleep(opts))
						}
						before := e.Calls(op)
						require.NoError(t, e.FailNth(op, n, kind))
						var err error
						if phase == "sleep" {
							err = p.Sleep(opts)
						} else {
							err = p.Wake()
						}
						reached := e.Calls(op)-before >= int64(n)
						e.ClearFaults()
						mustCheck(t, a, e)
						switch st := p.SleepState(); {
						case err == nil:
							// A failure the call absorbs (a retried create, a
							// host free); it must still have done its work.
							if phase == "sleep" {
								require.Equal(t, Asleep, st)
							} else {
								require.Equal(t, Awake, st)
							}
						case phase == "sleep" && errors.Is(err, segment.ErrHandleNotFreed):
							require.Equal(t, Asleep, st, "%v", err)
						case phase == "sleep":
							require.Equal(t, Awake, st, "%v", err)
							require.Equal(t, reserved, p.MemoryReserved())
							verify(t, e, s, live)
						default:
							require.Equal(t, Asleep, st, "%v", err)
						}
						if reached {
							fired++
						}
						if p.SleepState() == Asleep {
							require.NoError(t, p.Wake())
						}
						mustCheck(t, a, e)
						verify(t, e, s, live)
						require.Equal(t, reserved, p.MemoryReserved())
						if !reached {
							break
						}
					}
					if phase == "sleep" && (op == backend.OpUnmap || op == backend.OpFree || op == backend.OpMemcpy || op == backend.OpMallocHost) ||
						phase == "wake" && (op == backend.OpCreate || op == backend.OpMap || op == backend.OpSetAccess || op == backend.OpMemcpy) {
						assert.Positive(t, fired, "the sweep must reach %v", op)
					}
					for _, b := range live {
						require.NoError(t, a.Free(b.p))
					}
					require.NoError(t, p.Close())
					assert.Zero(t, host.Live())
				})
			}
		}
	}
}

// TestSleepWakeRollbackDoubleFault fails a call of Sleep (an unmap) or
// Wake (a map) and, once, the call of the rollback that undoes it (the
// map back, the unmap): the rollback tries again, and the pool is left
// as it was before the call, its contents intact, then sleeps and wakes.
func TestSleepWakeRollbackDoubleFault(t *testing.T) {
	tests := []struct {
		phase     string
		fail      backend.Op // the call that fails, at its n-th call
		rollback  backend.Op // the rollback's call that fails once
		wantState SleepState
	}{
		{"sleep", backend.OpUnmap, backend.OpMap, Awake},
		{"wake", backend.OpMap, backend.OpUnmap, Asleep},
		{"wake", backend.OpSetAccess, backend.OpUnmap, Asleep},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v/%v", tc.phase, tc.fail, tc.rollback), func(t *testing.T) {
			a, e, p, live := sleepSetup(t, "large_segment_size_mb:2,small_segment_size_mb:2")
			s := a.DefaultStream()
			opts := SleepOptions{Mode: Offload, Host: newPinnedHost(e)}
			reserved := p.MemoryReserved()
			for n := 2; n <= 3; n++ { // a later call: the rollback has something to undo
				if tc.phase == "wake" {
					require.NoError(t, p.Sleep(opts))
				}
				require.NoError(t, e.FailNth(tc.fail, n, backend.ErrUnavailable))
				require.NoError(t, e.FailNth(tc.rollback, 1, backend.ErrUnavailable))
				failed := e.Failures(tc.rollback)
				var err error
				if tc.phase == "sleep" {
					err = p.Sleep(opts)
				} else {
					err = p.Wake()
				}
				require.Error(t, err)
				assert.Equal(t, int64(1), e.Failures(tc.rollback)-failed, "the rollback's call failed once")
				e.ClearFaults()
				mustCheck(t, a, e)
				require.Equal(t, tc.wantState, p.SleepState())
				if tc.phase == "wake" {
					require.NoError(t, p.Wake())
				}
				mustCheck(t, a, e)
				verify(t, e, s, live)
				require.Equal(t, reserved, p.MemoryReserved())
			}
		})
	}
}

// TestSleepStreamDestroyed: a stream with work on the pool's memory,
// destroyed without ReleaseStream, cannot be synchronized; Sleep waits for
// the whole device instead (its work still runs), so nothing is unmapped
// under it. Without a driver that can wait for a device, Sleep refuses
// with ErrInvalidStream and the pool stays awake.
func TestSleepStreamDestroyed(t *testing.T) {
	for _, devSync := range []bool{true, false} {
		t.Run(fmt.Sprintf("devsync=%v", devSync), func(t *testing.T) {
			var (
				a *Allocator
				e *emulated.Emulator
			)
			if devSync {
				a, e = newAlloc(t, "", emulated.WithManualCompletion())
			} else {
				a, e = newAllocNoDevSync(t, emulated.WithManualCompletion())
			}
			p, err := a.NewPool(PoolOptions{Name: "kv"})
			require.NoError(t, err)
			s, err := e.StreamCreate(0)
			require.NoError(t, err)
			ptr, err := p.Malloc(3*mib, s)
			require.NoError(t, err)
			require.NoError(t, e.Launch(s, ptr, 1))
			require.NoError(t, e.StreamDestroy(s)) // its work is still queued
			err = p.Sleep(SleepOptions{Mode: Discard})
			if !devSync {
				require.ErrorIs(t, err, ErrInvalidStream)
				assert.Equal(t, Awake, p.SleepState())
				require.NoError(t, a.Check())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Asleep, p.SleepState())
			assert.Empty(t, e.Violations(), "nothing unmapped under the destroyed stream's work")
			require.NoError(t, p.Wake())
			require.NoError(t, a.Free(ptr))
			mustCheck(t, a, e)
		})
	}
}

// TestSleepWakeHooks: the hooks see the pool's ranges unmapped at sleep
// and mapped (and accessible) at wake; a hook refusing the wake keeps the
// pool asleep with nothing mapped.
func TestSleepWakeHooks(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(gib))
	p, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	x, err := p.Malloc(50<<20, 0)
	require.NoError(t, err)
	g := newRegistrar(e)
	_, err = a.AddSegmentHook(g.hook(p))
	require.NoError(t, err)
	maps, unms := g.maps, g.unms
	require.NoError(t, p.Sleep(SleepOptions{}))
	assert.Equal(t, unms+1, g.unms)
	assert.Empty(t, g.regs)
	require.NoError(t, p.Wake())
	assert.Equal(t, maps+1, g.maps)
	assert.Len(t, g.regs, 1)

	require.NoError(t, p.Sleep(SleepOptions{}))
	g.fail = func(SegmentRange) error { return errors.New("no") }
	err = p.Wake()
	assert.ErrorIs(t, err, ErrSegmentHook)
	assert.Equal(t, Asleep, p.SleepState())
	mustCheck(t, a, e)
	g.fail = nil
	require.NoError(t, p.Wake())
	require.NoError(t, a.Free(x))
	mustCheck(t, a, e)
}

// TestSleepWakeConcurrent: goroutines sleep, wake, allocate and free on
// several pools at once; every refusal is typed, and the invariants hold.
func TestSleepWakeConcurrent(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(4*gib))
	pools := []*Pool{a.DefaultPool()}
	for i := 0; i < 3; i++ {
		p, err := a.NewPool(PoolOptions{Name: fmt.Sprint("p", i)})
		require.NoError(t, err)
		pools = append(pools, p)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for gi := 0; gi < 6; gi++ {
		wg.Add(1)
		go func(gi int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(gi), 3))
			var mine []uintptr
			for i := 0; i < 150; i++ {
				p := pools[rng.IntN(len(pools))]
				var err error
				switch rng.IntN(5) {
				case 0:
					err = p.Sleep(SleepOptions{})
					if errors.Is(err, ErrPoolAsleep) || errors.Is(err, ErrSleepInProgress) {
						err = nil
					}
				case 1:
					err = p.Wake()
					if errors.Is(err, ErrPoolAwake) || errors.Is(err, ErrSleepInProgress) {
						err = nil
					}
				case 2, 3:
					var x uintptr
					x, err = p.Malloc(uint64(1+rng.IntN(8<<20)), 0)
					if errors.Is(err, ErrPoolAsleep) {
						err = nil
					} else if err == nil {
						mine = append(mine, x)
					}
				default:
					if len(mine) > 0 {
						j := rng.IntN(len(mine))
						err = a.Free(mine[j])
						mine = append(mine[:j], mine[j+1:]...)
					}
				}
				if err != nil {
					errc <- err
					return
				}
			}
			for _, x := range mine {
				if err := a.Free(x); err != nil {
					errc <- err
					return
				}
			}
		}(gi)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	mustCheck(t, a, e)
	for _, p := range pools {
		if p.SleepState() == Asleep {
			require.NoError(t, p.Wake())
		}
	}
	mustCheck(t, a, e)
	assert.Zero(t, a.MemoryAllocated())
}

// TestSleepWakeDriverCallsWithoutLock holds one driver call of a Wake
// (a handle creation, a map, a set access) or of a Sleep (an unmap) and
// proves that meanwhile the allocator's mutex is free: a cache hit and a
// free on another pool complete without a driver call, Stats and
// SleepState answer (the pool is Waking or Sleeping), the pool's own
// Malloc and a second Wake or Sleep are refused with typed errors. Then
// the held call goes on, or fails: a failed Wake leaves the pool asleep,
// a failed Sleep awake, with contents intact and nothing leaked.
func TestSleepWakeDriverCallsWithoutLock(t *testing.T) {
	type tc struct {
		phase string
		op    backend.Op
	}
	cases := []tc{{"wake", backend.OpCreate}, {"wake", backend.OpMap}, {"wake", backend.OpSetAccess}, {"sleep", backend.OpUnmap}}
	for _, c := range cases {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%v/fail=%v", c.phase, c.op, fail), func(t *testing.T) {
				a, drv := newInterleave(t, "", emulated.WithRealMemory(), emulated.WithCapacity(256<<20))
				s := a.DefaultStream()
				host := newPinnedHost(drv)
				p, err := a.NewPool(PoolOptions{Name: "rollout"})
				require.NoError(t, err)
				q, err := a.NewPool(PoolOptions{Name: "train"})
				require.NoError(t, err)
				x, err := p.Malloc(30<<20, 0)
				require.NoError(t, err)
				live := []patterned{fill(t, drv, s, x, 30<<20, 9)}
				y, err := q.Malloc(1<<20, 0)
				require.NoError(t, err)
				require.NoError(t, a.Free(y)) // q's cache
				opts := SleepOptions{Mode: Offload, Host: host}
				if c.phase == "wake" {
					require.NoError(t, p.Sleep(opts))
				}
				drv.hold(c.op, 1)
				done := make(chan error, 1)
				go func() {
					if c.phase == "wake" {
						done <- p.Wake()
					} else {
						done <- p.Sleep(opts)
					}
				}()
				held := drv.next(t)

				creates, maps := drv.Calls(backend.OpCreate), drv.Calls(backend.OpMap)
				hit := make(chan error, 1)
				go func() { // with mu held by the held call, this would block
					z, err := q.Malloc(1<<20, 0)
					if err == nil {
						err = a.Free(z)
					}
					hit <- err
				}()
				require.NoError(t, recvGrow(t, hit, "a cache hit on another pool while the driver call is held"))
				assert.Equal(t, creates, drv.Calls(backend.OpCreate))
				assert.Equal(t, maps, drv.Calls(backend.OpMap))
				want := Waking
				if c.phase == "sleep" {
					want = Sleeping
				}
				assert.Equal(t, want, p.SleepState())
				assert.Positive(t, a.Stats().NumAllocRetries+1) // Stats answers
				_, err = p.Malloc(4096, 0)
				assert.ErrorIs(t, err, ErrPoolAsleep)
				assert.ErrorIs(t, p.Wake(), ErrSleepInProgress)
				assert.ErrorIs(t, p.Sleep(opts), ErrSleepInProgress)

				var injected error
				if fail {
					injected = backend.Errorf(c.op, backend.ErrUnavailable, "", "injected")
				}
				held.goOn(injected)
				err = recvGrow(t, done, c.phase)
				switch {
				case !fail:
					require.NoError(t, err)
				default:
					require.ErrorIs(t, err, backend.ErrUnavailable)
				}
				wantState := map[string]SleepState{"wake": Awake, "sleep": Asleep}[c.phase]
				if fail {
					wantState = map[string]SleepState{"wake": Asleep, "sleep": Awake}[c.phase]
				}
				require.Equal(t, wantState, p.SleepState())
				verifyQuiescent(t, a, drv)
				if p.SleepState() == Asleep {
					require.NoError(t, p.Wake())
				}
				verify(t, drv, s, live)
				require.NoError(t, a.Free(x))
				drainAll(t, a, drv, nil)
				assert.Zero(t, host.Live())
			})
		}
	}
}

// TestSleepWakeConcurrentContents: goroutines allocate, fill, verify and
// free blocks on several pools of real memory while others sleep
// (offloading to pinned or Go memory, keeping buffers or not) and wake
// them. A pool's own RWMutex in the test orders the contents' readers and
// writers (device work must not touch an asleep pool) against its Sleep
// and Wake; everything else (Mallocs on other pools, Frees of asleep
// pools' blocks, Stats, Check, the other pools' sleeps) races freely.
// Every block's bytes survive every cycle; the invariants hold at the end.
func TestSleepWakeConcurrentContents(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithRealMemory(), emulated.WithCapacity(128<<20))
	host := newPinnedHost(e)
	s := a.DefaultStream()
	pools := []*Pool{a.DefaultPool()}
	for i := 0; i < 2; i++ {
		p, err := a.NewPool(PoolOptions{Name: fmt.Sprint("p", i)})
		require.NoError(t, err)
		pools = append(pools, p)
	}
	gates := make([]sync.RWMutex, len(pools))
	const workers, ops = 4, 60
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			type mine struct {
				pool int
				b    patterned
			}
			var blocks []mine
			check := func(m mine) error {
				got := make([]byte, len(m.b.data))
				if err := e.CopyDtoH(got, m.b.p, s); err != nil {
					return err
				}
				if !bytes.Equal(got, m.b.data) {
					return fmt.Errorf("block %#x of pool %d lost its contents", m.b.p, m.pool)
				}
				return nil
			}
			for i := 0; i < ops; i++ {
				pi := rng.IntN(len(pools))
				p, g := pools[pi], &gates[pi]
				var err error
				switch rng.IntN(6) {
				case 0:
					g.Lock()
					err = p.Sleep(SleepOptions{Mode: Offload, Host: []HostAllocator{nil, host}[rng.IntN(2)], KeepHostBuffers: rng.IntN(2) == 0})
					g.Unlock()
					if errors.Is(err, ErrPoolAsleep) {
						err = nil
					}
				case 1:
					g.Lock()
					err = p.Wake()
					g.Unlock()
					if errors.Is(err, ErrPoolAwake) {
						err = nil
					}
				case 2, 3:
					n := 1 + rng.IntN(1<<20)
					g.RLock()
					var x uintptr
					if x, err = p.Malloc(uint64(n), 0); err == nil {
						data := make([]byte, n)
						_, _ = rand.NewChaCha8([32]byte{byte(w), byte(i)}).Read(data)
						if err = e.CopyHtoD(x, data, s); err == nil {
							blocks = append(blocks, mine{pi, patterned{x, data}})
						}
					} else if errors.Is(err, ErrPoolAsleep) {
						err = nil
					} else if errors.Is(err, ErrOutOfMemory) {
						err = nil // the pools share 128 MiB
					}
					g.RUnlock()
				case 4:
					if len(blocks) > 0 {
						j := rng.IntN(len(blocks))
						g := &gates[blocks[j].pool]
						g.RLock()
						if pools[blocks[j].pool].SleepState() == Awake {
							err = check(blocks[j])
						}
						g.RUnlock()
					}
				default:
					if len(blocks) > 0 { // Free works asleep or awake
						j := rng.IntN(len(blocks))
						err = a.Free(blocks[j].b.p)
						blocks = append(blocks[:j], blocks[j+1:]...)
					}
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d op %d: %w", w, i, err)
					return
				}
			}
			// The end: wake what sleeps, verify and free everything.
			for _, m := range blocks {
				g := &gates[m.pool]
				g.Lock()
				if err := pools[m.pool].Wake(); err != nil && !errors.Is(err, ErrPoolAwake) {
					g.Unlock()
					errc <- err
					return
				}
				err := check(m)
				g.Unlock()
				if err == nil {
					err = a.Free(m.b.p)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	for _, p := range pools {
		if p.SleepState() == Asleep {
			require.NoError(t, p.Wake())
		}
	}
	mustCheck(t, a, e)
	assert.Zero(t, a.MemoryAllocated())
	for _, p := range pools[1:] {
		require.NoError(t, p.Close())
	}
	require.NoError(t, a.Close())
	assert.Zero(t, host.Live(), "kept pinned buffers are given back when their pools or the allocator close")
}

// TestSleepWakeHistory: with history on, a sleep records every allocated
// block of the pool freed and its memory unmapped, a wake mapped and the
// blocks allocated again (with their stacks), a free while asleep
// nothing; replaying the trace gives the reserved bytes and the live
// blocks at every step, and MemorySnapshot shows the asleep pool's memory
// unmapped, so that PyTorch's viewer, which replays the trace back from
// the snapshot, reaches it.
func TestSleepWakeHistory(t *testing.T) {
	a, _ := newAlloc(t, "", emulated.WithCapacity(gib))
	require.NoError(t, a.RecordHistory(HistoryOptions{MaxEntries: 1000, Stacks: true}))
	p, err := a.NewPool(PoolOptions{Name: "weights"})
	require.NoError(t, err)
	var ptrs []uintptr
	for _, n := range []uint64{30 << 20, 4096, 70 << 20} {
		x, err := p.Malloc(n, 0)
		require.NoError(t, err)
		ptrs = append(ptrs, x)
	}
	other, err := a.Malloc(8<<20, 0)
	require.NoError(t, err)
	type replay struct {
		reserved int64
		live     map[uintptr]bool
	}
	replayed := func() replay {
		h, ok := a.History()
		require.True(t, ok)
		r := replay{live: map[uintptr]bool{}}
		for _, en := range h.Entries {
			switch en.Action {
			case stats.TraceSegmentMap, stats.TraceSegmentAlloc:
				r.reserved += int64(en.Size)
			case stats.TraceSegmentUnmap, stats.TraceSegmentFree:
				r.reserved -= int64(en.Size)
			case stats.TraceAlloc:
				require.False(t, r.live[en.Addr], "alloc of live %#x", en.Addr)
				r.live[en.Addr] = true
			case stats.TraceFreeRequested:
				require.True(t, r.live[en.Addr], "free of %#x, not live", en.Addr)
				delete(r.live, en.Addr)
			}
		}
		return r
	}
	mapped := func(ps ...uintptr) map[uintptr]bool {
		m := map[uintptr]bool{}
		for _, x := range ps {
			m[x] = true
		}
		return m
	}
	r := replayed()
	assert.Equal(t, int64(a.MemoryReserved()), r.reserved)
	assert.Equal(t, mapped(append(ptrs, other)...), r.live)

	require.NoError(t, p.Sleep(SleepOptions{}))
	r = replayed()
	assert.Equal(t, int64(a.MemoryReserved()), r.reserved, "the sleep's segment_unmap entries")
	assert.Equal(t, mapped(other), r.live, "the sleep frees the pool's blocks in the trace")
	snapActive := func() map[uintptr]bool {
		m := map[uintptr]bool{}
		for _, d := range a.MemorySnapshot().Devices {
			for _, sg := range d.Segments {
				for _, b := range sg.Blocks {
					if b.State == stats.BlockActiveAllocated {
						m[b.Address] = true
					}
				}
			}
		}
		return m
	}
	assert.Equal(t, mapped(other), snapActive(), "the snapshot shows the asleep pool unmapped")
	require.NoError(t, a.Free(ptrs[1])) // freed while asleep: no entry
	assert.Equal(t, mapped(other), replayed().live)

	require.NoError(t, p.Wake())
	r = replayed()
	assert.Equal(t, int64(a.MemoryReserved()), r.reserved, "the wake's segment_map entries")
	assert.Equal(t, mapped(ptrs[0], ptrs[2], other), r.live)
	assert.Equal(t, r.live, snapActive())
	h, _ := a.History()
	last := h.Entries[len(h.Entries)-1]
	assert.Equal(t, stats.TraceAlloc, last.Action)
	assert.NotZero(t, last.Stack, "the block's Malloc stack comes back with it")
	assert.Equal(t, p.ID(), PoolID(last.Pool))
	var buf bytes.Buffer
	require.NoError(t, a.WriteSnapshot(&buf), "the viewer's file validates")
}

// TestEmptyCacheBeforeSleep: a pool emptied before it sleeps wakes with only
// the handles that hold its allocations; the free cache given back stays
// with the driver.
func TestEmptyCacheBeforeSleep(t *testing.T) {
	a, e := newAlloc(t, "expandable_handle_mb:2,large_segment_size_mb:2", emulated.WithRealMemory(), emulated.WithCapacity(256<<20))
	p, err := a.NewPool(PoolOptions{Name: "trainer"})
	require.NoError(t, err)
	s := a.DefaultStream()
	sp, err := p.Malloc(4<<20, 0)
	require.NoError(t, err)
	state := fill(t, e, s, sp, 4<<20, 1)
	activations, err := p.Malloc(32<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(activations))
	require.Equal(t, uint64(36<<20), p.MemoryReserved(), "state and cached activations")

	require.NoError(t, p.EmptyCache())
	require.Equal(t, uint64(4<<20), p.MemoryReserved(), "only the state's handles are left")
	require.NoError(t, p.Sleep(SleepOptions{Mode: Offload, Host: newPinnedHost(e)}))
	assert.Equal(t, int64(4<<20), p.Stats().AsleepBytes)
	free, _, err := e.MemGetInfo(0)
	require.NoError(t, err)
	require.NoError(t, p.Wake())
	freeAwake, _, err := e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(4<<20), free-freeAwake, "wake maps the state's handles only")
	assert.Equal(t, uint64(4<<20), p.MemoryReserved())
	verify(t, e, s, []patterned{state})
	mustCheck(t, a, e)
	require.NoError(t, a.Free(state.p))
}
