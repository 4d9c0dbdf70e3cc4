package replay

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Pools.
//
// An Alloc whose trace.Event.Pool is not the default pool (PyTorch's
// CUDA-graph pools, torch.cuda.MemPool) is made in an allocator Pool of
// its own, created with that PoolID (allocator.NewPool) the first time the
// trace allocates in it; Free, RecordStream and StreamSync go to the
// Allocator, which finds any pointer's pool. The allocator holds at most
// 64 private pools at once: a trace that uses more closes an empty one
// (no live allocation) to make room, and fails with ErrTooManyPools when
// none is empty. A pool's figures carry over its closes (peaks are the
// peaks over all its lives).

// ErrTooManyPools reports a trace that holds live allocations in more
// private pools at once than an allocator can hold (64).
var ErrTooManyPools = errors.New("replay: too many private pools hold memory at once")

// PoolReport is what a replay measured of one memory pool. Byte counts
// are in bytes. The pools' Allocs, OOMs and end figures add up to the
// Report's; a pool's peaks are its own, so they add up to at least the
// Report's peaks (the pools peak at different times).
type PoolReport struct {
	Pool string    `json:"pool"` // "default", or "pool(a,b)" as allocator.NewPool names it
	ID   [2]uint64 `json:"id"`   // PyTorch's MempoolId_t: (1, 0) is the first CUDA graph's pool

	Allocs int64 `json:"allocs"` // Alloc events in the pool
	OOMs   int64 `json:"ooms"`   // those that failed with out-of-memory

	PeakLive      uint64 `json:"peak_live_bytes"`      // peak trace demand (requested bytes, failed allocs included)
	PeakRequested uint64 `json:"peak_requested_bytes"` // peak requested bytes the pool served
	PeakAllocated uint64 `json:"peak_allocated_bytes"` // peak allocated (rounded) bytes
	PeakReserved  uint64 `json:"peak_reserved_bytes"`  // peak mapped bytes
	// ReservedOverLive is PeakReserved / PeakLive (0 if nothing was live).
	ReservedOverLive float64 `json:"reserved_over_live"`

	EndLive      uint64 `json:"end_live_bytes"`      // trace bytes still live after the last event
	EndAllocated uint64 `json:"end_allocated_bytes"` // allocated bytes after the last event
	EndReserved  uint64 `json:"end_reserved_bytes"`  // mapped bytes after the last event

	// Reopened counts the times the replay closed the pool (empty) to
	// stay within the allocator's 64 private pools and made it again.
	Reopened int `json:"reopened,omitempty"`
}

// poolRec is the replay state of one trace pool.
type poolRec struct {
	id   trace.PoolID
	pool *allocator.Pool // nil until its first Malloc, and after a close to make room
	rep  PoolReport      // counts, live bytes, and the peaks of closed lives

	live       uint64 // trace bytes live (requested sizes, failed allocs included)
	liveAllocs int64  // allocations live in pool (successful Mallocs not yet freed)
}

// poolSet maps the trace's pools to the allocator's. recs[0] is the
// default pool, which always exists; slot.pool indexes recs.
type poolSet struct {
	a       *allocator.Allocator
	recs    []*poolRec
	byID    map[trace.PoolID]uint32 // private pools' indices in recs
	lastID  trace.PoolID            // the private pool looked up last
	lastIdx uint32                  // its index
	opened  bool                    // a private allocator Pool was made
	// open lists the recs whose allocator Pool is open, oldest first (at
	// most the allocator's 64), so that making room looks at those only.
	open []uint32
}

func newPoolSet(a *allocator.Allocator) *poolSet {
	def := &poolRec{pool: a.DefaultPool()}
	return &poolSet{a: a, recs: []*poolRec{def}}
}

// index returns the index of trace pool id in recs, adding a record the
// first time.
func (ps *poolSet) index(id trace.PoolID) uint32 {
	if id.IsDefault() {
		return 0
	}
	if ps.lastIdx != 0 && id == ps.lastID {
		return ps.lastIdx
	}
	i, ok := ps.byID[id]
	if !ok {
		if ps.byID == nil {
			ps.byID = make(map[trace.PoolID]uint32)
		}
		i = uint32(len(ps.recs))
		ps.byID[id] = i
		ps.recs = append(ps.recs, &poolRec{id: id})
	}
	ps.lastID, ps.lastIdx = id, i
	return i
}

// private reports whether the trace named a pool other than the default.
func (ps *poolSet) private() bool { return len(ps.recs) > 1 }

// malloc allocates size bytes on stream in pool i, making its allocator
// Pool first if needed.
func (ps *poolSet) malloc(i uint32, size uint64, st backend.Stream) (uintptr, error) {
	rec := ps.recs[i]
	if rec.pool == nil {
		if err := ps.openPool(i); err != nil {
			return 0, err
		}
	}
	return rec.pool.Malloc(size, st)
}

// openPool makes the allocator Pool of recs[i], closing an empty pool
// first when the allocator holds as many as it can.
func (ps *poolSet) openPool(i uint32) error {
	rec := ps.recs[i]
	o := allocator.PoolOptions{ID: allocator.PoolID(rec.id)}
	p, err := ps.a.NewPool(o)
	if err != nil && errors.Is(err, allocator.ErrInvalidConfig) && ps.closeEmpty() {
		p, err = ps.a.NewPool(o)
	}
	if err != nil {
		if errors.Is(err, allocator.ErrInvalidConfig) {
			return fmt.Errorf("%w: making %v: %w", ErrTooManyPools, rec.id, err)
		}
		return fmt.Errorf("replay: making %v: %w", rec.id, err)
	}
	if rec.rep.Pool != "" {
		rec.rep.Reopened++
	}
	rec.rep.Pool = p.Name()
	rec.pool, ps.opened = p, true
	ps.open = append(ps.open, i)
	return nil
}

// closeEmpty closes the oldest open private pool without live
// allocations, keeping its figures, and reports whether it found one.
func (ps *poolSet) closeEmpty() bool {
	for k, i := range ps.open {
		rec := ps.recs[i]
		if rec.liveAllocs != 0 {
			continue
		}
		st := rec.pool.Stats()
		if err := rec.pool.Close(); err != nil {
			continue // frees still pending on a stream: not empty yet
		}
		rec.keepPeaks(&st)
		rec.pool = nil
		ps.open = slices.Delete(ps.open, k, k+1)
		return true
	}
	return false
}

// keepPeaks folds the peaks of a pool's statistics into rec.rep.
func (rec *poolRec) keepPeaks(st *stats.DeviceStats) {
	r := &rec.rep
	r.PeakRequested = max(r.PeakRequested, uint64(st.RequestedBytes[stats.AllPools].Peak))
	r.PeakAllocated = max(r.PeakAllocated, uint64(st.AllocatedBytes[stats.AllPools].Peak))
	r.PeakReserved = max(r.PeakReserved, uint64(st.ReservedBytes[stats.AllPools].Peak))
}

// alloc counts an Alloc event of pool i of size bytes (the trace's demand,
// before the Malloc).
func (ps *poolSet) alloc(i uint32, size uint64) {
	rec := ps.recs[i]
	rec.rep.Allocs++
	rec.live += size
	rec.rep.PeakLive = max(rec.rep.PeakLive, rec.live)
}

// reports returns the per-pool figures after the last event: nil when the
// trace used the default pool only, else the default pool first, then the
// private ones by PoolID.
func (ps *poolSet) reports() []PoolReport {
	if !ps.private() {
		return nil
	}
	out := make([]PoolReport, 0, len(ps.recs))
	for _, rec := range ps.recs {
		r := rec.rep
		r.ID = rec.id
		r.Pool = rec.id.String()
		if rec.pool != nil {
			r.Pool = rec.pool.Name()
			st := rec.pool.Stats()
			rec.keepPeaks(&st)
			r.PeakRequested, r.PeakAllocated, r.PeakReserved = rec.rep.PeakRequested, rec.rep.PeakAllocated, rec.rep.PeakReserved
			r.EndAllocated = uint64(st.AllocatedBytes[stats.AllPools].Current)
			r.EndReserved = uint64(st.ReservedBytes[stats.AllPools].Current)
		}
		r.EndLive = rec.live
		r.ReservedOverLive = ratio(r.PeakReserved, r.PeakLive)
		out = append(out, r)
	}
	slices.SortFunc(out[1:], func(x, y PoolReport) int {
		if c := cmpUint(x.ID[0], y.ID[0]); c != 0 {
			return c
		}
		return cmpUint(x.ID[1], y.ID[1])
	})
	return out
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
