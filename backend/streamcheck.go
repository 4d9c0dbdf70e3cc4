package backend

import (
	"errors"
	"fmt"
)

// AnyDevice makes a StreamValidator accept a stream of any device of its
// driver.
const AnyDevice = -1

// StreamValidator tells an allocator whether a stream a caller hands it
// names a live stream of a device the allocator serves. It asks the driver
// (Driver.StreamDevice: a lookup in every backend, which queues and waits
// for nothing) every time, and remembers nothing: a stream the allocator
// has seen before is asked about again, so one destroyed since is refused
// like one it never saw.
//
// Both of vmmalloc's allocators (package allocator for device memory,
// allocator/host for pinned host memory) validate the streams callers pass
// them through one, so they refuse the same streams with the same
// *StreamError, and tell a destroyed stream from a driver call on a live
// one that failed (Gone) the same way. What an allocator does with the
// state it keeps for a stream found destroyed is its own policy.
//
// A StreamValidator is a small value, safe for concurrent use.
type StreamValidator struct {
	drv  Driver
	dev  int // the one device accepted, or AnyDevice
	ndev int // the driver's device count, when dev is AnyDevice
}

// NewStreamValidator returns a validator of the streams of device dev of
// d, or of every device of d with AnyDevice.
func NewStreamValidator(d Driver, dev int) StreamValidator {
	v := StreamValidator{drv: d, dev: dev}
	if dev == AnyDevice {
		v.ndev = d.DeviceCount()
	}
	return v
}

// Validate returns the device of stream s. A stream that may not be used
// is refused with a *StreamError: 0, a stream the driver does not know
// (destroyed, or never created), or one of a device the validator does
// not accept. If the query itself fails (the driver is closed, say), the
// driver's error is returned as it is: nothing is known of s.
func (v StreamValidator) Validate(s Stream) (int, error) {
	if s == 0 {
		return 0, &StreamError{Stream: s, Reason: StreamZero}
	}
	dev, err := v.drv.StreamDevice(s)
	switch {
	case err != nil && errors.Is(err, ErrInvalidArgument):
		return 0, &StreamError{Stream: s, Reason: StreamUnknown, Err: err}
	case err != nil:
		return 0, err
	case v.dev == AnyDevice && (dev < 0 || dev >= v.ndev), v.dev != AnyDevice && dev != v.dev:
		return 0, &StreamError{Stream: s, Reason: StreamOtherDevice, Device: dev, Want: v.dev}
	}
	return dev, nil
}

// Gone reports whether the driver no longer knows stream s. An allocator
// asks it after a call naming s failed (EventRecord, StreamSynchronize), to
// tell a stream destroyed behind its back from a failure of the call
// itself, which must not make a live stream look destroyed.
func (v StreamValidator) Gone(s Stream) bool {
	_, err := v.drv.StreamDevice(s)
	return err != nil && errors.Is(err, ErrInvalidArgument)
}

// StreamReason says why a StreamValidator refused a stream.
type StreamReason uint8

const (
	// StreamZero: 0 names no stream a driver made.
	StreamZero StreamReason = iota + 1
	// StreamUnknown: the driver does not know the stream: it was
	// destroyed, or never created.
	StreamUnknown
	// StreamOtherDevice: the stream belongs to a device the allocator does
	// not serve.
	StreamOtherDevice
)

func (r StreamReason) String() string {
	switch r {
	case StreamZero:
		return "zero"
	case StreamUnknown:
		return "unknown"
	case StreamOtherDevice:
		return "other-device"
	}
	return fmt.Sprintf("StreamReason(%d)", int(r))
}

// StreamError is a StreamValidator's refusal of a stream. Allocators wrap
// it in their own ErrInvalidStream, so errors.Is tells the sentinel and
// errors.As the reason.
type StreamError struct {
	Stream Stream
	Reason StreamReason
	Device int   // StreamOtherDevice: the stream's device
	Want   int   // StreamOtherDevice: the device accepted, or AnyDevice
	Err    error // StreamUnknown: the driver's answer
}

func (e *StreamError) Error() string {
	switch e.Reason {
	case StreamZero:
		return "stream 0 names no stream (pass one made by StreamCreate)"
	case StreamUnknown:
		return fmt.Sprintf("stream %d does not exist (destroyed, or never created): %v", e.Stream, e.Err)
	case StreamOtherDevice:
		if e.Want == AnyDevice {
			return fmt.Sprintf("stream %d is on device %d, which the driver does not list", e.Stream, e.Device)
		}
		return fmt.Sprintf("stream %d belongs to device %d, not %d", e.Stream, e.Device, e.Want)
	}
	return fmt.Sprintf("stream %d: %v", e.Stream, e.Reason)
}

func (e *StreamError) Unwrap() error { return e.Err }
