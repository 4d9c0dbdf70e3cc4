//go:build unix

package cuda

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// StreamCreate implements backend.Driver: a non-blocking stream
// (CU_STREAM_NON_BLOCKING) in the device's primary context.
func (d *Driver) StreamCreate(dev int) (backend.Stream, error) {
	const op = backend.OpStreamCreate
	if !d.validDevice(dev) {
		return 0, invalid(op, "", "device %d out of range [0,%d)", dev, len(d.devs))
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	var s uintptr
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symStreamCreate, uintptr(unsafe.Pointer(&s)), cuStreamNonBlocking)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symStreamCreate, rc)
	}
	d.streams[backend.Stream(s)] = dev
	delete(d.adopted, backend.Stream(s)) // an adopted stream destroyed without DisownStream
	return backend.Stream(s), nil
}

// streamDev returns the device of a stream the Driver created.
func (d *Driver) streamDev(op backend.Op, s backend.Stream) (int, error) {
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	dev, ok := d.streamOf(s)
	if !ok {
		return 0, invalid(op, "", "unknown stream %#x", uint64(s))
	}
	return dev, nil
}

// streamOf is the device of a stream the Driver created or adopted, or a
// default stream's stand-in. mu held.
func (d *Driver) streamOf(s backend.Stream) (int, bool) {
	if dev, ok := d.defaultDev(s); ok {
		return dev, true
	}
	dev, ok := d.streams[s]
	return dev, ok
}

// StreamDestroy implements backend.Driver (cuStreamDestroy_v2).
func (d *Driver) StreamDestroy(s backend.Stream) error {
	const op = backend.OpStreamDestroy
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	dev, ok := d.streams[s]
	if !ok {
		return invalid(op, "", "unknown stream %#x", uint64(s))
	}
	if d.adopted[s] {
		return invalid(op, "", "stream %#x was adopted: its owner destroys it (DisownStream first)", uint64(s))
	}
	if rc := d.onDevice(dev, func() cuResult { return d.lib.call(symStreamDestroy, uintptr(s)) }); rc != cuSuccess {
		return driverError(op, symStreamDestroy, rc)
	}
	delete(d.streams, s)
	return nil
}

// StreamSynchronize implements backend.Driver (cuStreamSynchronize). It
// waits without holding the Driver's lock.
func (d *Driver) StreamSynchronize(s backend.Stream) error {
	const op = backend.OpStreamSync
	dev, err := d.streamDev(op, s)
	if err != nil {
		return err
	}
	if rc := d.onDevice(dev, func() cuResult { return d.lib.call(symStreamSynchronize, raw(s)) }); rc != cuSuccess {
		return driverError(op, symStreamSynchronize, rc)
	}
	return nil
}

// StreamDevice implements backend.Driver from the binding's records.
func (d *Driver) StreamDevice(s backend.Stream) (int, error) {
	return d.streamDev(backend.OpStreamSync, s)
}

// EventCreate implements backend.Driver: an event without timing
// (CU_EVENT_DISABLE_TIMING) in the device's primary context.
func (d *Driver) EventCreate(dev int) (backend.Event, error) {
	const op = backend.OpEventCreate
	if !d.validDevice(dev) {
		return 0, invalid(op, "", "device %d out of range [0,%d)", dev, len(d.devs))
	}
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	var e uintptr
	rc := d.onDevice(dev, func() cuResult {
		return d.lib.call(symEventCreate, uintptr(unsafe.Pointer(&e)), cuEventDisableTiming)
	})
	if rc != cuSuccess {
		return 0, driverError(op, symEventCreate, rc)
	}
	d.events[backend.Event(e)] = dev
	return backend.Event(e), nil
}

func (d *Driver) eventDev(op backend.Op, e backend.Event) (int, error) {
	if err := d.lockOpen(op); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	dev, ok := d.events[e]
	if !ok {
		return 0, invalid(op, "", "unknown event %#x", uint64(e))
	}
	return dev, nil
}

// EventDestroy implements backend.Driver (cuEventDestroy_v2).
func (d *Driver) EventDestroy(e backend.Event) error {
	const op = backend.OpEventDestroy
	if err := d.lockOpen(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	dev, ok := d.events[e]
	if !ok {
		return invalid(op, "", "unknown event %#x", uint64(e))
	}
	if rc := d.onDevice(dev, func() cuResult { return d.lib.call(symEventDestroy, uintptr(e)) }); rc != cuSuccess {
		return driverError(op, symEventDestroy, rc)
	}
	delete(d.events, e)
	return nil
}

// EventRecord implements backend.Driver (cuEventRecord). Event and stream
// must belong to the same device.
func (d *Driver) EventRecord(e backend.Event, s backend.Stream) error {
	const op = backend.OpEventRecord
	if err := d.lockOpen(op); err != nil {
		return err
	}
	edev, eok := d.events[e]
	sdev, sok := d.streamOf(s)
	d.mu.Unlock()
	switch {
	case !eok:
		return invalid(op, "", "unknown event %#x", uint64(e))
	case !sok:
		return invalid(op, "", "unknown stream %#x", uint64(s))
	case edev != sdev:
		return invalid(op, "", "event of device %d, stream of device %d", edev, sdev)
	}
	if rc := d.onDevice(edev, func() cuResult { return d.lib.call(symEventRecord, uintptr(e), raw(s)) }); rc != cuSuccess {
		return driverError(op, symEventRecord, rc)
	}
	return nil
}

// EventQuery implements backend.Driver (cuEventQuery: CUDA_SUCCESS is done,
// CUDA_ERROR_NOT_READY is pending).
func (d *Driver) EventQuery(e backend.Event) (bool, error) {
	const op = backend.OpEventQuery
	dev, err := d.eventDev(op, e)
	if err != nil {
		return false, err
	}
	switch rc := d.onDevice(dev, func() cuResult { return d.lib.call(symEventQuery, uintptr(e)) }); rc {
	case cuSuccess:
		return true, nil
	case cuErrNotReady:
		return false, nil
	default:
		return false, driverError(op, symEventQuery, rc)
	}
}

// EventSynchronize implements backend.Driver (cuEventSynchronize), waiting
// without holding the Driver's lock.
func (d *Driver) EventSynchronize(e backend.Event) error {
	const op = backend.OpEventSync
	dev, err := d.eventDev(op, e)
	if err != nil {
		return err
	}
	if rc := d.onDevice(dev, func() cuResult { return d.lib.call(symEventSynchronize, uintptr(e)) }); rc != cuSuccess {
		return driverError(op, symEventSynchronize, rc)
	}
	return nil
}

// DeviceSynchronize implements backend.DeviceSynchronizer (cuCtxSynchronize
// in the device's primary context).
func (d *Driver) DeviceSynchronize(dev int) error {
	const op = backend.OpDeviceSync
	if !d.validDevice(dev) {
		return invalid(op, "", "device %d out of range [0,%d)", dev, len(d.devs))
	}
	if d.isClosed() {
		return backend.Errorf(op, backend.ErrUnavailable, "", "%v", errClosed)
	}
	if rc := d.onDevice(dev, func() cuResult { return d.lib.call(symCtxSynchronize) }); rc != cuSuccess {
		return driverError(op, symCtxSynchronize, rc)
	}
	return nil
}
