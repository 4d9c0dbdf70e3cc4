package memviz

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// The pickle subset written here is the one MemoryViz.js's unpickle()
// reads (protocol 4 without FRAME): PROTO, EMPTY_DICT/EMPTY_LIST + MARK +
// SETITEMS/APPENDS, TUPLE2, NONE, NEWTRUE/NEWFALSE,
// BININT1/BININT2/BININT/LONG1, BINFLOAT, SHORT_BINUNICODE/BINUNICODE,
// BINPUT/LONG_BINPUT, BINGET/LONG_BINGET, STOP. Python's pickle.load reads
// it too.
const (
	opProto       = 0x80
	opStop        = '.'
	opMark        = '('
	opEmptyDict   = '}'
	opSetItems    = 'u'
	opEmptyList   = ']'
	opAppends     = 'e'
	opTuple2      = 0x86
	opNone        = 'N'
	opNewTrue     = 0x88
	opNewFalse    = 0x89
	opBinInt1     = 'K'
	opBinInt2     = 'M'
	opBinInt      = 'J'
	opLong1       = 0x8a
	opBinFloat    = 'G'
	opShortBinUni = 0x8c
	opBinUnicode  = 'X'
	opBinPut      = 'q'
	opLongBinPut  = 'r'
	opBinGet      = 'h'
	opLongBinGet  = 'j'

	protocol = 4
)

// pickler writes pickle opcodes to a buffered writer. The first write
// error sticks: later calls do nothing and err reports it.
type pickler struct {
	w    *bufio.Writer
	err  error
	memo uint32 // next memo index
	buf  [9]byte
}

func (p *pickler) bytes(b ...byte) {
	if p.err == nil {
		_, p.err = p.w.Write(b)
	}
}

func (p *pickler) str(s string) {
	if p.err == nil {
		_, p.err = p.w.WriteString(s)
	}
}

func (p *pickler) begin() { p.bytes(opProto, protocol) }
func (p *pickler) end()   { p.bytes(opStop) }

// dict opens a dict; items follow as key/value pairs, then closeDict.
func (p *pickler) dict()      { p.bytes(opEmptyDict, opMark) }
func (p *pickler) closeDict() { p.bytes(opSetItems) }
func (p *pickler) list()      { p.bytes(opEmptyList, opMark) }
func (p *pickler) closeList() { p.bytes(opAppends) }

func (p *pickler) none() { p.bytes(opNone) }

func (p *pickler) boolean(v bool) {
	if v {
		p.bytes(opNewTrue)
	} else {
		p.bytes(opNewFalse)
	}
}

// int writes v with the smallest opcode pickle itself would choose.
func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v <= math.MaxUint8:
		p.bytes(opBinInt1, byte(v))
	case v >= 0 && v <= math.MaxUint16:
		p.buf[0] = opBinInt2
		binary.LittleEndian.PutUint16(p.buf[1:], uint16(v))
		p.bytes(p.buf[:3]...)
	case v >= math.MinInt32 && v <= math.MaxInt32:
		p.buf[0] = opBinInt
		binary.LittleEndian.PutUint32(p.buf[1:], uint32(int32(v)))
		p.bytes(p.buf[:5]...)
	default:
		p.long(uint64(v), v < 0)
	}
}

// uint writes v, which may exceed MaxInt64.
func (p *pickler) uint(v uint64) {
	if v <= math.MaxInt64 {
		p.int(int64(v))
		return
	}
	p.long(v, false)
}

// long writes LONG1: the two's-complement little-endian bytes of v, as few
// as represent it with the sign bit right (an extra 0x00 when a positive
// value's top bit is set, as pickle does).
func (p *pickler) long(v uint64, negative bool) {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], v)
	n := 8
	if negative {
		for n > 1 && b[n-1] == 0xff && b[n-2]&0x80 != 0 {
			n--
		}
	} else {
		for n > 1 && b[n-1] == 0 && b[n-2]&0x80 == 0 {
			n--
		}
		if b[n-1]&0x80 != 0 {
			n++ // b[8] is 0
		}
	}
	p.bytes(opLong1, byte(n))
	p.bytes(b[:n]...)
}

func (p *pickler) float(v float64) {
	p.buf[0] = opBinFloat
	binary.BigEndian.PutUint64(p.buf[1:], math.Float64bits(v))
	p.bytes(p.buf[:9]...)
}

// string writes s as a str. Invalid UTF-8 is replaced by U+FFFD, since
// Python (and the viewer's TextDecoder) decode str as UTF-8.
func (p *pickler) string(s string) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) < 256 {
		p.bytes(opShortBinUni, byte(len(s)))
	} else {
		if uint64(len(s)) > math.MaxUint32 {
			if p.err == nil {
				p.err = fmt.Errorf("memviz: string of %d bytes is too long", len(s))
			}
			return
		}
		p.buf[0] = opBinUnicode
		binary.LittleEndian.PutUint32(p.buf[1:], uint32(len(s)))
		p.bytes(p.buf[:5]...)
	}
	p.str(s)
}

// put memoizes the value on top of the stack and returns its memo index.
func (p *pickler) put() uint32 {
	i := p.memo
	p.memo++
	if i <= math.MaxUint8 {
		p.bytes(opBinPut, byte(i))
	} else {
		p.buf[0] = opLongBinPut
		binary.LittleEndian.PutUint32(p.buf[1:], i)
		p.bytes(p.buf[:5]...)
	}
	return i
}

// get pushes memoized value i.
func (p *pickler) get(i uint32) {
	if i <= math.MaxUint8 {
		p.bytes(opBinGet, byte(i))
	} else {
		p.buf[0] = opLongBinGet
		binary.LittleEndian.PutUint32(p.buf[1:], i)
		p.bytes(p.buf[:5]...)
	}
}

// value writes a setting value: nil, bool, a signed or unsigned integer,
// a float or a string.
func (p *pickler) value(v any) error {
	switch x := v.(type) {
	case nil:
		p.none()
	case bool:
		p.boolean(x)
	case int:
		p.int(int64(x))
	case int64:
		p.int(x)
	case uint64:
		p.uint(x)
	case float64:
		p.float(x)
	case string:
		p.string(x)
	default:
		return fmt.Errorf("%w: %T", ErrUnsupportedValue, v)
	}
	return nil
}
