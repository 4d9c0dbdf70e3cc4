//go:build linux

package host

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

const gib = 1 << 30

// newExpandable is newHost with expandable segments and conf.
func newExpandable(t testing.TB, conf string, opts ...emulated.Option) (*Allocator, *emulated.Emulator) {
	t.Helper()
	return newHost(t, "expandable_segments:True,"+conf, opts...)
}

// touch writes and reads every page of [p, p+n): the memory must be
// mapped read-write.
func touch(p uintptr, n uint64, v byte) bool {
	mem := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), p)), n) // the allocator's own mapping, outside the Go heap
	for i := uint64(0); i < n; i += pageSize {
		mem[i] = v
	}
	mem[n-1] = v
	return mem[0] == v && mem[n-1] == v
}

// TestExpandableSplitsAndCoalesces: small requests share one 2 MiB chunk,
// split from it at page granularity; freed blocks coalesce so that a
// request as large as the chunk fits again without pinning more; EmptyCache
// unmaps the free chunk and gives its bytes back to the budget.
func TestExpandableSplitsAndCoalesces(t *testing.T) {
	a, e := newExpandable(t, "")
	sizes := []uint64{100, 4 * kib, 5000, 64 * kib, 300 * kib, 1 * mib}
	var ptrs []uintptr
	for i, n := range sizes {
		p, err := a.Malloc(n)
		require.NoError(t, err)
		require.True(t, touch(p, n, byte(i+1)))
		ptrs = append(ptrs, p)
		mustCheck(t, a, e)
	}
	st := a.Stats()
	assert.Equal(t, int64(1), st.Segment.Current, "one chunk")
	assert.Equal(t, int64(ChunkGranule), st.ReservedBytes.Current)
	assert.Equal(t, int64(1), st.NumHostAlloc)
	var want int64
	for _, n := range sizes {
		want += int64(roundPage(n))
	}
	assert.Equal(t, want, st.AllocatedBytes.Current, "blocks are page-rounded, not class-rounded")
	for i, p := range ptrs {
		for j, q := range ptrs {
			if i != j {
				require.False(t, p < q+uintptr(sizes[j]) && q < p+uintptr(sizes[i]), "blocks overlap")
			}
		}
		require.NoError(t, a.Free(p))
		mustCheck(t, a, e)
	}
	// The whole chunk is one free block again (small ones may sit in the
	// fast cache; a chunk-sized request flushes nothing but fits only if
	// the heap coalesced the rest).
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().ReservedBytes.Current)
	assert.Zero(t, a.Stats().Budget.Pinned)
	p, err := a.Malloc(ChunkGranule)
	require.NoError(t, err)
	assert.Equal(t, int64(ChunkGranule), a.Stats().ReservedBytes.Current)
	q, err := a.Malloc(ChunkGranule / 2)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	r, err := a.Malloc(ChunkGranule / 2)
	require.NoError(t, err)
	assert.Equal(t, q+ChunkGranule/2, r, "best fit: the rest of q's chunk, not the free chunk")
	assert.Equal(t, int64(2), a.Stats().Segment.Current)
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Free(r))
	mustCheck(t, a, e)
}

// TestExpandableDevicePointer: a block's device address is its chunk's
// plus the offset, as the driver says, valid for the chunk's life.
func TestExpandableDevicePointer(t *testing.T) {
	a, e := newExpandable(t, "")
	p1, err := a.Malloc(8 * kib)
	require.NoError(t, err)
	p2, err := a.Malloc(3 * mib)
	require.NoError(t, err)
	for _, p := range []uintptr{p1, p1 + 100, p2, p2 + 3*mib - 1} {
		d, err := a.DevicePointer(p)
		require.NoError(t, err)
		want, err := e.HostGetDevicePointer(p)
		require.NoError(t, err)
		assert.Equal(t, want, d)
	}
	require.NoError(t, a.Free(p1))
	_, err = a.DevicePointer(p1)
	require.ErrorIs(t, err, ErrUnknownPointer)
	_, err = a.DevicePointer(p2 + 3*mib + 10) // free memory of p2's chunk
	require.ErrorIs(t, err, ErrUnknownPointer)
	require.ErrorIs(t, a.Free(p2+4096), ErrInteriorPointer)
	require.NoError(t, a.Free(p2))
	require.ErrorIs(t, a.Free(p2), ErrDoubleFree)
	require.ErrorIs(t, a.Unregister(p2), ErrNotRegistered)
	require.ErrorIs(t, a.Register(p2, 4096, backend.HostRegisterMapped), ErrOverlap)
	mustCheck(t, a, e)
}

// TestLargeRequestPinsWhatItAsks: a 20.4 GiB request (the per-rank staging
// buffer of sglang#36562) pins 20.4 GiB rounded up to the 2 MiB granule
// with expandable segments; the size classes pin 22 GiB, and PyTorch's
// power-of-two classes 32 GiB. The emulator never touches the pages.
func TestLargeRequestPinsWhatItAsks(t *testing.T) {
	const n = uint64(204 * gib / 10)
	for _, tc := range []struct {
		conf string
		want uint64
	}{
		{"expandable_segments:True", (n + ChunkGranule - 1) &^ (ChunkGranule - 1)},
		{"expandable_segments:False", 22 * gib},
		{"expandable_segments:False,pinned_roundup_power2_divisions:1", 32 * gib},
	} {
		t.Run(tc.conf, func(t *testing.T) {
			a, e := newHost(t, tc.conf, emulated.WithHostCapacity(64*gib))
			p, err := a.Malloc(n)
			require.NoError(t, err)
			st := a.Stats()
			assert.Equal(t, int64(tc.want), st.ReservedBytes.Current)
			assert.Equal(t, tc.want, st.Budget.Pinned)
			if tc.conf == "expandable_segments:True" {
				assert.LessOrEqual(t, st.ReservedBytes.Current, int64(205*gib/10))
			}
			require.NoError(t, a.Free(p))
			mustCheck(t, a, e)
		})
	}
}

// TestPinBudgetAcrossAllocators: three allocators (both policies) share one
// budget; a pin that would pass it is refused before the driver is asked,
// with a *BudgetError naming it, unless MallocWith allows pageable memory;
// memory given back by one allocator can be pinned by another.
func TestPinBudgetAcrossAllocators(t *testing.T) {
	budget := NewPinBudget(0)
	var as []*Allocator
	var es []*emulated.Emulator
	for _, conf := range []string{"expandable_segments:True", "expandable_segments:True", "expandable_segments:False"} {
		e, err := emulated.New()
		require.NoError(t, err)
		cfg, err := ParseConfig(conf + ",pinned_budget_mb:8")
		require.NoError(t, err)
		cfg.Budget = budget
		a, err := New(e, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, a.Close()); assertNothingHeld(t, e) })
		as, es = append(as, a), append(es, e)
	}
	p0, err := as[0].Malloc(3 * mib) // a 4 MiB chunk
	require.NoError(t, err)
	p2, err := as[2].Malloc(2 * mib) // a 2 MiB block
	require.NoError(t, err)
	assert.Equal(t, uint64(6*mib), budget.Stats().Pinned)

	calls := es[1].CallCounts()
	_, err = as[1].Malloc(3 * mib)
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	require.ErrorIs(t, err, ErrBudget)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Equal(t, BudgetError{Requested: 4 * mib, Pinned: 6 * mib, Limit: 8 * mib}, *be)
	assert.Contains(t, err.Error(), "pinned_budget_mb")
	assert.Equal(t, calls, es[1].CallCounts(), "refused before the driver is asked")

	got, err := as[1].MallocWith(3*mib, MallocOptions{AllowPageable: true})
	require.NoError(t, err)
	assert.False(t, got.Pinned)
	require.True(t, touch(got.Ptr, 3*mib, 7))
	st := as[1].Stats()
	assert.Equal(t, int64(1), st.NumPageableFallbacks)
	assert.Equal(t, int64(3*mib), st.PageableBytes.Current)
	assert.Zero(t, st.ReservedBytes.Current)
	assert.Equal(t, int64(1), st.NumOOMs, "the Malloc refused above; a served fallback is no OOM")
	_, err = as[1].DevicePointer(got.Ptr)
	require.ErrorIs(t, err, ErrNotMapped)
	require.NoError(t, as[1].Check())
	require.NoError(t, as[1].Free(got.Ptr))
	assert.Zero(t, as[1].Stats().PageableBytes.Current)

	small, err := as[1].MallocWith(4*kib, MallocOptions{AllowPageable: true}) // 2 MiB fits
	require.NoError(t, err)
	assert.True(t, small.Pinned)
	require.NoError(t, as[1].Free(small.Ptr))
	require.NoError(t, as[1].EmptyCache())

	require.NoError(t, as[2].Free(p2))
	require.NoError(t, as[2].EmptyCache())
	p1, err := as[1].Malloc(3 * mib) // the budget as[2] gave back
	require.NoError(t, err)
	assert.Equal(t, uint64(8*mib), budget.Stats().Pinned)
	assert.Positive(t, budget.Stats().Denials)
	require.NoError(t, as[0].Free(p0))
	require.NoError(t, as[1].Free(p1))
	for i, a := range as {
		require.NoError(t, a.Check())
		mustCheck(t, a, es[i])
	}
}

// TestProcessPinBudget: allocators made without Config.Budget share
// ProcessPinBudget, whose limit New sets from pinned_budget_mb.
func TestProcessPinBudget(t *testing.T) {
	pb := ProcessPinBudget()
	old := pb.Stats().Limit
	t.Cleanup(func() { pb.SetLimit(old) })
	var as []*Allocator
	for range 2 {
		e, err := emulated.New()
		require.NoError(t, err)
		cfg, err := ParseConfig("pinned_budget_mb:4")
		require.NoError(t, err)
		a, err := New(e, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, a.Close()) })
		as = append(as, a)
	}
	before := pb.Stats().Pinned
	p, err := as[0].Malloc(3 * mib)
	require.NoError(t, err)
	_, err = as[1].Malloc(1 * mib)
	require.ErrorIs(t, err, ErrBudget)
	assert.Equal(t, uint64(4*mib), as[1].Stats().Budget.Limit)
	require.NoError(t, as[0].Free(p))
	require.NoError(t, as[0].EmptyCache())
	assert.Equal(t, before, pb.Stats().Pinned)
}

// TestExpandableLadderUnmapsFreeChunks: when the budget refuses a new
// chunk, the free chunks are unmapped and the pin retried; in a steady
// loop no chunk is pinned or unpinned after the first pass.
func TestExpandableLadderUnmapsFreeChunks(t *testing.T) {
	a, e := newExpandable(t, "pinned_budget_mb:10")
	p, err := a.Malloc(4 * mib) // chunk A, 4 MiB
	require.NoError(t, err)
	r, err := a.Malloc(2 * mib) // chunk B, 2 MiB, after A
	require.NoError(t, err)
	require.NoError(t, a.Free(p)) // A wholly free; B's block keeps it from the unmapped range after B
	q, err := a.Malloc(6 * mib)   // a 6 MiB chunk after B: 12 MiB > 10, so A must go first
	require.NoError(t, err)
	st := a.Stats()
	assert.Equal(t, int64(8*mib), st.ReservedBytes.Current)
	assert.Equal(t, int64(3), st.NumHostAlloc)
	assert.Equal(t, int64(1), st.NumHostFree)
	assert.Equal(t, int64(1), st.NumBudgetDenials)
	require.NoError(t, a.Free(r))
	require.NoError(t, a.Free(q))
	mustCheck(t, a, e)

	sizes := []uint64{1 * mib, 100 * kib, 2 * mib, 12 * kib, 3 * mib}
	step := func() {
		var ptrs []uintptr
		for _, n := range sizes {
			p, err := a.Malloc(n)
			require.NoError(t, err)
			ptrs = append(ptrs, p)
		}
		for _, p := range ptrs {
			require.NoError(t, a.Free(p))
		}
	}
	step()
	before := a.Stats()
	for range 5 {
		step()
	}
	after := a.Stats()
	assert.Equal(t, before.NumHostAlloc, after.NumHostAlloc, "pins in steady steps")
	assert.Equal(t, before.NumHostFree, after.NumHostFree, "unpins in steady steps")
	mustCheck(t, a, e)
}

// TestExpandableModel drives expandable segments with random Malloc,
// MallocWith, Free, RecordStream, EmptyCache and DevicePointer calls under
// a small budget, against a slow reference model (live ranges, never
// overlapping, their bytes intact; the statistics' recount), with Check
// after every operation.
func TestExpandableModel(t *testing.T) {
	a, e := newExpandable(t, "pinned_budget_mb:10", emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	type alloc struct {
		n      uint64
		v      byte
		pinned bool
	}
	live := map[uintptr]alloc{}
	var order []uintptr
	r := rand.New(rand.NewPCG(5, 6))
	sizes := []uint64{1, 4 * kib, 5000, 64 * kib, 300 * kib, 1 * mib, 3 * mib, 5 * mib}
	n := 3000
	if testing.Short() {
		n = 500
	}
	for i := range n {
		switch op := r.IntN(10); {
		case op < 4:
			size := sizes[r.IntN(len(sizes))] + uint64(r.IntN(5000))
			got, err := a.MallocWith(size, MallocOptions{AllowPageable: op == 0})
			if err != nil {
				require.ErrorIs(t, err, ErrOutOfMemory)
				require.ErrorIs(t, err, ErrBudget)
				break
			}
			for q, l := range live {
				require.False(t, got.Ptr < q+uintptr(l.n) && q < got.Ptr+uintptr(size), "op %d: %#x+%d overlaps live %#x+%d", i, got.Ptr, size, q, l.n)
			}
			v := byte(i)
			require.True(t, touch(got.Ptr, size, v))
			live[got.Ptr] = alloc{n: size, v: v, pinned: got.Pinned}
			order = append(order, got.Ptr)
		case op < 7 && len(order) > 0:
			k := r.IntN(len(order))
			p := order[k]
			l := live[p]
			require.True(t, touch(p, l.n, l.v), "contents intact")
			if r.IntN(2) == 0 && l.pinned {
				require.NoError(t, a.RecordStream(p, s))
			}
			require.NoError(t, a.Free(p))
			require.Error(t, a.Free(p))
			delete(live, p)
			order = append(order[:k], order[k+1:]...)
		case op == 7:
			require.NoError(t, e.CompleteAll())
		case op == 8:
			require.NoError(t, a.EmptyCache())
		case len(order) > 0:
			p := order[r.IntN(len(order))]
			d, err := a.DevicePointer(p)
			if live[p].pinned {
				require.NoError(t, err)
				want, err := e.HostGetDevicePointer(p)
				require.NoError(t, err)
				require.Equal(t, want, d)
			} else {
				require.ErrorIs(t, err, ErrNotMapped)
			}
		}
		require.NoError(t, a.Check(), "op %d", i)
		st := a.Stats()
		var pinned, pageable, req int64
		for _, l := range live {
			if l.pinned {
				pinned++
				req += int64(l.n)
			} else {
				pageable++
			}
		}
		require.Equal(t, pinned, st.Allocation.Current)
		require.Equal(t, req, st.RequestedBytes.Current)
		require.Equal(t, pageable, st.Pageable.Current)
		require.LessOrEqual(t, st.ReservedBytes.Current, int64(10*mib))
	}
	for _, p := range order {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, e.CompleteAll())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().ReservedBytes.Current)
	mustCheck(t, a, e)
}

// TestExpandableConcurrent: eight goroutines allocate, record streams, ask
// device addresses, free and empty the cache (-race); Check holds after.
func TestExpandableConcurrent(t *testing.T) {
	a, e := newExpandable(t, "pinned_budget_mb:64")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 3))
			var mine []uintptr
			for i := range 300 {
				switch r.IntN(6) {
				case 0, 1, 2:
					p, err := a.Malloc(uint64(1+r.IntN(600)) * kib)
					if err != nil {
						if !errors.Is(err, ErrOutOfMemory) {
							errs <- err
							return
						}
						continue
					}
					mine = append(mine, p)
				case 3:
					if len(mine) > 0 {
						p := mine[len(mine)-1]
						mine = mine[:len(mine)-1]
						if err := a.RecordStream(p, s); err != nil {
							errs <- err
							return
						}
						if _, err := a.DevicePointer(p + 1); err != nil {
							errs <- err
							return
						}
						if err := a.Free(p); err != nil {
							errs <- err
							return
						}
					}
				case 4:
					if len(mine) > 0 {
						if err := a.Free(mine[0]); err != nil {
							errs <- err
							return
						}
						mine = mine[1:]
					}
				case 5:
					if i%50 == 0 {
						if err := a.EmptyCache(); err != nil {
							errs <- err
							return
						}
					}
				}
			}
			for _, p := range mine {
				if err := a.Free(p); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, a.EmptyCache())
	mustCheck(t, a, e)
	assert.Zero(t, a.Stats().Allocation.Current)
}

// TestHistoryAndSummary: the memory history records allocations, frees,
// and chunk maps and unmaps; Summary names the policy and the budget.
func TestHistoryAndSummary(t *testing.T) {
	a, _ := newExpandable(t, "pinned_budget_mb:16")
	require.NoError(t, a.RecordHistory(100))
	p, err := a.Malloc(5 * mib)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	h, ok := a.History()
	require.True(t, ok)
	var acts []stats.TraceAction
	for _, en := range h {
		acts = append(acts, en.Action)
	}
	assert.Equal(t, []stats.TraceAction{stats.TraceSegmentMap, stats.TraceAlloc, stats.TraceFreeRequested, stats.TraceFreeCompleted, stats.TraceSegmentUnmap}, acts)
	assert.Equal(t, uint64(6*mib), h[0].Size)
	assert.Equal(t, p, h[1].Addr)
	sum := a.Summary()
	assert.Contains(t, sum, "expandable segments")
	assert.Contains(t, sum, "limit 16777216 bytes")
	assert.Regexp(t, `pinned bytes\s+0\s+6291456\s+6291456\s+6291456\n`, sum, "current, peak, allocated, freed")
	assert.Regexp(t, `requested bytes\s+0\s+5242880\s`, sum)
	require.NoError(t, a.RecordHistory(0))
	_, ok = a.History()
	assert.False(t, ok)
}

// TestReleaseOnGrow: with pinned_release_on_grow a wholly free chunk is
// unmapped before a new one is mapped, without any pressure; without it
// the free chunk stays for later requests.
func TestReleaseOnGrow(t *testing.T) {
	for _, tc := range []struct {
		conf       string
		held, unpn int64
	}{
		{"pinned_release_on_grow:True", 8 * mib, 1},
		{"pinned_release_on_grow:False", 12 * mib, 0},
	} {
		t.Run(tc.conf, func(t *testing.T) {
			a, e := newExpandable(t, tc.conf)
			p, err := a.Malloc(4 * mib) // chunk A, 4 MiB
			require.NoError(t, err)
			r, err := a.Malloc(2 * mib) // chunk B after A
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			q, err := a.Malloc(6 * mib) // A is too small: a 6 MiB chunk after B
			require.NoError(t, err)
			st := a.Stats()
			assert.Equal(t, tc.held, st.ReservedBytes.Current)
			assert.Equal(t, tc.unpn, st.NumHostFree)
			assert.Zero(t, st.NumBudgetDenials)
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Free(r))
			mustCheck(t, a, e)
		})
	}
}

// TestBlocksSpanChunks: a request larger than the free tail of a chunk
// maps only what the tail lacks, next to it, and its block spans both
// chunks, whose device addresses are contiguous; once free, the chunks
// are unmapped whole, the interior one too.
func TestBlocksSpanChunks(t *testing.T) {
	a, e := newExpandable(t, "")
	p, err := a.Malloc(3 * mib) // chunk A, 4 MiB: 1 MiB free after p
	require.NoError(t, err)
	q, err := a.Malloc(2 * mib) // 1 MiB of A and a 2 MiB chunk B after it
	require.NoError(t, err)
	st := a.Stats()
	assert.Equal(t, int64(6*mib), st.ReservedBytes.Current)
	assert.Equal(t, int64(2), st.NumHostAlloc)
	assert.Equal(t, p+3*mib, q)
	dq, err := a.DevicePointer(q)
	require.NoError(t, err)
	dEnd, err := a.DevicePointer(q + 2*mib - 1) // in chunk B
	require.NoError(t, err)
	assert.Equal(t, dq+2*mib-1, dEnd)
	want, err := e.HostGetDevicePointer(q + 2*mib - 1)
	require.NoError(t, err)
	assert.Equal(t, want, dEnd)
	assert.True(t, touch(q, 2*mib, 7))
	mustCheck(t, a, e)

	w, err := a.Malloc(1 * mib) // the 1 MiB left at B's end
	require.NoError(t, err)
	assert.Equal(t, q+2*mib, w)
	r, err := a.Malloc(3 * mib) // nothing free: a 4 MiB chunk C after B
	require.NoError(t, err)
	assert.Equal(t, w+1*mib, r)
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Free(w)) // A's last MiB and all of B free: B lies wholly in free memory
	require.NoError(t, a.EmptyCache())
	st = a.Stats()
	assert.Equal(t, int64(8*mib), st.ReservedBytes.Current, "A and C stay, B (between them) is unmapped")
	assert.Equal(t, int64(1), st.NumHostFree)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(r))
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().ReservedBytes.Current)
	mustCheck(t, a, e)
}

// TestChunkNotDeviceContiguous: a chunk the driver maps at device
// addresses that do not continue its neighbour's is unmapped again and
// the request served by a chunk a granule away from any other, so no
// block spans device addresses that are not contiguous.
func TestChunkNotDeviceContiguous(t *testing.T) {
	a, e := newExpandable(t, "")
	p, err := a.Malloc(3 * mib) // chunk A, 4 MiB: 1 MiB free after p
	require.NoError(t, err)
	own := mmapPages(t, 64*kib)
	// The emulator hands device addresses out in order: this registration
	// takes those right after A's.
	require.NoError(t, a.Register(own, 64*kib, backend.HostRegisterMapped))
	q, err := a.Malloc(2 * mib)
	require.NoError(t, err)
	st := a.Stats()
	assert.Equal(t, int64(6*mib), st.ReservedBytes.Current, "A and a 2 MiB chunk for q alone")
	assert.Equal(t, int64(3), st.NumHostAlloc, "A, the chunk after A, the isolated chunk")
	assert.Equal(t, int64(1), st.NumHostFree, "the chunk after A, unmapped again")
	assert.GreaterOrEqual(t, q, p+4*mib+ChunkGranule, "a granule away from A")
	dq, err := a.DevicePointer(q + 2*mib - 1)
	require.NoError(t, err)
	want, err := e.HostGetDevicePointer(q + 2*mib - 1)
	require.NoError(t, err)
	assert.Equal(t, want, dq)
	mustCheck(t, a, e)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Unregister(own))
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().ReservedBytes.Current)
	mustCheck(t, a, e)
}

// TestJoinRollsBack: a chunk that would join the free tail of its
// neighbour and fails to register leaves nothing behind: the range stays
// unmapped, the tail stays free, the budget and statistics are unchanged,
// and the next request joins as if the fault never happened.
func TestJoinRollsBack(t *testing.T) {
	for _, op := range []backend.Op{backend.OpHostRegister, backend.OpHostDevicePointer} {
		t.Run(op.String(), func(t *testing.T) {
			a, e := newExpandable(t, "")
			p, err := a.Malloc(3 * mib) // chunk A, 4 MiB: 1 MiB free after p
			require.NoError(t, err)
			before := a.Stats()
			require.NoError(t, e.FailNth(op, 1, backend.ErrUnavailable)) // not out of memory: no ladder, no retry
			_, err = a.Malloc(2 * mib)
			require.ErrorIs(t, err, backend.ErrUnavailable)
			e.ClearFaults()
			st := a.Stats()
			assert.Equal(t, before.ReservedBytes.Current, st.ReservedBytes.Current)
			assert.Equal(t, before.Segment.Current, st.Segment.Current)
			assert.Equal(t, before.Budget.Pinned, st.Budget.Pinned)
			mustCheck(t, a, e)
			q, err := a.Malloc(2 * mib)
			require.NoError(t, err)
			assert.Equal(t, p+3*mib, q, "joins A's free tail")
			assert.Equal(t, int64(6*mib), a.Stats().ReservedBytes.Current)
			mustCheck(t, a, e)
		})
	}
}
