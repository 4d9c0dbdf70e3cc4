package ipc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// ErrBadDescriptor is wrapped by every error of decoding or validating a
// Descriptor.
var ErrBadDescriptor = errors.New("ipc: bad descriptor")

// MaxHandles bounds the handles of one descriptor, so that hostile input
// cannot make a decoder allocate without limit.
const MaxHandles = 1 << 16

// Descriptor names shared device memory: the physical handles an export
// spans, as shareable handles, and where the exported bytes lie in them.
// Handles are laid out back to back from offset 0; the exported bytes are
// [Offset, Offset+Size) of that layout.
type Descriptor struct {
	Device  int          `json:"device"` // the exporter's device
	Pid     int32        `json:"pid"`    // the exporter's pid, as the driver knows it
	Size    uint64       `json:"size"`   // nbytes exported
	Offset  uint64       `json:"offset"` // offset of the first exported byte in the first handle
	Handles []HandleDesc `json:"handles"`
}

// HandleDesc is one shared physical handle.
type HandleDesc struct {
	Shareable uint64 `json:"shareable"` // backend.IPC shareable handle
	Size      uint64 `json:"size"`      // nbytes of the handle
	Offset    uint64 `json:"offset"`    // where the handle starts in the layout
}

// Span is the nbytes of the layout: the sum of the handle sizes.
func (d *Descriptor) Span() uint64 {
	var n uint64
	for _, h := range d.Handles {
		n += h.Size
	}
	return n
}

// Validate checks that d is well formed: at least one and at most
// MaxHandles handles of nonzero size laid out back to back, and the
// exported bytes nonempty and inside them. Errors wrap ErrBadDescriptor.
func (d *Descriptor) Validate() error {
	if d.Device < 0 || d.Device > math.MaxInt32 {
		return fmt.Errorf("%w: device %d", ErrBadDescriptor, d.Device)
	}
	if len(d.Handles) == 0 || len(d.Handles) > MaxHandles {
		return fmt.Errorf("%w: %d handles (want 1..%d)", ErrBadDescriptor, len(d.Handles), MaxHandles)
	}
	var at uint64
	for i, h := range d.Handles {
		if h.Size == 0 {
			return fmt.Errorf("%w: handle %d has size 0", ErrBadDescriptor, i)
		}
		if h.Offset != at {
			return fmt.Errorf("%w: handle %d at offset %d, want %d", ErrBadDescriptor, i, h.Offset, at)
		}
		if at+h.Size < at {
			return fmt.Errorf("%w: handle sizes overflow", ErrBadDescriptor)
		}
		at += h.Size
	}
	if d.Size == 0 || d.Offset >= d.Handles[0].Size || d.Offset+d.Size < d.Offset || d.Offset+d.Size > at {
		return fmt.Errorf("%w: bytes [%d,+%d) outside the %d bytes of the handles", ErrBadDescriptor, d.Offset, d.Size, at)
	}
	if last := d.Handles[len(d.Handles)-1]; d.Offset+d.Size <= last.Offset {
		return fmt.Errorf("%w: the last handle holds none of the exported bytes", ErrBadDescriptor)
	}
	return nil
}

// Binary encoding, little endian:
//
//	magic "VMIPC\x00" version u16 device u32 pid i32 size u64 offset u64 n u32
//	n × (shareable u64, size u64, offset u64)
const (
	magic     = "VMIPC\x00"
	version   = 1
	headerLen = len(magic) + 2 + 4 + 4 + 8 + 8 + 4
	handleLen = 24
	maxBinLen = headerLen + MaxHandles*handleLen
	minBinLen = headerLen + handleLen
)

// MarshalBinary encodes a valid d.
func (d Descriptor) MarshalBinary() ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, headerLen+len(d.Handles)*handleLen)
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint32(b, uint32(d.Device))
	b = binary.LittleEndian.AppendUint32(b, uint32(d.Pid))
	b = binary.LittleEndian.AppendUint64(b, d.Size)
	b = binary.LittleEndian.AppendUint64(b, d.Offset)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(d.Handles)))
	for _, h := range d.Handles {
		b = binary.LittleEndian.AppendUint64(b, h.Shareable)
		b = binary.LittleEndian.AppendUint64(b, h.Size)
		b = binary.LittleEndian.AppendUint64(b, h.Offset)
	}
	return b, nil
}

// UnmarshalBinary decodes and validates; on error d is unchanged and the
// error wraps ErrBadDescriptor.
func (d *Descriptor) UnmarshalBinary(b []byte) error {
	if len(b) < minBinLen || len(b) > maxBinLen {
		return fmt.Errorf("%w: %d bytes", ErrBadDescriptor, len(b))
	}
	if string(b[:len(magic)]) != magic {
		return fmt.Errorf("%w: not a descriptor (magic %q)", ErrBadDescriptor, b[:len(magic)])
	}
	le := binary.LittleEndian
	p := len(magic)
	if v := le.Uint16(b[p:]); v != version {
		return fmt.Errorf("%w: version %d, want %d", ErrBadDescriptor, v, version)
	}
	p += 2
	var x Descriptor
	dev := le.Uint32(b[p:])
	if dev > math.MaxInt32 {
		return fmt.Errorf("%w: device %d", ErrBadDescriptor, dev)
	}
	x.Device = int(dev)
	x.Pid = int32(le.Uint32(b[p+4:]))
	x.Size = le.Uint64(b[p+8:])
	x.Offset = le.Uint64(b[p+16:])
	n := le.Uint32(b[p+24:])
	p += 28
	if n > MaxHandles || uint64(len(b)-p) != uint64(n)*handleLen {
		return fmt.Errorf("%w: %d handles in %d bytes", ErrBadDescriptor, n, len(b)-p)
	}
	x.Handles = make([]HandleDesc, n)
	for i := range x.Handles {
		x.Handles[i] = HandleDesc{Shareable: le.Uint64(b[p:]), Size: le.Uint64(b[p+8:]), Offset: le.Uint64(b[p+16:])}
		p += handleLen
	}
	if err := x.Validate(); err != nil {
		return err
	}
	*d = x
	return nil
}

// descriptorJSON breaks the UnmarshalJSON recursion.
type descriptorJSON Descriptor

// UnmarshalJSON decodes and validates; on error d is unchanged and the
// error wraps ErrBadDescriptor.
func (d *Descriptor) UnmarshalJSON(b []byte) error {
	var x descriptorJSON
	if err := json.Unmarshal(b, &x); err != nil {
		return fmt.Errorf("%w: %v", ErrBadDescriptor, err)
	}
	if err := (*Descriptor)(&x).Validate(); err != nil {
		return err
	}
	*d = Descriptor(x)
	return nil
}
