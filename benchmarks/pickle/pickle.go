// Package pickle decodes the data-only subset of Python's pickle format that
// PyTorch memory snapshots (torch.cuda.memory._dump_snapshot) are written in.
//
// # Why a restricted decoder
//
// Unpickling in Python can import modules and call arbitrary functions: the
// GLOBAL/STACK_GLOBAL opcodes name a callable and REDUCE/BUILD/NEWOBJ/OBJ/
// INST call it. This decoder never resolves names or calls anything; it
// refuses every such opcode with ErrForbidden (naming the opcode) before
// touching the rest of the input. What remains is a plain stack machine over
// containers and scalars.
//
// # Supported opcodes (protocols 2–5)
//
//   - framing/control: PROTO (versions 0–5), FRAME, STOP, MARK, POP, POP_MARK, DUP
//   - memo: MEMOIZE, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET
//   - None/bool: NONE, NEWTRUE, NEWFALSE
//   - int: BININT, BININT1, BININT2, LONG1, LONG4
//   - float: BINFLOAT
//   - str: SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
//   - bytes: SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
//   - list: EMPTY_LIST, LIST, APPEND, APPENDS
//   - tuple: EMPTY_TUPLE, TUPLE, TUPLE1, TUPLE2, TUPLE3
//   - dict: EMPTY_DICT, DICT, SETITEM, SETITEMS
//
// Forbidden (ErrForbidden): GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ,
// NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1, EXT2, EXT4. Other opcodes that
// pickle defines (the protocol-0 text opcodes, py2 strings, sets,
// out-of-band buffers) fail with ErrUnsupported; bytes that are not pickle
// opcodes fail with ErrUnknownOpcode. Input that ends early fails with
// ErrTruncated, and structurally wrong input (stack underflow, APPEND to a
// non-list, a missing memo entry, an unhashable dict key) with ErrMalformed.
// All of these are returned inside an *Error carrying the offset and opcode.
//
// # Value mapping
//
//	None            nil
//	bool            bool
//	int             int64, or *big.Int when it does not fit in 64 bits
//	float           float64
//	str             string (bytes kept as written, not UTF-8 validated)
//	bytes/bytearray []byte
//	list, tuple     []any
//	dict            map[string]any when every key is a str (an empty dict too),
//	                otherwise *Dict, which keeps insertion order
//
// Sharing is preserved: an object referenced twice through the memo decodes
// to one Go value (the same map or the same slice backing array), and
// self-referencing containers decode to self-referencing Go values. So
// callers walking arbitrary input (fmt, encoding/json, reflect.DeepEqual)
// must guard against cycles and against sharing: 87 bytes of DUP+TUPLE2
// decode to a value of 2^40 paths, which the decoder builds in 40 steps but
// a naive walk visits path by path. Visit each container once.
//
// # Resource bounds
//
// Input comes from strangers, so decoding is a single pass over an
// in-memory buffer without recursion (beyond the bounded key nesting
// below), and time and memory are linear in the input size for every
// opcode sequence:
//
//   - every length prefix is checked against the bytes that remain before
//     anything is allocated, and each opcode creates at most one value;
//   - the final conversion visits each container once;
//   - a dict key's identity is computed once per object, not once per use.
//     A tuple's identity is an interned number built from its elements'
//     identities and cached in the tuple, so a key that references shared
//     sub-tuples (DUP+TUPLE2 repeated n times is a tuple with 2^n leaves)
//     costs one step per distinct tuple; a str or bytes longer than 64
//     bytes, or an int beyond 64 bits, is interned once by content and its
//     identity cached by object (a 1 MiB str or int referenced by a
//     thousand keys is hashed once). Ints are keyed by their magnitude
//     bytes, never by a decimal conversion. Tuple keys nest at most 100
//     deep (ErrMalformed beyond).
//
// One cost is not linear by construction: a dict whose keys are all str
// decodes to a Go map, and a Go map hashes the whole string at every
// insertion, so a long str used as a key by many dicts (or set into one
// dict many times) is hashed every time. The decoder charges every hash
// of a str key longer than 64 bytes to a budget of
// [KeyWorkPerByte] bytes per input byte plus [KeyWorkBase], and stops with
// ErrBudget when it runs out. Real snapshots charge nothing: none of the
// eight in shared/traces has a str key longer than 64 bytes.
// Read bounds the input size itself. The package's tests and fuzz target
// (and fuzz.FuzzPickle) hold decoding n bytes to at most 512n + 256 KiB
// of allocation; the worst shapes measured allocate about 165 bytes per
// input byte (a run of EMPTY_LIST: a container per byte).
//
// The package holds no global state; Decode is safe for concurrent use.
package pickle

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
)

// Sentinel errors, matched with errors.Is. Every error returned by Decode
// and Read (other than an I/O error from the reader) is an *Error wrapping
// exactly one of them.
var (
	// ErrForbidden reports an opcode that would import or call Python code
	// (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX,
	// PERSID, BINPERSID, EXT1, EXT2, EXT4). Such input is refused.
	ErrForbidden = errors.New("pickle: forbidden opcode")
	// ErrUnsupported reports a valid pickle opcode outside the data subset
	// this decoder implements, or a protocol newer than 5.
	ErrUnsupported = errors.New("pickle: unsupported opcode")
	// ErrUnknownOpcode reports a byte that is not a pickle opcode.
	ErrUnknownOpcode = errors.New("pickle: unknown opcode")
	// ErrTruncated reports input that ends before STOP or in the middle of
	// an opcode argument, including a length prefix that claims more bytes
	// than remain.
	ErrTruncated = errors.New("pickle: truncated input")
	// ErrMalformed reports input that is not a consistent pickle program:
	// stack underflow, a missing MARK or memo entry, APPEND/SETITEM on the
	// wrong type, an unhashable dict key.
	ErrMalformed = errors.New("pickle: malformed input")
	// ErrTooLarge reports input longer than the limit given to Read.
	ErrTooLarge = errors.New("pickle: input too large")
	// ErrBudget reports input whose dict keys would cost more to hash than
	// the budget the package documents (see Resource bounds): a long str
	// used as a key over and over.
	ErrBudget = errors.New("pickle: input exceeds the key hashing budget")
)

// Key hashing budget: decoding n bytes may hash at most
// KeyWorkPerByte*n + KeyWorkBase bytes of long str keys.
const (
	KeyWorkPerByte = 16
	KeyWorkBase    = 16 << 20
)

// Error describes where and why decoding stopped.
type Error struct {
	Offset int64  // byte offset of the opcode that failed (input length for ErrTooLarge)
	Op     byte   // the opcode byte at Offset; 0 when the input ended before an opcode
	Err    error  // one of the package's sentinel errors
	Detail string // human-readable specifics; may be empty
}

// Error implements error.
func (e *Error) Error() string {
	s := e.Err.Error()
	switch {
	case e.Err == ErrTooLarge:
	case e.Op == 0 && e.Err != ErrUnknownOpcode: // not tied to an opcode (input ended)
		s += fmt.Sprintf(" at offset %d", e.Offset)
	default:
		s += fmt.Sprintf(" %s (0x%02x) at offset %d", OpName(e.Op), e.Op, e.Offset)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel error.
func (e *Error) Unwrap() error { return e.Err }

// Dict is a decoded Python dict that has at least one key that is not a
// str. Items are in insertion order; a key set twice keeps its first
// position and its last value, as in Python. Keys are compared by Go type
// and value (tuples element-wise), so unlike Python, True, 1 and 1.0 are
// three different keys here.
type Dict struct {
	Items []Item // entries in insertion order
}

// Item is one key/value pair of a Dict.
type Item struct {
	Key   any // a hashable decoded value: nil, bool, int64, *big.Int, float64, string, []byte or a tuple ([]any)
	Value any // any decoded value
}

// Len returns the number of entries.
func (d *Dict) Len() int { return len(d.Items) }

// Get returns the value for key, comparing keys as Dict documents (a
// tuple key is a []any). It is a linear scan; the dicts this type
// represents are small in practice. Tuples that share sub-tuples are
// compared once per distinct pair, so keys built by repeated sharing do
// not cost exponential time.
func (d *Dict) Get(key any) (any, bool) {
	var c keyComparer
	for _, it := range d.Items {
		if c.eq(key, it.Key, 0) {
			return it.Value, true
		}
	}
	return nil, false
}

// Decode decodes one pickle from data and returns its value. Bytes after
// the STOP opcode are ignored, as Python's pickle.loads does. data is not
// retained: strings and byte slices in the result are copies.
func Decode(data []byte) (any, error) {
	d := decoder{data: data, budget: KeyWorkPerByte*int64(len(data)) + KeyWorkBase}
	return d.run()
}

// Read reads all of r (at most maxBytes bytes; maxBytes <= 0 means 1 GiB)
// and decodes it with Decode. Input longer than maxBytes fails with
// ErrTooLarge without being decoded.
func Read(r io.Reader, maxBytes int64) (any, error) {
	if maxBytes <= 0 {
		maxBytes = 1 << 30
	}
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("pickle: reading input: %w", err)
	}
	if int64(len(data)) > maxBytes {
		return nil, &Error{Offset: maxBytes, Err: ErrTooLarge,
			Detail: fmt.Sprintf("more than %d bytes", maxBytes)}
	}
	return Decode(data)
}

// Opcodes.
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opFloat          = 'F'
	opInt            = 'I'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opLong           = 'L'
	opBinInt2        = 'M'
	opNone           = 'N'
	opPersID         = 'P'
	opBinPersID      = 'Q'
	opReduce         = 'R'
	opString         = 'S'
	opBinString      = 'T'
	opShortBinString = 'U'
	opUnicode        = 'V'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opBuild          = 'b'
	opGlobal         = 'c'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opGet            = 'g'
	opBinGet         = 'h'
	opInst           = 'i'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opObj            = 'o'
	opPut            = 'p'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinFloat       = 'G'
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opProto          = 0x80
	opNewObj         = 0x81
	opExt1           = 0x82
	opExt2           = 0x83
	opExt4           = 0x84
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opEmptySet       = 0x8f
	opAddItems       = 0x90
	opFrozenSet      = 0x91
	opNewObjEx       = 0x92
	opStackGlobal    = 0x93
	opMemoize        = 0x94
	opFrame          = 0x95
	opByteArray8     = 0x96
	opNextBuffer     = 0x97
	opReadonlyBuffer = 0x98
)

var opNames = map[byte]string{
	opMark: "MARK", opStop: "STOP", opPop: "POP", opPopMark: "POP_MARK", opDup: "DUP",
	opFloat: "FLOAT", opInt: "INT", opBinInt: "BININT", opBinInt1: "BININT1", opLong: "LONG",
	opBinInt2: "BININT2", opNone: "NONE", opPersID: "PERSID", opBinPersID: "BINPERSID",
	opReduce: "REDUCE", opString: "STRING", opBinString: "BINSTRING",
	opShortBinString: "SHORT_BINSTRING", opUnicode: "UNICODE", opBinUnicode: "BINUNICODE",
	opAppend: "APPEND", opBuild: "BUILD", opGlobal: "GLOBAL", opDict: "DICT",
	opEmptyDict: "EMPTY_DICT", opAppends: "APPENDS", opGet: "GET", opBinGet: "BINGET",
	opInst: "INST", opLongBinGet: "LONG_BINGET", opList: "LIST", opEmptyList: "EMPTY_LIST",
	opObj: "OBJ", opPut: "PUT", opBinPut: "BINPUT", opLongBinPut: "LONG_BINPUT",
	opSetItem: "SETITEM", opTuple: "TUPLE", opEmptyTuple: "EMPTY_TUPLE", opSetItems: "SETITEMS",
	opBinFloat: "BINFLOAT", opBinBytes: "BINBYTES", opShortBinBytes: "SHORT_BINBYTES",
	opProto: "PROTO", opNewObj: "NEWOBJ", opExt1: "EXT1", opExt2: "EXT2", opExt4: "EXT4",
	opTuple1: "TUPLE1", opTuple2: "TUPLE2", opTuple3: "TUPLE3", opNewTrue: "NEWTRUE",
	opNewFalse: "NEWFALSE", opLong1: "LONG1", opLong4: "LONG4", opShortBinUni: "SHORT_BINUNICODE",
	opBinUnicode8: "BINUNICODE8", opBinBytes8: "BINBYTES8", opEmptySet: "EMPTY_SET",
	opAddItems: "ADDITEMS", opFrozenSet: "FROZENSET", opNewObjEx: "NEWOBJ_EX",
	opStackGlobal: "STACK_GLOBAL", opMemoize: "MEMOIZE", opFrame: "FRAME",
	opByteArray8: "BYTEARRAY8", opNextBuffer: "NEXT_BUFFER", opReadonlyBuffer: "READONLY_BUFFER",
}

// OpName returns the pickletools name of opcode op ("STACK_GLOBAL"), or
// "unknown" for a byte that is not an opcode.
func OpName(op byte) string {
	if n, ok := opNames[op]; ok {
		return n
	}
	return "unknown"
}

// maxProtocol is the newest pickle protocol understood.
const maxProtocol = 5

// node is a container under construction. Lists and dicts are mutable
// (APPEND/SETITEM reach them through the memo after creation), so the
// decoder works on pointers and converts to the public representation once
// at STOP, in place, so that shared and cyclic references survive.
type node struct {
	kind  nodeKind
	depth uint8      // tuples: key nesting depth (see tupleDepth)
	keyed bool       // tuples: key holds the tuple's identity
	done  bool       // out has been assigned (its children may still be converting)
	key   keyID      // tuples: identity as a dict key, computed on first use
	items []any      // list/tuple elements; converted in place at the end
	dict  *dictState // dicts: entries, once the first is set
	out   any        // public value, valid once done
}

// dictState holds a dict's entries. While every key is a str, m holds the
// entries and keys their insertion order; after the first non-str key,
// ordered holds every entry and index maps each key's identity to its
// position in ordered.
type dictState struct {
	m       map[string]any
	keys    []string
	ordered []Item
	index   map[keyID]int
}

type nodeKind uint8

const (
	kindList nodeKind = iota
	kindTuple
	kindDict
)

// decoder is the state of one Decode call.
type decoder struct {
	data   []byte
	pos    int   // next byte to read
	opPos  int   // offset of the opcode being executed
	op     byte  // opcode being executed
	stack  []any // operand stack
	marks  []int // stack heights saved by MARK
	memo   []any // dense memo: index i at memo[i]
	sparse map[uint32]any
	keys   interner // dict key identities
	work   int64    // bytes of long str keys hashed so far (see ErrBudget)
	budget int64    // limit on work
}

func (d *decoder) fail(sentinel error, format string, args ...any) error {
	return &Error{Offset: int64(d.opPos), Op: d.op, Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// take returns the next n bytes of argument, or ErrTruncated.
func (d *decoder) take(n uint64) ([]byte, error) {
	if rem := uint64(len(d.data) - d.pos); n > rem {
		return nil, d.fail(ErrTruncated, "argument of %d bytes, %d remain", n, rem)
	}
	b := d.data[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b, nil
}

func (d *decoder) push(v any) { d.stack = append(d.stack, v) }

func (d *decoder) pop() (any, error) {
	if len(d.stack) == 0 || (len(d.marks) > 0 && len(d.stack) <= d.marks[len(d.marks)-1]) {
		return nil, d.fail(ErrMalformed, "stack underflow")
	}
	v := d.stack[len(d.stack)-1]
	d.stack = d.stack[:len(d.stack)-1]
	return v, nil
}

func (d *decoder) top() (any, error) {
	if len(d.stack) == 0 || (len(d.marks) > 0 && len(d.stack) <= d.marks[len(d.marks)-1]) {
		return nil, d.fail(ErrMalformed, "stack underflow")
	}
	return d.stack[len(d.stack)-1], nil
}

// popMark removes everything above the most recent MARK and the mark
// itself, returning the removed items (aliasing the stack's array; copy
// before pushing).
func (d *decoder) popMark() ([]any, error) {
	if len(d.marks) == 0 {
		return nil, d.fail(ErrMalformed, "no MARK on the stack")
	}
	k := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := d.stack[k:]
	d.stack = d.stack[:k]
	return items, nil
}

func (d *decoder) memoPut(idx uint32) error {
	v, err := d.top()
	if err != nil {
		return err
	}
	switch {
	case uint64(idx) < uint64(len(d.memo)):
		d.memo[idx] = v
	case uint64(idx) == uint64(len(d.memo)):
		d.memo = append(d.memo, v)
	default:
		if d.sparse == nil {
			d.sparse = make(map[uint32]any)
		}
		d.sparse[idx] = v
	}
	return nil
}

func (d *decoder) memoGet(idx uint32) error {
	if uint64(idx) < uint64(len(d.memo)) {
		d.push(d.memo[idx])
		return nil
	}
	if v, ok := d.sparse[idx]; ok {
		d.push(v)
		return nil
	}
	return d.fail(ErrMalformed, "memo index %d not set", idx)
}

func (d *decoder) newTuple(items []any) {
	cp := make([]any, len(items))
	copy(cp, items)
	d.push(&node{kind: kindTuple, depth: tupleDepth(cp), items: cp})
}

// tupleN pops n items into a tuple.
func (d *decoder) tupleN(n int) error {
	base := len(d.stack) - n
	if base < 0 || (len(d.marks) > 0 && base < d.marks[len(d.marks)-1]) {
		return d.fail(ErrMalformed, "stack underflow")
	}
	items := d.stack[base:]
	d.stack = d.stack[:base]
	d.newTuple(items)
	return nil
}

func (d *decoder) appendItems(target any, items []any) error {
	n, ok := target.(*node)
	if !ok || n.kind != kindList {
		return d.fail(ErrMalformed, "append to %s", typeName(target))
	}
	n.items = append(n.items, items...)
	return nil
}

func (d *decoder) setItems(target any, kv []any) error {
	n, ok := target.(*node)
	if !ok || n.kind != kindDict {
		return d.fail(ErrMalformed, "setitem on %s", typeName(target))
	}
	if len(kv)%2 != 0 {
		return d.fail(ErrMalformed, "odd number of items (%d) for SETITEMS", len(kv))
	}
	for i := 0; i < len(kv); i += 2 {
		if err := d.setItem(n, kv[i], kv[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) setItem(n *node, k, v any) error {
	ds := n.dict
	if ds == nil {
		ds = &dictState{}
		n.dict = ds
	}
	if s, ok := k.(string); ok && ds.ordered == nil {
		// A Go map hashes the whole string at each use: charge long ones.
		if len(s) > inlineKeyBytes {
			if d.work += int64(len(s)); d.work > d.budget {
				return d.fail(ErrBudget, "str keys of more than %d bytes hashed %d bytes, limit %d for %d input bytes",
					inlineKeyBytes, d.work, d.budget, len(d.data))
			}
		}
		if ds.m == nil {
			ds.m = make(map[string]any)
		}
		before := len(ds.m)
		ds.m[s] = v
		if len(ds.m) > before {
			ds.keys = append(ds.keys, s)
		}
		return nil
	}
	h, err := d.keys.keyOf(k)
	if err != nil {
		return d.fail(ErrMalformed, "%v", err)
	}
	if ds.ordered == nil {
		// First non-str key: move the str entries over in insertion order.
		ds.ordered = make([]Item, 0, len(ds.keys)+1)
		ds.index = make(map[keyID]int, len(ds.keys)+1)
		for _, s := range ds.keys {
			ks, _ := d.keys.keyOf(s) // a str always has an identity
			ds.index[ks] = len(ds.ordered)
			ds.ordered = append(ds.ordered, Item{Key: s, Value: ds.m[s]})
		}
		ds.m, ds.keys = nil, nil
	}
	if i, dup := ds.index[h]; dup {
		ds.ordered[i].Value = v
		return nil
	}
	ds.index[h] = len(ds.ordered)
	ds.ordered = append(ds.ordered, Item{Key: k, Value: v})
	return nil
}

func typeName(v any) string {
	switch x := v.(type) {
	case *node:
		switch x.kind {
		case kindList:
			return "list"
		case kindTuple:
			return "tuple"
		default:
			return "dict"
		}
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	}
	return fmt.Sprintf("%T", v)
}

// decodeLong decodes a little-endian two's-complement integer.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var u uint64
		for i := len(b) - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		// Sign-extend from len(b) bytes.
		shift := uint(64 - 8*len(b))
		return int64(u<<shift) >> shift
	}
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	v := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if v.IsInt64() {
		return v.Int64()
	}
	return v
}

var forbidden = map[byte]bool{
	opGlobal: true, opStackGlobal: true, opReduce: true, opBuild: true, opInst: true,
	opObj: true, opNewObj: true, opNewObjEx: true, opPersID: true, opBinPersID: true,
	opExt1: true, opExt2: true, opExt4: true,
}

// run executes the pickle program and converts the result.
func (d *decoder) run() (any, error) {
	for {
		if d.pos >= len(d.data) {
			d.opPos, d.op = d.pos, 0
			return nil, d.fail(ErrTruncated, "input ended before STOP")
		}
		d.opPos = d.pos
		d.op = d.data[d.pos]
		d.pos++
		if err := d.step(); err != nil {
			if err == errStop {
				v, err := d.pop()
				if err != nil {
					return nil, err
				}
				return convert(v), nil
			}
			return nil, err
		}
	}
}

var errStop = errors.New("stop")

// step executes the opcode in d.op.
func (d *decoder) step() error {
	switch op := d.op; op {
	case opStop:
		return errStop
	case opProto:
		b, err := d.take(1)
		if err != nil {
			return err
		}
		if b[0] > maxProtocol {
			return d.fail(ErrUnsupported, "protocol %d (newest supported is %d)", b[0], maxProtocol)
		}
	case opFrame:
		b, err := d.take(8)
		if err != nil {
			return err
		}
		if n := binary.LittleEndian.Uint64(b); n > uint64(len(d.data)-d.pos) {
			return d.fail(ErrTruncated, "frame of %d bytes, %d remain", n, len(d.data)-d.pos)
		}
	case opMark:
		d.marks = append(d.marks, len(d.stack))
	case opPop:
		_, err := d.pop()
		return err
	case opPopMark:
		_, err := d.popMark()
		return err
	case opDup:
		v, err := d.top()
		if err != nil {
			return err
		}
		d.push(v)

	case opMemoize:
		return d.memoPut(uint32(len(d.memo)))
	case opBinPut:
		b, err := d.take(1)
		if err != nil {
			return err
		}
		return d.memoPut(uint32(b[0]))
	case opLongBinPut:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		return d.memoPut(binary.LittleEndian.Uint32(b))
	case opBinGet:
		b, err := d.take(1)
		if err != nil {
			return err
		}
		return d.memoGet(uint32(b[0]))
	case opLongBinGet:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		return d.memoGet(binary.LittleEndian.Uint32(b))

	case opNone:
		d.push(nil)
	case opNewTrue:
		d.push(true)
	case opNewFalse:
		d.push(false)
	case opBinInt:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		d.push(int64(int32(binary.LittleEndian.Uint32(b))))
	case opBinInt1:
		b, err := d.take(1)
		if err != nil {
			return err
		}
		d.push(int64(b[0]))
	case opBinInt2:
		b, err := d.take(2)
		if err != nil {
			return err
		}
		d.push(int64(binary.LittleEndian.Uint16(b)))
	case opLong1:
		b, err := d.take(1)
		if err != nil {
			return err
		}
		v, err := d.take(uint64(b[0]))
		if err != nil {
			return err
		}
		d.push(decodeLong(v))
	case opLong4:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		n := int32(binary.LittleEndian.Uint32(b))
		if n < 0 {
			return d.fail(ErrMalformed, "negative LONG4 length %d", n)
		}
		v, err := d.take(uint64(n))
		if err != nil {
			return err
		}
		d.push(decodeLong(v))
	case opBinFloat:
		b, err := d.take(8)
		if err != nil {
			return err
		}
		d.push(math.Float64frombits(binary.BigEndian.Uint64(b)))

	case opShortBinUni, opShortBinBytes:
		b, err := d.take(1)
		if err != nil {
			return err
		}
		return d.pushBlob(uint64(b[0]), op == opShortBinUni)
	case opBinUnicode, opBinBytes:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		return d.pushBlob(uint64(binary.LittleEndian.Uint32(b)), op == opBinUnicode)
	case opBinUnicode8, opBinBytes8, opByteArray8:
		b, err := d.take(8)
		if err != nil {
			return err
		}
		return d.pushBlob(binary.LittleEndian.Uint64(b), op == opBinUnicode8)

	case opEmptyList:
		d.push(&node{kind: kindList})
	case opList:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		cp := make([]any, len(items))
		copy(cp, items)
		d.push(&node{kind: kindList, items: cp})
	case opAppend:
		v, err := d.pop()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		return d.appendItems(t, []any{v})
	case opAppends:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		return d.appendItems(t, items)

	case opEmptyTuple:
		d.push(&node{kind: kindTuple, depth: 1, items: []any{}})
	case opTuple:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		d.newTuple(items)
	case opTuple1:
		return d.tupleN(1)
	case opTuple2:
		return d.tupleN(2)
	case opTuple3:
		return d.tupleN(3)

	case opEmptyDict:
		d.push(&node{kind: kindDict})
	case opDict:
		kv, err := d.popMark()
		if err != nil {
			return err
		}
		kv = append([]any(nil), kv...) // the stack's array is reused by push
		n := &node{kind: kindDict}
		d.push(n)
		return d.setItems(n, kv)
	case opSetItem:
		v, err := d.pop()
		if err != nil {
			return err
		}
		k, err := d.pop()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		return d.setItems(t, []any{k, v})
	case opSetItems:
		kv, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		return d.setItems(t, kv)

	default:
		switch {
		case forbidden[op]:
			return d.fail(ErrForbidden, "refusing to load code or objects (only plain data is accepted)")
		case opNames[op] != "":
			return d.fail(ErrUnsupported, "not part of the supported data subset")
		default:
			return d.fail(ErrUnknownOpcode, "")
		}
	}
	return nil
}

func (d *decoder) pushBlob(n uint64, str bool) error {
	b, err := d.take(n)
	if err != nil {
		return err
	}
	if str {
		d.push(string(b))
	} else {
		d.push(append([]byte{}, b...))
	}
	return nil
}

// convert replaces every *node reachable from v by its public value,
// iteratively (no recursion, each node once).
func convert(v any) any {
	root, ok := v.(*node)
	if !ok {
		return v
	}
	var work []*node
	// visit assigns n's public value (without converting its children yet)
	// and queues it.
	visit := func(x any) any {
		n, ok := x.(*node)
		if !ok {
			return x
		}
		if !n.done {
			n.done = true
			switch {
			case n.kind != kindDict:
				if n.items == nil {
					n.items = []any{}
				}
				n.out = n.items
			case n.dict == nil:
				n.out = map[string]any{}
			case n.dict.ordered != nil:
				n.out = &Dict{Items: n.dict.ordered}
			default:
				if n.dict.m == nil {
					n.dict.m = map[string]any{}
				}
				n.out = n.dict.m
			}
			work = append(work, n)
		}
		return n.out
	}
	out := visit(root)
	for len(work) > 0 {
		n := work[len(work)-1]
		work = work[:len(work)-1]
		switch {
		case n.kind != kindDict:
			for i, it := range n.items {
				n.items[i] = visit(it)
			}
		case n.dict == nil:
		case n.dict.ordered != nil:
			ds := n.dict
			for i := range ds.ordered {
				ds.ordered[i].Key = visit(ds.ordered[i].Key)
				ds.ordered[i].Value = visit(ds.ordered[i].Value)
			}
			n.dict = nil
		default:
			ds := n.dict
			for k, val := range ds.m {
				if _, isNode := val.(*node); isNode {
					ds.m[k] = visit(val)
				}
			}
			n.dict = nil
		}
	}
	return out
}
