// Package conformance is the test suite every backend.Driver must pass. A
// backend's tests call Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) backend.Driver {
//			d, err := mybackend.Open()
//			require.NoError(t, err)
//			t.Cleanup(func() { d.Close() })
//			return d
//		}, conformance.ExactMemInfo())
//	}
//
// Each case runs as a subtest on a fresh driver and checks one contract of
// the backend package documentation against the seed rules: the
// granularity, the reserve/create/map/set-access/unmap/free/release
// lifecycle, whole-handle maps at any offset of a reservation, rejection of
// size mismatches and of releasing a reservation that still holds a
// mapping, deferred freeing of a mapped handle, address-range lookup,
// retained handles, and stream/event ordering. A rejected call must return
// a *backend.Error wrapping the right sentinel and leave the state as it
// was, which the cases check through the driver's own queries.
//
// The suite needs only a couple of granules of device memory per case and
// never relies on undefined behaviour (such as using a freed handle), so it
// can run against hardware.
//
// Optional capabilities are found by type assertion: backend.IPC and
// backend.HostMemory cases run when the driver implements them, and so do
// the backend.Copier and backend.DeviceSynchronizer cases; Workload (a
// driver that lets the test queue work and decide when it completes, like
// the emulated backend) enables the ordering cases; HostView (mapped device
// memory readable from the host) enables the data cases.
package conformance

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Workload is implemented by test drivers that can queue work on a stream
// and hold it until the test completes it.
type Workload interface {
	// Hold makes work on s stay pending until completed by CompleteN or a
	// synchronize call.
	Hold(s backend.Stream) error
	// Launch queues work on s touching [va, va+size).
	Launch(s backend.Stream, va uintptr, size uint64) error
	// CompleteN completes the oldest n pending work items of s.
	CompleteN(s backend.Stream, n int) error
}

// HostView is implemented by drivers whose mapped memory the host can read
// and write once SetAccess granted read-write.
type HostView interface {
	// Bytes returns the memory at [va, va+size). It may fail with
	// backend.ErrNotSupported, which skips the data cases.
	Bytes(va uintptr, size uint64) ([]byte, error)
}

// Option adjusts what Run checks.
type Option func(*options)

type options struct {
	exactMemInfo bool
	other        func(t *testing.T, d backend.Driver) backend.Driver
}

// ExactMemInfo asserts that MemGetInfo's free memory moves by exactly the
// bytes of physical memory created and released: true of emulators, not of
// devices shared with other work.
func ExactMemInfo() Option { return func(o *options) { o.exactMemInfo = true } }

// OtherProcess supplies, for the IPC cases, a driver acting as a second
// process on the same devices as d.
func OtherProcess(fn func(t *testing.T, d backend.Driver) backend.Driver) Option {
	return func(o *options) { o.other = fn }
}

// suite is the state of one case.
type suite struct {
	t    *testing.T
	d    backend.Driver
	o    *options
	g    uint64               // granularity of prop, nbytes
	prop backend.PhysicalProp // huge pages on device 0
}

// Run runs every case as a subtest of t, each on a driver from newDriver.
func Run(t *testing.T, newDriver func(t *testing.T) backend.Driver, opts ...Option) {
	var o options
	for _, fn := range opts {
		fn(&o)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(t)
			require.NotNil(t, d, "newDriver returned nil")
			s := &suite{t: t, d: d, o: &o, prop: backend.DeviceProp(0)}
			g, err := d.Granularity(s.prop, backend.GranularityMinimum)
			require.NoError(t, err, "Granularity of device 0")
			require.NotZero(t, g)
			s.g = g
			c.fn(s)
		})
	}
}

var cases = []struct {
	name string
	fn   func(s *suite)
}{
	{"Identity", (*suite).identity},
	{"MemGetInfo", (*suite).memGetInfo},
	{"Granularity", (*suite).granularity},
	{"GranularityInvalid", (*suite).granularityInvalid},
	{"ReserveRelease", (*suite).reserveRelease},
	{"CreateInvalid", (*suite).createInvalid},
	{"OutOfMemory", (*suite).outOfMemory},
	{"Lifecycle", (*suite).lifecycle},
	{"MapAtOffset", (*suite).mapAtOffset},
	{"MapSizeMismatch", (*suite).mapSizeMismatch},
	{"MapOutsideReservation", (*suite).mapOutsideReservation},
	{"MapOverlap", (*suite).mapOverlap},
	{"MapMisaligned", (*suite).mapMisaligned},
	{"UnmapMismatch", (*suite).unmapMismatch},
	{"ReleaseWithMapping", (*suite).releaseWithMapping},
	{"FreeWhileMappedDeferred", (*suite).freeWhileMapped},
	{"AccessUntilSetAccess", (*suite).access},
	{"AddressRange", (*suite).addressRange},
	{"Retain", (*suite).retain},
	{"HandleProperties", (*suite).handleProperties},
	{"MultiDevice", (*suite).multiDevice},
	{"StreamsAndEvents", (*suite).streamsAndEvents},
	{"WorkOrdering", (*suite).workOrdering},
	{"Data", (*suite).data},
	{"IPC", (*suite).ipc},
	{"IPCImport", (*suite).ipcImport},
	{"HostMemory", (*suite).hostMemory},
	{"Copier", (*suite).copier},
	{"CopierRejects", (*suite).copierRejects},
	{"DeviceSynchronize", (*suite).deviceSynchronize},
}

// RequireKind asserts that err is a *backend.Error of primitive op wrapping
// kind.
func RequireKind(t testing.TB, err error, op backend.Op, kind error) {
	t.Helper()
	require.Error(t, err, "%v should fail with %v", op, kind)
	var be *backend.Error
	require.True(t, errors.As(err, &be), "error %v (%T) is not a *backend.Error", err, err)
	require.ErrorIs(t, err, kind, "wrong kind: %v", err)
	require.Equal(t, op, be.Op, "wrong op in %v", err)
}

// --- helpers --------------------------------------------------------------

func (s *suite) reserve(nbytes uint64) uintptr {
	s.t.Helper()
	va, err := s.d.ReserveAddress(nbytes)
	require.NoError(s.t, err, "ReserveAddress(%d)", nbytes)
	require.NotZero(s.t, va)
	require.Zero(s.t, uint64(va)%s.g, "reservation %#x not aligned to the granularity", va)
	return va
}

func (s *suite) create(nbytes uint64) backend.Handle {
	s.t.Helper()
	h, err := s.d.CreatePhysical(nbytes, s.prop)
	require.NoError(s.t, err, "CreatePhysical(%d)", nbytes)
	require.NotZero(s.t, h)
	return h
}

func (s *suite) mapRW(va uintptr, nbytes uint64, h backend.Handle, dev int) {
	s.t.Helper()
	require.NoError(s.t, s.d.Map(va, nbytes, h), "Map(%#x, %d, %d)", va, nbytes, h)
	require.NoError(s.t, s.d.SetAccess(va, nbytes, []backend.AccessDesc{{
		Location: backend.Location{Type: backend.LocationDevice, ID: dev}, Flags: backend.AccessReadWrite,
	}}))
}

func (s *suite) free() uint64 {
	s.t.Helper()
	f, _, err := s.d.MemGetInfo(0)
	require.NoError(s.t, err)
	return f
}

// requireMapped asserts that va lies in the mapping [base, base+size).
func (s *suite) requireMapped(va, base uintptr, size uint64) {
	s.t.Helper()
	b, n, err := s.d.AddressRange(va)
	require.NoError(s.t, err, "AddressRange(%#x)", va)
	require.Equal(s.t, base, b)
	require.Equal(s.t, size, n)
}

// requireUnmapped asserts that no mapping contains va.
func (s *suite) requireUnmapped(va uintptr) {
	s.t.Helper()
	_, _, err := s.d.AddressRange(va)
	RequireKind(s.t, err, backend.OpAddressRange, backend.ErrInvalidArgument)
}

func devLoc(dev int) backend.Location {
	return backend.Location{Type: backend.LocationDevice, ID: dev}
}

// --- cases ----------------------------------------------------------------

func (s *suite) identity() {
	assert.NotEmpty(s.t, s.d.Name())
	assert.GreaterOrEqual(s.t, s.d.DeviceCount(), 1)
}

func (s *suite) memGetInfo() {
	for dev := 0; dev < s.d.DeviceCount(); dev++ {
		free, total, err := s.d.MemGetInfo(dev)
		require.NoError(s.t, err)
		assert.NotZero(s.t, total, "device %d", dev)
		assert.LessOrEqual(s.t, free, total, "device %d", dev)
	}
	for _, dev := range []int{-1, s.d.DeviceCount()} {
		_, _, err := s.d.MemGetInfo(dev)
		RequireKind(s.t, err, backend.OpMemGetInfo, backend.ErrInvalidArgument)
	}
}

func (s *suite) granularity() {
	for dev := 0; dev < s.d.DeviceCount(); dev++ {
		prop := backend.DeviceProp(dev)
		minG, err := s.d.Granularity(prop, backend.GranularityMinimum)
		require.NoError(s.t, err)
		recG, err := s.d.Granularity(prop, backend.GranularityRecommended)
		require.NoError(s.t, err)
		assert.NotZero(s.t, minG)
		assert.Zero(s.t, minG&(minG-1), "minimum granularity %d is not a power of two", minG)
		assert.GreaterOrEqual(s.t, recG, minG)
		assert.Zero(s.t, recG%minG, "recommended %d is not a multiple of minimum %d", recG, minG)
	}
}

func (s *suite) granularityInvalid() {
	bad := []struct {
		name string
		prop backend.PhysicalProp
		opt  backend.GranularityOption
	}{
		{"device out of range", backend.DeviceProp(s.d.DeviceCount()), backend.GranularityMinimum},
		{"negative device", backend.DeviceProp(-1), backend.GranularityMinimum},
		{"unknown option", s.prop, backend.GranularityOption(7)},
		{"unknown page attribute", backend.PhysicalProp{Location: devLoc(0), Attr: backend.PageAttr(9)}, backend.GranularityMinimum},
		{"unknown location type", backend.PhysicalProp{Location: backend.Location{Type: backend.LocationType(9)}, Attr: backend.PageHuge}, backend.GranularityMinimum},
		{"1 GiB host pages", backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}, Attr: backend.PageHuge1G}, backend.GranularityMinimum},
	}
	for _, c := range bad {
		_, err := s.d.Granularity(c.prop, c.opt)
		require.Error(s.t, err, c.name)
		var be *backend.Error
		require.True(s.t, errors.As(err, &be), "%s: %v is not a *backend.Error", c.name, err)
		require.Equal(s.t, backend.OpGranularity, be.Op, c.name)
		require.True(s.t, errors.Is(err, backend.ErrInvalidArgument) || errors.Is(err, backend.ErrNotSupported),
			"%s: want invalid-argument or not-supported, got %v", c.name, err)
	}
}

func (s *suite) reserveRelease() {
	_, err := s.d.ReserveAddress(0)
	RequireKind(s.t, err, backend.OpReserve, backend.ErrInvalidArgument)

	a := s.reserve(4 * s.g)
	b := s.reserve(4 * s.g)
	assert.NotEqual(s.t, a, b)
	assert.True(s.t, uint64(b) >= uint64(a)+4*s.g || uint64(a) >= uint64(b)+4*s.g, "reservations overlap")

	err = s.d.ReleaseAddress(a, 4*s.g+s.g)
	RequireKind(s.t, err, backend.OpRelease, backend.ErrInvalidArgument)
	err = s.d.ReleaseAddress(a+uintptr(s.g), 3*s.g)
	RequireKind(s.t, err, backend.OpRelease, backend.ErrInvalidArgument)
	require.NoError(s.t, s.d.ReleaseAddress(a, 4*s.g))
	require.NoError(s.t, s.d.ReleaseAddress(b, 4*s.g))
	err = s.d.ReleaseAddress(a, 4*s.g)
	RequireKind(s.t, err, backend.OpRelease, backend.ErrInvalidArgument)
}

func (s *suite) createInvalid() {
	for _, n := range []uint64{0, s.g + 1, s.g / 2} {
		if n == s.g/2 && s.g < 2 {
			continue
		}
		before := s.free()
		_, err := s.d.CreatePhysical(n, s.prop)
		RequireKind(s.t, err, backend.OpCreate, backend.ErrInvalidArgument)
		if s.o.exactMemInfo {
			assert.Equal(s.t, before, s.free(), "rejected create of %d changed free memory", n)
		}
	}
	_, err := s.d.CreatePhysical(s.g, backend.DeviceProp(s.d.DeviceCount()))
	RequireKind(s.t, err, backend.OpCreate, backend.ErrInvalidArgument)
}

func (s *suite) outOfMemory() {
	_, total, err := s.d.MemGetInfo(0)
	require.NoError(s.t, err)
	n := (total/s.g + 1) * s.g
	before := s.free()
	_, err = s.d.CreatePhysical(n, s.prop)
	RequireKind(s.t, err, backend.OpCreate, backend.ErrOutOfMemory)
	if s.o.exactMemInfo {
		assert.Equal(s.t, before, s.free())
	}
}

func (s *suite) lifecycle() {
	g := s.g
	free0 := s.free()
	base := s.reserve(4 * g)
	h1 := s.create(g)
	h2 := s.create(2 * g)
	assert.NotEqual(s.t, h1, h2)
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0-3*g, s.free())
	}
	s.mapRW(base, g, h1, 0)
	s.mapRW(base+uintptr(2*g), 2*g, h2, 0)
	s.requireMapped(base, base, g)
	s.requireMapped(base+uintptr(3*g), base+uintptr(2*g), 2*g)
	s.requireUnmapped(base + uintptr(g))

	require.NoError(s.t, s.d.Unmap(base, g))
	require.NoError(s.t, s.d.Unmap(base+uintptr(2*g), 2*g))
	s.requireUnmapped(base)
	require.NoError(s.t, s.d.FreePhysical(h1))
	require.NoError(s.t, s.d.FreePhysical(h2))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0, s.free())
	}
}

func (s *suite) mapAtOffset() {
	g := s.g
	base := s.reserve(8 * g)
	h := s.create(2 * g)
	// Any granule-aligned offset inside the reservation is fine (R6), also
	// one that ends exactly at the reservation's end.
	for _, off := range []uint64{g, 6 * g} {
		va := base + uintptr(off)
		require.NoError(s.t, s.d.Map(va, 2*g, h), "offset %d", off)
		s.requireMapped(va+uintptr(g), va, 2*g)
		require.NoError(s.t, s.d.Unmap(va, 2*g))
	}
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 8*g))
}

func (s *suite) mapSizeMismatch() {
	g := s.g
	base := s.reserve(4 * g)
	h := s.create(2 * g)
	for _, n := range []uint64{g, 3 * g, 4 * g} {
		err := s.d.Map(base, n, h)
		RequireKind(s.t, err, backend.OpMap, backend.ErrInvalidArgument)
		s.requireUnmapped(base)
	}
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) mapOutsideReservation() {
	g := s.g
	base := s.reserve(4 * g)
	h := s.create(2 * g)
	// Sticks out of the end.
	err := s.d.Map(base+uintptr(3*g), 2*g, h)
	RequireKind(s.t, err, backend.OpMap, backend.ErrInvalidArgument)
	s.requireUnmapped(base + uintptr(3*g))
	// Released address space.
	other := s.reserve(4 * g)
	require.NoError(s.t, s.d.ReleaseAddress(other, 4*g))
	err = s.d.Map(other, 2*g, h)
	RequireKind(s.t, err, backend.OpMap, backend.ErrInvalidArgument)
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) mapOverlap() {
	g := s.g
	base := s.reserve(4 * g)
	h1 := s.create(2 * g)
	h2 := s.create(2 * g)
	require.NoError(s.t, s.d.Map(base+uintptr(g), 2*g, h1))
	for _, off := range []uint64{0, g, 2 * g} {
		err := s.d.Map(base+uintptr(off), 2*g, h2)
		RequireKind(s.t, err, backend.OpMap, backend.ErrInvalidArgument)
	}
	s.requireUnmapped(base)
	s.requireMapped(base+uintptr(2*g), base+uintptr(g), 2*g)
	require.NoError(s.t, s.d.Unmap(base+uintptr(g), 2*g))
	require.NoError(s.t, s.d.FreePhysical(h1))
	require.NoError(s.t, s.d.FreePhysical(h2))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) mapMisaligned() {
	g := s.g
	if g < 2 {
		s.t.Skip("granularity 1")
	}
	base := s.reserve(4 * g)
	h := s.create(g)
	err := s.d.Map(base+uintptr(g/2), g, h)
	RequireKind(s.t, err, backend.OpMap, backend.ErrInvalidArgument)
	s.requireUnmapped(base + uintptr(g/2))
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) unmapMismatch() {
	g := s.g
	base := s.reserve(4 * g)
	h := s.create(2 * g)
	require.NoError(s.t, s.d.Map(base, 2*g, h))
	err := s.d.Unmap(base, g)
	RequireKind(s.t, err, backend.OpUnmap, backend.ErrInvalidArgument)
	err = s.d.Unmap(base, 4*g)
	RequireKind(s.t, err, backend.OpUnmap, backend.ErrInvalidArgument)
	err = s.d.Unmap(base+uintptr(g), g) // inside the mapping, not its start (R9)
	RequireKind(s.t, err, backend.OpUnmap, backend.ErrInvalidArgument)
	err = s.d.Unmap(base+uintptr(2*g), 2*g) // nothing mapped there
	RequireKind(s.t, err, backend.OpUnmap, backend.ErrInvalidArgument)
	s.requireMapped(base+uintptr(g), base, 2*g)
	require.NoError(s.t, s.d.Unmap(base, 2*g))
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) releaseWithMapping() {
	g := s.g
	base := s.reserve(2 * g)
	h := s.create(g)
	require.NoError(s.t, s.d.Map(base+uintptr(g), g, h))
	err := s.d.ReleaseAddress(base, 2*g)
	RequireKind(s.t, err, backend.OpRelease, backend.ErrInvalidArgument)
	s.requireMapped(base+uintptr(g), base+uintptr(g), g)
	require.NoError(s.t, s.d.Unmap(base+uintptr(g), g))
	require.NoError(s.t, s.d.ReleaseAddress(base, 2*g))
	require.NoError(s.t, s.d.FreePhysical(h))
}

func (s *suite) freeWhileMapped() {
	g := s.g
	free0 := s.free()
	base := s.reserve(2 * g)
	h := s.create(g)
	s.mapRW(base, g, h, 0)
	require.NoError(s.t, s.d.FreePhysical(h))
	// The mapping and the memory stay until the unmap (R3).
	s.requireMapped(base, base, g)
	f, err := s.d.GetAccess(base, devLoc(0))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessReadWrite, f)
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0-g, s.free(), "memory released before the unmap")
	}
	require.NoError(s.t, s.d.Unmap(base, g))
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0, s.free(), "memory not released by the last unmap")
	}
	require.NoError(s.t, s.d.ReleaseAddress(base, 2*g))
}

func (s *suite) access() {
	g := s.g
	base := s.reserve(4 * g)
	h := s.create(2 * g)
	require.NoError(s.t, s.d.Map(base, 2*g, h))
	f, err := s.d.GetAccess(base, devLoc(0))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessNone, f, "mapped memory must be inaccessible until SetAccess")

	rw := []backend.AccessDesc{{Location: devLoc(0), Flags: backend.AccessReadWrite}}
	err = s.d.SetAccess(base, g, rw) // not the mapping's size (R10)
	RequireKind(s.t, err, backend.OpSetAccess, backend.ErrInvalidArgument)
	err = s.d.SetAccess(base+uintptr(g), g, rw) // inside, not the start
	RequireKind(s.t, err, backend.OpSetAccess, backend.ErrInvalidArgument)
	err = s.d.SetAccess(base+uintptr(2*g), 2*g, rw) // unmapped
	RequireKind(s.t, err, backend.OpSetAccess, backend.ErrInvalidArgument)
	f, err = s.d.GetAccess(base, devLoc(0))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessNone, f, "rejected SetAccess changed the access")

	require.NoError(s.t, s.d.SetAccess(base, 2*g, rw))
	f, err = s.d.GetAccess(base+uintptr(g), devLoc(0))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessReadWrite, f)
	require.NoError(s.t, s.d.SetAccess(base, 2*g, []backend.AccessDesc{{Location: devLoc(0), Flags: backend.AccessRead}}))
	f, err = s.d.GetAccess(base, devLoc(0))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessRead, f)

	_, err = s.d.GetAccess(base+uintptr(2*g), devLoc(0))
	RequireKind(s.t, err, backend.OpGetAccess, backend.ErrInvalidArgument)

	// A fresh mapping of the same handle starts inaccessible again.
	require.NoError(s.t, s.d.Unmap(base, 2*g))
	require.NoError(s.t, s.d.Map(base+uintptr(2*g), 2*g, h))
	f, err = s.d.GetAccess(base+uintptr(2*g), devLoc(0))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessNone, f)
	require.NoError(s.t, s.d.Unmap(base+uintptr(2*g), 2*g))
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) addressRange() {
	g := s.g
	base := s.reserve(6 * g)
	h1 := s.create(2 * g)
	h2 := s.create(g)
	require.NoError(s.t, s.d.Map(base, 2*g, h1))
	require.NoError(s.t, s.d.Map(base+uintptr(2*g), g, h2))
	for _, c := range []struct {
		va, base uintptr
		size     uint64
	}{
		{base, base, 2 * g},
		{base + 1, base, 2 * g},
		{base + uintptr(2*g) - 1, base, 2 * g},
		{base + uintptr(2*g), base + uintptr(2*g), g},
		{base + uintptr(3*g) - 1, base + uintptr(2*g), g},
	} {
		s.requireMapped(c.va, c.base, c.size)
	}
	s.requireUnmapped(base + uintptr(3*g))
	s.requireUnmapped(base + uintptr(6*g) - 1)
	require.NoError(s.t, s.d.Unmap(base, 2*g))
	require.NoError(s.t, s.d.Unmap(base+uintptr(2*g), g))
	require.NoError(s.t, s.d.FreePhysical(h1))
	require.NoError(s.t, s.d.FreePhysical(h2))
	require.NoError(s.t, s.d.ReleaseAddress(base, 6*g))
}

func (s *suite) retain() {
	g := s.g
	free0 := s.free()
	base := s.reserve(2 * g)
	h := s.create(g)
	require.NoError(s.t, s.d.Map(base, g, h))
	r, err := s.d.RetainHandle(base)
	require.NoError(s.t, err)
	assert.Equal(s.t, h, r, "RetainHandle returns the mapped handle")
	_, err = s.d.RetainHandle(base + uintptr(g)) // nothing mapped there
	RequireKind(s.t, err, backend.OpRetain, backend.ErrInvalidArgument)

	require.NoError(s.t, s.d.FreePhysical(h)) // the creation's reference
	require.NoError(s.t, s.d.Unmap(base, g))
	// The retained reference keeps the handle alive (R12).
	prop, size, err := s.d.HandleProperties(h)
	require.NoError(s.t, err, "handle released although a retained reference is left")
	assert.Equal(s.t, s.prop, prop)
	assert.Equal(s.t, g, size)
	require.NoError(s.t, s.d.Map(base, g, h))
	require.NoError(s.t, s.d.Unmap(base, g))
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0-g, s.free())
	}
	require.NoError(s.t, s.d.FreePhysical(r))
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0, s.free())
	}
	require.NoError(s.t, s.d.ReleaseAddress(base, 2*g))
}

func (s *suite) handleProperties() {
	h := s.create(2 * s.g)
	prop, size, err := s.d.HandleProperties(h)
	require.NoError(s.t, err)
	assert.Equal(s.t, s.prop, prop)
	assert.Equal(s.t, 2*s.g, size)
	_, _, err = s.d.HandleProperties(h + 1000)
	RequireKind(s.t, err, backend.OpHandleProps, backend.ErrInvalidArgument)
	require.NoError(s.t, s.d.FreePhysical(h))
}

func (s *suite) multiDevice() {
	if s.d.DeviceCount() < 2 {
		s.t.Skip("needs two devices")
	}
	g := s.g
	g1, err := s.d.Granularity(backend.DeviceProp(1), backend.GranularityMinimum)
	require.NoError(s.t, err)
	require.Equal(s.t, g, g1, "the case assumes equal granularities")
	base := s.reserve(4 * g)
	h0 := s.create(g)
	h1, err := s.d.CreatePhysical(g, backend.DeviceProp(1))
	require.NoError(s.t, err)
	prop, _, err := s.d.HandleProperties(h1)
	require.NoError(s.t, err)
	assert.Equal(s.t, 1, prop.Location.ID)

	require.NoError(s.t, s.d.Map(base, g, h0))
	err = s.d.Map(base+uintptr(2*g), g, h1) // two devices in one reservation (R7)
	RequireKind(s.t, err, backend.OpMap, backend.ErrInvalidArgument)
	s.requireUnmapped(base + uintptr(2*g))

	other := s.reserve(2 * g)
	s.mapRW(other, g, h1, 1)
	// Device 0 may be given access to device 1's memory (peer access).
	require.NoError(s.t, s.d.SetAccess(other, g, []backend.AccessDesc{{Location: devLoc(0), Flags: backend.AccessReadWrite}}))
	f, err := s.d.GetAccess(other, devLoc(1))
	require.NoError(s.t, err)
	assert.Equal(s.t, backend.AccessReadWrite, f)

	st, err := s.d.StreamCreate(1)
	require.NoError(s.t, err)
	dev, err := s.d.StreamDevice(st)
	require.NoError(s.t, err)
	assert.Equal(s.t, 1, dev)
	ev, err := s.d.EventCreate(0)
	require.NoError(s.t, err)
	err = s.d.EventRecord(ev, st) // event of device 0, stream of device 1
	RequireKind(s.t, err, backend.OpEventRecord, backend.ErrInvalidArgument)
	require.NoError(s.t, s.d.EventDestroy(ev))
	require.NoError(s.t, s.d.StreamDestroy(st))

	require.NoError(s.t, s.d.Unmap(other, g))
	require.NoError(s.t, s.d.Unmap(base, g))
	// Once empty, the reservation may hold device 1's memory.
	require.NoError(s.t, s.d.Map(base, g, h1))
	require.NoError(s.t, s.d.Unmap(base, g))
	require.NoError(s.t, s.d.FreePhysical(h0))
	require.NoError(s.t, s.d.FreePhysical(h1))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
	require.NoError(s.t, s.d.ReleaseAddress(other, 2*g))
}

func (s *suite) streamsAndEvents() {
	st, err := s.d.StreamCreate(0)
	require.NoError(s.t, err)
	st2, err := s.d.StreamCreate(0)
	require.NoError(s.t, err)
	assert.NotEqual(s.t, st, st2)
	dev, err := s.d.StreamDevice(st)
	require.NoError(s.t, err)
	assert.Equal(s.t, 0, dev)
	_, err = s.d.StreamCreate(s.d.DeviceCount())
	RequireKind(s.t, err, backend.OpStreamCreate, backend.ErrInvalidArgument)
	_, err = s.d.EventCreate(-1)
	RequireKind(s.t, err, backend.OpEventCreate, backend.ErrInvalidArgument)

	ev, err := s.d.EventCreate(0)
	require.NoError(s.t, err)
	require.NoError(s.t, s.d.EventRecord(ev, st))
	require.NoError(s.t, s.d.EventSynchronize(ev))
	done, err := s.d.EventQuery(ev)
	require.NoError(s.t, err)
	assert.True(s.t, done, "event complete after EventSynchronize")
	require.NoError(s.t, s.d.EventRecord(ev, st2)) // re-record on another stream
	require.NoError(s.t, s.d.StreamSynchronize(st2))
	done, err = s.d.EventQuery(ev)
	require.NoError(s.t, err)
	assert.True(s.t, done, "event complete after StreamSynchronize")

	require.NoError(s.t, s.d.EventDestroy(ev))
	require.NoError(s.t, s.d.StreamDestroy(st))
	// A destroyed stream is unknown to StreamDevice, with ErrInvalidArgument:
	// backend.StreamValidator, and so both allocators, rely on it.
	_, err = s.d.StreamDevice(st)
	require.ErrorIs(s.t, err, backend.ErrInvalidArgument)
	assert.True(s.t, backend.NewStreamValidator(s.d, 0).Gone(st))
	assert.False(s.t, backend.NewStreamValidator(s.d, 0).Gone(st2))
	require.NoError(s.t, s.d.StreamDestroy(st2))
}

func (s *suite) workOrdering() {
	w, ok := s.d.(Workload)
	if !ok {
		s.t.Skip("driver does not implement conformance.Workload")
	}
	g := s.g
	base := s.reserve(2 * g)
	h := s.create(g)
	s.mapRW(base, g, h, 0)
	st, err := s.d.StreamCreate(0)
	require.NoError(s.t, err)
	require.NoError(s.t, w.Hold(st))
	e1, err := s.d.EventCreate(0)
	require.NoError(s.t, err)
	e2, err := s.d.EventCreate(0)
	require.NoError(s.t, err)

	query := func(e backend.Event) bool {
		s.t.Helper()
		done, err := s.d.EventQuery(e)
		require.NoError(s.t, err)
		return done
	}
	require.NoError(s.t, w.Launch(st, base, g))
	require.NoError(s.t, s.d.EventRecord(e1, st))
	require.NoError(s.t, w.Launch(st, base, g))
	require.NoError(s.t, s.d.EventRecord(e2, st))
	assert.False(s.t, query(e1), "e1 captured pending work")
	assert.False(s.t, query(e2))

	require.NoError(s.t, w.CompleteN(st, 1))
	assert.True(s.t, query(e1), "e1's work completed")
	assert.False(s.t, query(e2), "e2 also captured the second item")
	require.NoError(s.t, s.d.EventSynchronize(e2))
	assert.True(s.t, query(e2))

	// An event captures only the work queued before its record.
	require.NoError(s.t, s.d.EventRecord(e1, st))
	require.NoError(s.t, w.Launch(st, base, g))
	assert.True(s.t, query(e1), "work launched after the record must not count")
	require.NoError(s.t, s.d.EventRecord(e2, st))
	assert.False(s.t, query(e2))
	require.NoError(s.t, s.d.StreamSynchronize(st))
	assert.True(s.t, query(e2))

	require.NoError(s.t, s.d.EventDestroy(e1))
	require.NoError(s.t, s.d.EventDestroy(e2))
	require.NoError(s.t, s.d.StreamDestroy(st))
	require.NoError(s.t, s.d.Unmap(base, g))
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 2*g))
}

// bytes returns host-visible memory or skips the case.
func (s *suite) bytes(d backend.Driver, va uintptr, n uint64) []byte {
	s.t.Helper()
	hv, ok := d.(HostView)
	if !ok {
		s.t.Skip("driver does not implement conformance.HostView")
	}
	b, err := hv.Bytes(va, n)
	if errors.Is(err, backend.ErrNotSupported) {
		s.t.Skip("host view not supported by this configuration")
	}
	require.NoError(s.t, err)
	require.Len(s.t, b, int(n))
	return b
}

func (s *suite) data() {
	g := s.g
	base := s.reserve(4 * g)
	h := s.create(g)
	s.mapRW(base, g, h, 0)
	s.mapRW(base+uintptr(2*g), g, h, 0) // a second VA of the same handle
	a := s.bytes(s.d, base, g)
	b := s.bytes(s.d, base+uintptr(2*g), g)
	for i := range a {
		a[i] = byte(i*7 + 3)
	}
	assert.Equal(s.t, a, b, "two mappings of one handle must see the same bytes")
	b[g-1] = 0x5a
	assert.Equal(s.t, byte(0x5a), a[g-1])

	// The data survives unmapping every mapping and mapping again.
	require.NoError(s.t, s.d.Unmap(base, g))
	require.NoError(s.t, s.d.Unmap(base+uintptr(2*g), g))
	s.mapRW(base+uintptr(3*g), g, h, 0)
	c := s.bytes(s.d, base+uintptr(3*g), g)
	assert.Equal(s.t, byte(3), c[0])
	assert.Equal(s.t, byte(10), c[1])
	assert.Equal(s.t, byte(0x5a), c[g-1])
	require.NoError(s.t, s.d.Unmap(base+uintptr(3*g), g))
	require.NoError(s.t, s.d.FreePhysical(h))
	require.NoError(s.t, s.d.ReleaseAddress(base, 4*g))
}

func (s *suite) ipc() {
	ipc, ok := s.d.(backend.IPC)
	if !ok {
		s.t.Skip("driver does not implement backend.IPC")
	}
	assert.Positive(s.t, ipc.Pid())
	h := s.create(s.g)
	sh, err := ipc.Export(h, backend.ShareDefault)
	require.NoError(s.t, err)
	assert.NotZero(s.t, sh)
	_, err = ipc.Export(h, backend.ShareDefault) // 1:1 (R15)
	RequireKind(s.t, err, backend.OpExport, backend.ErrInvalidArgument)
	require.NoError(s.t, ipc.SetPids(sh, []int32{ipc.Pid() + 1}))
	_, err = ipc.Import(sh, 0) // same process (R17)
	require.Error(s.t, err)
	var be *backend.Error
	require.True(s.t, errors.As(err, &be))
	assert.Equal(s.t, backend.OpImport, be.Op)
	require.NoError(s.t, s.d.FreePhysical(h))
}

func (s *suite) ipcImport() {
	ipcA, ok := s.d.(backend.IPC)
	if !ok {
		s.t.Skip("driver does not implement backend.IPC")
	}
	if s.o.other == nil {
		s.t.Skip("no OtherProcess option")
	}
	b := s.o.other(s.t, s.d)
	ipcB, ok := b.(backend.IPC)
	require.True(s.t, ok, "the other process must implement backend.IPC")
	require.NotEqual(s.t, ipcA.Pid(), ipcB.Pid())
	g := s.g
	free0 := s.free()

	h := s.create(g)
	sh, err := ipcA.Export(h, backend.ShareDefault)
	require.NoError(s.t, err)
	_, err = ipcB.Import(sh, 0) // not whitelisted (R16)
	RequireKind(s.t, err, backend.OpImport, backend.ErrNotPermitted)
	require.NoError(s.t, ipcA.SetPids(sh, []int32{ipcB.Pid()}))
	hb, err := ipcB.Import(sh, 0)
	require.NoError(s.t, err)
	_, err = ipcB.Import(sh, 0) // 1:1 within a process (R15)
	RequireKind(s.t, err, backend.OpImport, backend.ErrInvalidArgument)
	_, size, err := b.HandleProperties(hb)
	require.NoError(s.t, err)
	assert.Equal(s.t, g, size)

	vaA := s.reserve(2 * g)
	s.mapRW(vaA, g, h, 0)
	vaB, err := b.ReserveAddress(2 * g)
	require.NoError(s.t, err)
	require.NoError(s.t, b.Map(vaB, g, hb))
	require.NoError(s.t, b.SetAccess(vaB, g, []backend.AccessDesc{{Location: devLoc(0), Flags: backend.AccessReadWrite}}))
	if _, ok := s.d.(HostView); ok {
		if x, err := s.d.(HostView).Bytes(vaA, g); err == nil {
			y, err := b.(HostView).Bytes(vaB, g)
			require.NoError(s.t, err)
			x[0], x[g-1] = 0xa5, 0x5a
			assert.Equal(s.t, byte(0xa5), y[0], "importer sees the exporter's bytes")
			assert.Equal(s.t, byte(0x5a), y[g-1])
		}
	}

	// The exporter's free does not release memory the importer holds (R17).
	require.NoError(s.t, s.d.Unmap(vaA, g))
	require.NoError(s.t, s.d.FreePhysical(h))
	s.requireUnmapped(vaA)
	_, _, err = b.AddressRange(vaB)
	require.NoError(s.t, err)
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0-g, s.free())
	}
	require.NoError(s.t, b.Unmap(vaB, g))
	require.NoError(s.t, b.FreePhysical(hb))
	if s.o.exactMemInfo {
		assert.Equal(s.t, free0, s.free())
	}

	// Without pid validation any other process may import; a second device
	// may be named.
	h2 := s.create(g)
	sh2, err := ipcA.Export(h2, backend.ShareDisablePidValidation)
	require.NoError(s.t, err)
	dev := b.DeviceCount() - 1
	hb2, err := ipcB.Import(sh2, dev)
	require.NoError(s.t, err)
	prop, _, err := b.HandleProperties(hb2)
	require.NoError(s.t, err)
	assert.Equal(s.t, dev, prop.Location.ID)
	require.NoError(s.t, b.FreePhysical(hb2))
	require.NoError(s.t, s.d.FreePhysical(h2))
	require.NoError(s.t, s.d.ReleaseAddress(vaA, 2*g))
	require.NoError(s.t, b.ReleaseAddress(vaB, 2*g))
}

func (s *suite) hostMemory() {
	hm, ok := s.d.(backend.HostMemory)
	if !ok {
		s.t.Skip("driver does not implement backend.HostMemory")
	}
	_, err := hm.MallocHost(0)
	RequireKind(s.t, err, backend.OpMallocHost, backend.ErrInvalidArgument)
	p, err := hm.MallocHost(100)
	require.NoError(s.t, err)
	assert.Zero(s.t, uint64(p)%64, "MallocHost must be 64-byte aligned")
	require.NoError(s.t, hm.FreeHost(p))

	const page = 4096
	q, err := hm.MallocHost(3 * page)
	require.NoError(s.t, err)
	// Registration takes pageable memory the caller owns (what both
	// drivers accept; CUDA refuses memory MallocHost already pinned).
	pg, err := newPageable(page)
	if err != nil {
		require.NoError(s.t, hm.FreeHostWithDevSync(q))
		s.t.Skip(err)
	}
	defer func() { require.NoError(s.t, pg.unmap()) }()
	r := pg.addr()
	err = hm.HostRegister(r+64, page, backend.HostRegisterMapped)
	RequireKind(s.t, err, backend.OpHostRegister, backend.ErrInvalidArgument)
	err = hm.HostRegister(r, page, backend.HostRegisterIOMemory)
	require.Error(s.t, err)
	require.NoError(s.t, hm.HostRegister(r, page, backend.HostRegisterMapped))
	dp, err := hm.HostGetDevicePointer(r)
	require.NoError(s.t, err)
	assert.NotZero(s.t, dp)
	require.NoError(s.t, hm.HostUnregister(r))
	err = hm.HostUnregister(r)
	require.Error(s.t, err)
	require.NoError(s.t, hm.FreeHostWithDevSync(q))
}
