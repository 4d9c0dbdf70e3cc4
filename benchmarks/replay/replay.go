package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/stats"
)

// DefaultCapacity is the emulated device capacity Run uses when
// Options.Capacity is 0: 80 GiB, an 80 GB-class accelerator.
const DefaultCapacity = emulated.DefaultCapacity

// Resolution is the step of the capacity search and the alignment of every
// capacity it tries: the emulator's default granularity (2 MiB).
const Resolution = emulated.DefaultGranularity

const (
	defaultMaxSamples = 2048    // bound of Report.Samples
	minMaxSamples     = 16      // smallest accepted Options.MaxSamples
	defaultStride     = 16      // first sampling stride, in events
	progressEvery     = 1 << 16 // events between Options.Progress calls
	ctxCheckEvery     = 1 << 12 // events between checks of RunContext's context
	denseIDs          = 1 << 26 // bound of the id slice (1.5 GiB of slots); larger ids go to a map
	initialDense      = 1 << 12 // first length of the id slice
	denseStreams      = 1 << 10 // trace streams below this index a slice
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrInvalidOptions reports an unusable Options or Policy value.
	ErrInvalidOptions = errors.New("replay: invalid options")
	// ErrInvalidEvent reports an event the replay cannot apply (an
	// invalid Kind).
	ErrInvalidEvent = errors.New("replay: invalid event")
	// ErrNoFit reports that MinCapacity found no capacity up to
	// MaxSearchCapacity at which the trace replays without running out of
	// memory.
	ErrNoFit = errors.New("replay: trace does not fit any capacity searched")
)

// Options configures a replay. The zero value replays with DefaultConfig on
// an 80 GiB device, counting out-of-memory errors and going on.
type Options struct {
	// Name labels the report (a policy name); optional.
	Name string
	// Config is the allocator policy. The zero Config means
	// allocator.DefaultConfig(). Config.Device selects the emulated device
	// (the emulator gets Device+1 devices).
	Config allocator.Config
	// Capacity is the emulated device memory in bytes; 0 means
	// DefaultCapacity. At most MaxSearchCapacity (ErrInvalidOptions).
	Capacity uint64
	// StopOnOOM ends the replay at the first Alloc that fails with
	// out-of-memory (Report.Complete is then false). Otherwise the failure
	// is counted and the replay goes on.
	StopOnOOM bool
	// MaxSamples bounds Report.Samples (default 2048, at least 16). A
	// negative value records no samples.
	MaxSamples int
	// CostModel replaces emulated.DefaultCostModel for SimDriverTime;
	// CostProfile names it in the report (DefaultCostProfile when both
	// are unset).
	CostModel   *emulated.CostModel
	CostProfile string
	// Progress, if set, is called from the replaying goroutine with the
	// number of events applied so far, every 65536 events and once at the
	// end. It must be quick.
	Progress func(events int64)
	// Check runs the allocator's invariant check (allocator.Check) once
	// after the last event; a violation fails the replay.
	Check bool
	// MinCapacity asks Compare to search each policy's minimum capacity
	// (Report.MinCapacity). Run ignores it.
	MinCapacity bool
	// Parallel is how many replays the capacity search runs at once; 0
	// means GOMAXPROCS.
	Parallel int
	// SteadyFromMark, if nonzero, is the ID of the Mark event (a step
	// number) from which Report.SteadyDriverCalls counts driver calls: the
	// steady state after a warm-up, where a caching allocator should make
	// none.
	SteadyFromMark uint64
	// IgnoreReleases skips EmptyCache events (counted in
	// Report.ReleasesIgnored) instead of applying them. The PyTorch
	// importer turns the cache releases a snapshot records into EmptyCache
	// events, so this replays what the allocator alone would reserve
	// without the program's (or PyTorch's out-of-memory) releases.
	IgnoreReleases bool
	// Snapshot, if set, receives a PyTorch memory snapshot of the replay
	// (allocator.WriteSnapshot, which memory_viz opens) after the last
	// event. The memory history is recorded from the first event, at most
	// SnapshotEntries entries (DefaultSnapshotEntries when 0; older ones
	// are dropped), without call stacks.
	Snapshot        io.Writer
	SnapshotEntries int
}

// DefaultSnapshotEntries is the history size Options.Snapshot records by
// default.
const DefaultSnapshotEntries = 1 << 20

// Sample is the state of the replay after Event events.
type Sample struct {
	Event     int64  `json:"event"`           // events applied so far
	TimeNs    int64  `json:"time_ns"`         // TimeNs of the last event applied
	Live      uint64 `json:"live_bytes"`      // trace bytes live (requested sizes)
	Allocated uint64 `json:"allocated_bytes"` // allocator's allocated bytes (rounded blocks)
	Reserved  uint64 `json:"reserved_bytes"`  // allocator's mapped bytes
}

// Fragmentation is 1 − allocated/reserved: the share of mapped memory not
// handed out (0 when nothing is mapped).
func (s Sample) Fragmentation() float64 {
	if s.Reserved == 0 {
		return 0
	}
	return 1 - float64(s.Allocated)/float64(s.Reserved)
}

// Report is what a replay measured. Byte counts are in bytes.
type Report struct {
	Policy   string `json:"policy,omitempty"` // Options.Name
	Config   string `json:"config"`           // the allocator config, as ParseConfig reads it
	Capacity uint64 `json:"capacity_bytes"`   // emulated device memory
	Complete bool   `json:"complete"`         // every event was applied (false after StopOnOOM stopped it)

	Events        int64 `json:"events"`         // events applied
	Allocs        int64 `json:"allocs"`         // Alloc events
	Frees         int64 `json:"frees"`          // Free events
	RecordStreams int64 `json:"record_streams"` // RecordStream events
	StreamSyncs   int64 `json:"stream_syncs"`   // StreamSync events
	EmptyCaches   int64 `json:"empty_caches"`   // EmptyCache events
	// ReleasesApplied counts the EmptyCache events applied and
	// ReleasesIgnored those skipped (Options.IgnoreReleases).
	ReleasesApplied int64 `json:"releases_applied"`
	ReleasesIgnored int64 `json:"releases_ignored,omitempty"`
	Marks           int64 `json:"marks"`   // Mark events
	Streams         int   `json:"streams"` // distinct non-default trace streams (emulator streams created)

	SkippedFrees    int64 `json:"skipped_frees"`    // Free of an id that was never allocated or already freed
	FailedFrees     int64 `json:"failed_frees"`     // Free of an id whose Alloc ran out of memory
	SkippedRecords  int64 `json:"skipped_records"`  // RecordStream of an id that is not live
	DuplicateAllocs int64 `json:"duplicate_allocs"` // Alloc of an id still live (skipped)
	ZeroAllocs      int64 `json:"zero_allocs"`      // Alloc of 0 bytes (skipped, as a null pointer)

	OOMs          int64 `json:"ooms"`            // Alloc events that failed with out-of-memory
	FirstOOMEvent int64 `json:"first_oom_event"` // 0-based index of the first failed Alloc; -1 if none
	AllocRetries  int64 `json:"alloc_retries"`   // mallocs that released the cache and retried (allocator stats)

	PeakLive      uint64 `json:"peak_live_bytes"`      // peak trace demand (requested bytes, failed allocs included)
	PeakRequested uint64 `json:"peak_requested_bytes"` // peak requested bytes the allocator served
	PeakAllocated uint64 `json:"peak_allocated_bytes"` // peak allocated (rounded) bytes
	PeakReserved  uint64 `json:"peak_reserved_bytes"`  // peak mapped bytes
	// ReservedOverLive is PeakReserved / PeakLive (0 if nothing was live).
	ReservedOverLive float64 `json:"reserved_over_live"`

	// MinCapacity is the smallest capacity at which the trace replays
	// without an OOM (0 when not searched; see MinCapacity).
	MinCapacity uint64 `json:"min_capacity_bytes,omitempty"`
	// MinCapacityOverLive is MinCapacity / PeakLive.
	MinCapacityOverLive float64 `json:"min_capacity_over_live,omitempty"`

	EndLive          uint64 `json:"end_live_bytes"`           // trace bytes still live after the last event
	EndAllocated     uint64 `json:"end_allocated_bytes"`      // allocated bytes after the last event
	EndReserved      uint64 `json:"end_reserved_bytes"`       // mapped bytes after the last event
	LargestFreeBlock uint64 `json:"largest_free_block_bytes"` // largest free mapped block after the last event

	// Fragmentation over the samples (1 − allocated/reserved): the mean
	// over samples with memory mapped, and the maximum.
	MeanFragmentation float64 `json:"mean_fragmentation"`
	MaxFragmentation  float64 `json:"max_fragmentation"`

	DriverCalls      map[string]int64 `json:"driver_calls"`       // driver calls made during the replay, by primitive (nonzero only)
	DriverCallsTotal int64            `json:"driver_calls_total"` // their sum
	// SteadyDriverCalls counts the driver calls made after the Mark
	// Options.SteadyFromMark, and SteadySteps the steps from it on (the
	// Marks seen from it, less the last, which closes the run).
	SteadyDriverCalls int64         `json:"steady_driver_calls,omitempty"`
	SteadySteps       int64         `json:"steady_steps,omitempty"`
	SimDriverTime     time.Duration `json:"sim_driver_time_ns"` // simulated driver time (emulator cost model)
	// SimDriverTimes splits SimDriverTime by primitive (nonzero only), and
	// CostProfile names the cost model that charged it.
	SimDriverTimes map[string]time.Duration `json:"sim_driver_time_by_op_ns"`
	CostProfile    string                   `json:"cost_profile,omitempty"`
	Wall           time.Duration            `json:"wall_time_ns"`      // wall time of the event loop (reading included)
	EventsPerSec   float64                  `json:"events_per_second"` // Events / Wall

	// Pools has the figures of each memory pool the trace allocates in
	// (the default pool first, then the private ones by ID), when the
	// trace uses a pool other than the default one; nil otherwise.
	Pools []PoolReport `json:"pools,omitempty"`

	// Samples is the bounded time series (allocated, reserved, live).
	Samples []Sample `json:"samples,omitempty"`
	// Stats is the allocator's final statistics.
	Stats stats.DeviceStats `json:"-"`
}

// slot is the replay state of one trace id.
type slot struct {
	ptr  uintptr // 0: unseen; failedPtr; zeroPtr; else the live address
	size uint64  // requested nbytes (live or failed)
	pool uint32  // index of its pool in runner.pools.recs (0: the default pool)
}

const (
	failedPtr = ^uintptr(0)     // the Alloc ran out of memory
	zeroPtr   = ^uintptr(0) - 1 // a 0-byte Alloc (no memory)
)

// runner is one replay in progress. It is used by one goroutine.
type runner struct {
	opts     Options
	cfg      allocator.Config
	capacity uint64
	emu      *emulated.Emulator
	a        *allocator.Allocator

	dense     []slot                    // slots of ids < len(dense) (≤ denseIDs)
	sparse    map[uint64]slot           // slots of ids ≥ len(dense)
	streams   []backend.Stream          // trace stream < denseStreams → emulator stream; 0 = not yet created
	streamMap map[uint64]backend.Stream // larger trace streams
	lastTS    uint64                    // last trace stream looked up
	lastS     backend.Stream            // its emulator stream

	live, peakLive uint64 // trace bytes, nbytes

	pools *poolSet // the trace's pools (pools.go)

	maxSamples int
	stride     int64 // events between samples
	nextSample int64 // event count of the next sample
	samples    []Sample

	steady     bool                // the Mark Options.SteadyFromMark was seen
	steadyBase emulated.CallCounts // driver calls at that Mark

	rep *Report
}

func resolveConfig(c allocator.Config) allocator.Config {
	if c == (allocator.Config{}) {
		return allocator.DefaultConfig()
	}
	return c
}

func newRunner(opts Options) (*runner, error) {
	cfg := resolveConfig(opts.Config)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	capacity := opts.Capacity
	if capacity == 0 {
		capacity = DefaultCapacity
	}
	if capacity > MaxSearchCapacity {
		// The CLI's limit too: the allocator's address-space budget for a
		// larger device would not fit the emulator's address space.
		return nil, fmt.Errorf("%w: Capacity %d is above %d bytes", ErrInvalidOptions, capacity, MaxSearchCapacity)
	}
	if opts.MaxSamples > 0 && opts.MaxSamples < minMaxSamples {
		return nil, fmt.Errorf("%w: MaxSamples %d is below %d", ErrInvalidOptions, opts.MaxSamples, minMaxSamples)
	}
	eopts := []emulated.Option{emulated.WithCapacity(capacity), emulated.WithDevices(cfg.Device + 1)}
	if opts.CostModel != nil {
		eopts = append(eopts, emulated.WithCostModel(*opts.CostModel))
	}
	emu, err := emulated.New(eopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	a, err := allocator.New(emu, cfg)
	if err != nil {
		_ = emu.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if opts.Snapshot != nil {
		n := opts.SnapshotEntries
		if n == 0 {
			n = DefaultSnapshotEntries
		}
		if err := a.RecordHistory(allocator.HistoryOptions{MaxEntries: n}); err != nil {
			_ = a.Close()
			_ = emu.Close()
			return nil, fmt.Errorf("%w: SnapshotEntries: %w", ErrInvalidOptions, err)
		}
	}
	r := &runner{
		opts:     opts,
		cfg:      cfg,
		capacity: capacity,
		emu:      emu,
		a:        a,
		dense:    make([]slot, initialDense),
		streams:  make([]backend.Stream, 1, 8),
		pools:    newPoolSet(a),
		rep: &Report{
			Policy:        opts.Name,
			Config:        cfg.String(),
			Capacity:      capacity,
			FirstOOMEvent: -1,
		},
	}
	switch {
	case opts.MaxSamples < 0:
		r.maxSamples = 0
		r.nextSample = math.MaxInt64
	case opts.MaxSamples == 0:
		r.maxSamples = defaultMaxSamples
	default:
		r.maxSamples = opts.MaxSamples
	}
	if r.maxSamples > 0 {
		r.samples = make([]Sample, 1, r.maxSamples+1) // sample 0: before any event
		r.stride = defaultStride
		r.nextSample = r.stride
	}
	return r, nil
}

func (r *runner) close() {
	_ = r.a.Close()
	_ = r.emu.Close()
}

// get returns the slot of id.
func (r *runner) get(id uint64) slot {
	if id < uint64(len(r.dense)) {
		return r.dense[id]
	}
	if r.sparse == nil {
		return slot{}
	}
	return r.sparse[id]
}

// put sets the slot of id. Ids below len(dense) live in dense, all others
// in sparse. The slice doubles when an id lands within twice its length
// (so memory stays proportional to the ids in use, however large they
// are), taking over the map's entries below its new length.
func (r *runner) put(id uint64, s slot) {
	if id < uint64(len(r.dense)) {
		r.dense[id] = s
		return
	}
	if s.ptr != 0 && id < 2*uint64(len(r.dense)) && id < denseIDs {
		nd := make([]slot, min(2*uint64(len(r.dense)), denseIDs))
		copy(nd, r.dense)
		r.dense = nd
		for k, v := range r.sparse {
			if k < uint64(len(nd)) {
				nd[k] = v
				delete(r.sparse, k)
			}
		}
		r.dense[id] = s
		return
	}
	if s.ptr == 0 {
		delete(r.sparse, id)
		return
	}
	if r.sparse == nil {
		r.sparse = make(map[uint64]slot)
	}
	r.sparse[id] = s
}

// stream returns the emulator stream for trace stream ts, creating it the
// first time.
func (r *runner) stream(ts uint64) (backend.Stream, error) {
	if ts == r.lastTS {
		return r.lastS, nil
	}
	var s backend.Stream
	if ts < denseStreams {
		if ts < uint64(len(r.streams)) {
			s = r.streams[ts]
		}
	} else {
		s = r.streamMap[ts]
	}
	if s == 0 && ts != 0 {
		var err error
		if s, err = r.emu.StreamCreate(r.cfg.Device); err != nil {
			return 0, fmt.Errorf("replay: creating stream for trace stream %d: %w", ts, err)
		}
		r.rep.Streams++
		if ts < denseStreams {
			for uint64(len(r.streams)) <= ts {
				r.streams = append(r.streams, 0)
			}
			r.streams[ts] = s
		} else {
			if r.streamMap == nil {
				r.streamMap = make(map[uint64]backend.Stream)
			}
			r.streamMap[ts] = s
		}
	}
	r.lastTS, r.lastS = ts, s
	return s, nil
}

// isOOM reports whether a Malloc error of a size-byte request means the
// device is too small.
func (r *runner) isOOM(err error, size uint64) bool {
	return errors.Is(err, allocator.ErrOutOfMemory) ||
		(errors.Is(err, allocator.ErrInvalidSize) && size > r.capacity)
}

// sample records the state after n events.
func (r *runner) sample(n, timeNs int64) {
	if len(r.samples) > r.maxSamples-1 {
		// Keep samples 0, 2, 4, …: events 0, 2·stride, 4·stride, …
		j := 0
		for i := 0; i < len(r.samples); i += 2 {
			r.samples[j] = r.samples[i]
			j++
		}
		r.samples = r.samples[:j]
		r.stride *= 2
		if n%r.stride != 0 {
			r.nextSample = n - n%r.stride + r.stride
			return
		}
	}
	r.samples = append(r.samples, Sample{
		Event: n, TimeNs: timeNs, Live: r.live,
		Allocated: r.a.MemoryAllocated(), Reserved: r.a.MemoryReserved(),
	})
	r.nextSample = n + r.stride
}

// Run replays events on a fresh allocator over a fresh emulated device and
// reports what it measured. Read errors and allocator errors other than
// out-of-memory end the replay with an error (and no report); see the
// package documentation for how each event is applied.
func Run(events trace.EventReader, opts Options) (*Report, error) {
	return RunContext(context.Background(), events, opts)
}

// RunContext is Run that gives up when ctx is done: it checks ctx every
// ctxCheckEvery events and returns ctx's error (wrapped) with no report.
func RunContext(ctx context.Context, events trace.EventReader, opts Options) (*Report, error) {
	if events == nil {
		return nil, fmt.Errorf("%w: nil event reader", ErrInvalidOptions)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("replay: not started: %w", context.Cause(ctx))
	}
	r, err := newRunner(opts)
	if err != nil {
		return nil, err
	}
	defer r.close()
	return r.run(ctx, events)
}

func (r *runner) run(ctx context.Context, events trace.EventReader) (*Report, error) {
	rep := r.rep
	callsBefore := r.emu.CallCounts()
	simBefore := r.emu.SimulatedTime()
	simOpsBefore := r.emu.SimulatedTimes()
	nextProgress := int64(math.MaxInt64)
	if r.opts.Progress != nil {
		nextProgress = progressEvery
	}
	nextCheck := min(r.nextSample, nextProgress)
	var (
		n       int64 // events applied
		lastT   int64
		stopped bool
	)
	start := time.Now()
	for {
		e, err := events.Next()
		if err != nil {
			if err == io.EOF {
				break
			}
			return nil, fmt.Errorf("replay: reading event %d: %w", n, err)
		}
		if err := r.apply(e, n); err != nil {
			return nil, err
		}
		n++
		lastT = e.TimeNs
		if n%ctxCheckEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("replay: stopped after %d events: %w", n, context.Cause(ctx))
		}
		if rep.OOMs > 0 && r.opts.StopOnOOM {
			stopped = true
			break
		}
		if n >= nextCheck {
			if n >= r.nextSample {
				r.sample(n, e.TimeNs)
			}
			if n >= nextProgress {
				r.opts.Progress(n)
				nextProgress += progressEvery
			}
			nextCheck = min(r.nextSample, nextProgress)
		}
	}
	rep.Wall = time.Since(start)
	rep.Events = n
	rep.Complete = !stopped
	if r.opts.Progress != nil {
		r.opts.Progress(n)
	}
	if r.maxSamples > 0 && r.samples[len(r.samples)-1].Event != n {
		r.samples = append(r.samples, Sample{
			Event: n, TimeNs: lastT, Live: r.live,
			Allocated: r.a.MemoryAllocated(), Reserved: r.a.MemoryReserved(),
		})
	}
	if r.opts.Check {
		if err := r.a.Check(); err != nil {
			return nil, fmt.Errorf("replay: after %d events: %w", n, err)
		}
	}
	if r.opts.Snapshot != nil {
		if err := r.a.WriteSnapshot(r.opts.Snapshot); err != nil {
			return nil, fmt.Errorf("replay: writing the snapshot: %w", err)
		}
	}
	r.finish(callsBefore, simBefore, simOpsBefore)
	return rep, nil
}

// apply applies event e, the n-th (0-based).
func (r *runner) apply(e trace.Event, n int64) error {
	rep := r.rep
	switch e.Kind {
	case trace.Alloc:
		rep.Allocs++
		if s := r.get(e.ID); s.ptr != 0 {
			rep.DuplicateAllocs++
			r.pools.alloc(r.pools.index(e.Pool), 0)
			return nil
		}
		if e.Size == 0 {
			rep.ZeroAllocs++
			r.pools.alloc(r.pools.index(e.Pool), 0)
			r.put(e.ID, slot{ptr: zeroPtr})
			return nil
		}
		st, err := r.stream(e.Stream)
		if err != nil {
			return err
		}
		r.live += e.Size
		if r.live > r.peakLive {
			r.peakLive = r.live
		}
		pi := r.pools.index(e.Pool)
		r.pools.alloc(pi, e.Size)
		var ptr uintptr
		if pi == 0 {
			ptr, err = r.a.Malloc(e.Size, st)
		} else {
			ptr, err = r.pools.malloc(pi, e.Size, st)
		}
		if err != nil {
			if !r.isOOM(err, e.Size) {
				return fmt.Errorf("replay: event %d (%v): %w", n, e, err)
			}
			rep.OOMs++
			r.pools.recs[pi].rep.OOMs++
			if rep.FirstOOMEvent < 0 {
				rep.FirstOOMEvent = n
			}
			ptr = failedPtr
		} else {
			r.pools.recs[pi].liveAllocs++
		}
		r.put(e.ID, slot{ptr: ptr, size: e.Size, pool: pi})
	case trace.Free:
		rep.Frees++
		s := r.get(e.ID)
		switch s.ptr {
		case 0:
			rep.SkippedFrees++
			return nil
		case failedPtr:
			rep.FailedFrees++
		case zeroPtr:
		default:
			if err := r.a.Free(s.ptr); err != nil {
				return fmt.Errorf("replay: event %d (%v): %w", n, e, err)
			}
			r.pools.recs[s.pool].liveAllocs--
		}
		r.live -= s.size
		r.pools.recs[s.pool].live -= s.size
		r.put(e.ID, slot{})
	case trace.RecordStream:
		rep.RecordStreams++
		s := r.get(e.ID)
		if s.ptr == 0 || s.ptr == failedPtr || s.ptr == zeroPtr {
			rep.SkippedRecords++
			return nil
		}
		st, err := r.stream(e.Stream)
		if err != nil {
			return err
		}
		if err := r.a.RecordStream(s.ptr, st); err != nil {
			return fmt.Errorf("replay: event %d (%v): %w", n, e, err)
		}
	case trace.StreamSync:
		rep.StreamSyncs++
		st, err := r.stream(e.Stream)
		if err != nil {
			return err
		}
		if err := r.a.Synchronize(st); err != nil {
			return fmt.Errorf("replay: event %d (%v): %w", n, e, err)
		}
	case trace.EmptyCache:
		rep.EmptyCaches++
		if r.opts.IgnoreReleases {
			rep.ReleasesIgnored++
			return nil
		}
		rep.ReleasesApplied++
		// With private pools, empty_cache is PyTorch's: it releases the
		// default pool's cache and leaves the pools' (a captured graph
		// replays into its pool's memory without allocating).
		var err error
		if r.pools.opened {
			err = r.a.DefaultPool().EmptyCache()
		} else {
			err = r.a.EmptyCache()
		}
		if err != nil {
			return fmt.Errorf("replay: event %d (%v): %w", n, e, err)
		}
	case trace.Mark:
		rep.Marks++
		if r.opts.SteadyFromMark != 0 && e.ID == r.opts.SteadyFromMark && !r.steady {
			r.steady, r.steadyBase = true, r.emu.CallCounts()
		}
		if r.steady {
			rep.SteadySteps++
		}
	default:
		return fmt.Errorf("%w: event %d has kind %v", ErrInvalidEvent, n, e.Kind)
	}
	return nil
}

// finish fills in the figures read once at the end.
func (r *runner) finish(callsBefore emulated.CallCounts, simBefore time.Duration, simOpsBefore emulated.OpTimes) {
	rep := r.rep
	st := r.a.Stats()
	rep.Stats = st
	rep.AllocRetries = st.NumAllocRetries
	rep.PeakLive = r.peakLive
	rep.EndLive = r.live
	rep.PeakRequested = uint64(st.RequestedBytes[stats.AllPools].Peak)
	rep.PeakAllocated = uint64(st.AllocatedBytes[stats.AllPools].Peak)
	rep.PeakReserved = uint64(st.ReservedBytes[stats.AllPools].Peak)
	rep.EndAllocated = uint64(st.AllocatedBytes[stats.AllPools].Current)
	rep.EndReserved = uint64(st.ReservedBytes[stats.AllPools].Current)
	rep.ReservedOverLive = ratio(rep.PeakReserved, rep.PeakLive)
	rep.Pools = r.pools.reports()
	for _, sg := range r.a.Snapshot().Segments {
		for _, b := range sg.Blocks {
			if b.State == stats.BlockInactive && b.Size > rep.LargestFreeBlock {
				rep.LargestFreeBlock = b.Size
			}
		}
	}
	calls := r.emu.CallCounts()
	rep.DriverCalls = make(map[string]int64)
	for op := range calls {
		if d := calls[op] - callsBefore[op]; d != 0 {
			rep.DriverCalls[backend.Op(op).String()] = d
			rep.DriverCallsTotal += d
		}
	}
	if r.steady {
		rep.SteadySteps--
		for op := range calls {
			rep.SteadyDriverCalls += calls[op] - r.steadyBase[op]
		}
	}
	rep.SimDriverTime = r.emu.SimulatedTime() - simBefore
	rep.SimDriverTimes = make(map[string]time.Duration)
	for op, t := range r.emu.SimulatedTimes() {
		if d := t - simOpsBefore[op]; d != 0 {
			rep.SimDriverTimes[backend.Op(op).String()] = d
		}
	}
	rep.CostProfile = r.opts.CostProfile
	if rep.CostProfile == "" && r.opts.CostModel == nil {
		rep.CostProfile = emulated.DefaultCostProfile
	}
	if s := rep.Wall.Seconds(); s > 0 {
		rep.EventsPerSec = float64(rep.Events) / s
	}
	var sum float64
	var cnt int
	for _, s := range r.samples {
		if s.Reserved == 0 {
			continue
		}
		f := s.Fragmentation()
		sum += f
		cnt++
		rep.MaxFragmentation = max(rep.MaxFragmentation, f)
	}
	if cnt > 0 {
		rep.MeanFragmentation = sum / float64(cnt)
	}
	if r.maxSamples > 0 {
		rep.Samples = r.samples
	}
}

// ratio is num/den, or 0 when den is 0.
func ratio(num, den uint64) float64 {
	if den == 0 {
		return 0
	}
	return float64(num) / float64(den)
}
