package fuzz

import (
	"fmt"
	"sync"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Pools and hooks in the harness (harnessConfig.pools).
//
// The harness adds three private pools beside the default one: one with
// a memory limit of a quarter of the device, one isolated, one of classic
// segments. A Malloc's size-class byte picks the pool with its high bits
// (sizeFor reads only the low three). A registrar, the model of a
// collective library's registration table, is attached as a segment hook
// before the first operation. After every operation verifyPools checks:
// every live block is in the pool that allocated it (the snapshot's pool
// of the block); no pool has more mapped than its limit; the registrar saw
// no ordering violation (a range reported mapped before it was mapped and
// accessible or while registered, a range reported unmapped that was not
// registered or no longer mapped) and every live block lies wholly in
// registered memory, which never exceeds what the allocator maps. finish
// closes every pool, and after Close nothing is registered.

// registrar records registered ranges and every violation it sees.
type registrar struct {
	e    *emulated.Emulator
	mu   sync.Mutex
	regs map[uintptr]uint64 // registered ranges: Addr → nbytes
	bad  []string
}

// mappedAccessible reports whether every byte of [addr, addr+n) is mapped
// with access set.
func (g *registrar) mappedAccessible(addr uintptr, n uint64) bool {
	var covered uint64
	for _, m := range g.e.Mappings() {
		lo, hi := max(m.VA, addr), min(m.VA+uintptr(m.Size), addr+uintptr(n))
		if lo < hi {
			if len(m.Access) == 0 {
				return false
			}
			covered += uint64(hi - lo)
		}
	}
	return covered == n
}

func (g *registrar) mapped(r allocator.SegmentRange) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.mappedAccessible(r.Addr, r.Size) {
		g.bad = append(g.bad, fmt.Sprintf("mapped %#x+%d reported before it is mapped and accessible", r.Addr, r.Size))
	}
	for a, n := range g.regs {
		if a < r.Addr+uintptr(r.Size) && r.Addr < a+uintptr(n) {
			g.bad = append(g.bad, fmt.Sprintf("mapped %#x+%d overlaps registered %#x+%d", r.Addr, r.Size, a, n))
		}
	}
	g.regs[r.Addr] = r.Size
	return nil
}

func (g *registrar) unmapped(r allocator.SegmentRange) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.mappedAccessible(r.Addr, r.Size) {
		g.bad = append(g.bad, fmt.Sprintf("unmapped %#x+%d reported after it was unmapped", r.Addr, r.Size))
	}
	var covered uint64
	for a, n := range g.regs {
		lo, hi := max(a, r.Addr), min(a+uintptr(n), r.Addr+uintptr(r.Size))
		if lo >= hi {
			continue
		}
		covered += uint64(hi - lo)
		delete(g.regs, a)
		if a < lo {
			g.regs[a] = uint64(lo - a)
		}
		if end := a + uintptr(n); hi < end {
			g.regs[hi] = uint64(end - hi)
		}
	}
	if covered != r.Size {
		g.bad = append(g.bad, fmt.Sprintf("unmapped %#x+%d: only %d bytes were registered", r.Addr, r.Size, covered))
	}
}

// addPools makes the private pools and attaches the registrar.
func (h *harness) addPools() {
	for _, o := range []allocator.PoolOptions{
		{Name: "limited", MemoryLimit: h.cfg.capacity / 4},
		{Name: "isolated", Isolated: true},
		{Name: "classic", Segments: allocator.SegmentsClassic},
	} {
		p, err := h.a.NewPool(o)
		if err != nil {
			h.fatalf("NewPool(%+v): %v", o, err)
		}
		h.pools = append(h.pools, p)
	}
	h.reg = &registrar{e: h.e, regs: map[uintptr]uint64{}}
	if _, err := h.a.AddSegmentHook(allocator.SegmentHook{Mapped: h.reg.mapped, Unmapped: h.reg.unmapped}); err != nil {
		h.fatalf("AddSegmentHook: %v", err)
	}
}

// checkLimitOOM requires that an out-of-memory error naming a pool's
// limit is that pool's, and that the growth would indeed have passed it.
func (h *harness) checkLimitOOM(size uint64, oom *allocator.OutOfMemoryError, pool *allocator.Pool) {
	if oom.Pool != pool.ID() || oom.PoolLimit != pool.MemoryLimit() {
		h.fatalf("Malloc(%d) in pool %q: out of memory names pool %v with limit %d", size, pool.Name(), oom.Pool, oom.PoolLimit)
	}
	if oom.Reserved+oom.Tried <= oom.PoolLimit {
		h.fatalf("Malloc(%d) in pool %q: limit %d reported with %d reserved and %d tried", size, pool.Name(), oom.PoolLimit, oom.Reserved, oom.Tried)
	}
}

// verifyPools checks the pools and the registrar (see above).
func (h *harness) verifyPools(snap stats.Snapshot) {
	blockPool := map[uintptr][2]uint64{}
	for _, sg := range snap.Segments {
		for _, b := range sg.Blocks {
			if b.State == stats.BlockActiveAllocated {
				blockPool[b.Address] = b.Pool
			}
		}
	}
	for _, b := range h.live {
		if want := h.pools[b.pool].ID(); allocator.PoolID(blockPool[b.ptr]) != want {
			h.fatalf("block %#x allocated in pool %v is in pool %v", b.ptr, want, blockPool[b.ptr])
		}
	}
	for _, p := range h.pools {
		if lim := p.MemoryLimit(); lim != 0 && p.MemoryReserved() > lim {
			h.fatalf("pool %q maps %d bytes, limit %d", p.Name(), p.MemoryReserved(), lim)
		}
	}
	g := h.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.bad) > 0 {
		h.fatalf("registrar: %s", g.bad[0])
	}
	var registered uint64
	for _, n := range g.regs {
		registered += n
	}
	_, mappings, _ := h.a.Footprint()
	var mapped uint64
	for _, m := range mappings {
		mapped += m.Size
	}
	if registered > mapped {
		h.fatalf("registrar holds %d bytes, the allocator maps %d", registered, mapped)
	}
	for _, b := range h.live {
		if h.asleep[b.pool] {
			continue // unmapped: reported to the hook at Sleep
		}
		var covered uint64
		for a, n := range g.regs {
			lo, hi := max(a, b.ptr), min(a+uintptr(n), b.ptr+uintptr(b.size))
			if lo < hi {
				covered += uint64(hi - lo)
			}
		}
		if covered != b.size {
			h.fatalf("live block %#x+%d: only %d bytes registered", b.ptr, b.size, covered)
		}
	}
}

// closePools closes the private pools once every block is freed and the
// faults are cleared (finish).
func (h *harness) closePools() {
	for _, p := range h.pools[1:] {
		if err := p.Close(); err != nil {
			h.fatalf("Pool.Close(%q) with every block freed and no fault armed: %v", p.Name(), err)
		}
	}
}

// requireDeregistered requires that after Close nothing is registered.
func (h *harness) requireDeregistered() {
	if h.reg == nil {
		return
	}
	h.reg.mu.Lock()
	defer h.reg.mu.Unlock()
	if len(h.reg.bad) > 0 {
		h.fatalf("registrar: %s", h.reg.bad[0])
	}
	if len(h.reg.regs) > 0 {
		h.fatalf("after Close %d ranges are still registered", len(h.reg.regs))
	}
}
