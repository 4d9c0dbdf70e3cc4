package emulated_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestDeviceSynchronize: a device synchronize completes the work of every
// stream of the calling process on that device, destroyed streams
// included, and nothing else.
func TestDeviceSynchronize(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion(), emulated.WithDevices(2))
	other, err := e.Process(2000)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })

	s0, err := e.StreamCreate(0)
	require.NoError(t, err)
	gone, err := e.StreamCreate(0)
	require.NoError(t, err)
	s1, err := e.StreamCreate(1)
	require.NoError(t, err)
	so, err := other.StreamCreate(0)
	require.NoError(t, err)
	for _, s := range []backend.Stream{s0, gone, s1} {
		require.NoError(t, e.Launch(s, 0, 0))
	}
	require.NoError(t, other.Launch(so, 0, 0))
	ev, err := e.EventCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.EventRecord(ev, gone))
	require.NoError(t, e.StreamDestroy(gone))

	var ds backend.DeviceSynchronizer = e
	require.NoError(t, ds.DeviceSynchronize(0))
	assert.Equal(t, int64(1), e.Calls(backend.OpDeviceSync))
	done, err := e.EventQuery(ev)
	require.NoError(t, err)
	assert.True(t, done, "the destroyed stream's work completed")
	n, err := e.Pending(s0)
	require.NoError(t, err)
	assert.Zero(t, n, "device 0 stream")
	n, err = e.Pending(s1)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "device 1 is not synchronised")
	n, err = other.Pending(so)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "another process's work is not waited for")
	require.NoError(t, e.EventDestroy(ev))
	require.NoError(t, e.CompleteAll())
	require.NoError(t, other.CompleteAll())
}

// TestDeviceSynchronizeErrors: bad devices, injected faults (which complete
// nothing) and a closed process fail with the usual typed errors.
func TestDeviceSynchronizeErrors(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, 0, 0))
	for _, dev := range []int{-1, 1, 1 << 30} {
		requireErr(t, e.DeviceSynchronize(dev), backend.OpDeviceSync, backend.ErrInvalidArgument, "")
	}
	require.NoError(t, e.FailNth(backend.OpDeviceSync, 1, backend.ErrUnavailable))
	requireErr(t, e.DeviceSynchronize(0), backend.OpDeviceSync, backend.ErrUnavailable, "")
	n, err := e.Pending(s)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "a failed synchronize completes nothing")
	require.NoError(t, e.DeviceSynchronize(0))
	n, err = e.Pending(s)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, int64(5), e.Calls(backend.OpDeviceSync))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, e.Close())
	requireErr(t, e.DeviceSynchronize(0), backend.OpDeviceSync, backend.ErrUnavailable, "")
}
