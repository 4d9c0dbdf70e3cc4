package pickle

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Test vectors produced by CPython 3.11 pickle.dumps (values in comments).
const (
	// {'a': 1, 'b': [1, 2.5, None, True, False], 'c': (1, 2), 'd': 'héllo', 'e': b'\x00\x01'}, protocol 4
	vecDictP4 = "\x80\x04\x95A\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94K\x01\x8c\x01b\x94]\x94(K\x01G@\x04\x00\x00\x00\x00\x00\x00N\x88\x89e\x8c\x01c\x94K\x01K\x02\x86\x94\x8c\x01d\x94\x8c\x06h\xc3\xa9llo\x94\x8c\x01e\x94C\x02\x00\x01\x94u."
	// [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31-1, 2**31, 2**63-1, -2**63, 2**63, -2**63-1, 2**100, -2**100], protocol 2
	vecIntsP2 = "\x80\x02]q\x00(K\x00K\x01K\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\xff\xff\xff\xffJ\x00\x00\x00\x80J\xff\xff\xff\x7f\x8a\x05\x00\x00\x00\x80\x00\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff\x8a\x0d\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x8a\x0d\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xf0e."
	// ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)), protocol 2
	vecTuplesP2 = "\x80\x02()K\x01\x85q\x00K\x01K\x02\x86q\x01K\x01K\x02K\x03\x87q\x02(K\x01K\x02K\x03K\x04tq\x03tq\x04."
	// shared = [1, 2]; {'x': shared, 'y': shared}, protocol 4
	vecSharedP4 = "\x80\x04\x95\x17\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01x\x94]\x94(K\x01K\x02e\x8c\x01y\x94h\x02u."
	// {1: 'one', 'two': 2, (3, 4): 'tuple'}, protocol 4
	vecIntKeysP4 = "\x80\x04\x95#\x00\x00\x00\x00\x00\x00\x00}\x94(K\x01\x8c\x03one\x94\x8c\x03two\x94K\x02K\x03K\x04\x86\x94\x8c\x05tuple\x94u."
	// {}, protocol 5
	vecEmptyP5 = "\x80\x05}\x94."
	// [b'', b'abc', bytearray(b'zz')], protocol 5
	vecBytesP5 = "\x80\x05\x95\x1a\x00\x00\x00\x00\x00\x00\x00]\x94(C\x00\x94C\x03abc\x94\x96\x02\x00\x00\x00\x00\x00\x00\x00zz\x94e."
	// ['é', 1.5, -0.0], protocol 4
	vecFloatsP4 = "\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00]\x94(\x8c\x02\xc3\xa9\x94G?\xf8\x00\x00\x00\x00\x00\x00G\x80\x00\x00\x00\x00\x00\x00\x00e."
	// l = []; l.append(l), protocol 4
	vecCycleP4 = "\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00]\x94h\x00a."

	// collections.OrderedDict(a=1), protocol 4 (STACK_GLOBAL + REDUCE)
	vecOrderedDict = "\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94\x8c\x01a\x94K\x01s."
	// class C: pass; C(), protocol 4 (STACK_GLOBAL + NEWOBJ)
	vecClass = "\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x08__main__\x94\x8c\x01C\x94\x93\x94)\x81\x94."
	// [b'', b'abc', bytearray(b'zz')], protocol 3 (GLOBAL builtins.bytearray)
	vecByteArrayP3 = "\x80\x03]q\x00(C\x00q\x01C\x03abcq\x02cbuiltins\x0abytearray\x0aq\x03C\x02zzq\x04\x85q\x05Rq\x06e."
	// {1, 2}, protocol 4 (EMPTY_SET, ADDITEMS)
	vecSetP4 = "\x80\x04\x95\x09\x00\x00\x00\x00\x00\x00\x00\x8f\x94(K\x01K\x02\x90."
	// [1, 'a'], protocol 0
	vecProto0 = "(lp0\x0aI1\x0aaVa\x0ap1\x0aa."
)

func mustBig(t *testing.T, s string) *big.Int {
	t.Helper()
	v, ok := new(big.Int).SetString(s, 10)
	require.True(t, ok)
	return v
}

func TestDecodeVectors(t *testing.T) {
	t.Run("dict", func(t *testing.T) {
		v, err := Decode([]byte(vecDictP4))
		require.NoError(t, err)
		assert.Equal(t, map[string]any{
			"a": int64(1),
			"b": []any{int64(1), 2.5, nil, true, false},
			"c": []any{int64(1), int64(2)},
			"d": "héllo",
			"e": []byte{0, 1},
		}, v)
	})
	t.Run("ints", func(t *testing.T) {
		v, err := Decode([]byte(vecIntsP2))
		require.NoError(t, err)
		list := v.([]any)
		require.Len(t, list, 16)
		want := []any{int64(0), int64(1), int64(255), int64(256), int64(65535), int64(65536),
			int64(-1), int64(math.MinInt32), int64(math.MaxInt32), int64(1 << 31),
			int64(math.MaxInt64), int64(math.MinInt64)}
		assert.Equal(t, want, list[:12])
		assert.Equal(t, 0, list[12].(*big.Int).Cmp(mustBig(t, "9223372036854775808")))
		assert.Equal(t, 0, list[13].(*big.Int).Cmp(mustBig(t, "-9223372036854775809")))
		assert.Equal(t, 0, list[14].(*big.Int).Cmp(mustBig(t, "1267650600228229401496703205376")))
		assert.Equal(t, 0, list[15].(*big.Int).Cmp(mustBig(t, "-1267650600228229401496703205376")))
	})
	t.Run("tuples", func(t *testing.T) {
		v, err := Decode([]byte(vecTuplesP2))
		require.NoError(t, err)
		assert.Equal(t, []any{
			[]any{},
			[]any{int64(1)},
			[]any{int64(1), int64(2)},
			[]any{int64(1), int64(2), int64(3)},
			[]any{int64(1), int64(2), int64(3), int64(4)},
		}, v)
	})
	t.Run("empty dict", func(t *testing.T) {
		v, err := Decode([]byte(vecEmptyP5))
		require.NoError(t, err)
		assert.Equal(t, map[string]any{}, v)
	})
	t.Run("bytes", func(t *testing.T) {
		v, err := Decode([]byte(vecBytesP5))
		require.NoError(t, err)
		assert.Equal(t, []any{[]byte{}, []byte("abc"), []byte("zz")}, v)
	})
	t.Run("floats", func(t *testing.T) {
		v, err := Decode([]byte(vecFloatsP4))
		require.NoError(t, err)
		list := v.([]any)
		assert.Equal(t, "é", list[0])
		assert.Equal(t, 1.5, list[1])
		assert.True(t, math.Signbit(list[2].(float64)))
	})
}

func TestDecodeSharing(t *testing.T) {
	v, err := Decode([]byte(vecSharedP4))
	require.NoError(t, err)
	m := v.(map[string]any)
	x, y := m["x"].([]any), m["y"].([]any)
	require.Equal(t, []any{int64(1), int64(2)}, x)
	require.Equal(t, x, y)
	assert.Same(t, &x[0], &y[0], "memo-shared list must decode to one backing array")
}

func TestDecodeCycle(t *testing.T) {
	v, err := Decode([]byte(vecCycleP4))
	require.NoError(t, err)
	l := v.([]any)
	require.Len(t, l, 1)
	inner := l[0].([]any)
	assert.Same(t, &l[0], &inner[0], "self-referencing list decodes to a self-referencing slice")
}

func TestDecodeNonStringKeys(t *testing.T) {
	v, err := Decode([]byte(vecIntKeysP4))
	require.NoError(t, err)
	d, ok := v.(*Dict)
	require.True(t, ok, "dict with an int key decodes to *Dict, got %T", v)
	require.Equal(t, 3, d.Len())
	assert.Equal(t, []Item{
		{Key: int64(1), Value: "one"},
		{Key: "two", Value: int64(2)},
		{Key: []any{int64(3), int64(4)}, Value: "tuple"},
	}, d.Items)
	got, ok := d.Get(int64(1))
	assert.True(t, ok)
	assert.Equal(t, "one", got)
	got, ok = d.Get([]any{int64(3), int64(4)})
	assert.True(t, ok)
	assert.Equal(t, "tuple", got)
	_, ok = d.Get("one")
	assert.False(t, ok)
	_, ok = d.Get([]any{[]any{}}) // nested tuple absent
	assert.False(t, ok)
}

// Hand-assembled programs for opcodes CPython does not emit for the values
// above.
func TestDecodeHandAssembled(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want any
	}{
		{"DICT with duplicate key keeps last value", "(\x8c\x01aK\x01\x8c\x01aK\x02d.", map[string]any{"a": int64(2)}},
		{"switch to ordered keeps order", "}(\x8c\x01bK\x01\x8c\x01aK\x02K\x07K\x03\x8c\x01bK\x04u.",
			&Dict{Items: []Item{{"b", int64(4)}, {"a", int64(2)}, {int64(7), int64(3)}}}},
		{"LIST", "(K\x01K\x02l.", []any{int64(1), int64(2)}},
		{"POP and DUP", "K\x01K\x020\x85.", []any{int64(1)}},
		{"DUP", "K\x052\x86.", []any{int64(5), int64(5)}},
		{"POP_MARK", "K\x09(K\x01K\x021.", int64(9)},
		{"LONG_BINPUT/LONG_BINGET", "\x8c\x01zr\x05\x00\x00\x000j\x05\x00\x00\x00.", "z"},
		{"sparse BINPUT", "K\x07q\xfe0h\xfe.", int64(7)},
		{"LONG4", "\x8b\x02\x00\x00\x00\xff\x7f.", int64(32767)},
		{"LONG1 empty is zero", "\x8a\x00.", int64(0)},
		{"BINUNICODE8", "\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi.", "hi"},
		{"BINBYTES", "B\x01\x00\x00\x00z.", []byte("z")},
		{"BINBYTES8", "\x8e\x00\x00\x00\x00\x00\x00\x00\x00.", []byte{}},
		{"NONE", "N.", nil},
		{"trailing bytes ignored", "K\x01.garbage\x93", int64(1)},
		{"bytes key", "}C\x01kK\x01s.", &Dict{Items: []Item{{[]byte("k"), int64(1)}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Decode([]byte(tc.in))
			require.NoError(t, err)
			assert.Equal(t, tc.want, v)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		want   error
		opName string
		offset int64
	}{
		{"OrderedDict", vecOrderedDict, ErrForbidden, "STACK_GLOBAL", 39},
		{"class instance", vecClass, ErrForbidden, "STACK_GLOBAL", 26},
		{"bytearray via GLOBAL", vecByteArrayP3, ErrForbidden, "GLOBAL", 17},
		{"REDUCE", "N)R.", ErrForbidden, "REDUCE", 2},
		{"BUILD", "}}b.", ErrForbidden, "BUILD", 2},
		{"INST", "(i__main__\nC\n.", ErrForbidden, "INST", 1},
		{"OBJ", "(o.", ErrForbidden, "OBJ", 1},
		{"NEWOBJ_EX", "\x92.", ErrForbidden, "NEWOBJ_EX", 0},
		{"PERSID", "P1\n.", ErrForbidden, "PERSID", 0},
		{"BINPERSID", "NQ.", ErrForbidden, "BINPERSID", 1},
		{"EXT1", "\x82\x01.", ErrForbidden, "EXT1", 0},
		{"EXT2", "\x83\x01\x00.", ErrForbidden, "EXT2", 0},
		{"EXT4", "\x84\x01\x00\x00\x00.", ErrForbidden, "EXT4", 0},
		{"set", vecSetP4, ErrUnsupported, "EMPTY_SET", 11},
		{"protocol 0", vecProto0, ErrUnsupported, "PUT", 2},
		{"protocol 6", "\x80\x06N.", ErrUnsupported, "PROTO", 0},
		{"unknown opcode", "\xffN.", ErrUnknownOpcode, "unknown", 0},
		{"unknown opcode zero", "\x00", ErrUnknownOpcode, "unknown", 0},
		{"empty input", "", ErrTruncated, "unknown", 0},
		{"no STOP", "K\x01", ErrTruncated, "unknown", 2},
		{"short BININT", "J\x01\x02", ErrTruncated, "BININT", 0},
		{"absurd BINUNICODE8 length", "\x8d\xff\xff\xff\xff\xff\xff\xff\x7fab.", ErrTruncated, "BINUNICODE8", 0},
		{"absurd BINUNICODE length", "X\xff\xff\xff\xffab.", ErrTruncated, "BINUNICODE", 0},
		{"absurd FRAME length", "\x80\x04\x95\xff\xff\xff\xff\x00\x00\x00\x00N.", ErrTruncated, "FRAME", 2},
		{"negative LONG4", "\x8b\xff\xff\xff\xff.", ErrMalformed, "LONG4", 0},
		{"STOP on empty stack", ".", ErrMalformed, "STOP", 0},
		{"APPEND to dict", "}K\x01a.", ErrMalformed, "APPEND", 3},
		{"APPEND to tuple", ")K\x01a.", ErrMalformed, "APPEND", 3},
		{"SETITEM on list", "]K\x01K\x02s.", ErrMalformed, "SETITEM", 5},
		{"SETITEMS odd", "}(K\x01u.", ErrMalformed, "SETITEMS", 4},
		{"unhashable key", "}]K\x01s.", ErrMalformed, "SETITEM", 4},
		{"unhashable tuple key", "}]\x85K\x01s.", ErrMalformed, "SETITEM", 5},
		{"APPENDS without MARK", "]e.", ErrMalformed, "APPENDS", 1},
		{"BINGET missing", "h\x03.", ErrMalformed, "BINGET", 0},
		{"MEMOIZE empty stack", "\x94.", ErrMalformed, "MEMOIZE", 0},
		{"TUPLE2 underflow", "K\x01\x86.", ErrMalformed, "TUPLE2", 2},
		{"TUPLE1 across MARK", "K\x01(\x85.", ErrMalformed, "TUPLE1", 3},
		{"POP across MARK", "K\x01(0.", ErrMalformed, "POP", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Decode([]byte(tc.in))
			require.Error(t, err)
			assert.Nil(t, v)
			assert.ErrorIs(t, err, tc.want)
			var pe *Error
			require.True(t, errors.As(err, &pe))
			assert.Equal(t, tc.opName, OpName(pe.Op))
			assert.Equal(t, tc.offset, pe.Offset)
			if tc.opName != "unknown" {
				assert.Contains(t, err.Error(), tc.opName)
			}
		})
	}
}

func TestForbiddenMessageNamesOpcode(t *testing.T) {
	_, err := Decode([]byte(vecOrderedDict))
	require.ErrorIs(t, err, ErrForbidden)
	assert.Equal(t, "pickle: forbidden opcode STACK_GLOBAL (0x93) at offset 39: refusing to load code or objects (only plain data is accepted)", err.Error())
}

func TestErrorMessages(t *testing.T) {
	tests := []struct{ in, want string }{
		{"K\x01", "pickle: truncated input at offset 2: input ended before STOP"},
		{"\x00", "pickle: unknown opcode unknown (0x00) at offset 0"},
		{"J\x01", "pickle: truncated input BININT (0x4a) at offset 0: argument of 4 bytes, 1 remain"},
		{"}]K\x01s.", "pickle: malformed input SETITEM (0x73) at offset 4: unhashable dict key of type list"},
	}
	for _, tc := range tests {
		_, err := Decode([]byte(tc.in))
		assert.EqualError(t, err, tc.want)
	}
	_, err := Read(strings.NewReader("N."), 1)
	assert.EqualError(t, err, "pickle: input too large: more than 1 bytes")
}

func TestRead(t *testing.T) {
	v, err := Read(strings.NewReader(vecEmptyP5), 0)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{}, v)

	_, err = Read(strings.NewReader(vecEmptyP5), int64(len(vecEmptyP5)-1))
	assert.ErrorIs(t, err, ErrTooLarge)

	v, err = Read(strings.NewReader(vecEmptyP5), int64(len(vecEmptyP5)))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{}, v)

	boom := errors.New("boom")
	_, err = Read(errReader{boom}, 0)
	assert.ErrorIs(t, err, boom)
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestTruncationEverywhere cuts every vector at every length: the result is
// always a typed error, never a panic or a partial value.
func TestTruncationEverywhere(t *testing.T) {
	for _, vec := range []string{vecDictP4, vecIntsP2, vecTuplesP2, vecSharedP4, vecIntKeysP4, vecBytesP5, vecFloatsP4} {
		for n := 0; n < len(vec); n++ {
			v, err := Decode([]byte(vec[:n]))
			require.Error(t, err, "prefix %d of %q", n, vec)
			assert.Nil(t, v)
			var pe *Error
			require.True(t, errors.As(err, &pe))
			ok := errors.Is(err, ErrTruncated) || errors.Is(err, ErrMalformed)
			assert.True(t, ok, "prefix %d: %v", n, err)
		}
	}
}

// TestLinearInAdversarialSharing: a tuple referenced many times through the
// memo is converted once, so decoding stays within the allocation bound.
func TestLinearInAdversarialSharing(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("(")
	for range 10000 {
		b.WriteString("K\x01")
	}
	b.WriteString("t\x94]\x94(") // big tuple memoized at 0, list memoized at 1
	for range 100000 {
		b.WriteString("h\x00")
	}
	b.WriteString("e.")
	var v any
	var err error
	n := allocatedBy(func() { v, err = Decode(b.Bytes()) })
	require.NoError(t, err)
	assert.LessOrEqual(t, n, allocBound(b.Len()))
	list := v.([]any)
	require.Len(t, list, 100000)
	first, last := list[0].([]any), list[len(list)-1].([]any)
	assert.Len(t, first, 10000)
	assert.Same(t, &first[0], &last[0])
}

func TestDeepNesting(t *testing.T) {
	// 200k nested lists: ]]]...]a a a ... built with APPEND chain.
	const depth = 200000
	var b bytes.Buffer
	for range depth {
		b.WriteString("]")
	}
	for range depth - 1 {
		b.WriteString("a")
	}
	b.WriteString(".")
	v, err := Decode(b.Bytes())
	require.NoError(t, err)
	n := 1
	for l := v.([]any); len(l) > 0; l = l[0].([]any) {
		n++
	}
	assert.Equal(t, depth, n)
}

func TestDeepKeyTupleRejected(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("}N")
	for range maxKeyDepth + 5 {
		b.WriteString("\x85")
	}
	b.WriteString("N s.")
	_, err := Decode(bytes.ReplaceAll(b.Bytes(), []byte(" "), nil))
	assert.ErrorIs(t, err, ErrMalformed)
}

// FuzzDecode: every input decodes or fails with an *Error and no value,
// and no input makes Decode allocate more than allocBound of its size.
func FuzzDecode(f *testing.F) {
	for _, v := range []string{vecDictP4, vecIntsP2, vecTuplesP2, vecSharedP4, vecIntKeysP4,
		vecEmptyP5, vecBytesP5, vecFloatsP4, vecCycleP4, vecOrderedDict, vecClass, vecSetP4, vecProto0,
		"(\x8c\x01aK\x01\x8c\x01aK\x02d.", "}(\x8c\x01bK\x01K\x07K\x03u."} {
		f.Add([]byte(v))
	}
	for _, b := range [][]byte{dupTupleKey(30), bigStringInKey(300, 50), bigIntKey(300, 20),
		bigTupleKey(100, 20), bigStringKeyManyDicts(300, 20), bigStringKeySetRepeatedly(300, 20)} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v any
		var err error
		n := allocatedBy(func() { v, err = Decode(data) })
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not *Error", err)
			}
			if v != nil {
				t.Fatalf("value %v returned with error", v)
			}
		}
		if n > allocBound(len(data)) {
			t.Fatalf("%d input bytes allocated %d bytes (bound %d)", len(data), n, allocBound(len(data)))
		}
	})
}
