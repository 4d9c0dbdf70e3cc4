package trace

import (
	"fmt"
	"math"
	"slices"
)

// Pools in PyTorch snapshots.
//
// PyTorch records the pool of each segment in the snapshot's segments list
// (segment_pool_id, a (int, int) tuple: MempoolId_t), and newer versions
// also the pool of each trace entry (pool_id). The importer gives each
// alloc the pool its entry names when it names one. Otherwise it infers
// the pool from the segments at dump time: an alloc at an address inside
// a private-pool segment is in that pool, unless the segment's address
// range was released (segment_free or segment_unmap of any overlapping
// range) after the alloc, in which case the range may have belonged to
// another segment then and the alloc stays in the default pool. A private
// segment created and released within the trace leaves no trace in an
// older snapshot, so its allocs are in the default pool too: the
// inference can miss a private pool, never invent one.

// privateSegment is a segment of the snapshot's final state in a pool
// other than the default one.
type privateSegment struct {
	start, end int64  // address range [start, end)
	pool       PoolID // its segment_pool_id
	// validFrom is the index of the last entry that released (freed or
	// unmapped) an overlapping range, -1 if none: the segment held its
	// range for entries after it.
	validFrom int
}

// poolTuple converts a decoded (int, int) tuple to a PoolID. PyTorch
// writes the unsigned halves of MempoolId_t as int64, so negative values
// are their two's complement.
func poolTuple(v any) (PoolID, bool) {
	t, ok := v.([]any)
	if !ok || len(t) != 2 {
		return PoolID{}, false
	}
	a, ok1 := intOf(t[0])
	b, ok2 := intOf(t[1])
	return PoolID{uint64(a), uint64(b)}, ok1 && ok2
}

// addPrivateSegment records segments[i] (the dict m) if it lies in a
// private pool. A segment without segment_pool_id (older PyTorch) is in
// the default pool.
func (t *PyTorchTrace) addPrivateSegment(i int, m map[string]any, total int64) error {
	raw, ok := m["segment_pool_id"]
	if !ok || raw == nil {
		return nil
	}
	pool, ok := poolTuple(raw)
	if !ok {
		return fmt.Errorf("%w: segments[%d]: segment_pool_id is %s, want an (int, int) tuple", ErrSnapshot, i, typeOf(raw))
	}
	if pool.IsDefault() {
		return nil
	}
	addr, ok := intOf(m["address"])
	if !ok || addr < 0 {
		return fmt.Errorf("%w: segments[%d] in %v lacks a non-negative integer address", ErrSnapshot, i, pool)
	}
	end := addr + total
	if total > math.MaxInt64-addr {
		end = math.MaxInt64
	}
	t.PrivateSegments++
	t.private = append(t.private, privateSegment{start: addr, end: end, pool: pool, validFrom: -1})
	return nil
}

// preparePools sorts the private segments, rejects overlapping ones, and
// sets each one's validFrom from the release entries. Each release entry
// costs a binary search plus one step per segment it invalidates, and a
// segment is invalidated once (the scan runs backwards, so the first
// release met is the last one), so the work is O((entries + segments) log
// segments) however the entries and segments are shared in the pickle.
func (t *PyTorchTrace) preparePools(entries []any) error {
	segs := t.private
	if len(segs) == 0 {
		return nil
	}
	slices.SortFunc(segs, func(a, b privateSegment) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	for i := 1; i < len(segs); i++ {
		if segs[i].start < segs[i-1].end {
			return fmt.Errorf("%w: segments in %v at %#x and %v at %#x overlap", ErrSnapshot,
				segs[i-1].pool, segs[i-1].start, segs[i].pool, segs[i].start)
		}
	}
	// next[i] is the first segment at or after i still valid to the end
	// (len(segs) if none), with path compression.
	next := make([]int32, len(segs)+1)
	for i := range next {
		next[i] = int32(i)
	}
	find := func(i int) int {
		root := i
		for int(next[root]) != root {
			root = int(next[root])
		}
		for int(next[i]) != root {
			next[i], i = int32(root), int(next[i])
		}
		return root
	}
	for i := len(entries) - 1; i >= 0; i-- {
		m, ok := entries[i].(map[string]any)
		if !ok {
			continue // convert reports it
		}
		if a, _ := m["action"].(string); a != "segment_free" && a != "segment_unmap" {
			continue
		}
		addr, ok1 := intOf(m["addr"])
		size, ok2 := intOf(m["size"])
		if !ok1 || !ok2 || size <= 0 {
			continue
		}
		end := addr + size
		if size > math.MaxInt64-addr {
			end = math.MaxInt64
		}
		// The first segment ending after addr; ends are sorted too, the
		// segments being disjoint.
		j, _ := slices.BinarySearchFunc(segs, addr, func(s privateSegment, a int64) int {
			if s.end <= a {
				return -1
			}
			return 1
		})
		for j = find(j); j < len(segs) && segs[j].start < end; j = find(j + 1) {
			segs[j].validFrom = i
			next[j] = int32(j + 1)
		}
	}
	return nil
}

// poolAt returns the pool of an alloc at addr made by entry i, inferred
// from the private segments (the default pool when none holds it then).
func (t *PyTorchTrace) poolAt(addr int64, i int) PoolID {
	segs := t.private
	j, found := slices.BinarySearchFunc(segs, addr, func(s privateSegment, a int64) int {
		switch {
		case s.end <= a:
			return -1
		case s.start > a:
			return 1
		}
		return 0
	})
	if found && i > segs[j].validFrom {
		return segs[j].pool
	}
	return PoolID{}
}

// allocPool returns the pool of the alloc entry m (the i-th) at addr: its
// pool_id when it has one, else the one inferred from the segments.
func (t *PyTorchTrace) allocPool(m map[string]any, addr int64, i int) (PoolID, error) {
	if raw, ok := m["pool_id"]; ok && raw != nil {
		p, ok := poolTuple(raw)
		if !ok {
			return PoolID{}, fmt.Errorf("%w: device_traces[%d][%d]: pool_id is %s, want an (int, int) tuple", ErrSnapshot, t.Device, i, typeOf(raw))
		}
		t.AllocPoolIDs++
		return p, nil
	}
	if len(t.private) == 0 {
		return PoolID{}, nil
	}
	return t.poolAt(addr, i), nil
}
