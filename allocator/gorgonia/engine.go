package gorgonia

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"

	"gorgonia.org/tensor"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
)

// ErrNotAccessible is returned when host code would need to touch device
// memory the engine was told is not host-accessible.
var ErrNotAccessible = errors.New("vmgorgonia: device memory is not host-accessible")

// ErrUnknownMemory is returned by Free for memory the engine did not
// allocate, or has already freed or released.
var ErrUnknownMemory = errors.New("vmgorgonia: memory was not allocated by this engine, or is already freed")

// ErrInvalidSize is returned by Alloc for a negative size.
var ErrInvalidSize = errors.New("vmgorgonia: invalid size")

// Options configure New.
type Options struct {
	// HostAccessible says that the host can read and write the device
	// memory the allocator hands out at its device addresses: the
	// emulator with real memory, the CUDA and ACL test doubles after set
	// access, unified memory. Then tensors compute with tensor.StdEng's
	// kernels on it. Otherwise AllocAccessible is false, tensors are
	// marked natively inaccessible (the kernels refuse them), and Memset,
	// Memclr and Memcpy go through the driver's backend.Copier.
	HostAccessible bool
}

// Engine is a gorgonia.org/tensor Engine whose memory comes from a vmmalloc
// Allocator on one stream. It embeds tensor.StdEng for the kernels and is a
// tensor.NonStdEngine, so that tensors made with tensor.WithEngine(e)
// allocate through Alloc rather than from the Go heap.
//
// Tensors never call Engine.Free. The engine records every allocation, and
// Scope / Scope.Release free, in one call, every allocation made since the
// scope was opened (a training step's, or a whole run's), as Gorgonia's CUDA
// engine resets its arena; Free frees one tensor's memory early. Memory
// released is returned to the allocator's cache, not to the driver.
//
// An Engine is safe for concurrent use, but it allocates on one stream: a
// goroutine that queues work on another stream uses an Engine of its own
// (several Engines may share one Allocator).
type Engine struct {
	tensor.StdEng

	a          *allocator.Allocator
	stream     backend.Stream
	copier     backend.Copier // the driver's, nil if it has none
	accessible bool

	mu     sync.Mutex
	live   map[uintptr]allocation // by device address; mu
	seq    uint64                 // allocations made, ever; mu
	allocs uint64                 // Alloc calls that succeeded; mu
	frees  uint64                 // allocations freed, by Free or a release; mu
	bytes  uint64                 // nbytes of live allocations; mu
}

// allocation is one live Alloc.
type allocation struct {
	size uint64 // nbytes asked for
	seq  uint64 // position in the engine's allocation order (1 = first)
}

// Memory is device memory handed out by Alloc: a tensor.Memory.
type Memory struct {
	ptr  uintptr
	size uintptr
}

// Uintptr is the device address.
func (m Memory) Uintptr() uintptr { return m.ptr }

// MemSize is the size in bytes.
func (m Memory) MemSize() uintptr { return m.size }

// New returns an Engine allocating from a on stream (0 = the allocator's
// default stream).
func New(a *allocator.Allocator, stream backend.Stream, opt Options) (*Engine, error) {
	if a == nil {
		return nil, fmt.Errorf("%w: nil allocator", allocator.ErrInvalidConfig)
	}
	if stream == 0 {
		stream = a.DefaultStream()
	}
	e := &Engine{a: a, stream: stream, accessible: opt.HostAccessible, live: make(map[uintptr]allocation)}
	e.copier, _ = a.Driver().(backend.Copier)
	return e, nil
}

// Allocator is the allocator the engine allocates from.
func (e *Engine) Allocator() *allocator.Allocator { return e.a }

// Stream is the stream the engine allocates on.
func (e *Engine) Stream() backend.Stream { return e.stream }

// NonStdAlloc marks the engine as a tensor.NonStdEngine: tensors allocate
// through Alloc.
func (e *Engine) NonStdAlloc() {}

// AllocAccessible reports whether Go code can read the memory Alloc
// returns (Options.HostAccessible).
func (e *Engine) AllocAccessible() bool { return e.accessible }

// Alloc allocates size bytes on the engine's stream. A zero size allocates
// the smallest block (tensors of no elements still get an address).
func (e *Engine) Alloc(size int64) (tensor.Memory, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: %d bytes", ErrInvalidSize, size)
	}
	ptr, err := e.a.Malloc(max(uint64(size), 1), e.stream)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.seq++
	e.allocs++
	e.bytes += uint64(size)
	e.live[ptr] = allocation{size: uint64(size), seq: e.seq}
	e.mu.Unlock()
	return Memory{ptr: ptr, size: uintptr(size)}, nil
}

// Free frees the allocation that starts at mem.Uintptr() (a Memory from
// Alloc, or a tensor made on this engine: *tensor.Dense is a
// tensor.Memory). size is ignored: the engine knows it. Memory the engine
// did not allocate, or already freed, is ErrUnknownMemory and changes
// nothing.
func (e *Engine) Free(mem tensor.Memory, size int64) error {
	ptr := mem.Uintptr()
	e.mu.Lock()
	al, ok := e.live[ptr]
	if !ok {
		e.mu.Unlock()
		return fmt.Errorf("%w: %#x", ErrUnknownMemory, ptr)
	}
	delete(e.live, ptr)
	e.frees++
	e.bytes -= al.size
	e.mu.Unlock()
	if err := e.a.Free(ptr); err != nil {
		e.mu.Lock()
		e.live[ptr] = al // nothing changed
		e.frees--
		e.bytes += al.size
		e.mu.Unlock()
		return err
	}
	return nil
}

// Scope is a position in the engine's allocation order: Release frees
// every allocation made after it that is still live.
type Scope struct {
	e   *Engine
	seq uint64 // allocations made before the scope opened
}

// Scope opens a scope: Release frees what the engine allocates from now on
// (and has not freed by then). Scopes nest: releasing an outer one
// releases what inner ones allocated.
func (e *Engine) Scope() Scope {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Scope{e: e, seq: e.seq}
}

// Release frees every live allocation the engine made since the scope
// opened and returns the number freed. Tensors made since then must not be
// used afterwards. On a Free error it frees what it can and returns the
// errors joined; what failed stays live.
func (s Scope) Release() (int, error) {
	e := s.e
	e.mu.Lock()
	var ptrs []uintptr
	for p, al := range e.live {
		if al.seq > s.seq {
			ptrs = append(ptrs, p)
		}
	}
	e.mu.Unlock()
	n := 0
	var errs []error
	for _, p := range ptrs {
		if err := e.Free(Memory{ptr: p}, 0); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Stats are the engine's counters.
type Stats struct {
	Allocs    uint64 // Alloc calls that succeeded
	Frees     uint64 // allocations freed, by Free or Release
	Live      int    // allocations not freed
	LiveBytes uint64 // nbytes they asked for
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{Allocs: e.allocs, Frees: e.frees, Live: len(e.live), LiveBytes: e.bytes}
}

// Memset sets every element of mem to val. With host-accessible memory it
// is tensor.StdEng's (mem must be a tensor's array, which knows its
// element type); otherwise val's bytes (a fixed-size number) are repeated
// over mem and copied through the driver (backend.Copier) on the engine's
// stream.
func (e *Engine) Memset(mem tensor.Memory, val interface{}) error {
	if e.accessible {
		return e.StdEng.Memset(mem, val)
	}
	if e.copier == nil {
		return e.noCopier("Memset")
	}
	pat, err := valueBytes(val)
	if err != nil {
		return err
	}
	n := uint64(mem.MemSize())
	if allSame(pat) {
		return e.copier.Memset(mem.Uintptr(), pat[0], n, e.stream)
	}
	if n%uint64(len(pat)) != 0 {
		return fmt.Errorf("vmgorgonia: Memset: %d bytes is not a whole number of %d-byte %T values", n, len(pat), val)
	}
	host := make([]byte, n)
	for i := 0; i < len(host); i += len(pat) {
		copy(host[i:], pat)
	}
	return e.copier.CopyHtoD(mem.Uintptr(), host, e.stream)
}

// Memclr zeroes mem: tensor.StdEng's with host-accessible memory, else a
// driver memset on the engine's stream (errors are dropped: the
// tensor.Engine method returns none).
func (e *Engine) Memclr(mem tensor.Memory) {
	if e.accessible {
		e.StdEng.Memclr(mem)
		return
	}
	if e.copier != nil {
		_ = e.copier.Memset(mem.Uintptr(), 0, uint64(mem.MemSize()), e.stream)
	}
}

// Memcpy copies src into dst (min of their sizes): tensor.StdEng's with
// host-accessible memory, else a device-to-device copy through the driver
// on the engine's stream (both must be device memory).
func (e *Engine) Memcpy(dst, src tensor.Memory) error {
	if e.accessible {
		return e.StdEng.Memcpy(dst, src)
	}
	if e.copier == nil {
		return e.noCopier("Memcpy")
	}
	n := min(dst.MemSize(), src.MemSize())
	if n == 0 {
		return nil
	}
	return e.copier.CopyDtoD(dst.Uintptr(), src.Uintptr(), uint64(n), e.stream)
}

// Accessible returns mem if the host can read it, else ErrNotAccessible.
func (e *Engine) Accessible(mem tensor.Memory) (tensor.Memory, error) {
	if e.accessible {
		return mem, nil
	}
	return nil, fmt.Errorf("%w: %#x", ErrNotAccessible, mem.Uintptr())
}

// WorksWith reports whether the engine's kernels work on data of that
// order: every order with host-accessible memory (tensor.StdEng's), none
// without.
func (e *Engine) WorksWith(order tensor.DataOrder) bool { return e.accessible }

// CopyToDevice copies host bytes to device memory dst on the engine's
// stream, through the driver (how data reaches a tensor that is not
// host-accessible).
func (e *Engine) CopyToDevice(dst tensor.Memory, src []byte) error {
	if e.copier == nil {
		return e.noCopier("CopyToDevice")
	}
	if uintptr(len(src)) > dst.MemSize() {
		return fmt.Errorf("%w: %d bytes into %d", ErrInvalidSize, len(src), dst.MemSize())
	}
	return e.copier.CopyHtoD(dst.Uintptr(), src, e.stream)
}

// CopyToHost copies len(dst) bytes of device memory src to the host on the
// engine's stream, after the work queued on it.
func (e *Engine) CopyToHost(dst []byte, src tensor.Memory) error {
	if e.copier == nil {
		return e.noCopier("CopyToHost")
	}
	if uintptr(len(dst)) > src.MemSize() {
		return fmt.Errorf("%w: %d bytes from %d", ErrInvalidSize, len(dst), src.MemSize())
	}
	return e.copier.CopyDtoH(dst, src.Uintptr(), e.stream)
}

func (e *Engine) noCopier(op string) error {
	return fmt.Errorf("%w: %s: the %s driver has no backend.Copier", ErrNotAccessible, op, e.a.Driver().Name())
}

// valueBytes is the little-endian representation of a fixed-size number.
func valueBytes(val interface{}) ([]byte, error) {
	switch v := val.(type) {
	case float64:
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(v)), nil
	case float32:
		return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)), nil
	case bool:
		if v {
			return []byte{1}, nil
		}
		return []byte{0}, nil
	case int:
		return binary.LittleEndian.AppendUint64(nil, uint64(v)), nil
	case uint:
		return binary.LittleEndian.AppendUint64(nil, uint64(v)), nil
	}
	rv := reflect.ValueOf(val)
	if !rv.IsValid() {
		return nil, fmt.Errorf("vmgorgonia: Memset: nil value")
	}
	b, err := binary.Append(nil, binary.LittleEndian, val)
	if err != nil {
		return nil, fmt.Errorf("vmgorgonia: Memset: %T is not a fixed-size number: %w", val, err)
	}
	return b, nil
}

func allSame(b []byte) bool {
	for _, c := range b[1:] {
		if c != b[0] {
			return false
		}
	}
	return true
}
