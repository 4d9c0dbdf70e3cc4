package trace

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func encodeText(t testing.TB, info Info, events []Event) string {
	t.Helper()
	var buf bytes.Buffer
	w := NewTextWriter(&buf)
	require.NoError(t, w.SetInfo(info))
	for _, e := range events {
		require.NoError(t, w.Write(e))
	}
	require.NoError(t, w.Close())
	require.Equal(t, uint64(len(events)), w.Count())
	return buf.String()
}

func decodeText(t testing.TB, s string) (Info, []Event, error) {
	t.Helper()
	r, err := NewTextReader(strings.NewReader(s))
	if err != nil {
		return Info{}, nil, err
	}
	ev, err := ReadAll(r)
	return r.Info(), ev, err
}

func TestTextCanonicalForm(t *testing.T) {
	got := encodeText(t, Info{Name: "demo", Device: "cuda:0"}, []Event{
		{Kind: Alloc, ID: 17, Size: 1048576, Stream: 0, TimeNs: 123},
		{Kind: RecordStream, ID: 17, Stream: 2},
		{Kind: StreamSync, Stream: 1, TimeNs: 130},
		{Kind: Free, ID: 17},
		{Kind: Free, ID: 18, Stream: 3, TimeNs: -5},
		{Kind: EmptyCache},
		{Kind: Mark, ID: 3, TimeNs: 200},
		{Kind: EmptyCache, ID: 4, Size: 5},
		{Kind: Alloc, ID: 19, Size: 64, TimeNs: 300, Pool: PoolID{1, 0}},
		{Kind: Free, ID: 19, Pool: PoolID{0, 2}},
	})
	assert.Equal(t, `# vmmalloc-trace v2
# name: demo
# device: cuda:0
alloc 17 1048576 s=0 t=123
record 17 s=2
sync s=1 t=130
free 17
free 18 s=3 t=-5
empty_cache
mark 3 t=200
empty_cache id=4 size=5
alloc 19 64 s=0 t=300 pool=1,0
free 19 pool=0,2
`, got)
}

func TestTextRoundTrip(t *testing.T) {
	info := Info{Name: "sample", Source: "hand-built", Device: "cuda:0"}
	gotInfo, got, err := decodeText(t, encodeText(t, info, sampleEvents()))
	require.NoError(t, err)
	assert.Equal(t, info, gotInfo)
	assert.Equal(t, sampleEvents(), got)

	events := randomEvents(rand.New(rand.NewPCG(11, 12)), 5000)
	_, got, err = decodeText(t, encodeText(t, Info{}, events))
	require.NoError(t, err)
	assert.Equal(t, events, got)
}

func TestTextLenientInput(t *testing.T) {
	in := "# vmmalloc-trace v1  \r\n" +
		"#   name :  spaced out  \n" +
		"# a free-form comment: ignored key\n" +
		"\n" +
		"alloc 1 10   # trailing comment\r\n" +
		"\talloc 2 20 t=5 s=1\n" +
		"# source: too late, not info\n" +
		"free 1 t=+7\n" +
		"record 2 s=4\n" +
		"sync\n" +
		"free 2" // no final newline
	info, ev, err := decodeText(t, in)
	require.NoError(t, err)
	assert.Equal(t, Info{Name: "spaced out"}, info)
	assert.Equal(t, []Event{
		{Kind: Alloc, ID: 1, Size: 10},
		{Kind: Alloc, ID: 2, Size: 20, Stream: 1, TimeNs: 5},
		{Kind: Free, ID: 1, TimeNs: 7},
		{Kind: RecordStream, ID: 2, Stream: 4},
		{Kind: StreamSync},
		{Kind: Free, ID: 2},
	}, ev)
}

func TestTextReadsVersion1(t *testing.T) {
	r, err := NewTextReader(strings.NewReader(TextHeaderV1 + "\n# name: old\nalloc 1 10 s=2 t=3\nfree 1\n"))
	require.NoError(t, err)
	assert.Equal(t, 1, r.Version())
	ev, err := ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, []Event{{Kind: Alloc, ID: 1, Size: 10, Stream: 2, TimeNs: 3}, {Kind: Free, ID: 1}}, ev)
	assert.Equal(t, "old", r.Info().Name)

	r, err = NewTextReader(strings.NewReader(TextHeader + "\nalloc 1 10 pool=18446744073709551615,7\n"))
	require.NoError(t, err)
	assert.Equal(t, Version, r.Version())
	ev, err = ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, []Event{{Kind: Alloc, ID: 1, Size: 10, Pool: PoolID{math.MaxUint64, 7}}}, ev)
}

func TestPoolIDString(t *testing.T) {
	assert.Equal(t, "default", PoolID{}.String())
	assert.Equal(t, "pool(1,0)", PoolID{1, 0}.String())
	assert.Equal(t, "pool(0,18446744073709551615)", PoolID{0, math.MaxUint64}.String())
	assert.True(t, PoolID{}.IsDefault())
	assert.False(t, PoolID{0, 1}.IsDefault())
}

func TestTextErrors(t *testing.T) {
	const h = TextHeader + "\n"
	tests := []struct {
		name string
		in   string
		want error
		msg  string
	}{
		{"empty", "", ErrCorrupt, "empty input"},
		{"no header", "alloc 1 2\n", ErrCorrupt, "line 1: missing"},
		{"version 3", "# vmmalloc-trace v3\n", ErrVersion, `"3"`},
		{"pool in version 1", TextHeaderV1 + "\nalloc 1 2 pool=1,0\n", ErrCorrupt, "pool= needs format version 2"},
		{"pool without comma", h + "alloc 1 2 pool=1\n", ErrCorrupt, `bad value "1" for pool`},
		{"pool half empty", h + "alloc 1 2 pool=1,\n", ErrCorrupt, "bad value"},
		{"pool three parts", h + "alloc 1 2 pool=1,2,3\n", ErrCorrupt, "bad value"},
		{"pool negative", h + "alloc 1 2 pool=-1,0\n", ErrCorrupt, "bad value"},
		{"pool overflow", h + "alloc 1 2 pool=0,18446744073709551616\n", ErrCorrupt, "bad value"},
		{"pool twice", h + "alloc 1 2 pool=1,0 pool=1,0\n", ErrCorrupt, "pool given twice"},
		{"unknown event", h + "malloc 1 2\n", ErrCorrupt, `line 2: unknown event "malloc"`},
		{"missing size", h + "alloc 1\n", ErrCorrupt, "line 2: alloc: missing size"},
		{"missing id", h + "free\n", ErrCorrupt, "free: missing id"},
		{"bad id", h + "free x\n", ErrCorrupt, `bad id "x"`},
		{"negative size", h + "alloc 1 -5\n", ErrCorrupt, `bad size "-5"`},
		{"overflow", h + "alloc 1 18446744073709551616\n", ErrCorrupt, "bad size"},
		{"time overflow", h + "free 1 t=9223372036854775808\n", ErrCorrupt, "bad value"},
		{"not key=value", h + "free 1 2\n", ErrCorrupt, `unexpected "2"`},
		{"unknown key", h + "free 1 x=2\n", ErrCorrupt, `unknown key "x"`},
		{"duplicate key", h + "sync s=1 s=2\n", ErrCorrupt, "s given twice"},
		{"positional and key", h + "free 1 id=2\n", ErrCorrupt, "id given twice"},
		{"empty value", h + "sync s=\n", ErrCorrupt, "bad value"},
		{"error on later line", h + "alloc 1 2\n\n# c\nfree q\n", ErrCorrupt, "line 5"},
		{"long line", h + strings.Repeat("x", readBufSize+10) + "\n", ErrCorrupt, "longer than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeText(t, tc.in)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestTextMinInt64(t *testing.T) {
	_, ev, err := decodeText(t, TextHeader+"\nfree 1 t=-9223372036854775808\n")
	require.NoError(t, err)
	assert.Equal(t, int64(-9223372036854775808), ev[0].TimeNs)
}

func TestTextWriterErrors(t *testing.T) {
	var buf bytes.Buffer
	w := NewTextWriter(&buf)
	assert.ErrorIs(t, w.Write(Event{Kind: 0}), ErrInvalidEvent)
	assert.ErrorIs(t, w.SetInfo(Info{Device: "a\rb"}), ErrInvalidInfo)
	require.NoError(t, w.Comment("step 1"))
	assert.ErrorIs(t, w.Comment("two\nlines"), ErrInvalidEvent)
	assert.ErrorIs(t, w.SetInfo(Info{}), ErrStarted)
	require.NoError(t, w.Write(Event{Kind: Mark, ID: 1}))
	require.NoError(t, w.Close())
	assert.ErrorIs(t, w.Close(), ErrClosed)
	assert.ErrorIs(t, w.Write(Event{Kind: Mark}), ErrClosed)
	assert.ErrorIs(t, w.Comment("x"), ErrClosed)
	assert.Equal(t, TextHeader+"\n# step 1\nmark 1\n", buf.String())

	boom := errors.New("disk full")
	w = NewTextWriter(&failWriter{err: boom})
	require.NoError(t, w.Write(Event{Kind: Mark})) // buffered
	assert.ErrorIs(t, w.Close(), boom)
}

func TestTextReaderEOFIsSticky(t *testing.T) {
	r, err := NewTextReader(strings.NewReader(TextHeader + "\nmark 1\n"))
	require.NoError(t, err)
	e, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, Event{Kind: Mark, ID: 1}, e)
	_, err = r.Next()
	assert.Equal(t, io.EOF, err)
	_, err = r.Next()
	assert.Equal(t, io.EOF, err)
}

func TestOpenDetectsFormat(t *testing.T) {
	events := sampleEvents()
	info := Info{Name: "both"}
	bin := encodeBinary(t, info, events)
	txt := encodeText(t, info, events)
	for name, data := range map[string][]byte{"binary": bin, "text": []byte(txt)} {
		t.Run(name, func(t *testing.T) {
			r, err := Open(bytes.NewReader(data))
			require.NoError(t, err)
			got, err := ReadAll(r)
			require.NoError(t, err)
			assert.Equal(t, events, got)
			ir, ok := r.(InfoReader)
			require.True(t, ok)
			assert.Equal(t, info, ir.Info())
		})
	}
	_, err := Open(strings.NewReader(""))
	assert.ErrorIs(t, err, ErrFormat)
	_, err = Open(strings.NewReader("PK\x03\x04zipfile"))
	assert.ErrorIs(t, err, ErrFormat)
	_, err = Open(strings.NewReader("# some other file\n"))
	assert.ErrorIs(t, err, ErrCorrupt)
	_, err = Open(strings.NewReader("VMMTRACE\x07"))
	assert.ErrorIs(t, err, ErrVersion)
	_, err = Open(errorReader{errors.New("boom")})
	assert.ErrorContains(t, err, "boom")
}

func TestKindStrings(t *testing.T) {
	for k := Alloc; k < numKinds; k++ {
		got, ok := ParseKind(k.String())
		assert.True(t, ok)
		assert.Equal(t, k, got)
	}
	assert.Equal(t, "kind(0)", Kind(0).String())
	assert.Equal(t, "kind(9)", Kind(9).String())
	_, ok := ParseKind("kind(9)")
	assert.False(t, ok)
	assert.Equal(t, "alloc 3 4 s=1 t=2", Event{Kind: Alloc, ID: 3, Size: 4, Stream: 1, TimeNs: 2}.String())
}

func FuzzTextReader(f *testing.F) {
	f.Add(encodeText(f, Info{Name: "n"}, sampleEvents()))
	f.Add(TextHeader + "\nalloc 1 2 s=3 t=-4 # c\nfree 1\n")
	f.Add(TextHeader + "\nalloc 1 2 pool=1,0\nfree 1 pool=0,1\n")
	f.Add(TextHeaderV1 + "\nalloc 1 2 pool=1,0\n")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := NewTextReader(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		events, err := ReadAll(r)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("unexpected error type: %v", err)
		}
		// Canonical re-encoding reads back identically.
		var buf bytes.Buffer
		w := NewTextWriter(&buf)
		if err := WriteAll(w, events); err != nil {
			t.Fatal(err)
		}
		_, again, err := decodeText(t, buf.String())
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
