package emulated_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

const (
	MiB = emulated.MiB
	GiB = emulated.GiB
	TiB = emulated.TiB
)

var rw0 = []backend.AccessDesc{{Location: dev(0), Flags: backend.AccessReadWrite}}

func dev(id int) backend.Location { return backend.Location{Type: backend.LocationDevice, ID: id} }

// newEmu builds an emulator that is closed, and checked for violations, at
// the end of the test.
func newEmu(t *testing.T, opts ...emulated.Option) *emulated.Emulator {
	t.Helper()
	e, err := emulated.New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// state is everything observable about a set of processes.
type state struct {
	Live         []emulated.LiveCounts
	Mappings     [][]emulated.Mapping
	Reservations [][]emulated.Reservation
	Handles      [][]emulated.HandleInfo
	Violations   []emulated.Violation
}

func snapshot(procs ...*emulated.Emulator) state {
	var s state
	for _, p := range procs {
		s.Live = append(s.Live, p.Live())
		s.Mappings = append(s.Mappings, p.Mappings())
		s.Reservations = append(s.Reservations, p.Reservations())
		s.Handles = append(s.Handles, p.Handles())
	}
	s.Violations = procs[0].Violations()
	return s
}

// requireErr asserts err is a *backend.Error of op, kind and rule.
func requireErr(t *testing.T, err error, op backend.Op, kind error, rule string) *backend.Error {
	t.Helper()
	require.Error(t, err)
	var be *backend.Error
	require.True(t, errors.As(err, &be), "%v (%T) is not a *backend.Error", err, err)
	require.ErrorIs(t, err, kind, "%v", err)
	require.Equal(t, op, be.Op, "%v", err)
	require.Equal(t, rule, be.Rule, "%v", err)
	require.NotEmpty(t, be.Msg)
	require.NotZero(t, be.Code)
	return be
}

// mapped reserves nres bytes and maps a fresh handle of size bytes at its
// start with read-write access for device 0.
func mapped(t *testing.T, e *emulated.Emulator, nres, size uint64) (uintptr, backend.Handle) {
	t.Helper()
	va, err := e.ReserveAddress(nres)
	require.NoError(t, err)
	h, err := e.CreatePhysical(size, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, size, h))
	require.NoError(t, e.SetAccess(va, size, rw0))
	return va, h
}

// addr converts an address to uintptr; a function, so that the tests
// compile on 32-bit platforms, where New refuses to run.
func addr(a uint64) uintptr { return uintptr(a) }
