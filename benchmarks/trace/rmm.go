package trace

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// RMMTrace is a RAPIDS RMM memory-event log converted to events.
type RMMTrace struct {
	Events []Event // Alloc and Free events, in log order
	Info   Info    // Source filled in

	Rows            int // data rows (header excluded)
	Allocs          int // "allocate" rows that became Alloc events
	Frees           int // "free"/"deallocate" rows that became Free events
	Failures        int // "allocate failure" rows (counted, not replayed)
	UnmatchedFrees  int // frees of a pointer with no live allocation (skipped)
	DuplicateAllocs int // allocations of a pointer already live (the older one was freed first)
	NullPointers    int // allocate/free rows with a null pointer (zero-byte requests; skipped)

	PeakLive       uint64 // peak allocated-and-not-freed bytes
	LiveAllocsEnd  int    // allocations still live after the last row
	LiveBytesEnd   uint64 // their bytes
	TotalAllocated uint64 // sum of allocation sizes (saturates at MaxUint64)

	Streams []uint64 // Streams[i] is RMM's stream handle for Event.Stream i; Streams[0] == 0
}

// Reader returns an EventReader over t.Events.
func (t *RMMTrace) Reader() EventReader { return NewSliceReader(t.Events) }

// ImportRMMLog parses the CSV written by RMM's logging_resource_adaptor:
//
//	Thread,Time,Action,Pointer,Size,Stream
//	140573312345856,08:23:52.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020
//	140573312345856,08:23:52.123470,free,0x7f8a40000000,1024,0x7f8a38001020
//
// Columns are found by header name (Action, Pointer and Size are required;
// Time and Stream are optional; others are ignored). Actions: "allocate"
// becomes an Alloc (a fresh id, keyed by pointer); "free" (also
// "deallocate") a Free of the live allocation at that pointer, skipped and
// counted when there is none; "allocate failure" is counted in Failures and
// not replayed. Time is either a time of day "HH:MM:SS.ffffff" (RMM's
// format; a backwards jump of more than 12 h is taken as midnight passing)
// or seconds as a decimal number; Event.TimeNs is relative to the first
// row. Pointers and streams are hexadecimal with 0x, or decimal; "(nil)"
// and "nil" are null. Any other malformed row yields ErrRMMLog with its
// line number.
func ImportRMMLog(r io.Reader) (*RMMTrace, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true

	header, err := cr.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%w: empty input", ErrRMMLog)
	}
	if err != nil {
		return nil, csvErr(err)
	}
	col := map[string]int{"time": -1, "action": -1, "pointer": -1, "size": -1, "stream": -1}
	for i, h := range header {
		h = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))
		if j, ok := col[h]; ok && j < 0 {
			col[h] = i
		}
	}
	for _, need := range []string{"action", "pointer", "size"} {
		if col[need] < 0 {
			return nil, fmt.Errorf("%w: header %q lacks column %q", ErrRMMLog, clip(strings.Join(header, ",")), need)
		}
	}

	t := &RMMTrace{Info: Info{Source: "rmm logging_resource_adaptor"}, Streams: []uint64{0}}
	live := make(map[uint64]liveAlloc)
	streamIdx := map[uint64]uint64{0: 0}
	var nextID uint64 = 1
	var liveBytes uint64
	var start, prevRaw, dayOffset, timeNs int64
	haveStart := false

	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, csvErr(err)
		}
		line, _ := cr.FieldPos(0)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: line %d: %s", ErrRMMLog, line, fmt.Sprintf(format, args...))
		}
		field := func(name string) string {
			if i := col[name]; i >= 0 && i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue // blank line
		}
		t.Rows++

		if ts := field("time"); ts != "" {
			raw, clock, err := parseRMMTime(ts)
			if err != nil {
				return nil, bad("%v", err)
			}
			if clock && haveStart && raw+dayOffset < prevRaw-12*3600e9 {
				dayOffset += 24 * 3600e9 // passed midnight
			}
			raw += dayOffset
			if !haveStart {
				start, haveStart = raw, true
			}
			prevRaw = raw
			timeNs = raw - start
		}

		action := strings.ToLower(field("action"))
		if action == "allocate failure" {
			t.Failures++
			continue
		}
		if action != "allocate" && action != "free" && action != "deallocate" {
			return nil, bad("unknown action %q", clip(field("action")))
		}
		ptr, err := parseRMMHandle(field("pointer"))
		if err != nil {
			return nil, bad("pointer: %v", err)
		}
		size, err := strconv.ParseUint(field("size"), 10, 64)
		if err != nil {
			return nil, bad("size %q: not a non-negative integer", clip(field("size")))
		}
		var s uint64
		if raw := field("stream"); raw != "" {
			h, err := parseRMMHandle(raw)
			if err != nil {
				return nil, bad("stream: %v", err)
			}
			idx, seen := streamIdx[h]
			if !seen {
				idx = uint64(len(t.Streams))
				streamIdx[h] = idx
				t.Streams = append(t.Streams, h)
			}
			s = idx
		}
		if ptr == 0 {
			t.NullPointers++
			continue
		}
		if action == "allocate" {
			if old, dup := live[ptr]; dup {
				t.DuplicateAllocs++
				t.Events = append(t.Events, Event{Kind: Free, ID: old.id, Stream: s, TimeNs: timeNs})
				liveBytes -= old.size
			}
			if liveBytes+size < liveBytes {
				return nil, bad("live bytes overflow 64 bits")
			}
			id := nextID
			nextID++
			live[ptr] = liveAlloc{id: id, size: size}
			t.Events = append(t.Events, Event{Kind: Alloc, ID: id, Size: size, Stream: s, TimeNs: timeNs})
			t.Allocs++
			if t.TotalAllocated+size < t.TotalAllocated {
				t.TotalAllocated = 1<<64 - 1
			} else {
				t.TotalAllocated += size
			}
			liveBytes += size
			t.PeakLive = max(t.PeakLive, liveBytes)
			continue
		}
		a, ok := live[ptr]
		if !ok {
			t.UnmatchedFrees++
			continue
		}
		delete(live, ptr)
		t.Events = append(t.Events, Event{Kind: Free, ID: a.id, Stream: s, TimeNs: timeNs})
		t.Frees++
		liveBytes -= a.size
	}
	t.LiveAllocsEnd = len(live)
	t.LiveBytesEnd = liveBytes
	return t, nil
}

func csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%w: line %d: %v", ErrRMMLog, pe.Line, pe.Err)
	}
	return fmt.Errorf("trace: reading RMM log: %w", err)
}

// parseRMMHandle parses a pointer or stream handle: 0x-prefixed hex,
// decimal, or a null spelling.
func parseRMMHandle(s string) (uint64, error) {
	switch strings.ToLower(s) {
	case "", "(nil)", "nil", "nullptr", "null":
		return 0, nil
	}
	if h, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("bad hexadecimal %q", clip(s))
		}
		return v, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad value %q", clip(s))
	}
	return v, nil
}

// parseRMMTime returns nanoseconds and whether s was a time of day
// (HH:MM:SS[.frac]) rather than decimal seconds.
func parseRMMTime(s string) (ns int64, clock bool, err error) {
	if strings.Contains(s, ":") {
		parts := strings.Split(s, ":")
		if len(parts) != 3 {
			return 0, false, fmt.Errorf("bad time %q (want HH:MM:SS.ffffff)", clip(s))
		}
		h, err1 := strconv.ParseUint(parts[0], 10, 8)
		m, err2 := strconv.ParseUint(parts[1], 10, 8)
		sec, err3 := parseSeconds(parts[2])
		if err1 != nil || err2 != nil || err3 != nil || h > 23 || m > 59 || sec >= 61e9 {
			return 0, false, fmt.Errorf("bad time %q (want HH:MM:SS.ffffff)", clip(s))
		}
		return int64(h)*3600e9 + int64(m)*60e9 + sec, true, nil
	}
	v, err := parseSeconds(s)
	if err != nil {
		return 0, false, fmt.Errorf("bad time %q (want HH:MM:SS.ffffff or seconds)", clip(s))
	}
	return v, false, nil
}

// parseSeconds parses non-negative decimal seconds exactly (to the
// nanosecond; further digits are truncated).
func parseSeconds(s string) (int64, error) {
	whole, frac, _ := strings.Cut(s, ".")
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || w > 9e9 {
		return 0, errors.New("bad seconds")
	}
	ns := int64(w) * 1e9
	if len(frac) > 0 {
		for i := 0; i < len(frac); i++ {
			if frac[i] < '0' || frac[i] > '9' {
				return 0, errors.New("bad seconds")
			}
		}
		if len(frac) > 9 {
			frac = frac[:9]
		}
		f, err := strconv.ParseUint(frac, 10, 64)
		if err != nil {
			return 0, errors.New("bad seconds")
		}
		for i := len(frac); i < 9; i++ {
			f *= 10
		}
		ns += int64(f)
	}
	return ns, nil
}
