package trace

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Kind is the type of an Event.
type Kind uint8

// Event kinds. The zero Kind is invalid, so a zero Event is rejected by the
// writers instead of being recorded silently.
const (
	// Alloc requests Size bytes on Stream; ID names the allocation from now
	// until its Free.
	Alloc Kind = iota + 1
	// Free releases allocation ID.
	Free
	// RecordStream marks allocation ID as in use by Stream (as
	// torch.Tensor.record_stream does): an allocator must not reuse its
	// memory until work queued on Stream before the free has completed.
	RecordStream
	// StreamSync reports that all work queued on Stream has completed.
	StreamSync
	// EmptyCache asks the allocator to release its unused cached memory.
	EmptyCache
	// Mark is a numbered boundary (ID is the number, e.g. a training step)
	// that replay tools can use to report per-phase statistics. It does not
	// touch memory.
	Mark

	numKinds = Mark + 1 // one past the last valid Kind
)

var kindNames = [...]string{
	Alloc:        "alloc",
	Free:         "free",
	RecordStream: "record",
	StreamSync:   "sync",
	EmptyCache:   "empty_cache",
	Mark:         "mark",
}

// String returns the kind's text-format keyword ("alloc", "free", "record",
// "sync", "empty_cache", "mark"), or "kind(N)" for an invalid kind.
func (k Kind) String() string {
	if k.Valid() {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Valid reports whether k is one of the defined kinds.
func (k Kind) Valid() bool { return k >= Alloc && k < numKinds }

// ParseKind returns the Kind whose String is s.
func ParseKind(s string) (Kind, bool) {
	for k := Alloc; k < numKinds; k++ {
		if kindNames[k] == s {
			return k, true
		}
	}
	return 0, false
}

// PoolID names the memory pool an allocation is made in, as PyTorch's
// MempoolId_t does: (0, 0) is the default pool (the allocator's own
// cache); CUDA-graph pools are (n, 0) and torch.cuda.MemPool pools (0, n).
// A PyTorch snapshot writes it as segment_pool_id on segments and pool_id
// on trace entries.
type PoolID [2]uint64

// IsDefault reports whether p is the default pool (0, 0).
func (p PoolID) IsDefault() bool { return p == PoolID{} }

// String names the pool as vmmalloc's allocator names it: "default" for
// (0, 0), else "pool(a,b)".
func (p PoolID) String() string {
	if p.IsDefault() {
		return "default"
	}
	return "pool(" + strconv.FormatUint(p[0], 10) + "," + strconv.FormatUint(p[1], 10) + ")"
}

// Event is one step of an allocation trace. Which fields are meaningful
// depends on Kind:
//
//	Alloc         ID, Size, Stream, Pool, TimeNs
//	Free          ID, TimeNs (Stream optional: the stream the free was issued on)
//	RecordStream  ID, Stream, TimeNs
//	StreamSync    Stream, TimeNs
//	EmptyCache    TimeNs
//	Mark          ID (the mark's number), TimeNs
//
// The encoders store every field of every event, so an Event read back is
// always equal to the Event written, whatever its kind.
type Event struct {
	Kind   Kind
	ID     uint64 // allocation id; an Alloc introduces it, Free/RecordStream refer to it
	Size   uint64 // requested nbytes (Alloc only)
	Stream uint64 // stream index; 0 is the default stream
	TimeNs int64  // timestamp in nanoseconds, relative to the trace's start
	// Pool is the memory pool an Alloc is made in; the zero PoolID is the
	// default pool (and what traces without pools, such as format
	// version 1 files, read as).
	Pool PoolID
}

// String formats e as one line of the text format (without newline).
func (e Event) String() string { return string(appendText(nil, e)) }

// Info is optional metadata stored in a trace's header. Empty fields are
// not stored. Values must not contain line breaks (the text format keeps
// one per line, and trims surrounding white space when reading).
type Info struct {
	Name   string // short name of the workload ("gpt2-train-ctx128")
	Source string // where the trace came from ("pytorch snapshot foo.pickle", "workload.TransformerTraining seed=1")
	Device string // device the trace was recorded on ("cuda:0", "NVIDIA H200")
}

// maxInfoValue bounds the length of one Info value in bytes.
const maxInfoValue = 4096

func (in Info) fields() [3]struct{ key, val string } {
	return [3]struct{ key, val string }{{"name", in.Name}, {"source", in.Source}, {"device", in.Device}}
}

func (in *Info) set(key, val string) {
	switch key {
	case "name":
		in.Name = val
	case "source":
		in.Source = val
	case "device":
		in.Device = val
	}
}

// isInfoKey reports whether key names an Info field.
func isInfoKey(key string) bool { return key == "name" || key == "source" || key == "device" }

// checkInfoValue says why val cannot be stored as an Info value, the rule
// every writer and reader applies: at most maxInfoValue bytes, no line
// break.
func checkInfoValue(key, val string) error {
	if len(val) > maxInfoValue {
		return fmt.Errorf("%s is %d bytes (limit %d)", key, len(val), maxInfoValue)
	}
	if strings.ContainsAny(val, "\r\n") {
		return fmt.Errorf("%s contains a line break", key)
	}
	return nil
}

func (in Info) validate() error {
	for _, f := range in.fields() {
		if err := checkInfoValue(f.key, f.val); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidInfo, err)
		}
	}
	return nil
}

// maxQuoted is how much of an input field an error message quotes.
const maxQuoted = 64

// clip returns b for quoting in an error message: whole when short, else
// its first maxQuoted bytes and its length, so that a hostile field of a
// megabyte does not become a megabyte of message.
func clip[T ~string | ~[]byte](b T) string {
	if len(b) <= maxQuoted {
		return string(b)
	}
	return string(b[:maxQuoted]) + "... (" + strconv.Itoa(len(b)) + " bytes)"
}

// Sentinel errors, matched with errors.Is.
var (
	// ErrCorrupt reports binary or text input that is not a well-formed
	// trace: bad magic, truncation, a malformed field, a checksum mismatch.
	ErrCorrupt = errors.New("trace: corrupt input")
	// ErrVersion reports a trace written in a format version this package
	// does not read.
	ErrVersion = errors.New("trace: unsupported format version")
	// ErrFormat reports input that Open recognises as neither the binary
	// nor the text format.
	ErrFormat = errors.New("trace: unrecognised format")
	// ErrInvalidEvent reports an event a writer cannot store (invalid Kind).
	ErrInvalidEvent = errors.New("trace: invalid event")
	// ErrInvalidInfo reports Info a writer cannot store.
	ErrInvalidInfo = errors.New("trace: invalid info")
	// ErrClosed reports use of a writer after Close.
	ErrClosed = errors.New("trace: writer closed")
	// ErrStarted reports SetInfo after the header has been written.
	ErrStarted = errors.New("trace: header already written")
	// ErrInvalidTrace reports a trace whose events are inconsistent: a Free
	// or RecordStream of an id that is not live, an Alloc of an id that
	// is. The error is a *ValidationError.
	ErrInvalidTrace = errors.New("trace: inconsistent trace")
	// ErrSnapshot reports a PyTorch snapshot that does not have the
	// expected structure.
	ErrSnapshot = errors.New("trace: malformed PyTorch snapshot")
	// ErrRMMLog reports an RMM log that cannot be parsed.
	ErrRMMLog = errors.New("trace: malformed RMM log")
)

// EventReader is a stream of events. Next returns io.EOF after the last
// event; any other error is final and is returned again by later calls.
type EventReader interface {
	Next() (Event, error)
}

// EventWriter is a sink for events. Close completes the output (it does not
// close an underlying io.Writer).
type EventWriter interface {
	Write(Event) error
	Close() error
}

// InfoReader is implemented by readers that know their trace's Info
// (*Reader and *TextReader).
type InfoReader interface {
	Info() Info
}

// SliceReader is an EventReader over an in-memory slice.
type SliceReader struct {
	events []Event // remaining events
}

// NewSliceReader returns a reader that yields events in order. The slice is
// not copied.
func NewSliceReader(events []Event) *SliceReader { return &SliceReader{events: events} }

// Next implements EventReader.
func (s *SliceReader) Next() (Event, error) {
	if len(s.events) == 0 {
		return Event{}, io.EOF
	}
	e := s.events[0]
	s.events = s.events[1:]
	return e, nil
}

// ReadAll drains r into a slice. On error it returns the events read so
// far with the error.
func ReadAll(r EventReader) ([]Event, error) {
	var out []Event
	for {
		e, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
}

// WriteAll writes every event to w and then closes w.
func WriteAll(w EventWriter, events []Event) error {
	for _, e := range events {
		if err := w.Write(e); err != nil {
			return err
		}
	}
	return w.Close()
}
