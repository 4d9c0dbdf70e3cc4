package emulated

import (
	"github.com/vmmalloc/vmmalloc/backend"
)

// Copier (backend.Copier) moves bytes through real memory, so it needs
// WithRealMemory; without it every call fails with backend.ErrNotSupported.
//
// Device ranges must be mapped, in this process, with read-write access for
// the stream's device (read access for a copy's source), or the call fails
// with backend.ErrInvalidArgument and moves nothing. Data moves when the
// call is made. CopyHtoD and CopyDtoH first complete the work queued on the
// stream (they are ordered after it and return once done, as on a device);
// CopyDtoD and Memset are queued on the stream as work touching their
// destination, so that freeing the destination before the stream passes
// them is caught like any other use of freed memory (see Launch).

// copySpan is a device range a copy touches and the access it needs.
type copySpan struct {
	va   uint64
	n    uint64 // nbytes
	want backend.AccessFlags
}

// beginCopy counts op, checks the stream and the device ranges, and returns
// the stream. The world's lock is held.
func (e *Emulator) beginCopy(op backend.Op, id backend.Stream, spans ...copySpan) (*stream, error) {
	w, p := e.w, e.p
	if err := e.begin(op); err != nil {
		return nil, err
	}
	if !w.cfg.real {
		return nil, e.fail(op, backend.ErrNotSupported, "", "copies need WithRealMemory")
	}
	s, err := e.stream(op, id)
	if err != nil {
		return nil, err
	}
	loc := backend.Location{Type: backend.LocationDevice, ID: int(s.dev)}
	for _, sp := range spans {
		end := sp.va + sp.n
		if end < sp.va {
			return nil, e.fail(op, backend.ErrInvalidArgument, "", "%#x+%d wraps around", sp.va, sp.n)
		}
		for a := sp.va; a < end; {
			x, ok := p.maps.containing(a)
			if !ok {
				return nil, e.fail(op, backend.ErrInvalidArgument, "", "%#x is not mapped", a)
			}
			if accessOf(x.v.access, loc)&sp.want != sp.want {
				return nil, e.fail(op, backend.ErrInvalidArgument, "R8", "mapping at %#x does not grant device %d %v access", x.start, s.dev, sp.want)
			}
			a = x.end
		}
	}
	return s, nil
}

// queueWork queues work on s touching [va, va+n), as Launch does.
func (e *Emulator) queueWork(s *stream, va, n uint64) {
	s.submitted++
	it := work{seq: s.submitted, va: va, size: n}
	e.resolve(s, &it, s.held)
	if !s.held {
		s.completed++
		return
	}
	s.queue = append(s.queue, it)
	e.w.busy[s] = struct{}{}
}

// CopyHtoD implements backend.Copier.
func (e *Emulator) CopyHtoD(dst uintptr, src []byte, id backend.Stream) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpMemcpy
	s, err := e.beginCopy(op, id, copySpan{uint64(dst), uint64(len(src)), backend.AccessReadWrite})
	if err != nil {
		return err
	}
	w.complete(s, len(s.queue))
	if len(src) > 0 {
		copy(w.back.bytes(uint64(dst), uint64(len(src))), src)
	}
	e.charge(op, uint64(len(src)))
	return nil
}

// CopyDtoH implements backend.Copier.
func (e *Emulator) CopyDtoH(dst []byte, src uintptr, id backend.Stream) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpMemcpy
	s, err := e.beginCopy(op, id, copySpan{uint64(src), uint64(len(dst)), backend.AccessRead})
	if err != nil {
		return err
	}
	w.complete(s, len(s.queue))
	if len(dst) > 0 {
		copy(dst, w.back.bytes(uint64(src), uint64(len(dst))))
	}
	e.charge(op, uint64(len(dst)))
	return nil
}

// CopyDtoD implements backend.Copier.
func (e *Emulator) CopyDtoD(dst, src uintptr, n uint64, id backend.Stream) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpMemcpy
	s, err := e.beginCopy(op, id, copySpan{uint64(dst), n, backend.AccessReadWrite}, copySpan{uint64(src), n, backend.AccessRead})
	if err != nil {
		return err
	}
	if n > 0 {
		copy(w.back.bytes(uint64(dst), n), w.back.bytes(uint64(src), n))
		e.queueWork(s, uint64(dst), n)
	}
	e.charge(op, n)
	return nil
}

// Memset implements backend.Copier.
func (e *Emulator) Memset(dst uintptr, value byte, n uint64, id backend.Stream) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpMemset
	s, err := e.beginCopy(op, id, copySpan{uint64(dst), n, backend.AccessReadWrite})
	if err != nil {
		return err
	}
	if n > 0 {
		b := w.back.bytes(uint64(dst), n)
		for i := range b {
			b[i] = value
		}
		e.queueWork(s, uint64(dst), n)
	}
	e.charge(op, n)
	return nil
}

var _ backend.Copier = (*Emulator)(nil)
