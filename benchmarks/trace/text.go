package trace

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// TextHeader is the first line of a text trace (without the newline), as
// TextWriter writes it (format Version).
const TextHeader = "# vmmalloc-trace v2"

// TextHeaderV1 is the header of a version-1 text trace, which has no pool=
// field; TextReader still reads it.
const TextHeaderV1 = "# vmmalloc-trace v1"

const textHeaderPrefix = "# vmmalloc-trace v"

// appendText appends e's canonical text form (no newline) to b.
func appendText(b []byte, e Event) []byte {
	b = append(b, e.Kind.String()...)
	switch e.Kind {
	case Alloc:
		b = append(b, ' ')
		b = strconv.AppendUint(b, e.ID, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, e.Size, 10)
	case Free, RecordStream, Mark:
		b = append(b, ' ')
		b = strconv.AppendUint(b, e.ID, 10)
	default:
		if e.ID != 0 {
			b = append(b, " id="...)
			b = strconv.AppendUint(b, e.ID, 10)
		}
	}
	if e.Kind != Alloc && e.Size != 0 {
		b = append(b, " size="...)
		b = strconv.AppendUint(b, e.Size, 10)
	}
	if e.Stream != 0 || e.Kind == Alloc || e.Kind == RecordStream || e.Kind == StreamSync {
		b = append(b, " s="...)
		b = strconv.AppendUint(b, e.Stream, 10)
	}
	if e.TimeNs != 0 || e.Kind == Alloc {
		b = append(b, " t="...)
		b = strconv.AppendInt(b, e.TimeNs, 10)
	}
	if !e.Pool.IsDefault() {
		b = append(b, " pool="...)
		b = strconv.AppendUint(b, e.Pool[0], 10)
		b = append(b, ',')
		b = strconv.AppendUint(b, e.Pool[1], 10)
	}
	return b
}

// TextWriter writes the text format: a header line, optional "# key: value"
// info lines, then one event per line. Not safe for concurrent use.
type TextWriter struct {
	w       *bufio.Writer
	line    []byte // scratch
	info    Info
	started bool
	closed  bool
	err     error // sticky I/O error
	count   uint64
}

// NewTextWriter returns a TextWriter writing to w.
func NewTextWriter(w io.Writer) *TextWriter {
	return &TextWriter{w: bufio.NewWriterSize(w, writeFlushAt)}
}

// SetInfo sets the metadata written after the header line. It must be
// called before the first Write, Flush or Close (else ErrStarted).
func (t *TextWriter) SetInfo(info Info) error {
	if t.started || t.closed {
		return ErrStarted
	}
	if err := info.validate(); err != nil {
		return err
	}
	t.info = info
	return nil
}

func (t *TextWriter) start() error {
	if t.started {
		return nil
	}
	t.started = true
	b := append(t.line[:0], TextHeader...)
	b = append(b, '\n')
	for _, f := range t.info.fields() {
		if f.val != "" {
			b = append(b, "# "...)
			b = append(b, f.key...)
			b = append(b, ": "...)
			b = append(b, f.val...)
			b = append(b, '\n')
		}
	}
	t.line = b
	_, err := t.w.Write(b)
	t.err = err
	return err
}

// Write writes e as one line. Invalid kinds are rejected with
// ErrInvalidEvent.
func (t *TextWriter) Write(e Event) error {
	if t.closed {
		return ErrClosed
	}
	if t.err != nil {
		return t.err
	}
	if !e.Kind.Valid() {
		return fmt.Errorf("%w: kind %d", ErrInvalidEvent, uint8(e.Kind))
	}
	if err := t.start(); err != nil {
		return err
	}
	t.line = append(appendText(t.line[:0], e), '\n')
	if _, err := t.w.Write(t.line); err != nil {
		t.err = err
		return err
	}
	t.count++
	return nil
}

// Comment writes "# text" as its own line; text must not contain a line
// break.
func (t *TextWriter) Comment(text string) error {
	if t.closed {
		return ErrClosed
	}
	if t.err != nil {
		return t.err
	}
	if bytes.ContainsAny([]byte(text), "\r\n") {
		return fmt.Errorf("%w: comment contains a line break", ErrInvalidEvent)
	}
	if err := t.start(); err != nil {
		return err
	}
	if _, err := t.w.WriteString("# " + text + "\n"); err != nil {
		t.err = err
		return err
	}
	return nil
}

// Count returns the number of events written.
func (t *TextWriter) Count() uint64 { return t.count }

// Flush writes buffered lines to the underlying writer.
func (t *TextWriter) Flush() error {
	if t.closed {
		return ErrClosed
	}
	if t.err != nil {
		return t.err
	}
	if err := t.start(); err != nil {
		return err
	}
	t.err = t.w.Flush()
	return t.err
}

// Close flushes. It does not close the underlying writer.
func (t *TextWriter) Close() error {
	if t.closed {
		return ErrClosed
	}
	err := t.Flush()
	t.closed = true
	return err
}

// TextReader parses the text format. Not safe for concurrent use.
type TextReader struct {
	r       *bufio.Reader
	line    int64  // number of the last line read (1-based)
	pending []byte // first event line, read ahead while collecting Info
	info    Info
	err     error // sticky terminal error
	version int   // the header's format version (MinVersion..Version)
}

// NewTextReader reads the header line and the leading comment block (for
// Info) from r. A missing header yields ErrCorrupt; a header naming
// a version outside MinVersion..Version yields ErrVersion.
func NewTextReader(r io.Reader) (*TextReader, error) {
	t := &TextReader{r: bufio.NewReaderSize(r, readBufSize)}
	line, err := t.readLine()
	if err == io.EOF {
		return nil, fmt.Errorf("%w: empty input (missing %q header)", ErrCorrupt, TextHeader)
	}
	if err != nil {
		return nil, err
	}
	line = bytes.TrimRight(line, " \t\r\n")
	switch string(line) {
	case TextHeader:
		t.version = Version
	case TextHeaderV1:
		t.version = 1
	default:
		if rest, ok := bytes.CutPrefix(line, []byte(textHeaderPrefix)); ok {
			return nil, fmt.Errorf("%w: text trace version %q (this reader supports %d to %d)", ErrVersion, clip(rest), MinVersion, Version)
		}
		return nil, fmt.Errorf("%w: line 1: missing %q header", ErrCorrupt, TextHeader)
	}
	// Leading comments may carry Info; stop at the first event line.
	for {
		line, err := t.readLine()
		if err == io.EOF {
			return t, nil
		}
		if err != nil {
			return nil, err
		}
		content := bytes.TrimSpace(line)
		if len(content) == 0 {
			continue
		}
		if content[0] != '#' {
			t.pending = append([]byte(nil), line...)
			return t, nil
		}
		kv := bytes.TrimSpace(content[1:])
		if k, v, ok := bytes.Cut(kv, []byte(":")); ok {
			key, val := string(bytes.TrimSpace(k)), string(bytes.TrimSpace(v))
			// Known keys obey the writers' rule, so that whatever this
			// reader accepts can be written again (a lone '\r' inside a
			// line is a line break to them).
			if err := checkInfoValue(key, val); err != nil && isInfoKey(key) {
				return nil, fmt.Errorf("%w: line %d: info %v", ErrCorrupt, t.line, err)
			}
			t.info.set(key, val)
		}
	}
}

// Info returns the metadata from the leading "# key: value" comments.
func (t *TextReader) Info() Info { return t.info }

// Version returns the format version of the trace's header.
func (t *TextReader) Version() int { return t.version }

// readLine returns the next line (including its newline, if any); the slice
// is valid until the next call. io.EOF only when no bytes remain.
func (t *TextReader) readLine() ([]byte, error) {
	line, err := t.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, fmt.Errorf("%w: line %d longer than %d bytes", ErrCorrupt, t.line+1, readBufSize)
	}
	if err == io.EOF && len(line) > 0 {
		err = nil // last line without newline
	}
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("trace: reading input: %w", err)
	}
	if err == nil {
		t.line++
	}
	return line, err
}

// Next returns the next event, or io.EOF at the end of input.
func (t *TextReader) Next() (Event, error) {
	if t.err != nil {
		return Event{}, t.err
	}
	for {
		var line []byte
		if t.pending != nil {
			line, t.pending = t.pending, nil
		} else {
			var err error
			if line, err = t.readLine(); err != nil {
				t.err = err
				return Event{}, err
			}
		}
		e, ok, err := parseLine(line, t.version)
		if err != nil {
			t.err = fmt.Errorf("%w: line %d: %s", ErrCorrupt, t.line, err.Error())
			return Event{}, t.err
		}
		if ok {
			return e, nil
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// nextToken returns the first white-space separated token of b and the rest.
func nextToken(b []byte) (tok, rest []byte) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	return b[i:j], b[j:]
}

// parseKindBytes is ParseKind without converting tok to a string.
func parseKindBytes(tok []byte) (Kind, bool) {
	for k := Alloc; k < numKinds; k++ {
		if string(tok) == kindNames[k] {
			return k, true
		}
	}
	return 0, false
}

func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

func parseInt(b []byte) (int64, bool) {
	neg := false
	if len(b) > 0 && (b[0] == '-' || b[0] == '+') {
		neg = b[0] == '-'
		b = b[1:]
	}
	u, ok := parseUint(b)
	if !ok {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true // -(1<<63) wraps to MinInt64, which is right
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

// parsePool parses the value of pool=: two unsigned integers separated by
// a comma ("1,0").
func parsePool(b []byte) (PoolID, bool) {
	a, c, found := bytes.Cut(b, []byte(","))
	if !found {
		return PoolID{}, false
	}
	x, ok1 := parseUint(a)
	y, ok2 := parseUint(c)
	return PoolID{x, y}, ok1 && ok2
}

// parseLine parses one line of a trace of the given format version. ok is
// false for blank and comment lines.
func parseLine(line []byte, version int) (e Event, ok bool, err error) {
	if i := bytes.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	tok, rest := nextToken(line)
	if len(tok) == 0 {
		return Event{}, false, nil
	}
	kind, known := parseKindBytes(tok)
	if !known {
		return Event{}, false, fmt.Errorf("unknown event %q", clip(tok))
	}
	e.Kind = kind
	positional := 0
	switch kind {
	case Alloc:
		positional = 2
	case Free, RecordStream, Mark:
		positional = 1
	}
	const (
		seenID = 1 << iota
		seenSize
		seenStream
		seenTime
		seenPool
	)
	seen := 0
	for p := 0; p < positional; p++ {
		tok, rest = nextToken(rest)
		v, ok := parseUint(tok)
		if !ok {
			name := "id"
			if p == 1 {
				name = "size"
			}
			if len(tok) == 0 {
				return Event{}, false, fmt.Errorf("%s: missing %s", kind, name)
			}
			return Event{}, false, fmt.Errorf("%s: bad %s %q", kind, name, clip(tok))
		}
		if p == 0 {
			e.ID, seen = v, seen|seenID
		} else {
			e.Size, seen = v, seen|seenSize
		}
	}
	for {
		tok, rest = nextToken(rest)
		if len(tok) == 0 {
			return e, true, nil
		}
		k, v, found := bytes.Cut(tok, []byte("="))
		if !found {
			return Event{}, false, fmt.Errorf("%s: unexpected %q (want key=value)", kind, clip(tok))
		}
		var bit int
		var good bool
		switch string(k) {
		case "s":
			bit = seenStream
			e.Stream, good = parseUint(v)
		case "t":
			bit = seenTime
			e.TimeNs, good = parseInt(v)
		case "id":
			bit = seenID
			e.ID, good = parseUint(v)
		case "size":
			bit = seenSize
			e.Size, good = parseUint(v)
		case "pool":
			if version < 2 {
				return Event{}, false, fmt.Errorf("%s: pool= needs format version 2 (header %q)", kind, TextHeader)
			}
			bit = seenPool
			e.Pool, good = parsePool(v)
		default:
			return Event{}, false, fmt.Errorf("%s: unknown key %q", kind, clip(k))
		}
		if seen&bit != 0 {
			return Event{}, false, fmt.Errorf("%s: %s given twice", kind, k)
		}
		if !good {
			return Event{}, false, fmt.Errorf("%s: bad value %q for %s", kind, clip(v), k)
		}
		seen |= bit
	}
}

// Open detects the format of r (binary by its magic number, text by its
// header line) and returns a reader for it; the result also implements
// InfoReader. Input that is neither yields ErrFormat.
func Open(r io.Reader) (EventReader, error) {
	br := bufio.NewReaderSize(r, readBufSize)
	head, err := br.Peek(len(Magic))
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("trace: reading input: %w", err)
	}
	switch {
	case len(head) == 0:
		return nil, fmt.Errorf("%w: empty input", ErrFormat)
	case string(head) == Magic:
		return NewReader(br)
	case head[0] == '#':
		return NewTextReader(br)
	}
	return nil, fmt.Errorf("%w: input starts with %q (want %q or %q)", ErrFormat, head, Magic, TextHeader)
}
