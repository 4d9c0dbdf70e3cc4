package trace

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
)

// Binary format constants; see the package documentation for the layout.
const (
	// Magic is the first 8 bytes of a binary trace.
	Magic = "VMMTRACE"
	// Version is the format version this package writes, for both the
	// binary and the text format. Version 2 added Event.Pool; the readers
	// read versions 1 and 2 (MinVersion through Version), a version-1 file
	// as all in the default pool.
	Version = 2
	// MinVersion is the oldest format version the readers accept.
	MinVersion = 1

	flagPool   = 1 << 3 // version 2 on; in version 1 bit 3 was part of the kind
	flagID     = 1 << 4
	flagSize   = 1 << 5
	flagStream = 1 << 6
	flagTime   = 1 << 7
	kindMaskV1 = 0x0f
	kindMask   = 0x07
	tagEnd     = 0x00

	maxVarintLen = binary.MaxVarintLen64
	maxEventLen  = 1 + 6*maxVarintLen // tag + six varints (id, size, stream, time, two of pool)
	maxInfoKey   = 64
	maxInfoCount = 16

	readBufSize  = 64 << 10
	writeFlushAt = 32 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func zigzag(d int64) uint64   { return uint64(d<<1) ^ uint64(d>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// Writer encodes events in the binary format. It buffers internally; call
// Close to write the end-of-trace marker and flush. A Writer is not safe
// for concurrent use.
type Writer struct {
	w       io.Writer
	buf     []byte // encoded bytes not yet written to w
	crc     uint32 // CRC-32C of every byte already written to w
	info    Info
	started bool   // header encoded into buf (or written)
	closed  bool   // Close has been called
	err     error  // first write error from w; sticky
	count   uint64 // events written

	// encoder state, mirrored by Reader
	lastAlloc  uint64 // ID of the most recent Alloc
	prevStream uint64
	prevTime   int64
}

// NewWriter returns a Writer that writes a binary trace to w. Nothing is
// written to w until the buffer fills, Flush or Close.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, buf: make([]byte, 0, writeFlushAt+maxEventLen)}
}

// SetInfo sets the header metadata. It must be called before the first
// Write, Flush or Close; later it returns ErrStarted.
func (w *Writer) SetInfo(info Info) error {
	if w.started || w.closed {
		return ErrStarted
	}
	if err := info.validate(); err != nil {
		return err
	}
	w.info = info
	return nil
}

func (w *Writer) start() {
	if w.started {
		return
	}
	w.started = true
	w.buf = append(w.buf, Magic...)
	w.buf = binary.AppendUvarint(w.buf, Version)
	n := 0
	for _, f := range w.info.fields() {
		if f.val != "" {
			n++
		}
	}
	w.buf = binary.AppendUvarint(w.buf, uint64(n))
	for _, f := range w.info.fields() {
		if f.val == "" {
			continue
		}
		w.buf = binary.AppendUvarint(w.buf, uint64(len(f.key)))
		w.buf = append(w.buf, f.key...)
		w.buf = binary.AppendUvarint(w.buf, uint64(len(f.val)))
		w.buf = append(w.buf, f.val...)
	}
}

// Write encodes e. An event with an invalid Kind is rejected with
// ErrInvalidEvent (and nothing is written); an I/O error from the
// underlying writer is returned and makes the Writer unusable.
func (w *Writer) Write(e Event) error {
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	if !e.Kind.Valid() {
		return fmt.Errorf("%w: kind %d", ErrInvalidEvent, uint8(e.Kind))
	}
	w.start()
	var tmp [maxEventLen]byte
	tag := byte(e.Kind)
	i := 1
	if e.Kind == Alloc {
		if base := w.lastAlloc + 1; e.ID != base {
			tag |= flagID
			i += binary.PutUvarint(tmp[i:], zigzag(int64(e.ID-base)))
		}
		w.lastAlloc = e.ID
	} else if e.ID != 0 {
		tag |= flagID
		i += binary.PutUvarint(tmp[i:], zigzag(int64(e.ID-w.lastAlloc)))
	}
	if e.Size != 0 {
		tag |= flagSize
		i += binary.PutUvarint(tmp[i:], e.Size)
	}
	if e.Stream != w.prevStream {
		tag |= flagStream
		i += binary.PutUvarint(tmp[i:], e.Stream)
		w.prevStream = e.Stream
	}
	if e.TimeNs != w.prevTime {
		tag |= flagTime
		i += binary.PutUvarint(tmp[i:], zigzag(e.TimeNs-w.prevTime))
		w.prevTime = e.TimeNs
	}
	if !e.Pool.IsDefault() {
		tag |= flagPool
		i += binary.PutUvarint(tmp[i:], e.Pool[0])
		i += binary.PutUvarint(tmp[i:], e.Pool[1])
	}
	tmp[0] = tag
	w.buf = append(w.buf, tmp[:i]...)
	w.count++
	if len(w.buf) >= writeFlushAt {
		return w.flushBuf()
	}
	return nil
}

// Count returns the number of events written so far.
func (w *Writer) Count() uint64 { return w.count }

func (w *Writer) flushBuf() error {
	if len(w.buf) == 0 {
		return nil
	}
	w.crc = crc32.Update(w.crc, castagnoli, w.buf)
	_, err := w.w.Write(w.buf)
	w.buf = w.buf[:0]
	if err != nil {
		w.err = err
	}
	return err
}

// Flush writes buffered events (and the header) to the underlying writer.
// The output is not a complete trace until Close.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	w.start()
	return w.flushBuf()
}

// Close writes the end-of-trace marker (event count and checksum) and
// flushes. It does not close the underlying writer. Calling Close again
// returns ErrClosed.
func (w *Writer) Close() error {
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	w.start()
	w.closed = true
	w.buf = append(w.buf, tagEnd)
	w.buf = binary.AppendUvarint(w.buf, w.count)
	w.crc = crc32.Update(w.crc, castagnoli, w.buf)
	w.buf = binary.LittleEndian.AppendUint32(w.buf, w.crc)
	_, err := w.w.Write(w.buf)
	w.buf = w.buf[:0]
	if err != nil {
		w.err = err
	}
	return err
}

// Reader decodes a binary trace as a stream: it holds a fixed 64 KiB
// buffer, never the whole trace, and Next does not allocate. A Reader is
// not safe for concurrent use.
//
// Corruption is reported as ErrCorrupt as soon as it is seen. Damage that
// still decodes (a flipped bit inside a varint) is caught by the checksum
// in the end-of-trace marker, so only after the last event: a consumer
// that must not act on damaged data should read to io.EOF first.
type Reader struct {
	r       io.Reader
	buf     []byte
	pos     int    // next unread byte in buf
	end     int    // end of valid data in buf
	crcFrom int    // buf[crcFrom:pos] is consumed but not yet in crc
	crc     uint32 // CRC-32C of consumed bytes before buf[crcFrom]
	off     int64  // input offset of buf[0]
	eof     bool   // r has reported io.EOF
	err     error  // sticky terminal error (io.EOF after a clean end)
	info    Info
	count   uint64 // events decoded
	version uint64 // the header's format version (MinVersion..Version)
	// kindMask and poolFlag split a tag as the file's version does:
	// version 1 has no pool flag and a 4-bit kind.
	kindMask, poolFlag byte

	lastAlloc  uint64
	prevStream uint64
	prevTime   int64
}

// NewReader reads and checks the header of a binary trace from r.
// A wrong magic number yields ErrCorrupt, a version outside
// MinVersion..Version yields ErrVersion.
func NewReader(r io.Reader) (*Reader, error) {
	rd := &Reader{r: r, buf: make([]byte, readBufSize)}
	if err := rd.readHeader(); err != nil {
		return nil, err
	}
	return rd, nil
}

// Info returns the header metadata.
func (r *Reader) Info() Info { return r.info }

// Version returns the format version of the trace's header.
func (r *Reader) Version() int { return int(r.version) }

// Count returns the number of events decoded so far.
func (r *Reader) Count() uint64 { return r.count }

func (r *Reader) corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s (at byte %d)", ErrCorrupt, fmt.Sprintf(format, args...), r.off+int64(r.pos))
}

// fill makes at least min bytes available in buf[pos:end] unless the input
// ends first. It returns only I/O errors other than io.EOF.
func (r *Reader) fill(min int) error {
	if r.end-r.pos >= min || r.eof {
		return nil
	}
	if r.pos > 0 {
		r.crc = crc32.Update(r.crc, castagnoli, r.buf[r.crcFrom:r.pos])
		n := copy(r.buf, r.buf[r.pos:r.end])
		r.off += int64(r.pos)
		r.pos, r.end, r.crcFrom = 0, n, 0
	}
	for empty := 0; r.end-r.pos < min; {
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if err == io.EOF {
			r.eof = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("trace: reading input: %w", err)
		}
		if n == 0 {
			if empty++; empty > 100 {
				return fmt.Errorf("trace: reading input: %w", io.ErrNoProgress)
			}
		}
	}
	return nil
}

// uvarint decodes a varint from b. n == 0: b is too short; n < 0: overflow.
func uvarint(b []byte) (uint64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	return uvarintSlow(b)
}

// uvarintSlow is kept out of line so that uvarint stays small.
//
//go:noinline
func uvarintSlow(b []byte) (uint64, int) { return binary.Uvarint(b) }

// headerUvarint reads one varint of the header.
func (r *Reader) headerUvarint(what string) (uint64, error) {
	if err := r.fill(maxVarintLen); err != nil {
		return 0, err
	}
	v, n := uvarint(r.buf[r.pos:r.end])
	if n == 0 {
		return 0, r.corrupt("truncated header (%s)", what)
	}
	if n < 0 {
		return 0, r.corrupt("malformed header varint (%s)", what)
	}
	r.pos += n
	return v, nil
}

func (r *Reader) headerBytes(n int, what string) ([]byte, error) {
	if err := r.fill(n); err != nil {
		return nil, err
	}
	if r.end-r.pos < n {
		return nil, r.corrupt("truncated header (%s)", what)
	}
	b := r.buf[r.pos : r.pos+n]
	r.pos += n
	return b, nil
}

func (r *Reader) readHeader() error {
	magic, err := r.headerBytes(len(Magic), "magic")
	if err != nil {
		return err
	}
	if string(magic) != Magic {
		return fmt.Errorf("%w: bad magic %q (want %q)", ErrCorrupt, magic, Magic)
	}
	v, err := r.headerUvarint("version")
	if err != nil {
		return err
	}
	if v < MinVersion || v > Version {
		return fmt.Errorf("%w: binary trace version %d (this reader supports %d to %d)", ErrVersion, v, MinVersion, Version)
	}
	r.version = v
	r.kindMask, r.poolFlag = kindMask, flagPool
	if v == 1 {
		r.kindMask, r.poolFlag = kindMaskV1, 0
	}
	nf, err := r.headerUvarint("info count")
	if err != nil {
		return err
	}
	if nf > maxInfoCount {
		return r.corrupt("%d info fields (limit %d)", nf, maxInfoCount)
	}
	for range nf {
		kl, err := r.headerUvarint("info key length")
		if err != nil {
			return err
		}
		if kl == 0 || kl > maxInfoKey {
			return r.corrupt("info key length %d", kl)
		}
		kb, err := r.headerBytes(int(kl), "info key")
		if err != nil {
			return err
		}
		key := string(kb)
		vl, err := r.headerUvarint("info value length")
		if err != nil {
			return err
		}
		if vl > maxInfoValue {
			return r.corrupt("info value length %d (limit %d)", vl, maxInfoValue)
		}
		vb, err := r.headerBytes(int(vl), "info value")
		if err != nil {
			return err
		}
		if bytes.ContainsAny(vb, "\r\n") {
			return r.corrupt("info value for %q contains a line break", key)
		}
		r.info.set(key, string(vb)) // unknown keys are skipped
	}
	return nil
}

// Next returns the next event, io.EOF after the end-of-trace marker, or an
// error wrapping ErrCorrupt. Errors are sticky.
func (r *Reader) Next() (Event, error) {
	if r.err != nil {
		return Event{}, r.err
	}
	if r.end-r.pos < maxEventLen && !r.eof {
		if err := r.fill(maxEventLen); err != nil {
			r.err = err
			return Event{}, err
		}
	}
	b := r.buf[r.pos:r.end]
	if len(b) == 0 {
		r.err = r.corrupt("truncated: input ended without end-of-trace marker after %d events", r.count)
		return Event{}, r.err
	}
	tag := b[0]
	if tag == tagEnd {
		r.err = r.trailer()
		return Event{}, r.err
	}
	e := Event{Kind: Kind(tag & r.kindMask)}
	if !e.Kind.Valid() {
		r.err = r.corrupt("invalid event tag 0x%02x", tag)
		return Event{}, r.err
	}
	i := 1
	var u uint64
	var n int
	if tag&flagID != 0 {
		if u, n = uvarint(b[i:]); n <= 0 {
			return Event{}, r.badVarint(n, "id")
		}
		i += n
		base := r.lastAlloc
		if e.Kind == Alloc {
			base++
		}
		e.ID = base + uint64(unzigzag(u))
	} else if e.Kind == Alloc {
		e.ID = r.lastAlloc + 1
	}
	if tag&flagSize != 0 {
		if u, n = uvarint(b[i:]); n <= 0 {
			return Event{}, r.badVarint(n, "size")
		}
		i += n
		e.Size = u
	}
	e.Stream = r.prevStream
	if tag&flagStream != 0 {
		if u, n = uvarint(b[i:]); n <= 0 {
			return Event{}, r.badVarint(n, "stream")
		}
		i += n
		e.Stream = u
	}
	e.TimeNs = r.prevTime
	if tag&flagTime != 0 {
		if u, n = uvarint(b[i:]); n <= 0 {
			return Event{}, r.badVarint(n, "time")
		}
		i += n
		e.TimeNs += unzigzag(u)
	}
	if tag&r.poolFlag != 0 {
		for j := range e.Pool {
			if u, n = uvarint(b[i:]); n <= 0 {
				return Event{}, r.badVarint(n, "pool")
			}
			i += n
			e.Pool[j] = u
		}
	}
	r.pos += i
	if e.Kind == Alloc {
		r.lastAlloc = e.ID
	}
	r.prevStream, r.prevTime = e.Stream, e.TimeNs
	r.count++
	return e, nil
}

func (r *Reader) badVarint(n int, field string) error {
	if n == 0 {
		r.err = r.corrupt("truncated event (%s) after %d events", field, r.count)
	} else {
		r.err = r.corrupt("malformed varint (%s) after %d events", field, r.count)
	}
	return r.err
}

// trailer checks the end-of-trace marker at r.pos and returns io.EOF when
// it is intact and nothing follows it.
func (r *Reader) trailer() error {
	if err := r.fill(1 + maxVarintLen + 4); err != nil {
		return err
	}
	b := r.buf[r.pos:r.end]
	cnt, n := uvarint(b[1:])
	if n == 0 {
		return r.corrupt("truncated end-of-trace marker")
	}
	if n < 0 {
		return r.corrupt("malformed event count in end-of-trace marker")
	}
	if cnt != r.count {
		return r.corrupt("end-of-trace marker counts %d events, decoded %d", cnt, r.count)
	}
	if len(b) < 1+n+4 {
		return r.corrupt("truncated checksum")
	}
	crc := crc32.Update(r.crc, castagnoli, r.buf[r.crcFrom:r.pos+1+n])
	if got := binary.LittleEndian.Uint32(b[1+n:]); got != crc {
		return r.corrupt("checksum mismatch: stored %08x, computed %08x", got, crc)
	}
	r.pos += 1 + n + 4
	r.crcFrom = r.pos
	if err := r.fill(1); err != nil {
		return err
	}
	if r.end > r.pos {
		return r.corrupt("unexpected data after end-of-trace marker")
	}
	return io.EOF
}
