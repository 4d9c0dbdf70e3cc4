package acl_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	vmintegrity "github.com/vmmalloc/vmmalloc/allocator/integrity"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
	"github.com/vmmalloc/vmmalloc/stats"
)

// TestAllocatorIntegrity runs the caching allocator over the binding and the
// double (real memory) and proves that the memory it hands out holds data:
// every live block carries its own pattern, written through the Copier, and
// after many allocations, frees, reuses, unmaps under pressure and remaps,
// every live block still reads back its pattern.
func TestAllocatorIntegrity(t *testing.T) {
	for _, c := range []struct {
		name string
		conf string
	}{
		{"expandable", "expandable_segments:True"},
		{"classic", "expandable_segments:False"},
		{"expandable small pages, release on sync", "expandable_segments:True,large_segment_size_mb:2,release_threshold_mb:0,handle_cache_mb:0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := open(t)
			main_.capacity(t, 0, 64<<20)
			_, total, err := d.MemGetInfo(0)
			require.NoError(t, err)
			require.Equal(t, uint64(64<<20), total, "the device has the capacity the test set")
			cfg, err := allocator.ParseConfig(c.conf)
			require.NoError(t, err)
			chk := handlecheck.New(d) // the allocator runs over the handle-lifetime checker
			a, err := allocator.New(chk.Driver(), cfg)
			require.NoError(t, err)
			s := a.DefaultStream()
			integrity(t, a, d, s)
			require.NoError(t, a.Close())
			require.NoError(t, chk.Err())
		})
	}
}

type liveBlock struct {
	p   uintptr
	n   int
	off int // the pattern is pattern[off:off+n]
}

func integrity(t *testing.T, a *allocator.Allocator, c backend.Copier, s backend.Stream) {
	rng := rand.New(rand.NewPCG(8, 1))
	pattern := make([]byte, 4<<20)
	_, _ = rand.NewChaCha8([32]byte{8}).Read(pattern)
	var live []liveBlock
	check := func(b liveBlock) {
		t.Helper()
		got := make([]byte, b.n)
		require.NoError(t, c.CopyDtoH(got, b.p, s))
		require.True(t, bytes.Equal(pattern[b.off:b.off+b.n], got), "block %#x+%d lost its pattern", b.p, b.n)
	}
	free := func(i int) {
		t.Helper()
		check(live[i])
		require.NoError(t, a.Free(live[i].p))
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	}
	var allocs, ooms int
	for step := 0; step < 400; step++ {
		if len(live) > 0 && rng.IntN(5) < 2 {
			free(rng.IntN(len(live)))
			continue
		}
		n := 1 + rng.IntN(64<<10) // small pool
		if rng.IntN(3) == 0 {
			n = 1<<20 + rng.IntN(2<<20) // large pool
		}
		p, err := a.Malloc(uint64(n), s)
		var oom *allocator.OutOfMemoryError
		if errors.As(err, &oom) {
			ooms++
			for len(live) > 0 && rng.IntN(4) != 0 {
				free(rng.IntN(len(live)))
			}
			continue
		}
		require.NoError(t, err)
		allocs++
		b := liveBlock{p: p, n: n, off: rng.IntN(len(pattern) - n)}
		require.NoError(t, c.CopyHtoD(p, pattern[b.off:b.off+n], s))
		live = append(live, b)
		if step%100 == 99 {
			require.NoError(t, a.Synchronize(s)) // may unmap free pages
			require.NoError(t, a.Check())        // the allocator agrees with the binding's record
			for _, b := range live {
				check(b)
			}
		}
	}
	for len(live) > 0 {
		free(len(live) - 1)
	}
	require.NoError(t, a.Check())
	t.Logf("%d allocations, %d out-of-memory retries, peak reserved %d MiB", allocs, ooms, a.Stats().ReservedBytes[stats.AllPools].Peak>>20)
	require.Positive(t, allocs)
}

// TestAllocatorFaults fails one ACL call in the middle of an allocator
// workload (the allocator may recover, e.g. by releasing cache and
// retrying) and checks that the failure rolled back completely: the
// allocator's Check agrees with the binding's record, every live block keeps
// its pattern, and after Close the double holds nothing.
func TestAllocatorFaults(t *testing.T) {
	for _, c := range []struct {
		sym  string
		nths []int
	}{
		{"aclrtMallocPhysical", []int{1, 2, 5}},
		{"aclrtMapMem", []int{1, 2, 5}},
		{"aclrtMemSetAccess", []int{1, 2, 5}},
		{"aclrtReserveMemAddress", []int{1}}, // the workload reserves once
	} {
		sym := c.sym
		for _, code := range []int32{207001, 507899} {
			for _, nth := range c.nths {
				t.Run(sym, func(t *testing.T) {
					d := open(t)
					cfg, err := allocator.ParseConfig("large_segment_size_mb:2") // a handle per 2 MiB: more driver calls
					require.NoError(t, err)
					chk := handlecheck.New(d) // the allocator runs over the handle-lifetime checker
					a, err := allocator.New(chk.Driver(), cfg)
					require.NoError(t, err)
					s := a.DefaultStream()
					main_.failAt(t, sym, nth, code)
					pattern := make([]byte, 3<<20)
					_, _ = rand.NewChaCha8([32]byte{3}).Read(pattern)
					var live []liveBlock
					failed := 0
					for i := 0; i < 40; i++ {
						n := 1<<20 + (i*104729)%(2<<20) // large pool
						if i%2 == 0 {
							n = 1 + (i*7919)%(64<<10) // small pool
						}
						p, err := a.Malloc(uint64(n), s)
						if err != nil {
							failed++
							require.NoError(t, a.Check(), "after a failed Malloc (%v)", err)
							continue
						}
						require.NoError(t, d.CopyHtoD(p, pattern[:n], s))
						live = append(live, liveBlock{p: p, n: n})
					}
					require.True(t, main_.fired(), "the workload never reached call %d of %s", nth, sym)
					require.LessOrEqual(t, failed, 1, "only the injected fault may fail a Malloc")
					t.Logf("%s call %d failed with %d: %d Malloc failed", sym, nth, code, failed)
					for _, b := range live {
						got := make([]byte, b.n)
						require.NoError(t, d.CopyDtoH(got, b.p, s))
						require.True(t, bytes.Equal(pattern[:b.n], got))
						require.NoError(t, a.Free(b.p))
					}
					require.NoError(t, a.Check())
					require.NoError(t, a.Close())
					require.NoError(t, chk.Err())
				})
			}
		}
	}
}

// TestSleepCyclesDouble: sleep and wake keep contents byte-exact over the
// binding and the ACL double (aclrtUnmapMem/aclrtFreePhysical at sleep,
// aclrtMallocPhysical/aclrtMapMem at the old addresses at wake, backups in
// aclrtMallocHost buffers through aclrtMemcpyAsync).
func TestSleepCyclesDouble(t *testing.T) {
	d := open(t)
	main_.capacity(t, 0, 256<<20)
	_, total, err := d.MemGetInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(256<<20), total, "the device has the capacity the test set")
	r := vmintegrity.SleepCycles(t, d, vmintegrity.SleepOptions{})
	require.Equal(t, 6, r.Cycles)
	require.Positive(t, r.Verified)
}
