package emulated_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func query(t *testing.T, e *emulated.Emulator, ev backend.Event) bool {
	t.Helper()
	done, err := e.EventQuery(ev)
	require.NoError(t, err)
	return done
}

func pending(t *testing.T, e *emulated.Emulator, s backend.Stream) int {
	t.Helper()
	n, err := e.Pending(s)
	require.NoError(t, err)
	return n
}

func TestStreamsImmediateByDefault(t *testing.T) {
	e := newEmu(t)
	va, _ := mapped(t, e, 4*MiB, 2*MiB)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	ev, err := e.EventCreate(0)
	require.NoError(t, err)
	assert.True(t, query(t, e, ev), "an event never recorded is complete")
	require.NoError(t, e.Launch(s, va, 2*MiB))
	require.NoError(t, e.EventRecord(ev, s))
	assert.True(t, query(t, e, ev))
	assert.Zero(t, pending(t, e, s))
	assert.Empty(t, e.Violations())
}

func TestStreamsManualCompletion(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion(), emulated.WithDevices(2))
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	s1, err := e.StreamCreate(1)
	require.NoError(t, err)
	d, err := e.StreamDevice(s1)
	require.NoError(t, err)
	assert.Equal(t, 1, d)
	evs := make([]backend.Event, 3)
	for i := range evs {
		evs[i], err = e.EventCreate(0)
		require.NoError(t, err)
	}
	for i := range evs {
		require.NoError(t, e.Launch(s, 0, 0))
		require.NoError(t, e.EventRecord(evs[i], s))
	}
	assert.Equal(t, 3, pending(t, e, s))
	assert.Equal(t, 3, e.Live().PendingWork)
	for i := range evs {
		assert.False(t, query(t, e, evs[i]), "event %d", i)
	}
	require.NoError(t, e.CompleteN(s, 1))
	assert.Equal(t, []bool{true, false, false}, []bool{query(t, e, evs[0]), query(t, e, evs[1]), query(t, e, evs[2])})
	require.NoError(t, e.EventSynchronize(evs[1]))
	assert.Equal(t, []bool{true, true, false}, []bool{query(t, e, evs[0]), query(t, e, evs[1]), query(t, e, evs[2])})
	assert.Equal(t, 1, pending(t, e, s))
	assert.ErrorIs(t, e.CompleteN(s, 2), backend.ErrInvalidArgument)
	assert.ErrorIs(t, e.CompleteN(s, -1), backend.ErrInvalidArgument)
	require.NoError(t, e.StreamSynchronize(s))
	assert.True(t, query(t, e, evs[2]))
	assert.Equal(t, int64(1), e.Calls(backend.OpStreamSync))
	assert.Equal(t, int64(1), e.Calls(backend.OpEventSync))

	// EventRecord across devices is rejected.
	requireErr(t, e.EventRecord(evs[0], s1), backend.OpEventRecord, backend.ErrInvalidArgument, "")

	// Resume completes and switches back to immediate completion.
	require.NoError(t, e.Launch(s1, 0, 0))
	require.NoError(t, e.Resume(s1))
	assert.Zero(t, pending(t, e, s1))
	require.NoError(t, e.Launch(s1, 0, 0))
	assert.Zero(t, pending(t, e, s1))
	require.NoError(t, e.Hold(s1))
	require.NoError(t, e.Launch(s1, 0, 0))
	require.NoError(t, e.Launch(s, 0, 0))
	require.NoError(t, e.CompleteAll())
	assert.Zero(t, e.Live().PendingWork)

	// A destroyed stream's pending work stays until completed.
	require.NoError(t, e.Launch(s, 0, 0))
	require.NoError(t, e.EventRecord(evs[0], s))
	require.NoError(t, e.StreamDestroy(s))
	assert.False(t, query(t, e, evs[0]))
	_, err = e.StreamDevice(s)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
	requireErr(t, e.StreamSynchronize(s), backend.OpStreamSync, backend.ErrInvalidArgument, "")
	assert.ErrorIs(t, e.Launch(s, 0, 0), backend.ErrInvalidArgument)
	require.NoError(t, e.Complete(s))
	assert.True(t, query(t, e, evs[0]))
	_, err = e.Pending(s)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument, "the stream is gone once its work completed")
	assert.Equal(t, 1, e.Live().Streams)

	require.NoError(t, e.EventDestroy(evs[0]))
	requireErr(t, e.EventDestroy(evs[0]), backend.OpEventDestroy, backend.ErrInvalidArgument, "")
	_, err = e.EventQuery(evs[0])
	requireErr(t, err, backend.OpEventQuery, backend.ErrInvalidArgument, "")
	assert.ErrorIs(t, e.Hold(99), backend.ErrInvalidArgument)
}

// TestViolationUnmapInUse is PyTorch #196258: memory is unmapped while a
// stream still has work on it.
func TestViolationUnmapInUse(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion())
	va, h := mapped(t, e, 8*MiB, 4*MiB)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, va+uintptr(MiB), MiB))
	require.NoError(t, e.FreePhysical(h))
	assert.Empty(t, e.Violations(), "freeing a mapped handle releases nothing yet")
	require.NoError(t, e.Unmap(va, 4*MiB))
	v := e.Violations()
	require.Len(t, v, 2)
	assert.Equal(t, emulated.Violation{
		Kind: emulated.ViolationUnmapInUse, Pid: 1000, Stream: s, Device: 0, Seq: 1,
		VA: va + uintptr(MiB), Size: MiB, Msg: v[0].Msg,
	}, v[0])
	assert.Equal(t, emulated.ViolationFreeInUse, v[1].Kind, "the unmap released the memory too")
	assert.Contains(t, v[0].String(), "unmap-in-use")
	e.ClearViolations()
	assert.Empty(t, e.Violations())
	require.NoError(t, e.Complete(s))
}

func TestViolationNoneAfterSync(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion())
	va, h := mapped(t, e, 8*MiB, 4*MiB)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	ev, err := e.EventCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, va, 4*MiB))
	require.NoError(t, e.EventRecord(ev, s))
	require.NoError(t, e.Launch(s, va+uintptr(4*MiB), 0)) // touches nothing
	require.NoError(t, e.EventSynchronize(ev))
	require.NoError(t, e.Unmap(va, 4*MiB))
	require.NoError(t, e.FreePhysical(h))
	assert.Empty(t, e.Violations())
	assert.Equal(t, 1, pending(t, e, s))
}

// TestViolationWrongDeviceSynchronized: synchronizing device 0's stream
// does not make device 1's work on the memory safe to unmap (#196258).
func TestViolationWrongDeviceSynchronized(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion(), emulated.WithDevices(2))
	va, err := e.ReserveAddress(4 * MiB)
	require.NoError(t, err)
	h, err := e.CreatePhysical(2*MiB, backend.DeviceProp(1))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, 2*MiB, h))
	require.NoError(t, e.SetAccess(va, 2*MiB, []backend.AccessDesc{{Location: dev(1), Flags: backend.AccessReadWrite}}))
	s0, err := e.StreamCreate(0)
	require.NoError(t, err)
	s1, err := e.StreamCreate(1)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s1, va, 2*MiB))
	require.NoError(t, e.StreamSynchronize(s0)) // the wrong device
	require.NoError(t, e.Unmap(va, 2*MiB))
	v := e.Violations()
	require.Len(t, v, 1)
	assert.Equal(t, emulated.ViolationUnmapInUse, v[0].Kind)
	assert.Equal(t, s1, v[0].Stream)
	assert.Equal(t, 1, v[0].Device)
	require.NoError(t, e.Complete(s1))
}

func TestViolationIllegalAccess(t *testing.T) {
	e := newEmu(t, emulated.WithDevices(2))
	va, err := e.ReserveAddress(8 * MiB)
	require.NoError(t, err)
	h, err := e.CreatePhysical(2*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, 2*MiB, h))
	s0, err := e.StreamCreate(0)
	require.NoError(t, err)
	s1, err := e.StreamCreate(1)
	require.NoError(t, err)

	require.NoError(t, e.Launch(s0, va, MiB)) // before SetAccess (R8)
	require.Len(t, e.Violations(), 1)
	assert.Equal(t, emulated.ViolationIllegalAccess, e.Violations()[0].Kind)
	require.NoError(t, e.SetAccess(va, 2*MiB, rw0))
	h2, err := e.CreatePhysical(2*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.Map(va+uintptr(2*MiB), 2*MiB, h2))
	require.NoError(t, e.SetAccess(va+uintptr(2*MiB), 2*MiB, []backend.AccessDesc{{Location: dev(0), Flags: backend.AccessRead}}))
	hp, err := e.MallocHost(8192)
	require.NoError(t, err)
	require.NoError(t, e.HostRegister(hp, 4096, backend.HostRegisterMapped))
	dp, err := e.HostGetDevicePointer(hp)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		s    backend.Stream
		va   uintptr
		size uint64
		bad  bool
	}{
		{"accessible", s0, va, 2 * MiB, false},
		{"other device without peer access", s1, va, MiB, true},
		{"read-only mapping", s0, va + uintptr(2*MiB), MiB, true},
		{"runs past the mappings", s0, va + uintptr(MiB), 4 * MiB, true},
		{"unmapped", s0, va + uintptr(6*MiB), 1, true},
		{"wraps around", s0, ^uintptr(0) - 10, 100, true},
		{"pinned host memory", s1, hp + 1, 8000, false},
		{"past the host block", s1, hp, 8193, true},
		{"registered host memory", s1, dp, 4096, false},
		{"nothing", s1, 0, 0, false},
	} {
		e.ClearViolations()
		require.NoError(t, e.Launch(c.s, c.va, c.size))
		v := e.Violations()
		if c.bad {
			require.Len(t, v, 1, c.name)
			assert.Equal(t, emulated.ViolationIllegalAccess, v[0].Kind, c.name)
		} else {
			assert.Empty(t, v, c.name)
		}
	}
	e.ClearViolations()
	// Peer access makes device 1's work legal.
	require.NoError(t, e.SetAccess(va, 2*MiB, []backend.AccessDesc{{Location: dev(1), Flags: backend.AccessReadWrite}}))
	require.NoError(t, e.Launch(s1, va, 2*MiB))
	assert.Empty(t, e.Violations())
}

func TestViolationFreeHost(t *testing.T) {
	e := newEmu(t, emulated.WithManualCompletion())
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	p, err := e.MallocHost(4096)
	require.NoError(t, err)
	q, err := e.MallocHost(4096)
	require.NoError(t, err)
	require.NoError(t, e.Launch(s, p, 4096))
	require.NoError(t, e.Launch(s, q, 64))
	require.NoError(t, e.Launch(s, 0, 0))
	// FreeHostWithDevSync waits for the work on q (and what precedes it).
	require.NoError(t, e.FreeHostWithDevSync(q))
	assert.Empty(t, e.Violations())
	assert.Equal(t, 1, pending(t, e, s))
	require.NoError(t, e.Launch(s, p, 4096))
	require.NoError(t, e.FreeHost(p)) // FreeHost does not wait
	v := e.Violations()
	require.Len(t, v, 1)
	assert.Equal(t, emulated.ViolationFreeHostInUse, v[0].Kind)
	assert.Equal(t, uint64(4), v[0].Seq)
	require.NoError(t, e.Complete(s))
}

// TestViolationImportedMemory: work in the importing process keeps the
// memory busy; the exporter freeing its handle is fine, the importer
// unmapping too early is not.
func TestViolationImportedMemory(t *testing.T) {
	a := newEmu(t, emulated.WithManualCompletion())
	b, err := a.Process(2000)
	require.NoError(t, err)
	h, err := a.CreatePhysical(2*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	sh, err := a.Export(h, backend.ShareDisablePidValidation)
	require.NoError(t, err)
	hb, err := b.Import(sh, 0)
	require.NoError(t, err)
	vb, err := b.ReserveAddress(2 * MiB)
	require.NoError(t, err)
	require.NoError(t, b.Map(vb, 2*MiB, hb))
	require.NoError(t, b.SetAccess(vb, 2*MiB, rw0))
	s, err := b.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, b.Launch(s, vb, 2*MiB))
	require.NoError(t, a.FreePhysical(h))
	assert.Empty(t, a.Violations())
	require.NoError(t, b.FreePhysical(hb))
	require.NoError(t, b.Unmap(vb, 2*MiB))
	v := b.Violations()
	require.Len(t, v, 2)
	assert.Equal(t, int32(2000), v[0].Pid)
	assert.Equal(t, emulated.ViolationUnmapInUse, v[0].Kind)
	assert.Equal(t, emulated.ViolationFreeInUse, v[1].Kind)
	require.NoError(t, b.Complete(s))
}
