package emulated_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func free0(t *testing.T, e *emulated.Emulator, d int) uint64 {
	t.Helper()
	f, _, err := e.MemGetInfo(d)
	require.NoError(t, err)
	return f
}

func TestDefaults(t *testing.T) {
	e := newEmu(t)
	assert.Equal(t, "emulated", e.Name())
	assert.Equal(t, 1, e.DeviceCount())
	assert.Equal(t, int32(1000), e.Pid())
	free, total, err := e.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, 80*GiB, total)
	assert.Equal(t, 80*GiB, free)
	for _, c := range []struct {
		attr backend.PageAttr
		want uint64
	}{{backend.PageNormal, 2 * MiB}, {backend.PageHuge, 2 * MiB}, {backend.PageHuge1G, GiB}} {
		for _, opt := range []backend.GranularityOption{backend.GranularityMinimum, backend.GranularityRecommended} {
			g, err := e.Granularity(backend.PhysicalProp{Location: dev(0), Attr: c.attr}, opt)
			require.NoError(t, err)
			assert.Equal(t, c.want, g, "%v %v", c.attr, opt)
		}
	}
	g, err := e.Granularity(backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}}, backend.GranularityMinimum)
	require.NoError(t, err)
	assert.Equal(t, 2*MiB, g)
}

func TestOptions(t *testing.T) {
	e := newEmu(t, emulated.WithDevices(3), emulated.WithCapacity(GiB), emulated.WithGranularity(64*emulated.KiB),
		emulated.WithGranularity1G(256*MiB), emulated.WithPid(7), emulated.WithHostCapacity(MiB))
	assert.Equal(t, 3, e.DeviceCount())
	assert.Equal(t, int32(7), e.Pid())
	_, total, err := e.MemGetInfo(2)
	require.NoError(t, err)
	assert.Equal(t, GiB, total)
	g, err := e.Granularity(backend.DeviceProp(0), backend.GranularityMinimum)
	require.NoError(t, err)
	assert.Equal(t, 64*emulated.KiB, g)
	g, err = e.Granularity(backend.PhysicalProp{Location: dev(0), Attr: backend.PageHuge1G}, backend.GranularityMinimum)
	require.NoError(t, err)
	assert.Equal(t, 256*MiB, g)
	_, err = e.MallocHost(MiB + 1)
	requireErr(t, err, backend.OpMallocHost, backend.ErrOutOfMemory, "")

	for name, opt := range map[string]emulated.Option{
		"devices 0":          emulated.WithDevices(0),
		"capacity 0":         emulated.WithCapacity(0),
		"granularity 3 KiB":  emulated.WithGranularity(3 * emulated.KiB),
		"granularity 1 KiB":  emulated.WithGranularity(emulated.KiB),
		"1G granularity odd": emulated.WithGranularity1G(3 * MiB),
		"host capacity 0":    emulated.WithHostCapacity(0),
		"va size 0":          emulated.WithVASize(0),
		"pid 0":              emulated.WithPid(0),
	} {
		_, err := emulated.New(opt)
		assert.ErrorIs(t, err, backend.ErrInvalidArgument, name)
	}
	_, err = emulated.New(emulated.WithGranularity(4*MiB), emulated.WithGranularity1G(2*MiB))
	assert.ErrorIs(t, err, backend.ErrInvalidArgument, "1G granularity below the granularity")
}

// TestDeterminism replays one sequence on two emulators and expects the
// same addresses and ids, starting at the documented windows.
func TestDeterminism(t *testing.T) {
	run := func() []uint64 {
		e := newEmu(t, emulated.WithDevices(2))
		var out []uint64
		add := func(v uint64, err error) {
			require.NoError(t, err)
			out = append(out, v)
		}
		for i := 0; i < 3; i++ {
			va, err := e.ReserveAddress(uint64(i+1) * 3 * MiB)
			add(uint64(va), err)
			h, err := e.CreatePhysical(2*MiB, backend.DeviceProp(i%2))
			add(uint64(h), err)
		}
		va, err := e.ReserveAddress(GiB)
		add(uint64(va), err)
		require.NoError(t, e.ReleaseAddress(uintptr(out[2]), 6*MiB))
		va, err = e.ReserveAddress(MiB) // reuses the hole first-fit
		add(uint64(va), err)
		s, err := e.StreamCreate(1)
		add(uint64(s), err)
		ev, err := e.EventCreate(1)
		add(uint64(ev), err)
		p, err := e.MallocHost(100)
		add(uint64(p), err)
		return out
	}
	a := run()
	assert.Equal(t, a, run())
	base := uint64(16 * TiB)
	assert.Equal(t, []uint64{
		base, 1, base + 4*MiB, 2, base + 10*MiB, 3, // 3, 6 and 9 MiB rounded to 4, 6 and 10
		base + GiB,            // 1 GiB reservations are 1 GiB aligned
		base + 4*MiB,          // the released 6 MiB hole
		1, 1, uint64(8 * TiB), // first stream, event, host block
	}, a)
}

func TestVASpaceExhaustion(t *testing.T) {
	e := newEmu(t, emulated.WithVASize(8*MiB))
	a, err := e.ReserveAddress(6 * MiB)
	require.NoError(t, err)
	before := snapshot(e)
	_, err = e.ReserveAddress(4 * MiB)
	requireErr(t, err, backend.OpReserve, backend.ErrOutOfMemory, "")
	assert.Equal(t, before, snapshot(e))
	b, err := e.ReserveAddress(2 * MiB)
	require.NoError(t, err)
	assert.Equal(t, a+6*uintptr(MiB), b)
	require.NoError(t, e.ReleaseAddress(a, 6*MiB))
	_, err = e.ReserveAddress(6 * MiB)
	require.NoError(t, err)
}

// TestReserveSmall: torch_npu probes with a 512-byte reservation.
func TestReserveSmall(t *testing.T) {
	e := newEmu(t)
	va, err := e.ReserveAddress(512)
	require.NoError(t, err)
	assert.Equal(t, []emulated.Reservation{{VA: va, Size: 512}}, e.Reservations())
	requireErr(t, e.ReleaseAddress(va, 2*MiB), backend.OpRelease, backend.ErrInvalidArgument, "")
	require.NoError(t, e.ReleaseAddress(va, 512))
	assert.Empty(t, e.Reservations())
}

func TestReserveAddressAt(t *testing.T) {
	e := newEmu(t)
	at := addr(20 * TiB)
	va, err := e.ReserveAddressAt(3*MiB, at) // aligned to 4 MiB
	require.NoError(t, err)
	assert.Equal(t, at, va)
	big, err := e.ReserveAddressAt(2*GiB, at+uintptr(GiB))
	require.NoError(t, err)
	assert.Equal(t, at+uintptr(GiB), big)
	z, err := e.ReserveAddressAt(MiB, 0) // the system chooses
	require.NoError(t, err)
	assert.Equal(t, addr(16*TiB), z)
	require.NoError(t, e.ReleaseAddress(va, 3*MiB))
	require.NoError(t, e.ReleaseAddress(big, 2*GiB))
}

func TestOutOfMemoryAndTenants(t *testing.T) {
	e := newEmu(t, emulated.WithCapacity(10*MiB), emulated.WithDevices(2))
	h, err := e.CreatePhysical(6*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	assert.Equal(t, 4*MiB, free0(t, e, 0))
	assert.Equal(t, 10*MiB, free0(t, e, 1))

	before := snapshot(e)
	_, err = e.CreatePhysical(6*MiB, backend.DeviceProp(0))
	requireErr(t, err, backend.OpCreate, backend.ErrOutOfMemory, "")
	assert.Equal(t, before, snapshot(e))

	id, err := e.Occupy(0, 2*MiB)
	require.NoError(t, err)
	assert.Equal(t, 2*MiB, free0(t, e, 0))
	assert.Equal(t, []emulated.DeviceUsage{
		{Capacity: 10 * MiB, Physical: 6 * MiB, Tenants: 2 * MiB, Free: 2 * MiB},
		{Capacity: 10 * MiB, Free: 10 * MiB},
	}, e.Live().Devices)
	_, err = e.CreatePhysical(4*MiB, backend.DeviceProp(0))
	requireErr(t, err, backend.OpCreate, backend.ErrOutOfMemory, "")
	_, err = e.Occupy(0, 4*MiB)
	assert.ErrorIs(t, err, backend.ErrOutOfMemory)
	_, err = e.Occupy(5, MiB)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
	_, err = e.Occupy(0, 0)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)

	require.NoError(t, e.Vacate(id))
	assert.ErrorIs(t, e.Vacate(id), backend.ErrInvalidArgument)
	assert.Equal(t, 4*MiB, free0(t, e, 0))
	h2, err := e.CreatePhysical(4*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.FreePhysical(h))
	require.NoError(t, e.FreePhysical(h2))
	assert.Equal(t, 10*MiB, free0(t, e, 0))
}

// TestR3FreeWhileMapped walks a handle through created → mapped (twice) →
// freed-pending → freed and checks what stays accounted at each step.
func TestR3FreeWhileMapped(t *testing.T) {
	e := newEmu(t)
	va, h := mapped(t, e, 8*MiB, 2*MiB)
	require.NoError(t, e.Map(va+uintptr(4*MiB), 2*MiB, h))
	require.NoError(t, e.FreePhysical(h))
	assert.Equal(t, []emulated.HandleInfo{{Handle: h, Prop: backend.DeviceProp(0), Size: 2 * MiB, Mappings: 2, FreedPending: true}}, e.Handles())
	assert.Equal(t, 80*GiB-2*MiB, free0(t, e, 0), "memory released before the unmap")
	l := e.Live()
	assert.Equal(t, 1, l.FreedPending)
	assert.Equal(t, 2, l.Mappings)

	require.NoError(t, e.Unmap(va, 2*MiB))
	assert.Equal(t, 80*GiB-2*MiB, free0(t, e, 0), "one mapping left")
	require.NoError(t, e.Unmap(va+uintptr(4*MiB), 2*MiB))
	assert.Equal(t, 80*GiB, free0(t, e, 0))
	assert.Empty(t, e.Handles())
	_, _, err := e.HandleProperties(h)
	requireErr(t, err, backend.OpHandleProps, backend.ErrInvalidArgument, "")
	require.NoError(t, e.ReleaseAddress(va, 8*MiB))
}

// TestR8MappedInaccessible: Map grants no access until SetAccess.
func TestR8MappedInaccessible(t *testing.T) {
	e := newEmu(t, emulated.WithDevices(2))
	va, err := e.ReserveAddress(4 * MiB)
	require.NoError(t, err)
	h, err := e.CreatePhysical(2*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	require.NoError(t, e.Map(va, 2*MiB, h))
	for _, loc := range []backend.Location{dev(0), dev(1), {Type: backend.LocationHost}} {
		f, err := e.GetAccess(va, loc)
		require.NoError(t, err)
		assert.Equal(t, backend.AccessNone, f, "%v", loc)
	}
	assert.Nil(t, e.Mappings()[0].Access)
	require.NoError(t, e.SetAccess(va, 2*MiB, []backend.AccessDesc{
		{Location: dev(1), Flags: backend.AccessRead},
		{Location: backend.Location{Type: backend.LocationHost, ID: 3}, Flags: backend.AccessReadWrite},
		{Location: dev(0), Flags: backend.AccessReadWrite},
	}))
	assert.Equal(t, []backend.AccessDesc{
		{Location: dev(0), Flags: backend.AccessReadWrite},
		{Location: dev(1), Flags: backend.AccessRead},
		{Location: backend.Location{Type: backend.LocationHost}, Flags: backend.AccessReadWrite},
	}, e.Mappings()[0].Access)
	f, err := e.GetAccess(va+uintptr(MiB), dev(1))
	require.NoError(t, err)
	assert.Equal(t, backend.AccessRead, f)
	// AccessNone revokes.
	require.NoError(t, e.SetAccess(va, 2*MiB, []backend.AccessDesc{{Location: dev(1), Flags: backend.AccessNone}}))
	f, err = e.GetAccess(va, dev(1))
	require.NoError(t, err)
	assert.Equal(t, backend.AccessNone, f)
}

func TestR12Retain(t *testing.T) {
	e := newEmu(t)
	va, h := mapped(t, e, 4*MiB, 2*MiB)
	for i := 0; i < 2; i++ {
		r, err := e.RetainHandle(va)
		require.NoError(t, err)
		assert.Equal(t, h, r)
	}
	assert.Equal(t, 3, e.Handles()[0].Refs)
	require.NoError(t, e.Unmap(va, 2*MiB))
	for i := 0; i < 3; i++ {
		assert.Len(t, e.Handles(), 1, "freed after %d of 3 frees", i)
		require.NoError(t, e.FreePhysical(h))
	}
	assert.Empty(t, e.Handles())
	assert.Equal(t, 80*GiB, free0(t, e, 0))

	// Retaining a freed-pending handle through its mapping revives it.
	va2, h2 := mapped(t, e, 4*MiB, 2*MiB)
	require.NoError(t, e.FreePhysical(h2))
	r, err := e.RetainHandle(va2)
	require.NoError(t, err)
	assert.Equal(t, h2, r)
	require.NoError(t, e.Unmap(va2, 2*MiB))
	assert.Len(t, e.Handles(), 1, "revived handle must survive its unmap")
	require.NoError(t, e.FreePhysical(r))
	assert.Empty(t, e.Handles())
}

func TestR13HandleProperties(t *testing.T) {
	e := newEmu(t, emulated.WithDevices(2))
	for _, prop := range []backend.PhysicalProp{
		backend.DeviceProp(1),
		{Location: dev(0), Attr: backend.PageNormal},
		{Location: dev(0), Attr: backend.PageHuge1G},
		{Location: backend.Location{Type: backend.LocationHost}, Attr: backend.PageHuge},
	} {
		size := 4 * MiB
		if prop.Attr == backend.PageHuge1G {
			size = GiB
		}
		h, err := e.CreatePhysical(size, prop)
		require.NoError(t, err)
		got, n, err := e.HandleProperties(h)
		require.NoError(t, err)
		assert.Equal(t, prop, got)
		assert.Equal(t, size, n)
		require.NoError(t, e.FreePhysical(h))
	}
	assert.Equal(t, uint64(0), e.Live().HostUsed)
}

func TestR14AddressRange(t *testing.T) {
	e := newEmu(t)
	va, _ := mapped(t, e, 8*MiB, 4*MiB)
	base, size, err := e.AddressRange(va + uintptr(4*MiB) - 1)
	require.NoError(t, err)
	assert.Equal(t, va, base)
	assert.Equal(t, 4*MiB, size)
	p, err := e.MallocHost(100)
	require.NoError(t, err)
	base, size, err = e.AddressRange(p + 99)
	require.NoError(t, err)
	assert.Equal(t, p, base)
	assert.Equal(t, uint64(100), size)
	_, _, err = e.AddressRange(p + 100)
	requireErr(t, err, backend.OpAddressRange, backend.ErrInvalidArgument, "R14")
}

// TestR17SharedMemoryLifetime: the memory lives until every process freed
// its handle, is accounted once on the exporter's device, and an import may
// name another device.
func TestR17SharedMemoryLifetime(t *testing.T) {
	a := newEmu(t, emulated.WithDevices(2))
	b, err := a.Process(2000)
	require.NoError(t, err)
	c, err := a.Process(3000)
	require.NoError(t, err)
	assert.Equal(t, int32(2000), b.Pid())
	same, err := a.Process(2000)
	require.NoError(t, err)
	assert.Same(t, b, same)
	_, err = a.Process(-4)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)

	h, err := a.CreatePhysical(4*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	sh, err := a.Export(h, backend.ShareDefault)
	require.NoError(t, err)
	require.NoError(t, a.SetPids(sh, []int32{2000, 3000}))
	hb, err := b.Import(sh, 1)
	require.NoError(t, err)
	hc, err := c.Import(sh, 0)
	require.NoError(t, err)
	prop, _, err := b.HandleProperties(hb)
	require.NoError(t, err)
	assert.Equal(t, backend.DeviceProp(1), prop, "imported onto device 1")
	assert.Equal(t, 80*GiB-4*MiB, free0(t, a, 0), "accounted once, on the exporter's device")
	assert.Equal(t, 80*GiB, free0(t, a, 1))
	assert.Equal(t, 1, a.Live().Exports)
	assert.Equal(t, 1, b.Live().Imports)

	// The importer maps on device 1; a reservation of imported handles.
	vb, err := b.ReserveAddress(8 * MiB)
	require.NoError(t, err)
	require.NoError(t, b.Map(vb, 4*MiB, hb))
	require.NoError(t, a.FreePhysical(h))
	assert.Equal(t, 0, a.Live().Exports, "the shareable handle dies with the exporter's handle")
	_, err = c.Import(sh, 0) // c still holds its import; a fresh one is gone anyway
	requireErr(t, err, backend.OpImport, backend.ErrInvalidArgument, "R17")
	require.NoError(t, c.FreePhysical(hc))
	assert.Equal(t, 80*GiB-4*MiB, free0(t, a, 0), "b still holds the memory")
	require.NoError(t, b.FreePhysical(hb))
	assert.Equal(t, 80*GiB-4*MiB, free0(t, a, 0), "b's mapping still holds the memory")
	require.NoError(t, b.Unmap(vb, 4*MiB))
	assert.Equal(t, 80*GiB, free0(t, a, 0))
	assert.Empty(t, b.Handles())
	assert.Equal(t, 0, b.Live().Imports)
}

// TestCloseProcess: a closed process releases what it holds; the others go
// on; later calls are unavailable but counted.
func TestCloseProcess(t *testing.T) {
	a := newEmu(t)
	b, err := a.Process(2000)
	require.NoError(t, err)
	h, err := a.CreatePhysical(2*MiB, backend.DeviceProp(0))
	require.NoError(t, err)
	sh, err := a.Export(h, backend.ShareDisablePidValidation)
	require.NoError(t, err)
	hb, err := b.Import(sh, 0)
	require.NoError(t, err)
	vb, _ := mapped(t, b, 4*MiB, 2*MiB)
	_, err = b.MallocHost(4096)
	require.NoError(t, err)
	s, err := b.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, b.Hold(s))
	require.NoError(t, b.Launch(s, vb, 2*MiB))
	assert.Equal(t, 80*GiB-4*MiB, free0(t, a, 0))

	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	assert.Equal(t, 80*GiB-2*MiB, free0(t, a, 0), "b's own handle went, a's shared one stays")
	assert.Equal(t, emulated.LiveCounts{Devices: a.Live().Devices}, b.Live())
	assert.Empty(t, a.Violations(), "process exit discards pending work without violations")

	calls := b.Calls(backend.OpMap)
	err = b.Map(vb, 2*MiB, hb)
	requireErr(t, err, backend.OpMap, backend.ErrUnavailable, "")
	assert.Equal(t, calls+1, b.Calls(backend.OpMap))
	_, err = b.StreamDevice(s)
	assert.ErrorIs(t, err, backend.ErrUnavailable)
	assert.ErrorIs(t, b.Launch(s, 0, 0), backend.ErrUnavailable)

	// The pid can be reused by a fresh process.
	b2, err := a.Process(2000)
	require.NoError(t, err)
	assert.NotSame(t, b, b2)
	_, err = b2.Import(sh, 0)
	require.NoError(t, err)

	require.NoError(t, a.Close())
	_, err = a.CreatePhysical(2*MiB, backend.DeviceProp(0))
	requireErr(t, err, backend.OpCreate, backend.ErrUnavailable, "")
	assert.Equal(t, 80*GiB-2*MiB, free0(t, b2, 0), "b2's import keeps the memory after the exporter exits")
}

func TestHostMemory(t *testing.T) {
	e := newEmu(t, emulated.WithHostCapacity(64*emulated.KiB))
	p, err := e.MallocHost(1)
	require.NoError(t, err)
	assert.Zero(t, p%64)
	q, err := e.MallocHost(5000)
	require.NoError(t, err)
	assert.Zero(t, q%4096)
	assert.Equal(t, p+4096, q, "blocks are page-rounded and packed")
	l := e.Live()
	assert.Equal(t, 2, l.HostAllocs)
	assert.Equal(t, uint64(5001), l.HostBytes)
	assert.Equal(t, uint64(3*4096), l.HostUsed)

	require.NoError(t, e.HostRegister(q, 8192, backend.HostRegisterMapped))
	d, err := e.HostGetDevicePointer(q + 100)
	require.NoError(t, err)
	d0, err := e.HostGetDevicePointer(q)
	require.NoError(t, err)
	assert.Equal(t, d0+100, d)
	assert.Equal(t, addr(4*TiB), d0)
	// Registering memory that is not MallocHost's is fine (malloc'd memory).
	require.NoError(t, e.HostRegister(addr(1*TiB), 4096, backend.HostRegisterPinned))
	require.NoError(t, e.HostUnregister(addr(1*TiB)))
	require.NoError(t, e.HostUnregister(q))
	_, err = e.HostGetDevicePointer(q)
	requireErr(t, err, backend.OpHostDevicePointer, backend.ErrInvalidArgument, "R19")
	require.NoError(t, e.FreeHost(q))
	require.NoError(t, e.FreeHostWithDevSync(p))
	assert.Zero(t, e.Live().HostUsed)
	requireErr(t, e.FreeHost(p), backend.OpFreeHost, backend.ErrInvalidArgument, "R18")
}
