package allocator

// Isolated pools (PoolOptions.Isolated).
//
// A physical handle holds blocks of one owner only (the heap's invariant
// that Check verifies), so an isolated pool gives every allocation an
// owner of its own: the stream's owner in the pool is only a lead, whose
// isolated list holds one owner per allocation. Growth for such an owner
// merges with no free block (it has none) and maps the allocation's
// granule-rounded size, so the allocation's handles hold nothing else; a
// classic pool maps a segment per allocation. A freed allocation leaves
// its owner with its whole handles free; a later Malloc of the same mapped
// size on the stream takes them back (no other pool and no other
// allocation ever shares them), and releases unmap them as any free
// memory. Owners left with no block are dropped at the next Malloc.

// isolatedOwner returns the owner a Malloc of rounded bytes in size class
// cl uses in the isolated pool of lead: an owner of lead's stream holding
// only a free block of exactly what a growth would map (reuse), else a new
// one. mu held.
func (a *Allocator) isolatedOwner(lead *streamState, cl *sizeClass, rounded uint64) (*streamState, error) {
	want := a.growSize(lead.pool, cl, rounded)
	kept := lead.isolated[:0]
	var reuse *streamState
	for _, t := range lead.isolated {
		if t.active == 0 && a.heap.StreamBlocks(t.sid) == 0 {
			a.unregister(t) // released: nothing left to reuse
			continue
		}
		kept = append(kept, t)
		if reuse == nil && t.active == 0 && a.freeLen(t) == 1 && a.heap.FreeBytes(t.sid, uint8(cl.idx)) == want {
			reuse = t
		}
	}
	clear(lead.isolated[len(kept):])
	lead.isolated = kept
	if reuse != nil {
		return reuse, nil
	}
	t, err := a.newStreamState(lead.stream)
	if err != nil {
		return nil, err
	}
	t.pool, t.primary, t.lead = lead.pool, lead.primary, lead
	lead.isolated = append(lead.isolated, t)
	return t, nil
}
