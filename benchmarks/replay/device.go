package replay

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/stats"
)

// DeviceOptions configures RunOnDriver.
type DeviceOptions struct {
	// Config is the allocator policy; the zero Config means
	// allocator.DefaultConfig(). Config.Device selects the device.
	Config allocator.Config
	// Scale multiplies every request size. 0 scales the trace so that its
	// peak live bytes are at most Fit × the device's free memory (and never
	// scales up).
	Scale float64
	// Fit is the share of free memory the scaled peak may take (default 0.5:
	// room for rounding and fragmentation).
	Fit float64
}

// DeviceReport is what RunOnDriver measured. Byte counts are in bytes.
type DeviceReport struct {
	Backend       string        `json:"backend"`
	Config        string        `json:"config"`
	Scale         float64       `json:"scale"`          // size multiplier applied
	DeviceFree    uint64        `json:"device_free"`    // free memory before the replay
	DeviceTotal   uint64        `json:"device_total"`   // device memory
	Events        int64         `json:"events"`         // events applied
	Allocs        int64         `json:"allocs"`         // successful Mallocs
	Frees         int64         `json:"frees"`          // Frees
	OOMs          int64         `json:"ooms"`           // Mallocs that ran out of memory
	PeakLive      uint64        `json:"peak_live"`      // peak of the scaled sizes live
	PeakAllocated uint64        `json:"peak_allocated"` // allocator's peak allocated bytes
	PeakReserved  uint64        `json:"peak_reserved"`  // allocator's peak mapped bytes
	Elapsed       time.Duration `json:"elapsed_ns"`     // wall time of the replay
	// Pools has each pool's figures (scaled sizes) when the trace uses a
	// private pool, as Report.Pools; nil otherwise.
	Pools []PoolReport `json:"pools,omitempty"`
}

// String is a one-line summary.
func (r *DeviceReport) String() string {
	ratio := 0.0
	if r.PeakLive > 0 {
		ratio = float64(r.PeakReserved) / float64(r.PeakLive)
	}
	return fmt.Sprintf("%s: %d events in %v, scale %.4g: peak live %s, peak allocated %s, peak reserved %s (%.3f× live), %d OOMs",
		r.Backend, r.Events, r.Elapsed.Round(time.Millisecond), r.Scale, FormatBytes(r.PeakLive),
		FormatBytes(r.PeakAllocated), FormatBytes(r.PeakReserved), ratio, r.OOMs)
}

// peakLive is the peak of bytes allocated and not yet freed over events.
func peakLive(events []trace.Event) uint64 {
	live := map[uint64]uint64{}
	var cur, peak uint64
	for _, e := range events {
		switch e.Kind {
		case trace.Alloc:
			if _, dup := live[e.ID]; dup {
				continue
			}
			live[e.ID] = e.Size
			cur += e.Size
			peak = max(peak, cur)
		case trace.Free:
			cur -= live[e.ID]
			delete(live, e.ID)
		}
	}
	return peak
}

// RunOnDriver replays events through an allocator over drv, a real device
// or any backend.Driver, unlike Run, which builds its own emulator. Sizes
// are scaled to fit the device (see DeviceOptions.Scale). Trace streams
// other than 0 become streams of drv. Everything still live at the end is
// freed, and the allocator is closed, so drv is left as it was found.
func RunOnDriver(drv backend.Driver, events []trace.Event, o DeviceOptions) (rep *DeviceReport, err error) {
	cfg := o.Config
	if cfg == (allocator.Config{}) {
		cfg = allocator.DefaultConfig()
	}
	fit := o.Fit
	if fit == 0 {
		fit = 0.5
	}
	if !(fit > 0 && fit <= 1) || o.Scale < 0 || math.IsNaN(o.Scale) {
		return nil, fmt.Errorf("replay: bad DeviceOptions: Fit %v, Scale %v", o.Fit, o.Scale)
	}
	free, total, err := drv.MemGetInfo(cfg.Device)
	if err != nil {
		return nil, err
	}
	scale := o.Scale
	if scale == 0 {
		scale = 1
		if p := peakLive(events); p > 0 && float64(p) > fit*float64(free) {
			scale = fit * float64(free) / float64(p)
		}
	}
	a, err := allocator.New(drv, cfg)
	if err != nil {
		return nil, err
	}
	streams := map[uint64]backend.Stream{0: a.DefaultStream()}
	defer func() {
		if cerr := a.Close(); err == nil && cerr != nil {
			err = cerr
		}
		for id, s := range streams {
			if id != 0 {
				if serr := drv.StreamDestroy(s); err == nil && serr != nil {
					err = serr
				}
			}
		}
	}()
	rep = &DeviceReport{Backend: drv.Name(), Config: cfg.String(), Scale: scale, DeviceFree: free, DeviceTotal: total}
	type alloc struct {
		ptr  uintptr
		size uint64
		pool uint32 // index in pools.recs
	}
	pools := newPoolSet(a)
	live := map[uint64]alloc{}
	var cur uint64
	stream := func(id uint64) (backend.Stream, error) {
		if s, ok := streams[id]; ok {
			return s, nil
		}
		s, err := drv.StreamCreate(cfg.Device)
		if err != nil {
			return 0, err
		}
		streams[id] = s
		return s, nil
	}
	start := time.Now()
	for _, e := range events {
		rep.Events++
		switch e.Kind {
		case trace.Alloc:
			if _, dup := live[e.ID]; dup || e.Size == 0 {
				continue
			}
			s, err := stream(e.Stream)
			if err != nil {
				return rep, err
			}
			n := max(1, uint64(float64(e.Size)*scale))
			pi := pools.index(e.Pool)
			pools.alloc(pi, n)
			var p uintptr
			var merr error
			if pi == 0 {
				p, merr = a.Malloc(n, s)
			} else {
				p, merr = pools.malloc(pi, n, s)
			}
			var oom *allocator.OutOfMemoryError
			if errors.As(merr, &oom) {
				rep.OOMs++
				pools.recs[pi].rep.OOMs++
				pools.recs[pi].live -= n
				continue
			}
			if merr != nil {
				return rep, fmt.Errorf("replay: event %d: Malloc(%d): %w", rep.Events-1, n, merr)
			}
			pools.recs[pi].liveAllocs++
			live[e.ID] = alloc{p, n, pi}
			rep.Allocs++
			cur += n
			rep.PeakLive = max(rep.PeakLive, cur)
		case trace.Free:
			b, ok := live[e.ID]
			if !ok {
				continue
			}
			if err := a.Free(b.ptr); err != nil {
				return rep, fmt.Errorf("replay: event %d: Free: %w", rep.Events-1, err)
			}
			delete(live, e.ID)
			cur -= b.size
			pools.recs[b.pool].live -= b.size
			pools.recs[b.pool].liveAllocs--
			rep.Frees++
		case trace.RecordStream:
			b, ok := live[e.ID]
			if !ok {
				continue
			}
			s, err := stream(e.Stream)
			if err != nil {
				return rep, err
			}
			if err := a.RecordStream(b.ptr, s); err != nil {
				return rep, fmt.Errorf("replay: event %d: RecordStream: %w", rep.Events-1, err)
			}
		case trace.StreamSync:
			if s, ok := streams[e.Stream]; ok {
				if err := a.Synchronize(s); err != nil {
					return rep, err
				}
			}
		case trace.EmptyCache:
			// As Run: PyTorch's empty_cache leaves live private pools alone.
			release := a.EmptyCache
			if pools.opened {
				release = a.DefaultPool().EmptyCache
			}
			if err := release(); err != nil {
				return rep, err
			}
		}
	}
	rep.Elapsed = time.Since(start)
	st := a.Stats()
	rep.PeakAllocated = uint64(st.AllocatedBytes[stats.AllPools].Peak)
	rep.PeakReserved = uint64(st.ReservedBytes[stats.AllPools].Peak)
	rep.Pools = pools.reports()
	for _, b := range live {
		if err := a.Free(b.ptr); err != nil {
			return rep, err
		}
	}
	return rep, nil
}
