package allocator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// registrar is a model of a collective library's registration table: it
// records registered ranges and every ordering violation it sees.
type registrar struct {
	e    *emulated.Emulator
	mu   sync.Mutex
	regs map[uintptr]SegmentRange // by Addr
	bad  []string
	maps int
	unms int
	fail func(SegmentRange) error // the answer Mapped gives; nil: accept
}

func newRegistrar(e *emulated.Emulator) *registrar {
	return &registrar{e: e, regs: map[uintptr]SegmentRange{}}
}

// mappedAccessible reports whether every byte of r is mapped with access
// set, per the emulator.
func (g *registrar) mappedAccessible(r SegmentRange) bool {
	var covered uint64
	for _, m := range g.e.Mappings() {
		lo, hi := max(m.VA, r.Addr), min(m.VA+uintptr(m.Size), r.Addr+uintptr(r.Size))
		if lo < hi {
			if len(m.Access) == 0 {
				return false
			}
			covered += uint64(hi - lo)
		}
	}
	return covered == r.Size
}

func (g *registrar) hook(pool *Pool) SegmentHook {
	return SegmentHook{Pool: pool, Mapped: g.mapped, Unmapped: g.unmapped}
}

func (g *registrar) mapped(r SegmentRange) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.maps++
	var hsum uint64
	for _, h := range r.Handles {
		hsum += h.Size
	}
	if len(r.Handles) == 0 || r.Handles[0].VA != r.Addr || hsum != r.Size {
		g.bad = append(g.bad, fmt.Sprintf("mapped %#x+%d: handles %v do not cover it", r.Addr, r.Size, r.Handles))
	}
	if !g.mappedAccessible(r) {
		g.bad = append(g.bad, fmt.Sprintf("mapped %#x+%d reported before it is mapped and accessible", r.Addr, r.Size))
	}
	for _, q := range g.regs {
		if q.Addr < r.Addr+uintptr(r.Size) && r.Addr < q.Addr+uintptr(q.Size) {
			g.bad = append(g.bad, fmt.Sprintf("mapped %#x+%d overlaps registered %#x+%d", r.Addr, r.Size, q.Addr, q.Size))
		}
	}
	if g.fail != nil {
		if err := g.fail(r); err != nil {
			return err
		}
	}
	g.regs[r.Addr] = r
	return nil
}

// unmapped deregisters r, which may be a part of registered ranges (a
// release unmaps whole handles): each covering registration is cut.
func (g *registrar) unmapped(r SegmentRange) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unms++
	if !g.mappedAccessible(r) {
		g.bad = append(g.bad, fmt.Sprintf("unmapped %#x+%d reported after it was unmapped", r.Addr, r.Size))
	}
	var covered uint64
	for addr, q := range g.regs {
		lo, hi := max(q.Addr, r.Addr), min(q.Addr+uintptr(q.Size), r.Addr+uintptr(r.Size))
		if lo >= hi {
			continue
		}
		covered += uint64(hi - lo)
		delete(g.regs, addr)
		if q.Addr < lo {
			g.regs[q.Addr] = SegmentRange{Pool: q.Pool, Addr: q.Addr, Size: uint64(lo - q.Addr)}
		}
		if end := q.Addr + uintptr(q.Size); hi < end {
			g.regs[hi] = SegmentRange{Pool: q.Pool, Addr: hi, Size: uint64(end - hi)}
		}
	}
	if covered != r.Size {
		g.bad = append(g.bad, fmt.Sprintf("unmapped %#x+%d: only %d bytes were registered", r.Addr, r.Size, covered))
	}
}

// check asserts the registrar's invariants against the allocator: no
// violation seen, every live allocation inside registered memory, and (if
// whole) the registrations exactly the allocator's mapped memory of pool
// (nil: every pool).
func (g *registrar) check(t *testing.T, a *Allocator, live map[uintptr]uint64, pool *Pool) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Empty(t, g.bad)
	for ptr, size := range live {
		var covered uint64
		for _, q := range g.regs {
			lo, hi := max(q.Addr, ptr), min(q.Addr+uintptr(q.Size), ptr+uintptr(size))
			if lo < hi {
				covered += uint64(hi - lo)
			}
		}
		require.Equal(t, size, covered, "allocation %#x+%d is not wholly registered", ptr, size)
	}
	var regBytes uint64
	for _, q := range g.regs {
		regBytes += q.Size
	}
	want := a.MemoryReserved()
	if pool != nil {
		want = pool.MemoryReserved()
	}
	require.Equal(t, want, regBytes, "registered bytes vs mapped bytes")
}

func TestSegmentHookRegistrarModel(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False", "expandable_handle_mb:8"} {
		t.Run(conf, func(t *testing.T) {
			a, e := newAlloc(t, conf, emulated.WithCapacity(2*gib))
			g := newRegistrar(e)
			live := map[uintptr]uint64{}
			// Memory mapped before the hook: the catch-up reports it.
			pre, err := a.Malloc(5<<20, 0)
			require.NoError(t, err)
			live[pre] = 5 << 20
			id, err := a.AddSegmentHook(g.hook(nil))
			require.NoError(t, err)
			g.check(t, a, live, nil)
			pool, err := a.NewPool(PoolOptions{})
			require.NoError(t, err)
			s2, err := e.StreamCreate(0)
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(7, 7))
			for i := 0; i < 300; i++ {
				switch op := rng.IntN(10); {
				case op < 5:
					pl := a.DefaultPool()
					if rng.IntN(2) == 0 {
						pl = pool
					}
					s := backend.Stream(0)
					if rng.IntN(3) == 0 {
						s = s2
					}
					size := uint64(1 + rng.IntN(40<<20))
					ptr, err := pl.Malloc(size, s)
					if err == nil {
						sz, _, serr := a.Spans(ptr)
						require.NoError(t, serr)
						live[ptr] = sz
					} else {
						require.ErrorIs(t, err, ErrOutOfMemory)
					}
				case op < 8 && len(live) > 0:
					ptrs := make([]uintptr, 0, len(live))
					for p := range live {
						ptrs = append(ptrs, p)
					}
					sort.Slice(ptrs, func(i, j int) bool { return ptrs[i] < ptrs[j] })
					p := ptrs[rng.IntN(len(ptrs))]
					require.NoError(t, a.Free(p))
					delete(live, p)
				case op == 8:
					require.NoError(t, a.Synchronize(s2))
				default:
					if rng.IntN(2) == 0 {
						require.NoError(t, pool.EmptyCache())
					} else {
						require.NoError(t, a.EmptyCache())
					}
				}
				g.check(t, a, live, nil)
				if i%50 == 0 {
					require.NoError(t, a.Check())
				}
			}
			for p := range live {
				require.NoError(t, a.Free(p))
				delete(live, p)
			}
			require.NoError(t, a.ReleaseStream(s2))
			require.NoError(t, e.StreamDestroy(s2))
			require.NoError(t, pool.Close())
			g.check(t, a, live, nil)
			mustCheck(t, a, e)
			assert.Positive(t, g.maps)
			assert.Positive(t, g.unms)
			// Close reports the unmap of everything still mapped.
			_ = id
			require.NoError(t, a.Close())
			g.mu.Lock()
			assert.Empty(t, g.regs)
			assert.Empty(t, g.bad)
			g.mu.Unlock()
		})
	}
}

func TestSegmentHookRefusalRollsBack(t *testing.T) {
	errRefused := errors.New("ibv_reg_mr: cannot register")
	for _, c := range []struct {
		name string
		conf string
		fail func(SegmentRange) error
	}{
		{"error/expandable", "", func(SegmentRange) error { return errRefused }},
		{"error/classic", "expandable_segments:False", func(SegmentRange) error { return errRefused }},
		{"panic/expandable", "", func(SegmentRange) error { panic("registrar bug") }},
		{"panic/classic", "expandable_segments:False", func(SegmentRange) error { panic("registrar bug") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, e := newAlloc(t, c.conf)
			// A second hook that accepts everything: it is told to unmap
			// what it accepted when the first refuses.
			ok := newRegistrar(e)
			_, err := a.AddSegmentHook(ok.hook(nil))
			require.NoError(t, err)
			g := newRegistrar(e)
			_, err = a.AddSegmentHook(g.hook(nil))
			require.NoError(t, err)
			x, err := a.Malloc(3<<20, 0)
			require.NoError(t, err)
			before := a.Stats()
			nmaps := len(e.Mappings())
			g.mu.Lock()
			g.fail = c.fail
			g.mu.Unlock()
			_, err = a.Malloc(50<<20, 0)
			var herr *SegmentHookError
			require.ErrorAs(t, err, &herr)
			require.ErrorIs(t, err, ErrSegmentHook)
			if c.name[:5] == "error" {
				require.ErrorIs(t, err, errRefused)
			} else {
				assert.Contains(t, err.Error(), "hook panicked: registrar bug")
			}
			assert.Equal(t, uint64(50<<20), herr.Range.Size)
			after := a.Stats()
			assert.Equal(t, before.ReservedBytes, after.ReservedBytes)
			assert.Equal(t, before.AllocatedBytes, after.AllocatedBytes)
			assert.Len(t, e.Mappings(), nmaps, "the refused range is unmapped")
			mustCheck(t, a, e)
			live := map[uintptr]uint64{x: 3 << 20}
			ok.check(t, a, live, nil)
			g.mu.Lock()
			g.fail = nil
			g.mu.Unlock()
			y, err := a.Malloc(50<<20, 0)
			require.NoError(t, err)
			live[y] = 50 << 20
			ok.check(t, a, live, nil)
			g.check(t, a, live, nil)
			mustCheck(t, a, e)
		})
	}
}

func TestSegmentHookCatchUpRefusedAndMisuse(t *testing.T) {
	a, e := newAlloc(t, "")
	other, _ := newAlloc(t, "")
	foreign, err := other.NewPool(PoolOptions{})
	require.NoError(t, err)
	x, err := a.Malloc(30<<20, 0)
	require.NoError(t, err)
	side, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	y, err := side.Malloc(40<<20, 0) // its own range: another pool's
	require.NoError(t, err)
	// Refuses the second catch-up range: the first is unmapped again and
	// the hook is not attached.
	g := newRegistrar(e)
	n := 0
	g.fail = func(SegmentRange) error {
		if n++; n == 2 {
			return errors.New("no more registrations")
		}
		return nil
	}
	_, err = a.AddSegmentHook(g.hook(nil))
	require.ErrorIs(t, err, ErrSegmentHook)
	g.mu.Lock()
	assert.Empty(t, g.regs)
	g.mu.Unlock()
	before := g.maps
	z, err := a.Malloc(60<<20, 0)
	require.NoError(t, err)
	assert.Equal(t, before, g.maps, "a refused hook is not attached")

	for _, c := range []struct {
		name string
		h    SegmentHook
		want error
	}{
		{"no callbacks", SegmentHook{}, ErrInvalidConfig},
		{"another allocator's pool", SegmentHook{Mapped: g.mapped, Pool: foreign}, ErrInvalidPool},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := a.AddSegmentHook(c.h)
			require.ErrorIs(t, err, c.want)
		})
	}
	p, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	_, err = a.AddSegmentHook(SegmentHook{Mapped: g.mapped, Pool: p})
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, a.RemoveSegmentHook(12345), ErrInvalidConfig)
	for _, ptr := range []uintptr{x, y, z} {
		require.NoError(t, a.Free(ptr))
	}
	mustCheck(t, a, e)
	require.NoError(t, a.Close())
	_, err = a.AddSegmentHook(g.hook(nil))
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, a.RemoveSegmentHook(1), ErrClosed)
}

func TestSegmentHookRemoveAndPoolFilter(t *testing.T) {
	a, e := newAlloc(t, "")
	pool, err := a.NewPool(PoolOptions{})
	require.NoError(t, err)
	all := newRegistrar(e)
	mine := newRegistrar(e)
	idAll, err := a.AddSegmentHook(all.hook(nil))
	require.NoError(t, err)
	_, err = a.AddSegmentHook(mine.hook(pool))
	require.NoError(t, err)
	x, err := a.Malloc(10<<20, 0)
	require.NoError(t, err)
	y, err := pool.Malloc(12<<20, 0)
	require.NoError(t, err)
	mine.check(t, a, map[uintptr]uint64{y: 12 << 20}, pool)
	all.check(t, a, map[uintptr]uint64{x: 10 << 20, y: 12 << 20}, nil)
	mine.mu.Lock()
	for _, r := range mine.regs {
		assert.Equal(t, pool.ID(), r.Pool)
	}
	mine.mu.Unlock()
	require.NoError(t, a.RemoveSegmentHook(idAll))
	require.ErrorIs(t, a.RemoveSegmentHook(idAll), ErrInvalidConfig)
	maps, unms := all.maps, all.unms
	require.NoError(t, a.Free(x))
	require.NoError(t, a.EmptyCache())
	z, err := a.Malloc(30<<20, 0)
	require.NoError(t, err)
	assert.Equal(t, maps, all.maps, "a removed hook is not called")
	assert.Equal(t, unms, all.unms)
	require.NoError(t, a.Free(y))
	require.NoError(t, pool.EmptyCache())
	mine.check(t, a, nil, pool)
	require.NoError(t, a.Free(z))
	mustCheck(t, a, e)
}

// TestSegmentHookRunsWithoutLock: a callback may call Stats and Spans,
// and while it is blocked, cache hits on another stream go on.
func TestSegmentHookRunsWithoutLock(t *testing.T) {
	a, e := newAlloc(t, "")
	s2, err := e.StreamCreate(0)
	require.NoError(t, err)
	hit, err := a.Malloc(1<<20, s2)
	require.NoError(t, err)
	require.NoError(t, a.Free(hit))
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	_, err = a.AddSegmentHook(SegmentHook{Mapped: func(r SegmentRange) error {
		_ = a.Stats()
		_ = a.MemoryReserved()
		if r.Size >= 100<<20 {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return nil
	}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		p, err := a.Malloc(100<<20, 0)
		if err == nil {
			err = a.Free(p)
		}
		done <- err
	}()
	<-entered
	for i := 0; i < 100; i++ { // the growth's callback is blocked meanwhile
		p, err := a.Malloc(1<<20, s2)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
	}
	close(release)
	require.NoError(t, <-done)
	mustCheck(t, a, e)
	require.NoError(t, a.ReleaseStream(s2))
	require.NoError(t, e.StreamDestroy(s2))
}

// TestSegmentHookFaults: with a registrar attached, a fault at any driver
// call leaves its model and the allocator consistent.
func TestSegmentHookFaults(t *testing.T) {
	ops := []backend.Op{backend.OpCreate, backend.OpMap, backend.OpSetAccess, backend.OpUnmap, backend.OpFree, backend.OpStreamSync}
	for _, op := range ops {
		for n := 1; n <= 3; n++ {
			t.Run(fmt.Sprintf("%v/%d", op, n), func(t *testing.T) {
				a, e := newAlloc(t, "")
				g := newRegistrar(e)
				_, err := a.AddSegmentHook(g.hook(nil))
				require.NoError(t, err)
				p, err := a.NewPool(PoolOptions{})
				require.NoError(t, err)
				require.NoError(t, e.FailNth(op, n, backend.ErrOutOfMemory))
				live := map[uintptr]uint64{}
				for i := 0; i < 8; i++ {
					pl := p
					if i%2 == 0 {
						pl = a.DefaultPool()
					}
					if ptr, err := pl.Malloc(uint64(i+1)*7<<20, 0); err == nil {
						live[ptr] = roundUp(uint64(i+1)*7<<20, 512)
					}
					if i%3 == 2 {
						for ptr := range live {
							require.NoError(t, a.Free(ptr))
							delete(live, ptr)
							break
						}
						_ = a.EmptyCache()
					}
					g.mu.Lock()
					require.Empty(t, g.bad)
					g.mu.Unlock()
					require.NoError(t, a.Check())
				}
				e.ClearFaults()
				_ = a.EmptyCache()
				g.check(t, a, live, nil)
				mustCheck(t, a, e)
			})
		}
	}
}

// TestSegmentHooksRace: goroutines on pools and streams with registrars
// attached and detached meanwhile; run with -race.
func TestSegmentHooksRace(t *testing.T) {
	a, e := newAlloc(t, "", emulated.WithCapacity(2*gib))
	g := newRegistrar(e)
	_, err := a.AddSegmentHook(g.hook(nil))
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			s, err := e.StreamCreate(0)
			if err != nil {
				errs <- err
				return
			}
			p, err := a.NewPool(PoolOptions{})
			if err != nil {
				errs <- err
				return
			}
			var live []uintptr
			for i := 0; i < 80; i++ {
				pl := p
				if rng.IntN(2) == 0 {
					pl = a.DefaultPool()
				}
				if ptr, err := pl.Malloc(uint64(1+rng.IntN(12<<20)), s); err == nil {
					live = append(live, ptr)
				} else if !errors.Is(err, ErrOutOfMemory) {
					errs <- err
					return
				}
				if len(live) > 3 {
					j := rng.IntN(len(live))
					if err := a.Free(live[j]); err != nil {
						errs <- err
						return
					}
					live = append(live[:j], live[j+1:]...)
				}
				if i%25 == 0 {
					if w == 0 {
						// attach and detach another registrar meanwhile
						h := newRegistrar(e)
						id, err := a.AddSegmentHook(h.hook(nil))
						if err == nil {
							err = a.RemoveSegmentHook(id)
						}
						if err != nil {
							errs <- err
							return
						}
					}
					if err := a.EmptyCache(); err != nil {
						errs <- err
						return
					}
				}
			}
			for _, ptr := range live {
				if err := a.Free(ptr); err != nil {
					errs <- err
					return
				}
			}
			if err := p.Close(); err != nil {
				errs <- err
				return
			}
			if err := a.ReleaseStream(s); err != nil {
				errs <- err
				return
			}
			errs <- e.StreamDestroy(s)
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	g.check(t, a, nil, nil)
	mustCheck(t, a, e)
}
