// Package devprof writes device-memory profiles of vmmalloc allocators in
// pprof format, so that `go tool pprof` answers "which code holds device
// memory" the way it does for the Go heap.
//
// A profile has the four sample types of Go's heap profile, in its order:
// alloc_objects/count, alloc_space/bytes, inuse_objects/count and
// inuse_space/bytes (the default). Each sample is one call site: the Go
// call stack of the Malloc caller, on one stream of one device, in one
// pool, with the string labels device, stream and pool, so that
//
//	go tool pprof -sample_index=inuse_space -tagfocus pool=large_pool devmem.pb.gz
//
// works as it does for heap profiles. Bytes are block bytes (the rounded
// sizes allocated_bytes counts), so a profile's inuse_space adds up to the
// allocator's MemoryAllocated. There is no sampling: Period is 1.
//
// Stacks and the alloc_* counts come from the allocator's memory history
// (allocator.RecordHistory with Stacks), and count from when recording
// began; blocks allocated before it, or by an allocator recording without
// stacks, appear under one "(stack not recorded)" frame. An allocator that
// is not recording contributes its live blocks as in use and allocated,
// without stacks.
package devprof

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/google/pprof/profile"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/stats"
)

// NoStack is the function name of the frame standing for a call stack
// that was not recorded.
const NoStack = "(stack not recorded)"

// Profile builds the device-memory profile of the given allocators (one
// per device, typically). A nil allocator is skipped.
func Profile(allocs ...*allocator.Allocator) *profile.Profile {
	b := newBuilder()
	for _, a := range allocs {
		if a == nil {
			continue
		}
		dev := strconv.Itoa(a.Device())
		ds := a.DefaultStream()
		recs, ok := a.MemProfile()
		if !ok {
			recs = liveRecords(a)
		}
		for _, r := range recs {
			stream := r.Stream
			if stream == ds {
				stream = 0 // the default stream, as PyTorch numbers it
			}
			b.add(r, map[string][]string{
				"device": {dev},
				"stream": {strconv.FormatUint(uint64(stream), 10)},
				"pool":   {r.Pool.String()},
			})
		}
	}
	return b.p
}

// Write writes the profile of allocs to w, gzip-compressed protobuf as
// `go tool pprof` reads it.
func Write(w io.Writer, allocs ...*allocator.Allocator) error {
	if err := Profile(allocs...).Write(w); err != nil {
		return fmt.Errorf("devprof: write: %w", err)
	}
	return nil
}

// Handler serves the profile of allocs, to be mounted next to
// net/http/pprof:
//
//	http.Handle("/debug/pprof/devmem", devprof.Handler(a))
//
// and read with `go tool pprof http://host/debug/pprof/devmem`. It answers
// GET and HEAD only.
func Handler(allocs ...*allocator.Allocator) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="devmem.pb.gz"`)
		if r.Method == http.MethodHead {
			return
		}
		if err := Write(w, allocs...); err != nil {
			// Headers are out; the client sees a truncated profile.
			return
		}
	})
}

// liveRecords counts the allocated blocks of an allocator that is not
// recording, as allocated and in use, by stream and pool.
func liveRecords(a *allocator.Allocator) []allocator.MemProfileRecord {
	type key struct {
		stream uint64
		pool   stats.PoolKind
	}
	idx := map[key]int{}
	var out []allocator.MemProfileRecord
	for _, sg := range a.Snapshot().Segments {
		for _, b := range sg.Blocks {
			if b.State != stats.BlockActiveAllocated {
				continue
			}
			k := key{b.Stream, sg.Pool}
			i, ok := idx[k]
			if !ok {
				i = len(out)
				idx[k] = i
				out = append(out, allocator.MemProfileRecord{Stream: backend.Stream(b.Stream), Pool: sg.Pool})
			}
			out[i].AllocObjects++
			out[i].AllocBytes += int64(b.Size)
		}
	}
	return out
}

// executable is the program's path, or its name.
func executable() string {
	if exe, err := os.Executable(); err == nil {
		return exe
	}
	return os.Args[0]
}

// builder accumulates samples, interning locations and functions.
type builder struct {
	p      *profile.Profile
	locs   map[uintptr]*profile.Location
	funcs  map[string]*profile.Function
	noLoc  *profile.Location
	frames []uintptr // scratch
}

func newBuilder() *builder {
	return &builder{
		p: &profile.Profile{
			SampleType: []*profile.ValueType{
				{Type: "alloc_objects", Unit: "count"},
				{Type: "alloc_space", Unit: "bytes"},
				{Type: "inuse_objects", Unit: "count"},
				{Type: "inuse_space", Unit: "bytes"},
			},
			DefaultSampleType: "inuse_space",
			PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
			Period:            1,
			TimeNanos:         time.Now().UnixNano(),
			// One mapping for the whole program, symbolized already, as
			// pprof wants a main binary to name.
			Mapping: []*profile.Mapping{{
				ID: 1, Limit: math.MaxUint64, File: executable(),
				HasFunctions: true, HasFilenames: true, HasLineNumbers: true,
			}},
		},
		locs:  map[uintptr]*profile.Location{},
		funcs: map[string]*profile.Function{},
	}
}

func (b *builder) add(r allocator.MemProfileRecord, labels map[string][]string) {
	s := &profile.Sample{
		Value: []int64{r.AllocObjects, r.AllocBytes, r.InUseObjects(), r.InUseBytes()},
		Label: labels,
	}
	if len(r.Stack) == 0 {
		s.Location = []*profile.Location{b.noStack()}
	}
	for _, pc := range r.Stack {
		s.Location = append(s.Location, b.location(pc))
	}
	b.p.Sample = append(b.p.Sample, s)
}

func (b *builder) function(name, file string) *profile.Function {
	if f, ok := b.funcs[name]; ok {
		return f
	}
	f := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: name, Filename: file}
	b.p.Function = append(b.p.Function, f)
	b.funcs[name] = f
	return f
}

func (b *builder) newLocation(addr uint64, lines []profile.Line) *profile.Location {
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: b.p.Mapping[0], Address: addr, Line: lines}
	b.p.Location = append(b.p.Location, l)
	return l
}

func (b *builder) noStack() *profile.Location {
	if b.noLoc == nil {
		b.noLoc = b.newLocation(0, []profile.Line{{Function: b.function(NoStack, "")}})
	}
	return b.noLoc
}

// location resolves return address pc into its frames, innermost first
// (several when calls were inlined into the function at pc).
func (b *builder) location(pc uintptr) *profile.Location {
	if l, ok := b.locs[pc]; ok {
		return l
	}
	b.frames = append(b.frames[:0], pc)
	frames := runtime.CallersFrames(b.frames)
	var lines []profile.Line
	for {
		f, more := frames.Next()
		name := f.Function
		if name == "" {
			name = fmt.Sprintf("%#x", pc)
		}
		lines = append(lines, profile.Line{Function: b.function(name, f.File), Line: int64(f.Line)})
		if !more {
			break
		}
	}
	l := b.newLocation(uint64(pc), lines)
	b.locs[pc] = l
	return l
}
