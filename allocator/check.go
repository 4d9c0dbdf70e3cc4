package allocator

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

// ErrCorrupt is wrapped by every invariant violation Check reports.
var ErrCorrupt = errors.New("vmmalloc: invariant violated")

// Check verifies the allocator's invariants and returns the first
// violation found, wrapping ErrCorrupt:
//   - blocks tile every segment without gap or overlap, with consistent links;
//   - free neighbours of one stream are coalesced, as are unmapped ones;
//   - the blocks that are not unmapped cover exactly the segment's mapped
//     runs, unmapped blocks are granule-aligned, and a physical handle
//     holds blocks of one stream only;
//   - the free lists hold exactly the free blocks, the unmapped sets exactly
//     the unmapped blocks, the live map exactly the allocated blocks;
//   - pending events match the pending-free blocks, the busy list exactly
//     the streams with queued events, and each stream's active count its
//     allocated and pending-free blocks;
//   - the statistics equal a recount, and the cache hit's guard (hitOff)
//     the fields it summarises;
//   - the handle reserve creates nothing while no wait is in flight, its
//     stock sizes are ones the handle caches hold, and each cache's
//     budget leaves room for its reserve (checkReserve);
//   - every handle registered as exported (ShareSpans) and mapped is
//     mapped by a segment at its size, and none held only by its
//     exporter is;
//   - when the driver can list its state (backend.Introspector, as the
//     emulated driver can), its reservations, this device's mappings and
//     handles equal the allocator's own view (handles held only by
//     exporters included).
//
// It walks everything: use it in tests, not on a hot path.
func (a *Allocator) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.quiesceWaits()
	if off := a.hitOffNow(); a.hitOff != off {
		return corrupt("cache-hit guard %05b, its fields say %05b", a.hitOff, off)
	}
	if a.closed {
		return ErrClosed
	}
	if err := a.check(); err != nil {
		return err
	}
	if err := a.checkExported(); err != nil {
		return err
	}
	if err := a.checkReserve(); err != nil {
		return err
	}
	if in, ok := a.drv.(backend.Introspector); ok {
		return a.checkDriver(in)
	}
	return nil
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

func (a *Allocator) check() error {
	// The heap's own invariants: tiling, coalescing, indexes, table.
	if err := a.heap.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if a.pressureAt != pressureLine(a.allowed) {
		return corrupt("pressure line %d bytes, want %d for %d bytes allowed", a.pressureAt, pressureLine(a.allowed), a.allowed)
	}
	h := a.heap
	rc := recount{pools: map[*Pool]*stats.DeviceStats{}}
	want := &rc.all
	nLive, nEvents, nRegions := 0, 0, 0
	active := map[*streamState]int{}
	slept := map[*Pool]uint64{} // bytes of sleeping pools' blocks (not mapped)
	h.Regions(func(arena.RegionID) bool { nRegions++; return true })
	if nRegions != len(a.segs) {
		return corrupt("the heap holds %d regions, the allocator %d segments", nRegions, len(a.segs))
	}
	for i, sg := range a.segs {
		if i > 0 && a.segs[i-1].base+uintptr(a.segs[i-1].size) > sg.base {
			return corrupt("segments %#x and %#x overlap or are unordered", a.segs[i-1].base, sg.base)
		}
		cl := sg.class
		r, ok := h.Region(sg.rid)
		if !ok || a.segOf[sg.rid] != sg {
			return corrupt("segment %#x has no region in the heap", sg.base)
		}
		if r.Base != sg.s.Base() || r.Size != sg.s.Size() || r.Base != sg.base || r.Size != sg.size || int(r.Pool) != cl.idx {
			return corrupt("region %#x+%d (pool %d) differs from its segment %#x+%d", r.Base, r.Size, r.Pool, sg.s.Base(), sg.s.Size())
		}
		for _, w := range rc.of(a.segPool(sg)) {
			w.Segment.Add(cl.kind, 1)
			if !sg.expandable && a.cfg.MaxSplitSize != 0 && r.Size >= a.cfg.MaxSplitSize {
				w.OversizeSegments.Add(1)
			}
		}

		gran := sg.s.Granule()
		var mapped []segment.Run // mapped runs implied by the blocks
		var runStart uint64      // offset where the current run of mapped blocks began
		addr := r.Base
		var unmappedBytes, sleptBytes uint64
		var prev *arena.BlockInfo
		prevMapped := false // prev is mapped: neither unmapped nor of a sleeping pool
		for id := r.Head; id != arena.NoBlock; id = h.Next(id) {
			b, _ := h.Block(id)
			if b.Addr != addr || b.Size == 0 {
				return corrupt("block %#x+%d: expected to start at %#x", b.Addr, b.Size, addr)
			}
			if b.Addr%minBlockSize != 0 || b.Size%minBlockSize != 0 {
				return corrupt("block %#x+%d: not 512-byte aligned", b.Addr, b.Size)
			}
			addr = b.End()
			off := uint64(b.Addr - r.Base)
			// A sleeping pool's blocks keep their state, but their
			// handles are given back (sleep.go; checkSleeps).
			asleep := b.State != arena.Unmapped && b.StreamID > 0 && int(b.StreamID) < len(a.states) &&
				a.states[b.StreamID] != nil && a.states[b.StreamID].pool.asleep
			if asleep {
				slept[a.states[b.StreamID].pool] += b.Size
				sleptBytes += b.Size
			}
			if b.State == arena.Unmapped || asleep {
				if b.State == arena.Unmapped && (!sg.expandable || off%gran != 0 || b.Size%gran != 0) {
					return corrupt("unmapped block %#x+%d not granule-aligned in an expandable segment", b.Addr, b.Size)
				}
				if prevMapped {
					mapped = append(mapped, segment.Run{Off: runStart, Len: off - runStart})
				}
				runStart = off + b.Size
				if !asleep {
					unmappedBytes += b.Size
				}
			}
			if b.State != arena.Unmapped {
				if prevMapped && !asleep && prev.StreamID != b.StreamID {
					// Owners are per stream and pool: this also says no
					// mapped handle is shared by two pools.
					if start, _, ok := sg.s.HandleRange(off); !ok || start != off {
						return corrupt("a physical handle holds blocks of owners %d and %d (streams %d and %d, pools %q and %q, at %#x)",
							prev.StreamID, b.StreamID, prev.Stream, b.Stream, a.states[prev.StreamID].pool.name, a.states[b.StreamID].pool.name, b.Addr)
					}
				}
				if b.StreamID <= 0 || int(b.StreamID) >= len(a.states) || a.states[b.StreamID] == nil || a.states[b.StreamID].stream != b.Stream {
					return corrupt("block %#x on unknown stream %d", b.Addr, b.Stream)
				}
				if o := a.states[b.StreamID]; a.stateOf(b.Stream) != o.primary && !o.idleOwner {
					if _, gone := a.vanished[b.Stream]; !gone {
						return corrupt("block %#x: stream %d's owner is not the state in use", b.Addr, b.Stream)
					}
				}
			}
			n := int64(b.Size)
			var bp *Pool // the block's pool
			if b.State != arena.Unmapped {
				bp = a.states[b.StreamID].pool
				if !asleep {
					rc.add(bp, func(w *stats.DeviceStats) { w.ReservedBytes.Add(cl.kind, n) })
				}
			}
			switch b.State {
			case arena.Free:
				if b.Events != 0 || len(a.uses[id]) != 0 || b.Requested != 0 {
					return corrupt("free block %#x has events, uses or a requested size", b.Addr)
				}
				if a.inactiveSplit(b) {
					rc.add(bp, func(w *stats.DeviceStats) { w.InactiveSplit.Add(cl.kind, 1) })
					rc.add(bp, func(w *stats.DeviceStats) { w.InactiveSplitBytes.Add(cl.kind, n) })
				}
			case arena.Releasing, arena.Mapping:
				return corrupt("block %#x is %s with the lock held", b.Addr, b.State)
			case arena.Allocated, arena.PendingFree:
				active[a.states[b.StreamID]]++
				if a.planned != nil && (a.planned.regionOf(id) != nil || a.pendingRegion(id, false)) {
					// A plan region: checkPlans counts its planned blocks.
					if b.State == arena.Allocated {
						nLive++
					} else {
						nEvents += int(b.Events)
					}
					break
				}
				rc.add(bp, func(w *stats.DeviceStats) { w.Active.Add(cl.kind, 1) })
				rc.add(bp, func(w *stats.DeviceStats) { w.ActiveBytes.Add(cl.kind, n) })
				rc.add(bp, func(w *stats.DeviceStats) { w.RequestedBytes.Add(cl.kind, int64(b.Requested)) })
				if b.Requested == 0 || b.Requested > b.Size {
					return corrupt("block %#x: requested %d of %d bytes", b.Addr, b.Requested, b.Size)
				}
				if b.State == arena.Allocated {
					nLive++
					rc.add(bp, func(w *stats.DeviceStats) { w.Allocation.Add(cl.kind, 1) })
					rc.add(bp, func(w *stats.DeviceStats) { w.AllocatedBytes.Add(cl.kind, n) })
					if a.cfg.MaxSplitSize != 0 && b.Size >= a.cfg.MaxSplitSize {
						rc.add(bp, func(w *stats.DeviceStats) { w.OversizeAllocations.Add(1) })
					}
				} else {
					if b.Events <= 0 {
						return corrupt("pending-free block %#x has no events", b.Addr)
					}
					if len(a.uses[id]) != 0 {
						return corrupt("pending-free block %#x still has recorded uses", b.Addr)
					}
					nEvents += int(b.Events)
				}
			}
			prev = &b
			prevMapped = b.State != arena.Unmapped && !asleep
		}
		if addr != r.End() {
			return corrupt("blocks of segment %#x end at %#x, not %#x", r.Base, addr, r.End())
		}
		if prevMapped {
			mapped = append(mapped, segment.Run{Off: runStart, Len: r.Size - runStart})
		}
		// The blocks that are not unmapped cover exactly the mapped granules.
		got := sg.s.MappedRuns()
		if len(got) != len(mapped) {
			return corrupt("segment %#x: blocks say %d mapped runs, segment %d", r.Base, len(mapped), len(got))
		}
		for i := range got {
			if got[i] != mapped[i] {
				return corrupt("segment %#x: blocks say mapped run %+v, segment %+v", r.Base, mapped[i], got[i])
			}
		}
		if r.Size-unmappedBytes-sleptBytes != sg.s.MappedBytes() {
			return corrupt("segment %#x: %d bytes outside unmapped and sleeping blocks but %d mapped", r.Base, r.Size-unmappedBytes-sleptBytes, sg.s.MappedBytes())
		}
	}
	for _, z := range a.zombies {
		if z.counted != z.s.MappedBytes() {
			return corrupt("zombie segment %#x maps %d bytes, %d counted", z.s.Base(), z.s.MappedBytes(), z.counted)
		}
		for _, w := range rc.of(z.pool) {
			w.ReservedBytes.Add(z.kind, int64(z.counted))
		}
	}
	if nLive != h.Allocated() {
		return corrupt("the heap's address table holds %d blocks, segments %d allocated", h.Allocated(), nLive)
	}
	for id := range a.uses {
		if h.State(id) != arena.Allocated {
			return corrupt("recorded uses of a %s block %d", h.State(id), id)
		}
	}
	registered := 0
	var regErr error
	a.eachState(func(ss *streamState) {
		registered++
		if ss.sid <= 0 || int(ss.sid) >= len(a.states) || a.states[ss.sid] != ss || h.Stream(ss.sid) != ss.stream {
			regErr = corrupt("stream %d is not registered with the heap as its own", ss.stream)
		}
	})
	if regErr != nil {
		return regErr
	}
	for sid, ss := range a.states {
		if ss != nil && h.StreamBlocks(arena.StreamID(sid)) > 0 && ss.sid != arena.StreamID(sid) {
			return corrupt("heap stream %d holds blocks but its state is gone", sid)
		}
	}
	if len(a.freeing) != 0 { // quiesceWaits: no Free waits without mu
		return corrupt("%d blocks marked as being freed with no wait in flight", len(a.freeing))
	}
	for _, ss := range a.streams {
		if ss.releasing {
			return corrupt("stream %d marked releasing with no wait in flight", ss.stream)
		}
	}
	queued, nBusy := 0, 0
	var stateErr error
	a.eachState(func(ss *streamState) {
		queued += len(ss.queue)
		if len(ss.queue) > 0 {
			nBusy++
			if ss.busyIdx < 0 || ss.busyIdx >= len(a.busy) || a.busy[ss.busyIdx] != ss {
				stateErr = corrupt("stream %d has queued events but is not in the busy list", ss.stream)
			}
		} else if ss.busyIdx >= 0 {
			stateErr = corrupt("stream %d has no queued events but is in the busy list", ss.stream)
		}
		if ss.active != active[ss] {
			stateErr = corrupt("stream %d counts %d active blocks, segments %d", ss.stream, ss.active, active[ss])
		}
		for _, pe := range ss.queue {
			if h.State(pe.b) != arena.PendingFree {
				stateErr = corrupt("event waits on %s block %#x", h.State(pe.b), h.Addr(pe.b))
			}
		}
	})
	if stateErr != nil {
		return stateErr
	}
	if nBusy != len(a.busy) {
		return corrupt("busy list holds %d streams, %d have queued events", len(a.busy), nBusy)
	}
	for id, ss := range a.vanished {
		if _, ok := a.streams[id]; ok || ss.stream != id {
			return corrupt("vanished stream %d is also in use, or mislabelled (%d)", id, ss.stream)
		}
	}
	for _, ss := range a.spare {
		if ss.active != 0 || ss.busyIdx >= 0 || ss.sid != 0 {
			return corrupt("a spare stream state is not empty")
		}
	}
	for _, p := range a.pools {
		if p == nil {
			continue
		}
		if ds := p.idle; ds.stream != idleStream || len(ds.queue) != 0 || !ds.idleOwner || ds.pool != p {
			return corrupt("the idle owner of pool %q has stream %d and %d queued events", p.name, ds.stream, len(ds.queue))
		}
	}
	for _, b := range a.stranded {
		if h.State(b) != arena.PendingFree {
			return corrupt("stranded block %#x is %s", h.Addr(b), h.State(b))
		}
	}
	if queued != nEvents-len(a.stranded) { // a stranded block counts one phantom event
		return corrupt("%d events queued, blocks wait on %d (%d stranded)", queued, nEvents, len(a.stranded))
	}
	pendingBlocks := 0
	for _, sg := range a.segs {
		r, _ := h.Region(sg.rid)
		for id := r.Head; id != arena.NoBlock; id = h.Next(id) {
			if h.State(id) == arena.PendingFree {
				pendingBlocks++
			}
		}
	}
	if pendingBlocks != a.pending {
		return corrupt("pending counter %d, blocks %d", a.pending, pendingBlocks)
	}
	if err := a.checkPlans(&rc); err != nil {
		return err
	}
	got := a.st.Settled() // Active's Current is derived (stats.HotCounters)
	if err := compareStats(want, &got); err != nil {
		return err
	}
	if err := a.checkDefragSlack(); err != nil {
		return err
	}
	if err := a.checkSleeps(slept); err != nil {
		return err
	}
	return a.checkPools(&rc)
}

// recount is Check's recount of the statistics: the aggregate and, once
// private pools exist, each pool's.
type recount struct {
	all   stats.DeviceStats
	pools map[*Pool]*stats.DeviceStats
}

// add applies f to the aggregate and to pool p's recount.
func (rc *recount) add(p *Pool, f func(*stats.DeviceStats)) {
	f(&rc.all)
	w := rc.pools[p]
	if w == nil {
		w = new(stats.DeviceStats)
		rc.pools[p] = w
	}
	f(w)
}

func (rc *recount) of(p *Pool) []*stats.DeviceStats {
	w := rc.pools[p]
	if w == nil {
		w = new(stats.DeviceStats)
		rc.pools[p] = w
	}
	return []*stats.DeviceStats{&rc.all, w}
}

// checkPools verifies the per-pool invariants: every pool's statistics
// equal its recount (so they add up to the aggregate, which equals its
// own), every owner of a pool is the pool's, and the pool list is
// consistent. mu held.
func (a *Allocator) checkPools(rc *recount) error {
	if len(a.pools) == 0 || a.pools[0] != &a.def {
		return corrupt("the default pool is not the first pool")
	}
	var ownerErr error
	for _, ps := range a.streams {
		if ps.pool != &a.def || ps.primary != ps {
			return corrupt("stream %d: its primary state is not the default pool's", ps.stream)
		}
		for slot, o := range ps.owners {
			if o == nil {
				continue
			}
			if slot == 0 || slot >= len(a.pools) || a.pools[slot] != o.pool || o.pool.slot != slot || o.primary != ps || o.stream != ps.stream || len(o.queue) != 0 {
				ownerErr = corrupt("stream %d: its owner in slot %d is not pool %d's", ps.stream, slot, slot)
			}
		}
	}
	if ownerErr != nil {
		return ownerErr
	}
	if !a.pooled {
		return nil
	}
	var sum stats.DeviceStats
	for _, p := range a.pools {
		if p == nil {
			continue
		}
		if p.closed || p.a != a {
			return corrupt("pool %q in slot %d is closed or another allocator's", p.name, p.slot)
		}
		want := rc.pools[p]
		if want == nil {
			want = new(stats.DeviceStats)
		}
		got := p.st.Settled() // Active's Current is derived (stats.HotCounters)
		if err := compareStats(want, &got); err != nil {
			return fmt.Errorf("pool %q: %w", p.name, err)
		}
		for _, pr := range [][2]*stats.StatArray{{&sum.AllocatedBytes, &got.AllocatedBytes}, {&sum.ReservedBytes, &got.ReservedBytes}, {&sum.Allocation, &got.Allocation}, {&sum.ActiveBytes, &got.ActiveBytes}} {
			for k := range pr[0] {
				pr[0][k].Current += pr[1][k].Current
				pr[0][k].Allocated += pr[1][k].Allocated
				pr[0][k].Freed += pr[1][k].Freed
			}
		}
	}
	for p := range rc.pools {
		if p != nil && p.closed {
			if w := rc.pools[p]; w.ReservedBytes[stats.AllPools].Current != 0 || w.Active[stats.AllPools].Current != 0 {
				return corrupt("closed pool %q still holds memory", p.name)
			}
		}
	}
	all := a.st.Settled()
	for _, pr := range []struct {
		name string
		s, a *stats.StatArray
	}{{"allocated_bytes", &sum.AllocatedBytes, &all.AllocatedBytes}, {"reserved_bytes", &sum.ReservedBytes, &all.ReservedBytes}, {"allocation", &sum.Allocation, &all.Allocation}, {"active_bytes", &sum.ActiveBytes, &all.ActiveBytes}} {
		for k := range pr.s {
			// A closed pool takes its accumulated counts with it; current
			// values always add up.
			accDiffer := a.poolsClosed == 0 && (pr.s[k].Allocated != pr.a[k].Allocated || pr.s[k].Freed != pr.a[k].Freed)
			if pr.s[k].Current != pr.a[k].Current || accDiffer {
				return corrupt("%s.%s: the pools add up to %+v, the allocator has %+v", pr.name, stats.PoolKind(k), pr.s[k], pr.a[k])
			}
		}
	}
	return nil
}

func compareStats(want, got *stats.DeviceStats) error {
	pairs := []struct {
		name string
		w, g *stats.StatArray
	}{
		{"allocation", &want.Allocation, &got.Allocation},
		{"segment", &want.Segment, &got.Segment},
		{"active", &want.Active, &got.Active},
		{"inactive_split", &want.InactiveSplit, &got.InactiveSplit},
		{"allocated_bytes", &want.AllocatedBytes, &got.AllocatedBytes},
		{"reserved_bytes", &want.ReservedBytes, &got.ReservedBytes},
		{"active_bytes", &want.ActiveBytes, &got.ActiveBytes},
		{"inactive_split_bytes", &want.InactiveSplitBytes, &got.InactiveSplitBytes},
		{"requested_bytes", &want.RequestedBytes, &got.RequestedBytes},
	}
	for _, p := range pairs {
		for k := stats.PoolKind(0); k < stats.NumPoolKinds; k++ {
			if p.w[k].Current != p.g[k].Current {
				return corrupt("stat %s.%s.current is %d, recount %d", p.name, k, p.g[k].Current, p.w[k].Current)
			}
			if p.g[k].Current < 0 || p.g[k].Peak < p.g[k].Current {
				return corrupt("stat %s.%s: current %d, peak %d", p.name, k, p.g[k].Current, p.g[k].Peak)
			}
		}
	}
	if want.OversizeAllocations.Current != got.OversizeAllocations.Current {
		return corrupt("oversize_allocations %d, recount %d", got.OversizeAllocations.Current, want.OversizeAllocations.Current)
	}
	if want.OversizeSegments.Current != got.OversizeSegments.Current {
		return corrupt("oversize_segments %d, recount %d", got.OversizeSegments.Current, want.OversizeSegments.Current)
	}
	return nil
}

// Range is a span of device address space.
type Range = backend.Range

// Footprint lists what the allocator holds from the driver: its address
// reservations, its mappings (one per physical handle), and the number of
// physical handles it holds unmapped (cached, or kept after a failed free
// for a retry). Tests compare it with the backend's own view.
func (a *Allocator) Footprint() (reservations, mappings []Range, cachedHandles int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.footprint()
}

// footprint is Footprint with mu held; both lists ascend by address.
func (a *Allocator) footprint() (reservations, mappings []Range, cachedHandles int) {
	for _, sg := range a.segs {
		reservations = append(reservations, Range{Addr: sg.s.Base(), Size: sg.s.Size()})
		for _, h := range sg.s.Handles() {
			mappings = append(mappings, Range{Addr: sg.s.Base() + uintptr(h.Off), Size: h.Len})
		}
	}
	cachedHandles = a.classes[0].cache.Len() + a.classes[1].cache.Len()
	for _, sg := range a.segs {
		cachedHandles += sg.s.Leftovers()
	}
	cachedHandles += a.heldHandles() // sleeping pools' handles whose free failed
	for _, z := range a.zombies {
		if !z.s.Released() {
			reservations = append(reservations, Range{Addr: z.s.Base(), Size: z.s.Size()})
		}
		for _, h := range z.s.Handles() {
			mappings = append(mappings, Range{Addr: z.s.Base() + uintptr(h.Off), Size: h.Len})
		}
		cachedHandles += z.s.Leftovers()
	}
	sort.Slice(reservations, func(i, j int) bool { return reservations[i].Addr < reservations[j].Addr })
	sort.Slice(mappings, func(i, j int) bool { return mappings[i].Addr < mappings[j].Addr })
	return reservations, mappings, cachedHandles
}

// checkDriver compares the allocator's footprint with what a driver that
// can list its state holds for this device. mu held.
func (a *Allocator) checkDriver(in backend.Introspector) error {
	res, maps, cached := a.footprint()
	_, _, exporterHeld, _ := a.exportedTotals()
	cached += int(exporterHeld) // unmapped, but exporters hold them for open exports
	dres, dmaps, dhandles := in.LiveRanges(a.dev)
	if len(maps) != len(dmaps) {
		return corrupt("allocator maps %d handles, driver %d", len(maps), len(dmaps))
	}
	for i := range maps {
		if maps[i] != dmaps[i] {
			return corrupt("mapping %d: allocator %#x+%d, driver %#x+%d", i, maps[i].Addr, maps[i].Size, dmaps[i].Addr, dmaps[i].Size)
		}
	}
	if dhandles != len(maps)+cached {
		return corrupt("driver holds %d handles of device %d, allocator %d mapped + %d unmapped", dhandles, a.dev, len(maps), cached)
	}
	held := make(map[Range]bool, len(dres))
	for _, r := range dres {
		held[r] = true
	}
	for _, r := range res {
		if !held[r] {
			return corrupt("reservation %#x+%d unknown to the driver", r.Addr, r.Size)
		}
	}
	// Every driver reservation holding this device's mappings is ours.
	ours := make(map[Range]bool, len(res))
	for _, r := range res {
		ours[r] = true
	}
	j := 0
	for _, r := range dres {
		for j < len(dmaps) && dmaps[j].Addr < r.Addr {
			j++
		}
		if j < len(dmaps) && dmaps[j].Addr < r.Addr+uintptr(r.Size) && !ours[r] {
			return corrupt("driver reservation %#x+%d maps device %d memory the allocator does not know", r.Addr, r.Size, a.dev)
		}
	}
	return nil
}

// Snapshot describes every segment and block (torch.cuda.memory_snapshot).
func (a *Allocator) Snapshot() stats.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.quiesceWaits()
	return a.snapshotLocked()
}

func (a *Allocator) snapshotLocked() stats.Snapshot {
	var s stats.Snapshot
	for _, sg := range a.segs {
		si := stats.SegmentInfo{
			Device: a.dev, Address: sg.base, TotalSize: sg.size, MappedSize: sg.s.MappedBytes(),
			Pool: sg.class.kind, IsExpandable: sg.expandable, PageSize: sg.s.PageSize(),
		}
		r, _ := a.heap.Region(sg.rid)
		for id := r.Head; id != arena.NoBlock; id = a.heap.Next(id) {
			b, _ := a.heap.Block(id)
			bi := stats.BlockInfo{Address: b.Addr, Size: b.Size, RequestedSize: b.Requested, Stream: uint64(b.Stream)}
			if b.State != arena.Unmapped {
				bi.Pool = a.blockPool(b)
			}
			if b.State == arena.Allocated {
				if planned := a.planSnapshotBlocks(id, b, bi.Pool); planned != nil {
					for _, pb := range planned {
						if pb.State == stats.BlockActiveAllocated {
							si.AllocatedSize += pb.Size
							si.ActiveSize += pb.Size
							si.RequestedSize += pb.RequestedSize
						}
					}
					si.Blocks = append(si.Blocks, planned...)
					continue
				}
			}
			switch b.State {
			case arena.Allocated:
				bi.State = stats.BlockActiveAllocated
				si.AllocatedSize += b.Size
				si.ActiveSize += b.Size
				si.RequestedSize += b.Requested
				bi.Stack = a.blockStack(b)
			case arena.PendingFree:
				bi.State = stats.BlockActivePendingFree
				si.ActiveSize += b.Size
			case arena.Free:
				bi.State = stats.BlockInactive
			case arena.Unmapped:
				bi.State = stats.BlockUnmapped
			}
			si.Blocks = append(si.Blocks, bi)
		}
		s.Segments = append(s.Segments, si)
	}
	return s
}

// checkDefragSlack verifies that no pool's learned defrag slack exceeds
// defragSlackCap of its high water mark. mu held.
func (a *Allocator) checkDefragSlack() error {
	for _, p := range a.pools {
		if p == nil {
			continue
		}
		for i, sl := range p.defragSlack {
			if limit := a.defragSlackCap(p.highWater[i]); sl > limit {
				return corrupt("pool %q: defrag slack %d bytes in class %d, over %d", p.name, sl, i, limit)
			}
		}
	}
	return nil
}
