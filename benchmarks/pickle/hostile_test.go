package pickle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hostile inputs: small pickles that cost far more than their size to a
// decoder that re-encodes shared sub-objects or hashes big keys again at
// every use. Each builder returns a complete pickle program.

// dupTupleKey is the 2^depth key: N, then depth times DUP+TUPLE2, so that
// level i is the pair (level i-1, level i-1); the result is used as a key.
func dupTupleKey(depth int) []byte {
	var b bytes.Buffer
	b.WriteString("}N")
	b.WriteString(strings.Repeat("2\x86", depth))
	b.WriteString("Ns.")
	return b.Bytes()
}

// bigStringInKey memoizes one str of n bytes and builds a key tuple that
// references it refs times.
func bigStringInKey(n, refs int) []byte {
	var b bytes.Buffer
	b.WriteString("}")
	b.WriteByte(opBinUnicode)
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(n)))
	b.WriteString(strings.Repeat("s", n))
	b.WriteString("\x940(")
	b.WriteString(strings.Repeat("h\x00", refs))
	b.WriteString("tNs.")
	return b.Bytes()
}

// bigIntKey memoizes one integer of n bytes (LONG4) and sets it as a key
// sets times.
func bigIntKey(n, sets int) []byte {
	var b bytes.Buffer
	b.WriteString("}")
	b.WriteByte(opLong4)
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(n)))
	b.Write(bytes.Repeat([]byte{0x5a}, n)) // positive, no byte fits int64
	b.WriteString("\x940")
	b.WriteString(strings.Repeat("h\x00Ns", sets))
	b.WriteString(".")
	return b.Bytes()
}

// bigTupleKey memoizes a tuple of items small ints and sets it as a key
// sets times.
func bigTupleKey(items, sets int) []byte {
	var b bytes.Buffer
	b.WriteString("}(")
	b.WriteString(strings.Repeat("K\x07", items))
	b.WriteString("t\x940")
	b.WriteString(strings.Repeat("h\x00Ns", sets))
	b.WriteString(".")
	return b.Bytes()
}

// bigStringKeyManyDicts memoizes one str of n bytes and uses it as the key
// of dicts new dicts, all kept in a list.
func bigStringKeyManyDicts(n, dicts int) []byte {
	var b bytes.Buffer
	b.WriteString("](")
	b.WriteByte(opBinUnicode)
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(n)))
	b.WriteString(strings.Repeat("s", n))
	b.WriteString("\x940")
	b.WriteString(strings.Repeat("}h\x00Ns", dicts))
	b.WriteString("e.")
	return b.Bytes()
}

// bigStringKeySetRepeatedly sets one str key of n bytes sets times in one
// dict.
func bigStringKeySetRepeatedly(n, sets int) []byte {
	var b bytes.Buffer
	b.WriteString("}")
	b.WriteByte(opBinUnicode)
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(n)))
	b.WriteString(strings.Repeat("s", n))
	b.WriteString("\x940")
	b.WriteString(strings.Repeat("h\x00Ns", sets))
	b.WriteString(".")
	return b.Bytes()
}

// Allocation bound the tests and FuzzDecode hold Decode to: at most
// allocPerByte bytes per input byte plus allocBase. The worst single
// opcodes measured allocate about 165 bytes per input byte (EMPTY_LIST,
// EMPTY_DICT, EMPTY_TUPLE: a container node and its stack slot).
const (
	allocPerByte = 512
	allocBase    = 256 << 10
)

// allocBound is the most Decode may allocate for n input bytes.
func allocBound(n int) uint64 { return allocPerByte*uint64(n) + allocBase }

// allocatedBy returns the bytes f allocates on the heap (a process-wide
// count, so callers must not run allocating goroutines meanwhile).
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHostileShapes decodes each hostile shape at its full size: each
// either decodes or fails with ErrBudget, and allocates within allocBound
// of its size. Before identities were cached, the first
// four cost 2^depth, gigabytes, a second per SETITEM and a megabyte per
// SETITEM respectively.
func TestHostileShapes(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		wantErr error // nil: decodes
	}{
		{"DUP+TUPLE2 key of depth 40", dupTupleKey(40), nil},
		{"DUP+TUPLE2 key of depth 99", dupTupleKey(99), nil},
		{"1 MiB str referenced 5000 times in one key", bigStringInKey(1<<20, 5000), nil},
		{"1 MiB int key set 1000 times", bigIntKey(1<<20, 1000), nil},
		{"100k-element tuple key set 10000 times", bigTupleKey(100_000, 10_000), nil},
		{"1 MiB str key of 100000 dicts", bigStringKeyManyDicts(1<<20, 100_000), ErrBudget},
		{"1 MiB str key set 100000 times", bigStringKeySetRepeatedly(1<<20, 100_000), ErrBudget},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v any
			var err error
			n := allocatedBy(func() { v, err = Decode(tc.in) })
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.Nil(t, v)
				var pe *Error
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "SETITEM", OpName(pe.Op))
			} else {
				require.NoError(t, err)
				d, ok := v.(*Dict)
				if ok {
					assert.Equal(t, 1, d.Len(), "every SETITEM sets the same key")
				} else {
					l, ok := v.([]any)
					require.True(t, ok, "got %T", v)
					assert.NotEmpty(t, l)
				}
			}
			assert.LessOrEqual(t, n, allocBound(len(tc.in)),
				"%d input bytes allocated %d bytes (%.1f per byte)", len(tc.in), n, float64(n)/float64(len(tc.in)))
		})
	}
}

// TestSharedKeyDecodesShared checks the value of the 2^depth key: each
// level is a pair of the same tuple, shared, not copied.
func TestSharedKeyDecodesShared(t *testing.T) {
	const depth = 60
	v, err := Decode(dupTupleKey(depth))
	require.NoError(t, err)
	d := v.(*Dict)
	require.Equal(t, 1, d.Len())
	k := d.Items[0].Key
	for i := range depth {
		pair, ok := k.([]any)
		require.True(t, ok, "level %d is %T", i, k)
		require.Len(t, pair, 2)
		a, b := pair[0], pair[1]
		if i < depth-1 {
			assert.Same(t, &a.([]any)[0], &b.([]any)[0], "level %d shares its halves", i)
		}
		k = a
	}
	assert.Nil(t, k)

	// Get finds it both by the decoded key and by an equal key built
	// independently (with its own sharing), one step per level.
	got, ok := d.Get(d.Items[0].Key)
	assert.True(t, ok)
	assert.Nil(t, got)
	var mine any
	for range depth {
		mine = []any{mine, mine}
	}
	_, ok = d.Get(mine)
	assert.True(t, ok)
	var other any = int64(1)
	for range depth {
		other = []any{other, other}
	}
	_, ok = d.Get(other)
	assert.False(t, ok, "a different leaf is a different key")
}

// TestKeyIdentity: keys equal under Dict's rules are one entry however they
// are spelled or shared; different ones are different entries.
func TestKeyIdentity(t *testing.T) {
	long := strings.Repeat("k", inlineKeyBytes+1)
	bin := func(s string) string {
		return string(opBinUnicode) + string(binary.LittleEndian.AppendUint32(nil, uint32(len(s)))) + s
	}
	tests := []struct {
		name string
		in   string
		want int // entries
	}{
		{"same long str written twice", "}K\x01K\x01s" + bin(long) + "K\x01s" + bin(long) + "K\x02s.", 2},
		{"long str and its memo reference", "}K\x01K\x01s" + bin(long) + "\x94K\x01sh\x00K\x02s.", 2},
		{"long str differing in the last byte", "}K\x01K\x01s" + bin(long) + "K\x01s" + bin(long[1:]+"j") + "K\x02s.", 3},
		{"str and bytes of the same content", "}K\x01K\x01s" + bin("ab") + "K\x01sC\x02abK\x02s.", 3},
		{"big int padded differently", "}\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00K\x01s\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x80\x00\x00K\x02s.", 1},
		{"big int and its negation", "}\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00K\x01s\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xffK\x02s.", 2},
		{"equal tuples built twice", "}K\x01K\x02\x86K\x01sK\x01K\x02\x86K\x02s.", 1},
		{"tuples differing in order", "}K\x01K\x02\x86K\x01sK\x02K\x01\x86K\x02s.", 2},
		{"int and float", "}K\x01K\x01sG?\xf0\x00\x00\x00\x00\x00\x00K\x02s.", 2},
		{"None, True, False", "}NK\x01s\x88K\x01s\x89K\x01sNK\x02s.", 3},
		{"nested and flat", "}K\x01\x85\x85K\x01sK\x01\x85K\x02s.", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Decode([]byte(tc.in))
			require.NoError(t, err)
			d, ok := v.(*Dict)
			require.True(t, ok, "got %T", v)
			assert.Equal(t, tc.want, d.Len())
			for _, it := range d.Items {
				got, ok := d.Get(it.Key)
				assert.True(t, ok)
				assert.Equal(t, it.Value, got, "Get agrees with the decoder on %v", it.Key)
			}
		})
	}
}

// TestLongStrKeysWithinBudget: dicts whose long str keys are each written
// out (as real data is) stay far inside the budget.
func TestLongStrKeysWithinBudget(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("}")
	for i := range 2000 {
		key := fmt.Sprintf("%04d", i) + strings.Repeat("x", 1020)
		b.WriteByte(opBinUnicode)
		b.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(key))))
		b.WriteString(key)
		b.WriteString("K\x01s")
	}
	b.WriteString(".")
	v, err := Decode(b.Bytes())
	require.NoError(t, err)
	assert.Len(t, v.(map[string]any), 2000)
}

// BenchmarkHostileShapes decodes each hostile shape at its full size; alloc-B/in-B is the allocation per input byte (at most
// allocPerByte, plus allocBase in all).
//
//	go test ./benchmarks/pickle -run '^$' -bench Hostile -benchmem
func BenchmarkHostileShapes(b *testing.B) {
	shapes := []struct {
		name string
		in   []byte
	}{
		{"dup-tuple-key-depth-40", dupTupleKey(40)},
		{"1MiB-str-x5000-in-key", bigStringInKey(1<<20, 5000)},
		{"1MiB-int-key-x1000", bigIntKey(1<<20, 1000)},
		{"100k-tuple-key-x10000", bigTupleKey(100_000, 10_000)},
		{"1MiB-str-key-x100000-dicts", bigStringKeyManyDicts(1<<20, 100_000)},
	}
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(int64(len(s.in)))
			b.ReportAllocs()
			var total uint64
			for b.Loop() {
				total += allocatedBy(func() { _, _ = Decode(s.in) })
			}
			b.ReportMetric(float64(total)/float64(b.N)/float64(len(s.in)), "alloc-B/in-B")
		})
	}
}
