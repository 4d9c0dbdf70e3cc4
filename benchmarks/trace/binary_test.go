package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sampleEvents covers every kind and the edge values of every field.
func sampleEvents() []Event {
	return []Event{
		{Kind: Alloc, ID: 1, Size: 1 << 20, Stream: 0, TimeNs: 100},
		{Kind: Alloc, ID: 2, Size: 512, Stream: 0, TimeNs: 100},
		{Kind: RecordStream, ID: 1, Stream: 2, TimeNs: 150},
		{Kind: Free, ID: 1, TimeNs: 200},
		{Kind: StreamSync, Stream: 2, TimeNs: 250},
		{Kind: Alloc, ID: 7, Size: 0, Stream: 3, TimeNs: 90}, // id jump, time going back, size 0
		{Kind: Mark, ID: 5},
		{Kind: EmptyCache, TimeNs: math.MaxInt64},
		{Kind: Alloc, ID: math.MaxUint64, Size: math.MaxUint64, Stream: math.MaxUint64, TimeNs: math.MinInt64},
		{Kind: Alloc, ID: 0, Size: 1, TimeNs: -1}, // wraps around
		{Kind: Free, ID: math.MaxUint64, Size: 9, Stream: 1},
		{Kind: StreamSync, ID: 3, Size: 4}, // fields the kind does not use
		{Kind: EmptyCache, ID: 8, Stream: 6},
		{Kind: Free, ID: 0},
		{Kind: Free, ID: 2, TimeNs: 300},
		{Kind: Free, ID: 7, TimeNs: 300},
		{Kind: Alloc, ID: 8, Size: 4096, Stream: 1, TimeNs: 310, Pool: PoolID{1, 0}}, // a CUDA-graph pool
		{Kind: Alloc, ID: 9, Size: 1, TimeNs: 311, Pool: PoolID{0, 3}},               // a MemPool
		{Kind: Alloc, ID: 10, Pool: PoolID{math.MaxUint64, math.MaxUint64}},
		{Kind: Free, ID: 8, TimeNs: 320},
		{Kind: EmptyCache, Pool: PoolID{1, 0}}, // a field the kind does not use
	}
}

func randomEvents(rng *rand.Rand, n int) []Event {
	ev := make([]Event, n)
	for i := range ev {
		e := Event{Kind: Kind(1 + rng.IntN(int(numKinds-1)))}
		switch rng.IntN(3) {
		case 0:
			e.ID = rng.Uint64()
		case 1:
			e.ID = uint64(i)
		}
		if rng.IntN(2) == 0 {
			e.Size = rng.Uint64() >> rng.IntN(64)
		}
		e.Stream = uint64(rng.IntN(4))
		if rng.IntN(4) == 0 {
			e.Pool = PoolID{uint64(rng.IntN(3)), rng.Uint64() >> rng.IntN(64)}
		}
		e.TimeNs = rng.Int64() >> rng.IntN(64)
		if rng.IntN(2) == 0 {
			e.TimeNs = -e.TimeNs
		}
		ev[i] = e
	}
	return ev
}

func encodeBinary(t testing.TB, info Info, events []Event) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	require.NoError(t, w.SetInfo(info))
	for _, e := range events {
		require.NoError(t, w.Write(e))
	}
	require.NoError(t, w.Close())
	require.Equal(t, uint64(len(events)), w.Count())
	return buf.Bytes()
}

func decodeBinary(t testing.TB, data []byte) (Info, []Event, error) {
	t.Helper()
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return Info{}, nil, err
	}
	ev, err := ReadAll(r)
	return r.Info(), ev, err
}

func TestBinaryRoundTrip(t *testing.T) {
	info := Info{Name: "sample", Source: "hand-built", Device: "cuda:0"}
	events := sampleEvents()
	data := encodeBinary(t, info, events)
	gotInfo, got, err := decodeBinary(t, data)
	require.NoError(t, err)
	assert.Equal(t, info, gotInfo)
	assert.Equal(t, events, got)

	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 1000, 100000} {
		events := randomEvents(rng, n)
		_, got, err := decodeBinary(t, encodeBinary(t, Info{}, events))
		require.NoError(t, err)
		if n == 0 {
			assert.Empty(t, got)
		} else {
			assert.Equal(t, events, got)
		}
	}
}

// TestBinaryCompact checks the encodings the format promises to be cheap.
func TestBinaryCompact(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	require.NoError(t, w.Flush())
	headerLen := buf.Len()
	assert.Equal(t, len(Magic)+2, headerLen) // magic, version, zero info fields
	assert.Equal(t, []byte("VMMTRACE\x02\x00"), buf.Bytes())

	require.NoError(t, w.Write(Event{Kind: Alloc, ID: 1, Size: 100})) // tag + size
	require.NoError(t, w.Write(Event{Kind: Alloc, ID: 2, Size: 100})) // tag + size
	require.NoError(t, w.Write(Event{Kind: Free, ID: 2}))             // tag + id delta 0
	require.NoError(t, w.Write(Event{Kind: EmptyCache}))              // tag only
	require.NoError(t, w.Write(Event{Kind: Alloc, ID: 3, Size: 100, Pool: PoolID{1, 0}}))
	require.NoError(t, w.Flush())
	assert.Equal(t, []byte{
		byte(Alloc) | flagSize, 100,
		byte(Alloc) | flagSize, 100,
		byte(Free) | flagID, 0,
		byte(EmptyCache),
		byte(Alloc) | flagSize | flagPool, 100, 1, 0, // a private pool: two bytes more
	}, buf.Bytes()[headerLen:])
	require.NoError(t, w.Close())
	tail := buf.Bytes()[headerLen+11:]
	require.Len(t, tail, 1+1+4)
	assert.Equal(t, []byte{0, 5}, tail[:2])
	crc := binary.LittleEndian.Uint32(tail[2:])
	assert.Equal(t, crc32c(buf.Bytes()[:buf.Len()-4]), crc)
}

func crc32c(b []byte) uint32 {
	// Independent bitwise CRC-32C, to check the table-driven one.
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x82F63B78
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

func TestBinaryEmptyTraceAndInfoOnly(t *testing.T) {
	data := encodeBinary(t, Info{Name: "x"}, nil)
	info, ev, err := decodeBinary(t, data)
	require.NoError(t, err)
	assert.Empty(t, ev)
	assert.Equal(t, Info{Name: "x"}, info)
}

func TestBinaryTruncatedEverywhere(t *testing.T) {
	data := encodeBinary(t, Info{Name: "n"}, sampleEvents())
	for n := 0; n < len(data); n++ {
		_, ev, err := decodeBinary(t, data[:n])
		require.Error(t, err, "prefix of %d bytes", n)
		assert.ErrorIs(t, err, ErrCorrupt, "prefix of %d bytes", n)
		assert.LessOrEqual(t, len(ev), len(sampleEvents()))
	}
}

func TestBinaryCorruption(t *testing.T) {
	good := encodeBinary(t, Info{}, sampleEvents())
	corruptAt := func(i int, b byte) []byte {
		d := append([]byte(nil), good...)
		d[i] = b
		return d
	}
	tests := []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"bad magic", corruptAt(0, 'X'), ErrCorrupt, "bad magic"},
		{"version 3", corruptAt(8, 3), ErrVersion, "version 3"},
		{"version 0", corruptAt(8, 0), ErrVersion, "version 0"},
		{"invalid tag", corruptAt(10, 0x0f), ErrCorrupt, "invalid event tag"},
		{"trailing data", append(append([]byte(nil), good...), 0), ErrCorrupt, "after end-of-trace"},
		{"checksum", corruptAt(len(good)-1, good[len(good)-1]^1), ErrCorrupt, "checksum mismatch"},
		{"count", corruptAt(len(good)-5, good[len(good)-5]+1), ErrCorrupt, "counts"},
		{"overlong varint", append([]byte("VMMTRACE\x01\x00\x21"), bytes.Repeat([]byte{0xff}, 11)...), ErrCorrupt, "malformed varint"},
		{"too many info fields", []byte("VMMTRACE\x01\x11"), ErrCorrupt, "info fields"},
		{"huge info value", []byte("VMMTRACE\x01\x01\x04name\xff\xff\x03"), ErrCorrupt, "info value length"},
		{"zero key", []byte("VMMTRACE\x01\x01\x00"), ErrCorrupt, "info key length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeBinary(t, tc.data)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// v1File is the events of sampleEvents that version 1 can hold (those in
// the default pool), written as a version-1 file: what this package wrote
// before pools existed.
func v1File(t *testing.T) ([]byte, []Event) {
	t.Helper()
	var events []Event
	for _, e := range sampleEvents() {
		if e.Pool.IsDefault() {
			events = append(events, e)
		}
	}
	data := encodeBinary(t, Info{Name: "old"}, events)
	require.Equal(t, byte(Version), data[len(Magic)])
	data[len(Magic)] = 1 // no event has bit 3 set, so only the version and checksum differ
	binary.LittleEndian.PutUint32(data[len(data)-4:], crc32c(data[:len(data)-4]))
	return data, events
}

func TestBinaryReadsVersion1(t *testing.T) {
	data, events := v1File(t)
	r, err := NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, 1, r.Version())
	got, err := ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, events, got, "a version-1 file reads as all in the default pool")
	assert.Equal(t, Info{Name: "old"}, r.Info())

	// In version 1 bit 3 belongs to the kind, so a tag with it set is an
	// invalid kind, not a pool.
	bad := append([]byte(nil), data...)
	first := len(Magic) + 1 + 1 + 1 + len("name") + 1 + len("old") // magic, version, count, key, value
	require.Equal(t, byte(Alloc)|flagSize|flagTime, bad[first])
	bad[first] |= flagPool
	_, _, err = decodeBinary(t, bad)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "invalid event tag 0x")

	// Opened through Open too.
	er, err := Open(bytes.NewReader(data))
	require.NoError(t, err)
	got, err = ReadAll(er)
	require.NoError(t, err)
	assert.Equal(t, events, got)
}

func TestBinaryPoolTruncated(t *testing.T) {
	data := encodeBinary(t, Info{}, []Event{{Kind: Alloc, ID: 1, Size: 1, Pool: PoolID{1 << 40, 1 << 40}}})
	// Cut inside each of the two pool varints: header 10 bytes, tag, size.
	for _, n := range []int{12, 14, 17, 19} {
		_, _, err := decodeBinary(t, data[:n])
		require.ErrorIs(t, err, ErrCorrupt, "prefix of %d bytes", n)
		assert.ErrorContains(t, err, "pool", "prefix of %d bytes", n)
	}
	over := append([]byte("VMMTRACE\x02\x00"), byte(Alloc)|flagPool)
	over = append(over, bytes.Repeat([]byte{0xff}, 11)...)
	_, _, err := decodeBinary(t, over)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "malformed varint (pool)")
}

func TestBinaryBitFlipsNeverPanic(t *testing.T) {
	good := encodeBinary(t, Info{Source: "s"}, sampleEvents())
	for i := range good {
		for bit := range 8 {
			d := append([]byte(nil), good...)
			d[i] ^= 1 << bit
			_, _, err := decodeBinary(t, d)
			require.Error(t, err, "flip byte %d bit %d went unnoticed", i, bit)
			assert.True(t, errors.Is(err, ErrCorrupt) || errors.Is(err, ErrVersion), "byte %d bit %d: %v", i, bit, err)
		}
	}
}

func TestBinaryErrorsAreSticky(t *testing.T) {
	data := encodeBinary(t, Info{}, sampleEvents())
	r, err := NewReader(bytes.NewReader(data[:len(data)-3]))
	require.NoError(t, err)
	_, err = ReadAll(r)
	require.ErrorIs(t, err, ErrCorrupt)
	_, err2 := r.Next()
	assert.Equal(t, err, err2)

	r, err = NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	_, err = ReadAll(r)
	require.NoError(t, err)
	_, err = r.Next()
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, uint64(len(sampleEvents())), r.Count())
}

// oneByteReader returns one byte per Read, exercising buffer refills.
type oneByteReader struct{ data []byte }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(o.data) == 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = o.data[0]
	o.data = o.data[1:]
	return 1, nil
}

func TestBinarySlowReader(t *testing.T) {
	events := randomEvents(rand.New(rand.NewPCG(3, 4)), 30000) // > 64 KiB
	data := encodeBinary(t, Info{Device: "d"}, events)
	require.Greater(t, len(data), readBufSize)
	r, err := NewReader(&oneByteReader{data: data})
	require.NoError(t, err)
	got, err := ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, events, got)
	assert.Equal(t, "d", r.Info().Device)
}

type failWriter struct {
	n   int // bytes accepted before failing
	err error
}

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		return 0, f.err
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriterErrors(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	err := w.Write(Event{})
	assert.ErrorIs(t, err, ErrInvalidEvent)
	assert.ErrorIs(t, w.Write(Event{Kind: 7}), ErrInvalidEvent)
	assert.ErrorIs(t, w.SetInfo(Info{Name: "a\nb"}), ErrInvalidInfo)
	assert.ErrorIs(t, w.SetInfo(Info{Source: string(make([]byte, maxInfoValue+1))}), ErrInvalidInfo)
	require.NoError(t, w.Write(Event{Kind: Mark, ID: 1}))
	assert.ErrorIs(t, w.SetInfo(Info{Name: "late"}), ErrStarted)
	require.NoError(t, w.Close())
	assert.ErrorIs(t, w.Close(), ErrClosed)
	assert.ErrorIs(t, w.Write(Event{Kind: Mark}), ErrClosed)
	assert.ErrorIs(t, w.Flush(), ErrClosed)
	_, ev, err := decodeBinary(t, buf.Bytes())
	require.NoError(t, err)
	assert.Equal(t, []Event{{Kind: Mark, ID: 1}}, ev, "rejected events leave no trace")

	boom := errors.New("disk full")
	w = NewWriter(&failWriter{n: 0, err: boom})
	assert.ErrorIs(t, w.Flush(), boom)
	assert.ErrorIs(t, w.Write(Event{Kind: Mark}), boom, "write errors are sticky")
	assert.ErrorIs(t, w.Close(), boom)
}

func TestReaderIOError(t *testing.T) {
	data := encodeBinary(t, Info{}, sampleEvents())
	boom := errors.New("network down")
	r, err := NewReader(io.MultiReader(bytes.NewReader(data[:20]), errorReader{boom}))
	require.NoError(t, err)
	_, err = ReadAll(r)
	assert.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, ErrCorrupt)
}

type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) { return 0, e.err }

func TestReaderNextDoesNotAllocate(t *testing.T) {
	events := randomEvents(rand.New(rand.NewPCG(5, 6)), 200000)
	data := encodeBinary(t, Info{}, events)
	r, err := NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100000, func() {
		if _, err := r.Next(); err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs)
}

func BenchmarkReaderNext(b *testing.B) {
	// A realistic mix: sequential alloc ids, frees of recent ids, small time deltas.
	rng := rand.New(rand.NewPCG(7, 8))
	var events []Event
	var live []uint64
	var id uint64
	var tns int64
	for len(events) < 1<<20 {
		tns += int64(rng.IntN(5000))
		if len(live) > 0 && rng.IntN(2) == 0 {
			i := len(live) - 1 - rng.IntN(min(len(live), 32))
			events = append(events, Event{Kind: Free, ID: live[i], TimeNs: tns})
			live = append(live[:i], live[i+1:]...)
			continue
		}
		id++
		live = append(live, id)
		events = append(events, Event{Kind: Alloc, ID: id, Size: uint64(512 << rng.IntN(20)), TimeNs: tns})
	}
	data := encodeBinary(b, Info{}, events)
	b.SetBytes(int64(len(data)) / int64(len(events)))
	b.ReportAllocs()
	b.ResetTimer()
	var r *Reader
	for i := 0; i < b.N; i++ {
		if r == nil || i%len(events) == 0 {
			b.StopTimer()
			var err error
			if r, err = NewReader(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if _, err := r.Next(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkWriter(b *testing.B) {
	events := randomEvents(rand.New(rand.NewPCG(9, 10)), 1<<16)
	w := NewWriter(io.Discard)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := w.Write(events[i%len(events)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func FuzzReader(f *testing.F) {
	f.Add(encodeBinary(f, Info{Name: "n"}, sampleEvents()))
	f.Add([]byte("VMMTRACE\x01\x00\x00\x00"))
	f.Add([]byte("VMMTRACE\x02\x00\x09\x01\x00\x00\x00"))
	f.Add([]byte("VMMTRACE"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		events, err := ReadAll(r)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		// Whatever decoded cleanly must re-encode to a trace that decodes
		// to the same events.
		var buf bytes.Buffer
		w := NewWriter(&buf)
		if err := w.SetInfo(r.Info()); err != nil {
			t.Fatal(err)
		}
		if err := WriteAll(w, events); err != nil {
			t.Fatal(err)
		}
		r2, err := NewReader(&buf)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ReadAll(r2)
		if err != nil {
			t.Fatal(err)
		}
		if len(again) != len(events) {
			t.Fatalf("re-encoded %d events, read %d", len(events), len(again))
		}
		for i := range events {
			if events[i] != again[i] {
				t.Fatalf("event %d: %v != %v", i, events[i], again[i])
			}
		}
	})
}
