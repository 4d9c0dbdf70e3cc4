package host

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

// TestClosedBeforeArguments: after Close every method returns ErrClosed,
// whatever its arguments; a bad argument is not reported first (the device
// allocator's contract, issue 7 §3).
func TestClosedBeforeArguments(t *testing.T) {
	a, e := newHost(t, "")
	require.NoError(t, a.Close())
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Malloc 0", func() error { _, err := a.Malloc(0); return err }},
		{"Malloc 2^64-1", func() error { _, err := a.Malloc(math.MaxUint64); return err }},
		{"Free 0", func() error { return a.Free(0) }},
		{"RecordStream 0, stream 0", func() error { return a.RecordStream(0, 0) }},
		{"DevicePointer 0", func() error { _, err := a.DevicePointer(0); return err }},
		{"Register 0", func() error { return a.Register(0, 4*kib, backend.HostRegisterMapped) }},
		{"Register misaligned", func() error { return a.Register(1, 4*kib, backend.HostRegisterMapped) }},
		{"Register size 0", func() error { return a.Register(4*kib, 0, backend.HostRegisterMapped) }},
		{"Register bad flags", func() error { return a.Register(4*kib, 4*kib, 3) }},
		{"Unregister ^0", func() error { return a.Unregister(^uintptr(0)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := e.CallCounts()
			require.ErrorIs(t, tc.call(), ErrClosed)
			assert.Equal(t, calls, e.CallCounts())
		})
	}
}

// TestDriverFaultsChangeNothing: a driver call that fails inside Malloc,
// DevicePointer, Register or Unregister leaves the statistics and the
// driver as they were (Check agrees), and the same call then succeeds.
func TestDriverFaultsChangeNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   backend.Op
		kind error
		call func(a *Allocator, own uintptr) error
	}{
		{"Malloc: MallocHost", backend.OpMallocHost, backend.ErrUnavailable, func(a *Allocator, _ uintptr) error { _, err := a.Malloc(64 * kib); return err }},
		{"DevicePointer: HostRegister", backend.OpHostRegister, backend.ErrUnavailable, func(a *Allocator, _ uintptr) error { return devPtr(a) }},
		{"DevicePointer: HostGetDevicePointer", backend.OpHostDevicePointer, backend.ErrUnavailable, func(a *Allocator, _ uintptr) error { return devPtr(a) }},
		{"Register: HostRegister", backend.OpHostRegister, backend.ErrUnavailable, func(a *Allocator, own uintptr) error {
			return a.Register(own, 8*kib, backend.HostRegisterMapped)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newHost(t, "")
			own := mmapPages(t, 16*kib)
			// DevicePointer cases need a live block made before the fault.
			p, err := a.Malloc(4 * kib)
			require.NoError(t, err)
			before := a.Stats()
			require.NoError(t, e.FailNth(tc.op, 1, tc.kind))
			err = tc.call(a, own)
			require.ErrorIs(t, err, tc.kind)
			assert.Equal(t, before, a.Stats())
			mustCheck(t, a, e)
			require.NoError(t, tc.call(a, own), "the retry succeeds")
			mustCheck(t, a, e)
			require.NoError(t, a.Free(p))
		})
	}
}

// devPtr asks for the device address of the newest allocated block.
func devPtr(a *Allocator) error {
	a.mu.Lock()
	var p uintptr
	for ptr, b := range a.blocks {
		if b.state == stateAllocated {
			p = ptr
		}
	}
	a.mu.Unlock()
	_, err := a.DevicePointer(p + 100)
	return err
}
