package emulated

import "github.com/vmmalloc/vmmalloc/backend"

// The emulator implements backend.DeviceSynchronizer.
var _ backend.DeviceSynchronizer = (*Emulator)(nil)

// DeviceSynchronize completes all work this process queued on device dev,
// on every stream, destroyed streams whose work is still pending included
// (cuCtxSynchronize, aclrtSynchronizeDevice). Other processes' work is not
// waited for: a context synchronises its own. Like every primitive it is
// counted (Calls(backend.OpDeviceSync)), charged by the cost model, fails
// after Close with ErrUnavailable, takes injected faults (a failed call
// completes nothing), and rejects a device out of range with
// ErrInvalidArgument.
func (e *Emulator) DeviceSynchronize(dev int) error {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = backend.OpDeviceSync
	if err := e.begin(op); err != nil {
		return err
	}
	if !w.checkDevice(dev) {
		return e.fail(op, backend.ErrInvalidArgument, "", "device %d out of range [0,%d)", dev, len(w.devs))
	}
	for _, s := range w.busyStreams() {
		if s.proc == e.p && int(s.dev) == dev {
			w.complete(s, len(s.queue))
		}
	}
	e.charge(op, 0)
	return nil
}
