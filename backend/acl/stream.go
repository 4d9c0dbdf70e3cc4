package acl

import (
	"unsafe"

	"github.com/vmmalloc/vmmalloc/backend"
)

// StreamCreate creates a stream on dev (aclrtCreateStream with dev's
// context current).
func (d *Driver) StreamCreate(dev int) (backend.Stream, error) {
	const op = backend.OpStreamCreate
	if !d.validDev(dev) {
		return 0, invalid(op, "", "device %d of %d", dev, len(d.phys))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var s uintptr
	if c := d.call(dev, d.lib.createStream, uintptr(unsafe.Pointer(&s))); c != codeSuccess {
		return 0, driverError(op, "aclrtCreateStream", c)
	}
	d.streams[backend.Stream(s)] = dev
	delete(d.adopted, backend.Stream(s)) // an adopted stream destroyed without DisownStream
	return backend.Stream(s), nil
}

// streamDev returns the device of s, taking and releasing mu.
func (d *Driver) streamDev(op backend.Op, s backend.Stream) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	dev, ok := d.streams[s]
	if !ok {
		return 0, invalid(op, "", "unknown stream %#x", uint64(s))
	}
	return dev, nil
}

// eventDev returns the device of e, taking and releasing mu.
func (d *Driver) eventDev(op backend.Op, e backend.Event) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	dev, ok := d.events[e]
	if !ok {
		return 0, invalid(op, "", "unknown event %#x", uint64(e))
	}
	return dev, nil
}

// StreamDestroy destroys s (aclrtDestroyStream).
func (d *Driver) StreamDestroy(s backend.Stream) error {
	const op = backend.OpStreamDestroy
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	dev, ok := d.streams[s]
	if !ok {
		return invalid(op, "", "unknown stream %#x", uint64(s))
	}
	if d.adopted[s] {
		return invalid(op, "", "stream %#x was adopted: its owner destroys it (DisownStream first)", uint64(s))
	}
	if c := d.call(dev, d.lib.destroyStream, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtDestroyStream", c)
	}
	delete(d.streams, s)
	return nil
}

// StreamSynchronize waits for the work queued on s (aclrtSynchronizeStream),
// without holding the driver's lock.
func (d *Driver) StreamSynchronize(s backend.Stream) error {
	const op = backend.OpStreamSync
	dev, err := d.streamDev(op, s)
	if err != nil {
		return err
	}
	if c := d.call(dev, d.lib.synchronizeStream, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtSynchronizeStream", c)
	}
	return nil
}

// StreamDevice reports the device s was created on.
func (d *Driver) StreamDevice(s backend.Stream) (int, error) {
	return d.streamDev(backend.OpStreamSync, s)
}

// EventCreate creates an event on dev (aclrtCreateEventWithFlag(ACL_EVENT_SYNC)).
func (d *Driver) EventCreate(dev int) (backend.Event, error) {
	const op = backend.OpEventCreate
	if !d.validDev(dev) {
		return 0, invalid(op, "", "device %d of %d", dev, len(d.phys))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errClosed(op)
	}
	var e uintptr
	if c := d.call(dev, d.lib.createEventWithFlag, uintptr(unsafe.Pointer(&e)), eventSync); c != codeSuccess {
		return 0, driverError(op, "aclrtCreateEventWithFlag", c)
	}
	d.events[backend.Event(e)] = dev
	return backend.Event(e), nil
}

// EventDestroy destroys e (aclrtDestroyEvent).
func (d *Driver) EventDestroy(e backend.Event) error {
	const op = backend.OpEventDestroy
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	dev, ok := d.events[e]
	if !ok {
		return invalid(op, "", "unknown event %#x", uint64(e))
	}
	if c := d.call(dev, d.lib.destroyEvent, uintptr(e)); c != codeSuccess {
		return driverError(op, "aclrtDestroyEvent", c)
	}
	delete(d.events, e)
	return nil
}

// EventRecord records e on s (aclrtRecordEvent); both must be of one device.
func (d *Driver) EventRecord(e backend.Event, s backend.Stream) error {
	const op = backend.OpEventRecord
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed(op)
	}
	edev, ok := d.events[e]
	if !ok {
		return invalid(op, "", "unknown event %#x", uint64(e))
	}
	sdev, ok := d.streams[s]
	if !ok {
		return invalid(op, "", "unknown stream %#x", uint64(s))
	}
	if edev != sdev {
		return invalid(op, "", "event of device %d, stream of device %d", edev, sdev)
	}
	if c := d.call(sdev, d.lib.recordEvent, uintptr(e), uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtRecordEvent", c)
	}
	return nil
}

// EventQuery reports whether e's work has completed (aclrtQueryEventStatus).
func (d *Driver) EventQuery(e backend.Event) (bool, error) {
	const op = backend.OpEventQuery
	dev, err := d.eventDev(op, e)
	if err != nil {
		return false, err
	}
	var status int32
	if c := d.call(dev, d.lib.queryEventStatus, uintptr(e), uintptr(unsafe.Pointer(&status))); c != codeSuccess {
		return false, driverError(op, "aclrtQueryEventStatus", c)
	}
	return status == eventComplete, nil
}

// EventSynchronize waits for e's work (aclrtSynchronizeEvent), without
// holding the driver's lock.
func (d *Driver) EventSynchronize(e backend.Event) error {
	const op = backend.OpEventSync
	dev, err := d.eventDev(op, e)
	if err != nil {
		return err
	}
	if c := d.call(dev, d.lib.synchronizeEvent, uintptr(e)); c != codeSuccess {
		return driverError(op, "aclrtSynchronizeEvent", c)
	}
	return nil
}

// DeviceSynchronize waits for all work on dev (aclrtSynchronizeDevice).
func (d *Driver) DeviceSynchronize(dev int) error {
	const op = backend.OpDeviceSync
	if !d.validDev(dev) {
		return invalid(op, "", "device %d of %d", dev, len(d.phys))
	}
	if err := d.closedErr(op); err != nil {
		return err
	}
	if c := d.call(dev, d.lib.synchronizeDevice); c != codeSuccess {
		return driverError(op, "aclrtSynchronizeDevice", c)
	}
	return nil
}

// CopyHtoD copies src to device address dst on s (aclrtMemcpyAsync
// HOST_TO_DEVICE) and waits for s, since src is Go memory.
func (d *Driver) CopyHtoD(dst uintptr, src []byte, s backend.Stream) error {
	const op = backend.OpMemcpy
	dev, err := d.streamDev(op, s)
	if err != nil || len(src) == 0 {
		return err
	}
	n := uintptr(len(src))
	if c := d.call(dev, d.lib.memcpyAsync, dst, n, uintptr(unsafe.Pointer(&src[0])), n, memcpyHtoD, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtMemcpyAsync", c)
	}
	if c := d.call(dev, d.lib.synchronizeStream, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtSynchronizeStream", c)
	}
	return nil
}

// CopyDtoH copies device memory at src into dst on s (aclrtMemcpyAsync
// DEVICE_TO_HOST) and waits for s.
func (d *Driver) CopyDtoH(dst []byte, src uintptr, s backend.Stream) error {
	const op = backend.OpMemcpy
	dev, err := d.streamDev(op, s)
	if err != nil || len(dst) == 0 {
		return err
	}
	n := uintptr(len(dst))
	if c := d.call(dev, d.lib.memcpyAsync, uintptr(unsafe.Pointer(&dst[0])), n, src, n, memcpyDtoH, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtMemcpyAsync", c)
	}
	if c := d.call(dev, d.lib.synchronizeStream, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtSynchronizeStream", c)
	}
	return nil
}

// CopyDtoD queues a copy of n bytes between device addresses on s
// (aclrtMemcpyAsync DEVICE_TO_DEVICE).
func (d *Driver) CopyDtoD(dst, src uintptr, n uint64, s backend.Stream) error {
	const op = backend.OpMemcpy
	dev, err := d.streamDev(op, s)
	if err != nil || n == 0 {
		return err
	}
	if c := d.call(dev, d.lib.memcpyAsync, dst, uintptr(n), src, uintptr(n), memcpyDtoD, uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtMemcpyAsync", c)
	}
	return nil
}

// Memset queues setting n bytes at dst to value on s (aclrtMemsetAsync).
func (d *Driver) Memset(dst uintptr, value byte, n uint64, s backend.Stream) error {
	const op = backend.OpMemset
	dev, err := d.streamDev(op, s)
	if err != nil || n == 0 {
		return err
	}
	if c := d.call(dev, d.lib.memsetAsync, dst, uintptr(n), uintptr(value), uintptr(n), uintptr(s)); c != codeSuccess {
		return driverError(op, "aclrtMemsetAsync", c)
	}
	return nil
}
