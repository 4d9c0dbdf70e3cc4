package backend_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestStreamValidator: every answer of a validator over the emulator, for
// both kinds of validator (one device, any device), and Gone for the same
// streams.
func TestStreamValidator(t *testing.T) {
	e, err := emulated.New(emulated.WithDevices(2), emulated.WithManualCompletion())
	require.NoError(t, err)
	defer e.Close()
	s0, err := e.StreamCreate(0)
	require.NoError(t, err)
	s1, err := e.StreamCreate(1)
	require.NoError(t, err)
	busy, err := e.StreamCreate(0) // destroyed with work pending: the driver still runs it
	require.NoError(t, err)
	require.NoError(t, e.Launch(busy, 0, 0))
	require.NoError(t, e.StreamDestroy(busy))
	idle, err := e.StreamCreate(1)
	require.NoError(t, err)
	require.NoError(t, e.StreamDestroy(idle))

	dev0 := backend.NewStreamValidator(e, 0)
	any := backend.NewStreamValidator(e, backend.AnyDevice)
	for _, tc := range []struct {
		name   string
		v      backend.StreamValidator
		s      backend.Stream
		dev    int
		reason backend.StreamReason // 0: valid
		text   string
	}{
		{"dev0: its stream", dev0, s0, 0, 0, ""},
		{"dev0: stream of device 1", dev0, s1, 0, backend.StreamOtherDevice, "belongs to device 1, not 0"},
		{"dev0: zero", dev0, 0, 0, backend.StreamZero, "stream 0 names no stream"},
		{"dev0: destroyed with work pending", dev0, busy, 0, backend.StreamUnknown, "does not exist (destroyed, or never created)"},
		{"dev0: destroyed", dev0, idle, 0, backend.StreamUnknown, "does not exist"},
		{"dev0: never created", dev0, 1 << 40, 0, backend.StreamUnknown, "does not exist"},
		{"any: device 0", any, s0, 0, 0, ""},
		{"any: device 1", any, s1, 1, 0, ""},
		{"any: zero", any, 0, 0, backend.StreamZero, "stream 0"},
		{"any: destroyed", any, busy, 0, backend.StreamUnknown, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, err := tc.v.Validate(tc.s)
			if tc.reason == 0 {
				require.NoError(t, err)
				assert.Equal(t, tc.dev, dev)
				assert.False(t, tc.v.Gone(tc.s))
				return
			}
			var se *backend.StreamError
			require.True(t, errors.As(err, &se), "%v", err)
			assert.Equal(t, tc.s, se.Stream)
			assert.Equal(t, tc.reason, se.Reason)
			assert.Contains(t, err.Error(), tc.text)
			assert.Equal(t, tc.reason == backend.StreamUnknown, errors.Is(err, backend.ErrInvalidArgument),
				"only the driver's refusal wraps its error")
			if tc.s != 0 {
				assert.Equal(t, tc.reason == backend.StreamUnknown, tc.v.Gone(tc.s))
			}
		})
	}
}

// TestStreamValidatorQueryFails: when the driver cannot answer, the
// validator returns the driver's error, not a refusal of the stream, and
// Gone does not call the stream destroyed.
func TestStreamValidatorQueryFails(t *testing.T) {
	e, err := emulated.New()
	require.NoError(t, err)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	v := backend.NewStreamValidator(e, 0)
	require.NoError(t, e.Close())
	_, err = v.Validate(s)
	require.ErrorIs(t, err, backend.ErrUnavailable)
	var se *backend.StreamError
	assert.False(t, errors.As(err, &se), "a failed query is no verdict on the stream: %v", err)
	assert.False(t, v.Gone(s))
}

func TestStreamReasonNames(t *testing.T) {
	assert.Equal(t, "zero", backend.StreamZero.String())
	assert.Equal(t, "unknown", backend.StreamUnknown.String())
	assert.Equal(t, "other-device", backend.StreamOtherDevice.String())
	assert.Equal(t, "StreamReason(9)", backend.StreamReason(9).String())
}
