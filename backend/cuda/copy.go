//go:build unix

package cuda

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// checkRange reports whether [va, va+n) is covered by adjacent mappings that
// grant want to device dev. The binding checks this itself because a copy
// to an unmapped address on a real GPU fails asynchronously and leaves the
// context unusable (CUDA_ERROR_ILLEGAL_ADDRESS is sticky). mu held.
func (d *Driver) checkRange(va uintptr, n uint64, dev int, want backend.AccessFlags) bool {
	for n > 0 {
		i := d.mappingAt(va)
		if i < 0 || d.maps[i].access[dev]&want != want {
			return false
		}
		m := d.maps[i]
		in := m.h.size - uint64(va-m.va)
		if in >= n {
			return true
		}
		va += uintptr(in)
		n -= in
	}
	return true
}

// span is a device range a copy touches and the access it needs.
type span struct {
	va   uintptr
	n    uint64 // nbytes
	want backend.AccessFlags
}

// copyTarget validates a copy on s and returns the stream's device.
func (d *Driver) copyTarget(op backend.Op, s backend.Stream, ranges ...span) (int, error) {
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	dev, ok := d.streamOf(s)
	if !ok {
		return 0, invalid(op, "", "unknown stream %#x", uint64(s))
	}
	for _, r := range ranges {
		if r.va+uintptr(r.n) < r.va {
			return 0, invalid(op, "", "%#x+%d wraps around", r.va, r.n)
		}
		if !d.checkRange(r.va, r.n, dev, r.want) {
			return 0, invalid(op, "R8", "%#x+%d is not mapped with %v access for device %d", r.va, r.n, r.want, dev)
		}
	}
	return dev, nil
}

// CopyHtoD implements backend.Copier (cuMemcpyHtoDAsync_v2, then
// cuStreamSynchronize: src is Go memory and must not be read after return).
func (d *Driver) CopyHtoD(dst uintptr, src []byte, s backend.Stream) error {
	const op = backend.OpMemcpy
	dev, err := d.copyTarget(op, s, span{dst, uint64(len(src)), backend.AccessReadWrite})
	if err != nil || len(src) == 0 {
		return err
	}
	var failed sym
	rc := d.onDevice(dev, func() cuResult {
		failed = symMemcpyHtoDAsync
		if rc := d.lib.call(symMemcpyHtoDAsync, dst, uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), raw(s)); rc != cuSuccess {
			return rc
		}
		failed = symStreamSynchronize
		return d.lib.call(symStreamSynchronize, raw(s))
	})
	if rc != cuSuccess {
		return driverError(op, failed, rc)
	}
	return nil
}

// CopyDtoH implements backend.Copier (cuMemcpyDtoHAsync_v2, then
// cuStreamSynchronize).
func (d *Driver) CopyDtoH(dst []byte, src uintptr, s backend.Stream) error {
	const op = backend.OpMemcpy
	dev, err := d.copyTarget(op, s, span{src, uint64(len(dst)), backend.AccessRead})
	if err != nil || len(dst) == 0 {
		return err
	}
	var failed sym
	rc := d.onDevice(dev, func() cuResult {
		failed = symMemcpyDtoHAsync
		if rc := d.lib.call(symMemcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), src, uintptr(len(dst)), raw(s)); rc != cuSuccess {
			return rc
		}
		failed = symStreamSynchronize
		return d.lib.call(symStreamSynchronize, raw(s))
	})
	if rc != cuSuccess {
		return driverError(op, failed, rc)
	}
	return nil
}

// CopyDtoD implements backend.Copier (cuMemcpyDtoDAsync_v2, queued on s).
func (d *Driver) CopyDtoD(dst, src uintptr, n uint64, s backend.Stream) error {
	const op = backend.OpMemcpy
	dev, err := d.copyTarget(op, s, span{dst, n, backend.AccessReadWrite}, span{src, n, backend.AccessRead})
	if err != nil || n == 0 {
		return err
	}
	if rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symMemcpyDtoDAsync, dst, src, uintptr(n), raw(s))
	}); rc != cuSuccess {
		return driverError(op, symMemcpyDtoDAsync, rc)
	}
	return nil
}

// Memset implements backend.Copier (cuMemsetD8Async, queued on s).
func (d *Driver) Memset(dst uintptr, value byte, n uint64, s backend.Stream) error {
	const op = backend.OpMemset
	dev, err := d.copyTarget(op, s, span{dst, n, backend.AccessReadWrite})
	if err != nil || n == 0 {
		return err
	}
	if rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symMemsetD8Async, dst, uintptr(value), uintptr(n), raw(s))
	}); rc != cuSuccess {
		return driverError(op, symMemsetD8Async, rc)
	}
	return nil
}
