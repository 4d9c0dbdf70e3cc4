package pickle

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"unsafe"
)

// Dict keys
//
// A dict with a key that is not a str is indexed by keyID, a small
// comparable identity: scalars carry their value, and a str, bytes, int
// too big for int64, or tuple carries a number the decoder's interner
// assigns to its content, so that two Python-equal keys (under Dict's
// rules) get equal identities. Identities are computed once per object:
// a tuple caches its own in its node, and a long str, bytes or big int
// is cached by the address of its data, which every reference handed out
// by the memo shares. So a key costs O(elements of the tuples it newly
// meets) and O(bytes of the long values it newly meets), and the whole
// decode stays linear however keys share sub-objects.

// inlineKeyBytes is the length up to which a str or bytes key is interned
// by content at every use (a bounded cost per opcode); longer ones are
// interned once per object.
const inlineKeyBytes = 64

// maxKeyDepth bounds tuple nesting inside dict keys (identities are
// computed recursively, one level per nesting).
const maxKeyDepth = 100

// keyKind tags a keyID.
type keyKind uint8

const (
	keyNone keyKind = iota + 1
	keyFalse
	keyTrue
	keyInt   // bits: the int64
	keyFloat // bits: the IEEE 754 bit pattern
	keyStr   // bits: interned id
	keyBytes // bits: interned id
	keyBig   // bits: interned id
	keyTuple // bits: interned id
)

// keyID is the identity of a hashable value: equal values (under Dict's
// rules) have equal keyIDs.
type keyID struct {
	kind keyKind
	bits uint64
}

// dataRef names a long str or bytes object by its data (and length):
// every reference the memo hands out to one object shares it.
type dataRef struct {
	p *byte
	n int
}

// interner assigns identities to key contents for one decode. Every map
// grows by at most one entry per object first used as a key, and each
// entry holds at most that object's bytes (or 9 bytes per tuple element),
// so its size is linear in the input.
type interner struct {
	ids    map[string]uint64  // kind byte + content -> id (str, bytes, big, tuple)
	byData map[dataRef]keyID  // long str/bytes object -> its identity
	byBig  map[*big.Int]keyID // big int object -> its identity
	buf    []byte             // scratch for building content keys
}

// intern returns the id of (kind, content), assigning the next one the
// first time. content is not retained.
func (in *interner) intern(kind keyKind, content []byte) uint64 {
	in.buf = append(append(in.buf[:0], byte(kind)), content...)
	if id, ok := in.ids[string(in.buf)]; ok { // no allocation for the lookup
		return id
	}
	if in.ids == nil {
		in.ids = make(map[string]uint64)
	}
	id := uint64(len(in.ids)) + 1
	in.ids[string(in.buf)] = id
	return id
}

// blobKey is the identity of a str or bytes key of content b.
func (in *interner) blobKey(kind keyKind, b []byte) keyID {
	if len(b) <= inlineKeyBytes {
		return keyID{kind, in.intern(kind, b)}
	}
	ref := dataRef{unsafe.SliceData(b), len(b)}
	if k, ok := in.byData[ref]; ok && k.kind == kind {
		return k
	}
	k := keyID{kind, in.intern(kind, b)}
	if in.byData == nil {
		in.byData = make(map[dataRef]keyID)
	}
	in.byData[ref] = k
	return k
}

// errNestedTooDeeply is returned by keyOf for tuples past maxKeyDepth.
var errNestedTooDeeply = errors.New("dict key nested too deeply")

// keyOf returns the identity of k, a value on the decoder's stack, or an
// error for an unhashable value.
func (in *interner) keyOf(k any) (keyID, error) {
	switch v := k.(type) {
	case nil:
		return keyID{kind: keyNone}, nil
	case bool:
		if v {
			return keyID{kind: keyTrue}, nil
		}
		return keyID{kind: keyFalse}, nil
	case int64:
		return keyID{keyInt, uint64(v)}, nil
	case float64:
		return keyID{keyFloat, math.Float64bits(v)}, nil
	case string:
		return in.blobKey(keyStr, unsafe.Slice(unsafe.StringData(v), len(v))), nil
	case []byte:
		return in.blobKey(keyBytes, v), nil
	case *big.Int:
		if k, ok := in.byBig[v]; ok {
			return k, nil
		}
		// Sign and magnitude bytes: linear, unlike a decimal conversion.
		b := make([]byte, 1+(v.BitLen()+7)/8)
		b[0] = byte(v.Sign() + 1)
		v.FillBytes(b[1:])
		k := keyID{keyBig, in.intern(keyBig, b)}
		if in.byBig == nil {
			in.byBig = make(map[*big.Int]keyID)
		}
		in.byBig[v] = k
		return k, nil
	case *node:
		if v.kind != kindTuple {
			return keyID{}, fmt.Errorf("unhashable dict key of type %s", typeName(v))
		}
		if v.depth > maxKeyDepth {
			return keyID{}, errNestedTooDeeply
		}
		return in.tupleKey(v)
	}
	return keyID{}, fmt.Errorf("unhashable dict key of type %T", k)
}

// tupleKey returns (and caches) the identity of tuple t, whose depth has
// been checked: the recursion below is at most maxKeyDepth deep, and it
// only descends into tuples whose identity is not cached yet.
func (in *interner) tupleKey(t *node) (keyID, error) {
	if t.keyed {
		return t.key, nil
	}
	enc := make([]byte, 0, 9*len(t.items))
	for _, it := range t.items {
		k, err := in.keyOf(it)
		if err != nil {
			return keyID{}, err
		}
		enc = append(enc, byte(k.kind))
		enc = binary.LittleEndian.AppendUint64(enc, k.bits)
	}
	t.key, t.keyed = keyID{keyTuple, in.intern(keyTuple, enc)}, true
	return t.key, nil
}

// tupleDepth is the key nesting depth of a tuple with these items: 1 plus
// the deepest tuple among them, saturating past maxKeyDepth.
func tupleDepth(items []any) uint8 {
	var d uint8
	for _, it := range items {
		if n, ok := it.(*node); ok && n.kind == kindTuple && n.depth > d {
			d = n.depth
		}
	}
	if d > maxKeyDepth {
		return d
	}
	return d + 1
}

// keyComparer compares decoded keys for Dict.Get. It remembers the tuple
// pairs it has found equal, so comparing keys that share sub-tuples costs
// one step per distinct pair of tuples rather than per path through them.
type keyComparer struct {
	memo map[[2]*any]bool // (first element of a, of b) -> equal, for tuples of the same length
}

// eq reports whether a and b are equal keys under Dict's rules: same Go
// type and value, floats by bit pattern, tuples ([]any) element-wise, at
// most maxKeyDepth deep.
func (c *keyComparer) eq(a, b any, depth int) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool, int64, string:
		return a == b
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case *big.Int:
		y, ok := b.(*big.Int)
		return ok && x.Cmp(y) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) || depth >= maxKeyDepth {
			return false
		}
		if len(x) == 0 || &x[0] == &y[0] {
			return true // tuples are immutable: the same elements are equal
		}
		pair := [2]*any{&x[0], &y[0]}
		if r, ok := c.memo[pair]; ok {
			return r
		}
		r := true
		for i := range x {
			if !c.eq(x[i], y[i], depth+1) {
				r = false
				break
			}
		}
		if c.memo == nil {
			c.memo = make(map[[2]*any]bool)
		}
		c.memo[pair] = r
		return r
	}
	return false
}
