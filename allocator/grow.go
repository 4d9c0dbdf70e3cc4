package allocator

import (
	"errors"
	"math/bits"
	"sort"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

func bitsLen(x uint64) int { return bits.Len64(x) }

// errNoVA reports that no reservation has room and the VA budget is spent.
var errNoVA = errors.New("address-space budget exhausted")

// isOOM reports whether err means "no memory" (retryable by freeing cache).
func isOOM(err error) bool {
	return errors.Is(err, backend.ErrOutOfMemory) || errors.Is(err, errNoVA)
}

// allocSlow runs when no free block fits: it grows the pool, and on
// out-of-memory climbs the ladder: release cached handles → wait for
// pending events and release every free handle and segment → retry → a
// typed OutOfMemoryError. It returns a free block, in its free list or
// out of any. mu held.
func (a *Allocator) allocSlow(ss *streamState, p *pool, rounded, size uint64) (*arena.Block, error) {
	if thr := a.cfg.GarbageCollectionThreshold; thr > 0 && a.cfg.PerProcessMemoryFraction < 1 {
		limit := uint64(thr * float64(a.allowed))
		if uint64(a.st.ReservedBytes[0].Current) > limit {
			_ = a.releaseUntil(limit) // best effort; growth below reports real failures
		}
	}
	b, err := a.grow(ss, p, rounded)
	if err == nil || !isOOM(err) {
		return b, err
	}
	// Rung 1: cached physical handles hold device memory without being mapped.
	if a.cachedHandleBytes() > 0 {
		if terr := a.trimCaches(); terr == nil {
			if b, err = a.grow(ss, p, rounded); err == nil || !isOOM(err) {
				return b, err
			}
		}
	}
	// Rung 2: wait for every pending event, release every free handle and
	// segment (what can be: a failure on one stream does not stop the
	// others), then retry whatever the release reported.
	a.st.NumAllocRetries++
	rerr := a.releaseAll()
	if b = a.bestFit(ss, p, rounded); b != nil {
		return b, nil
	}
	if b, err = a.grow(ss, p, rounded); err == nil || !isOOM(err) {
		return b, err
	}
	a.st.NumOOMs++
	free, _, _ := a.drv.MemGetInfo(a.dev)
	oom := &OutOfMemoryError{
		Device:    a.dev,
		Requested: size,
		Tried:     a.growSize(p, rounded),
		Total:     a.total,
		Free:      free,
		Allocated: uint64(a.st.AllocatedBytes[0].Current),
		Reserved:  uint64(a.st.ReservedBytes[0].Current),
		Stranded:  a.strandedBytes(),
	}
	if a.allowed < a.total {
		oom.Allowed = a.allowed
	}
	if errors.Is(err, errNoVA) {
		oom.AddrSpaceVA = true
	} else {
		oom.Cause = err
	}
	if rerr != nil && !isOOM(rerr) {
		oom.Cause = errors.Join(oom.Cause, rerr) // what the release could not do
	}
	return nil, oom
}

// growSize is how many bytes growth for rounded maps.
func (a *Allocator) growSize(p *pool, rounded uint64) uint64 {
	if a.cfg.ExpandableSegments {
		return roundUp(rounded, a.gran)
	}
	return a.classicSegmentSize(rounded)
}

// classicSegmentSize is PyTorch's get_allocation_size.
func (a *Allocator) classicSegmentSize(rounded uint64) uint64 {
	switch {
	case rounded <= smallSize:
		return a.cfg.SmallSegmentSize
	case rounded < minLargeAlloc:
		return max(a.cfg.LargeSegmentSize, roundUp(rounded, roundLarge))
	default:
		return roundUp(rounded, roundLarge)
	}
}

// overCap reports whether mapping n more bytes would exceed the memory
// fraction.
func (a *Allocator) overCap(n uint64) bool {
	return uint64(a.st.ReservedBytes[0].Current)+n > a.allowed
}

// grow maps new memory for a request and returns a free block of at least
// rounded bytes for ss, out of any list. mu held.
func (a *Allocator) grow(ss *streamState, p *pool, rounded uint64) (*arena.Block, error) {
	if !a.cfg.ExpandableSegments {
		return a.growClassic(ss, p, rounded)
	}
	return a.growExpandable(ss, p, rounded)
}

func (a *Allocator) growClassic(ss *streamState, p *pool, rounded uint64) (*arena.Block, error) {
	size := a.classicSegmentSize(rounded)
	if a.overCap(size) {
		return nil, backend.Errorf(backend.OpCreate, backend.ErrOutOfMemory, "", "per_process_memory_fraction cap %d bytes reached", a.allowed)
	}
	s, err := segment.NewClassicConfig(a.drv, size, segment.Config{
		Device: a.dev, Prop: backend.DeviceProp(a.dev), Counters: &a.counters,
	})
	if err != nil {
		if s != nil { // rollback incomplete: keep it to destroy later
			a.addZombie(s, p.kind)
		}
		return nil, err
	}
	sg := &seg{s: s, pool: p}
	sg.r = arena.NewRegion(&a.bpool, s.Base(), s.Size(), arena.Free, ss.stream, sg)
	sg.r.Pool = uint8(p.idx)
	a.addSeg(sg)
	a.st.Segment.Add(p.kind, 1)
	a.st.ReservedBytes.Add(p.kind, int64(s.MappedBytes()))
	a.histReserve(true, s.Base(), int64(s.MappedBytes()), ss.stream)
	if a.cfg.MaxSplitSize != 0 && s.Size() >= a.cfg.MaxSplitSize {
		a.st.OversizeSegments.Add(1)
	}
	return sg.r.Head, nil
}

// growExpandable finds the lowest-addressed unmapped run that, together
// with a free block of ss just before it (and after it, when the whole run
// is mapped), fits rounded bytes, maps the granules needed, and returns the
// merged free block. With no such run it reserves a new segment if the VA
// budget allows. mu held.
func (a *Allocator) growExpandable(ss *streamState, p *pool, rounded uint64) (*arena.Block, error) {
	if a.cfg.DefragThreshold >= 0 {
		if b := a.adoptFromStreams(ss, p, rounded); b != nil {
			return b, nil // another stream's idle handles, mapped where they are
		}
		defer a.holdForGrowth(p, rounded)() // handles unmapped now are remapped below
		a.reclaimBeforeGrow(ss, p, rounded) // other streams first: no wait
		a.defragBeforeGrow(ss, p, rounded)
	}
	fl := ss.free[p.idx]
	mergeable := func(b *arena.Block) bool {
		return b != nil && b.State == arena.Free && b.Stream == ss.stream && fl.Contains(b)
	}
	var (
		u      *arena.Block
		mapLen uint64
	)
	p.unmapped.Ascend(func(c *arena.Block) bool {
		var pre uint64
		if mergeable(c.Prev) {
			pre = c.Prev.Size
		}
		need := roundUp(rounded-min(pre, rounded-1), a.gran)
		if need <= c.Size {
			u, mapLen = c, need
			return false
		}
		if mergeable(c.Next) && pre+c.Size+c.Next.Size >= rounded {
			u, mapLen = c, c.Size
			return false
		}
		return true
	})
	if u == nil {
		if p.nexp >= a.cfg.MaxSegmentsPerPool {
			return nil, errNoVA
		}
		mapLen = roundUp(rounded, a.gran)
		if a.overCap(mapLen) {
			return nil, backend.Errorf(backend.OpMap, backend.ErrOutOfMemory, "", "per_process_memory_fraction cap %d bytes reached", a.allowed)
		}
		s, err := segment.New(a.drv, segment.Config{
			Device: a.dev, Prop: backend.DeviceProp(a.dev), PageSize: p.pageSize, Cut: segment.CutFromStart,
			VASize: max(p.vaSize, roundUp(mapLen, p.pageSize)), Cache: p.cache, Counters: &a.counters,
		})
		if err != nil {
			if errors.Is(err, backend.ErrOutOfMemory) {
				return nil, errNoVA
			}
			return nil, err
		}
		sg := &seg{s: s, pool: p, expandable: true}
		sg.r = arena.NewRegion(&a.bpool, s.Base(), s.Size(), arena.Unmapped, 0, sg)
		sg.r.Pool = uint8(p.idx)
		a.addSeg(sg)
		p.nexp++
		p.unmapped.ReplaceOrInsert(sg.r.Head)
		a.st.Segment.Add(p.kind, 1)
		u = sg.r.Head
	}
	if a.overCap(mapLen) {
		return nil, backend.Errorf(backend.OpMap, backend.ErrOutOfMemory, "", "per_process_memory_fraction cap %d bytes reached", a.allowed)
	}
	sg := u.Region.Owner.(*seg)
	if err := sg.s.Map(uint64(u.Addr-sg.r.Base), mapLen); err != nil {
		a.adoptStrayMappings(ss, p, sg, u)
		a.maybeDropEmpty(sg)
		return nil, err
	}
	p.unmapped.Delete(u)
	if mapLen < u.Size {
		rest := arena.Split(&a.bpool, u, mapLen)
		p.unmapped.ReplaceOrInsert(rest)
	}
	u.State = arena.Free
	u.Stream = ss.stream
	a.st.ReservedBytes.Add(p.kind, int64(mapLen))
	a.histReserve(false, u.Addr, int64(mapLen), ss.stream)
	b := u
	if mergeable(b.Prev) {
		prev := b.Prev
		fl.Remove(prev)
		arena.Merge(&a.bpool, prev)
		b = prev
	}
	if mergeable(b.Next) {
		fl.Remove(b.Next)
		arena.Merge(&a.bpool, b)
	}
	return b, nil
}

// defragBeforeGrow keeps reserved memory within defrag_threshold of
// allocated memory: if mapping rounded bytes would push the
// pool's mapped bytes above (1+threshold) × its allocated bytes plus one
// page, the requesting stream's free handles in the pool (holes too small
// for the request) are unmapped first, after synchronising that stream.
// Their handles go to the handle cache, so the growth that follows remaps
// the same physical memory at the new address. Other streams' handles are
// left to the out-of-memory ladder: growth never waits for another stream.
// Failures are left to the growth (and the OOM ladder) to report. mu held.
func (a *Allocator) defragBeforeGrow(ss *streamState, p *pool, rounded uint64) {
	page := p.pageSize
	reserved := uint64(a.st.ReservedBytes[p.kind].Current)
	after := reserved + roundUp(rounded, a.gran)
	limit := uint64((1+a.cfg.DefragThreshold)*float64(uint64(a.st.AllocatedBytes[p.kind].Current)+rounded)) + page
	if after <= limit {
		return
	}
	excess := after - limit
	total := uint64(a.st.ReservedBytes[0].Current)
	target := total - min(excess, total)
	_ = a.releaseStreamPool(ss, p.idx, target, true)
}

// adoptStrayMappings reconciles unmapped block u with its segment after a
// failed Map whose rollback failed too: handles the segment still has mapped
// inside u are unmapped again, and any that stay mapped become free blocks
// of ss, so the allocator's view stays true and the memory stays usable.
// mu held.
func (a *Allocator) adoptStrayMappings(ss *streamState, p *pool, sg *seg, u *arena.Block) {
	base := sg.r.Base
	lo0, hi0 := uint64(u.Addr-base), uint64(u.End()-base)
	var stray []segment.Run
	for _, r := range sg.s.MappedRuns() {
		if lo, hi := max(r.Off, lo0), min(r.Off+r.Len, hi0); lo < hi {
			stray = append(stray, segment.Run{Off: lo, Len: hi - lo})
		}
	}
	for i := len(stray) - 1; i >= 0; i-- { // from the top, so u stays the lowest piece
		r := stray[i]
		done, _ := sg.s.Unmap(r.Off, r.Len)
		r.Off, r.Len = r.Off+done, r.Len-done
		if r.Len == 0 {
			continue
		}
		piece := u
		if r.Off > lo0 {
			piece = arena.Split(&a.bpool, u, r.Off-lo0)
		} else {
			p.unmapped.Delete(u)
		}
		if piece.Size > r.Len {
			p.unmapped.ReplaceOrInsert(arena.Split(&a.bpool, piece, r.Len))
		}
		piece.State, piece.Stream = arena.Free, ss.stream
		a.st.ReservedBytes.Add(p.kind, int64(r.Len))
		a.histReserve(false, piece.Addr, int64(r.Len), ss.stream)
		a.coalesceInsert(p, ss.free[p.idx], piece)
		if r.Off == lo0 {
			return
		}
	}
}

// addSeg inserts sg into the address-ordered segment list. mu held.
func (a *Allocator) addSeg(sg *seg) {
	i := sort.Search(len(a.segs), func(i int) bool { return a.segs[i].r.Base > sg.r.Base })
	a.segs = append(a.segs, nil)
	copy(a.segs[i+1:], a.segs[i:])
	a.segs[i] = sg
}

// dropSeg forgets a destroyed or released segment and its blocks,
// adjusting statistics; mapped is the bytes it had mapped. mu held.
func (a *Allocator) dropSeg(sg *seg, mapped uint64) {
	p := sg.pool
	a.histReserve(!sg.expandable, sg.r.Base, -int64(mapped), sg.r.Head.Stream)
	for b := sg.r.Head; b != nil; {
		next := b.Next
		switch b.State {
		case arena.Free:
			a.countInactive(p, b, -1)
			a.stateOf(b.Stream).free[p.idx].Remove(b)
		case arena.Unmapped:
			p.unmapped.Delete(b)
		case arena.Allocated, arena.PendingFree:
			a.live.Delete(b.Addr)
			a.stateOf(b.Stream).active--
			n := int64(b.Size)
			if b.State == arena.Allocated {
				a.st.Allocation.Add(p.kind, -1)
				a.st.AllocatedBytes.Add(p.kind, -n)
			}
			a.st.Active.Add(p.kind, -1)
			a.st.ActiveBytes.Add(p.kind, -n)
			a.st.RequestedBytes.Add(p.kind, -int64(b.Requested))
		}
		a.bpool.Put(b)
		b = next
	}
	if sg.expandable {
		p.nexp--
	}
	a.st.ReservedBytes.Add(p.kind, -int64(mapped))
	a.st.Segment.Add(p.kind, -1)
	if !sg.expandable && a.cfg.MaxSplitSize != 0 && sg.r.Size >= a.cfg.MaxSplitSize {
		a.st.OversizeSegments.Add(-1)
	}
	for i, s := range a.segs {
		if s == sg {
			a.segs = append(a.segs[:i], a.segs[i+1:]...)
			break
		}
	}
	sg.r.Head = nil
}

// zombie is a segment the allocator no longer uses that still holds
// driver state. Memory it still maps counts as reserved.
type zombie struct {
	s       *segment.Segment
	kind    stats.PoolKind
	counted uint64 // bytes of it counted in reserved_bytes
}

// addZombie keeps s for a later teardown. mu held.
func (a *Allocator) addZombie(s *segment.Segment, kind stats.PoolKind) {
	z := &zombie{s: s, kind: kind}
	a.recountZombie(z)
	a.zombies = append(a.zombies, z)
}

// recountZombie brings reserved_bytes in line with what z still maps. mu held.
func (a *Allocator) recountZombie(z *zombie) {
	now := z.s.MappedBytes()
	a.st.ReservedBytes.Add(z.kind, int64(now)-int64(z.counted))
	a.histReserve(true, z.s.Base(), int64(now)-int64(z.counted), 0)
	z.counted = now
}

// destroyZombies retries the teardown of segments the allocator no longer
// uses but that still hold driver state: a classic segment whose creation
// could not be rolled back, or whose release failed after its memory was
// unmapped (its reservation or a leftover handle). mu held.
func (a *Allocator) destroyZombies() error {
	var errs []error
	kept := a.zombies[:0]
	for _, z := range a.zombies {
		var err error
		if z.s.Released() {
			err = z.s.FreeLeftovers()
		} else {
			err = z.s.Destroy()
		}
		a.recountZombie(z)
		if err != nil {
			errs = append(errs, err)
			kept = append(kept, z)
		}
	}
	clear(a.zombies[len(kept):])
	a.zombies = kept
	return errors.Join(errs...)
}

// maybeDropEmpty releases an expandable segment with nothing mapped. mu held.
func (a *Allocator) maybeDropEmpty(sg *seg) {
	if a.keepEmpty || !sg.expandable || sg.r.Head.State != arena.Unmapped || sg.r.Head.Next != nil {
		return
	}
	if err := sg.s.Release(); err != nil {
		return // keep it; a later release retries
	}
	a.dropSeg(sg, 0)
}
