//go:build unix

package cuda

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Streams made by someone else.
//
// A program that embeds vmmalloc (PyTorch through cmd/libvmmalloc, say)
// hands it streams the CUDA runtime created, and the default stream, which
// the runtime names NULL. The binding records only what it created, so such
// a stream is first adopted: AdoptStream checks with the driver that the
// stream belongs to the device's primary context (cuStreamGetCtx) and
// records it, and from then on every stream method accepts it as one of the
// device's streams. The binding never destroys an adopted stream
// (StreamDestroy refuses it); DisownStream forgets it, which its owner must
// have the binding do before destroying it.
//
// The default stream is one handle per context (CU_STREAM_LEGACY, or
// CU_STREAM_PER_THREAD), so it cannot key a per-device record: AdoptStream
// returns a stand-in, LegacyStream(dev) or PerThreadStream(dev), that the
// binding turns back into the driver's handle on every call.

// Stand-ins for the default streams: addresses in the first page, which no
// created stream has.
const (
	defaultStreamBase backend.Stream = 0x1000
	defaultStreamEnd  backend.Stream = 0x2000
	cuStreamLegacy                   = 0x1 // CU_STREAM_LEGACY
	cuStreamPerThread                = 0x2 // CU_STREAM_PER_THREAD
)

// LegacyStream is the stand-in for device dev's legacy default stream
// (NULL or CU_STREAM_LEGACY to the CUDA runtime, PyTorch's default stream).
func LegacyStream(dev int) backend.Stream { return defaultStreamBase + 2*backend.Stream(dev) }

// PerThreadStream is the stand-in for device dev's per-thread default
// stream (CU_STREAM_PER_THREAD).
func PerThreadStream(dev int) backend.Stream { return LegacyStream(dev) + 1 }

// raw is the driver's handle of stream s.
func raw(s backend.Stream) uintptr {
	if s >= defaultStreamBase && s < defaultStreamEnd {
		if (s-defaultStreamBase)%2 == 0 {
			return cuStreamLegacy
		}
		return cuStreamPerThread
	}
	return uintptr(s)
}

// AdoptStream makes stream s of device dev, created by someone else (the
// CUDA runtime: cudaStream_t and CUstream are the same handle), usable
// with the Driver, and returns the backend.Stream that names it: s itself,
// or for the default stream (0 or CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
// its stand-in. A stream the driver does not know, or one of another
// context than device dev's primary context, is refused with
// backend.ErrInvalidArgument. Adopting a stream already known returns it
// (a stream the Driver created included) if it is of device dev.
func (d *Driver) AdoptStream(dev int, s uintptr) (backend.Stream, error) {
	const op = backend.OpStreamSync
	if !d.validDevice(dev) {
		return 0, invalid(op, "", "device %d out of range [0,%d)", dev, len(d.devs))
	}
	switch s {
	case 0, cuStreamLegacy:
		return LegacyStream(dev), nil
	case cuStreamPerThread:
		return PerThreadStream(dev), nil
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if known, ok := d.streams[backend.Stream(s)]; ok {
		if known != dev {
			return 0, invalid(op, "", "stream %#x is of device %d, not %d", s, known, dev)
		}
		return backend.Stream(s), nil
	}
	if backend.Stream(s) >= defaultStreamBase && backend.Stream(s) < defaultStreamEnd {
		return 0, invalid(op, "", "stream %#x is not a stream handle", s)
	}
	var ctx uintptr
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symStreamGetCtx, s, uintptr(unsafe.Pointer(&ctx)))
	})
	if rc != cuSuccess {
		return 0, invalid(op, "", "stream %#x: %s: %s", s, symNames[symStreamGetCtx], cuErrorName(rc))
	}
	if ctx != d.devs[dev].ctx {
		return 0, invalid(op, "", "stream %#x is not of device %d's primary context", s, dev)
	}
	d.streams[backend.Stream(s)] = dev
	if d.adopted == nil {
		d.adopted = map[backend.Stream]bool{}
	}
	d.adopted[backend.Stream(s)] = true
	return backend.Stream(s), nil
}

// DisownStream forgets an adopted stream, before its owner destroys it.
// The default streams' stand-ins need no disowning (it is a no-op); a
// stream the Driver created or does not know is refused.
func (d *Driver) DisownStream(s backend.Stream) error {
	const op = backend.OpStreamDestroy
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if s >= defaultStreamBase && s < defaultStreamEnd {
		return nil
	}
	if !d.adopted[s] {
		return invalid(op, "", "stream %#x was not adopted", uint64(s))
	}
	delete(d.adopted, s)
	delete(d.streams, s)
	return nil
}

// defaultDev is the device of a default stream's stand-in, and whether s is
// one of a visible device.
func (d *Driver) defaultDev(s backend.Stream) (int, bool) {
	if s < defaultStreamBase || s >= defaultStreamEnd {
		return 0, false
	}
	dev := int(s-defaultStreamBase) / 2
	return dev, d.validDevice(dev)
}
