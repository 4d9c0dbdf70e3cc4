package emulated_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// fix is the state every rule row starts from: process e (pid 1000) with
// two devices, a reservation of 8 granules at base holding handle h (two
// granules, read-write for device 0) at its start, an unmapped handle h2
// (one granule), a pinned host block hp of three pages whose first page
// is registered, and a second process b (pid 2000).
type fix struct {
	e, b *emulated.Emulator
	g    uint64
	base uintptr
	h    backend.Handle
	h2   backend.Handle
	hp   uintptr
	// set by setups
	sh uint64         // a shareable handle
	x  backend.Handle // an extra handle
	va uintptr        // an extra address
}

func newFix(t *testing.T, opts ...emulated.Option) *fix {
	t.Helper()
	e := newEmu(t, append([]emulated.Option{emulated.WithDevices(2)}, opts...)...)
	b, err := e.Process(2000)
	require.NoError(t, err)
	f := &fix{e: e, b: b, g: 2 * MiB}
	f.base, f.h = mapped(t, e, 8*f.g, 2*f.g)
	f.h2, err = e.CreatePhysical(f.g, backend.DeviceProp(0))
	require.NoError(t, err)
	f.hp, err = e.MallocHost(3 * 4096)
	require.NoError(t, err)
	require.NoError(t, e.HostRegister(f.hp, 4096, backend.HostRegisterMapped))
	return f
}

func (f *fix) off(n uint64) uintptr { return f.base + uintptr(n*f.g) }

// exportToB exports h2 from e with flags into f.sh.
func exportH2(flags backend.ShareFlags) func(t *testing.T, f *fix) {
	return func(t *testing.T, f *fix) {
		var err error
		f.sh, err = f.e.Export(f.h2, flags)
		require.NoError(t, err)
	}
}

// TestRules proves, rule by rule, that a violating call returns a
// *backend.Error of the right kind naming the rule and changes nothing.
func TestRules(t *testing.T) {
	devProp := backend.DeviceProp
	hostProp := func(attr backend.PageAttr) backend.PhysicalProp {
		return backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost}, Attr: attr}
	}
	rows := []struct {
		rule, name string
		opts       []emulated.Option
		setup      func(t *testing.T, f *fix)
		op         backend.Op
		kind       error
		call       func(f *fix) error
	}{
		// R1: size aligned to the granularity, nonzero.
		{rule: "R1", name: "create size 0", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.CreatePhysical(0, devProp(0)); return err }},
		{rule: "R1", name: "create unaligned", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.CreatePhysical(f.g+4096, devProp(0)); return err }},
		{rule: "R1", name: "create 2 MiB of 1 GiB pages", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				_, err := f.e.CreatePhysical(f.g, backend.PhysicalProp{Location: dev(0), Attr: backend.PageHuge1G})
				return err
			}},
		// R2: valid property combinations.
		{rule: "R2", name: "1 GiB host pages", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.CreatePhysical(GiB, hostProp(backend.PageHuge1G)); return err }},
		{rule: "R2", name: "unknown page attribute", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				_, err := f.e.CreatePhysical(f.g, backend.PhysicalProp{Location: dev(0), Attr: 9})
				return err
			}},
		{rule: "R2", name: "device out of range", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.CreatePhysical(f.g, devProp(2)); return err }},
		{rule: "R2", name: "host NUMA node out of range", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				_, err := f.e.CreatePhysical(f.g, backend.PhysicalProp{Location: backend.Location{Type: backend.LocationHost, ID: 1}})
				return err
			}},
		{rule: "R2", name: "unknown location type", op: backend.OpCreate, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				_, err := f.e.CreatePhysical(f.g, backend.PhysicalProp{Location: backend.Location{Type: 7}})
				return err
			}},
		{rule: "R2", name: "1 GiB pages unsupported", opts: []emulated.Option{emulated.WithoutHuge1G()},
			op: backend.OpCreate, kind: backend.ErrNotSupported,
			call: func(f *fix) error {
				_, err := f.e.CreatePhysical(GiB, backend.PhysicalProp{Location: dev(0), Attr: backend.PageHuge1G})
				return err
			}},
		{rule: "R2", name: "granularity of 1 GiB host pages", op: backend.OpGranularity, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				_, err := f.e.Granularity(hostProp(backend.PageHuge1G), backend.GranularityMinimum)
				return err
			}},
		// R3: a freed-pending handle is gone for everything but its mappings.
		{rule: "R3", name: "map freed-pending handle", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) { require.NoError(t, f.e.FreePhysical(f.h)) },
			call:  func(f *fix) error { return f.e.Map(f.off(4), 2*f.g, f.h) }},
		{rule: "R3", name: "free freed-pending handle", op: backend.OpFree, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) { require.NoError(t, f.e.FreePhysical(f.h)) },
			call:  func(f *fix) error { return f.e.FreePhysical(f.h) }},
		{rule: "R3", name: "properties of freed-pending handle", op: backend.OpHandleProps, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) { require.NoError(t, f.e.FreePhysical(f.h)) },
			call:  func(f *fix) error { _, _, err := f.e.HandleProperties(f.h); return err }},
		// R4: reservation arguments.
		{rule: "R4", name: "reserve size 0", op: backend.OpReserve, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.ReserveAddress(0); return err }},
		{rule: "R4", name: "expected address below the window", op: backend.OpReserve, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.ReserveAddressAt(f.g, addr(8*TiB)); return err }},
		{rule: "R4", name: "expected range past the window", op: backend.OpReserve, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.ReserveAddressAt(2*f.g, addr(24*TiB-f.g)); return err }},
		{rule: "R4", name: "expected address misaligned", op: backend.OpReserve, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.ReserveAddressAt(4*f.g, addr(20*TiB+2*f.g)); return err }},
		{rule: "R4", name: "1 GiB reservation not 1 GiB aligned", op: backend.OpReserve, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.ReserveAddressAt(GiB, addr(20*TiB+512*MiB)); return err }},
		{rule: "R4", name: "expected address occupied", op: backend.OpReserve, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.ReserveAddressAt(f.g, f.base); return err }},
		// R5: release only empty reservations.
		{rule: "R5", name: "release with a mapping", op: backend.OpRelease, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.ReleaseAddress(f.base, 8*f.g) }},
		{rule: "R5", name: "release with a freed-pending mapping", op: backend.OpRelease, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) { require.NoError(t, f.e.FreePhysical(f.h)) },
			call:  func(f *fix) error { return f.e.ReleaseAddress(f.base, 8*f.g) }},
		// R6: whole-handle maps inside one reservation.
		{rule: "R6", name: "map size differs from the handle", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Map(f.off(4), 2*f.g, f.h2) }},
		{rule: "R6", name: "map misaligned", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Map(f.off(4)+4096, f.g, f.h2) }},
		{rule: "R6", name: "map past the reservation", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) { require.NoError(t, f.e.Unmap(f.base, 2*f.g)) },
			call:  func(f *fix) error { return f.e.Map(f.off(7), 2*f.g, f.h) }},
		{rule: "R6", name: "map outside any reservation", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Map(f.off(64), f.g, f.h2) }},
		{rule: "R6", name: "map over a mapping", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Map(f.off(1), f.g, f.h2) }},
		{rule: "R6", name: "1 GiB handle at a 2 MiB offset", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				var err error
				f.va, err = f.e.ReserveAddress(3 * GiB)
				require.NoError(t, err)
				f.x, err = f.e.CreatePhysical(GiB, backend.PhysicalProp{Location: dev(0), Attr: backend.PageHuge1G})
				require.NoError(t, err)
			},
			call: func(f *fix) error { return f.e.Map(f.va+uintptr(f.g), GiB, f.x) }},
		// R7: no mixing of devices, or of local and imported handles.
		{rule: "R7", name: "two devices in one reservation", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				var err error
				f.x, err = f.e.CreatePhysical(f.g, devProp(1))
				require.NoError(t, err)
			},
			call: func(f *fix) error { return f.e.Map(f.off(4), f.g, f.x) }},
		{rule: "R7", name: "local and imported handles in one reservation", op: backend.OpMap, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				h, err := f.b.CreatePhysical(f.g, devProp(0))
				require.NoError(t, err)
				sh, err := f.b.Export(h, backend.ShareDisablePidValidation)
				require.NoError(t, err)
				f.x, err = f.e.Import(sh, 0)
				require.NoError(t, err)
			},
			call: func(f *fix) error { return f.e.Map(f.off(4), f.g, f.x) }},
		// R9: unmap by the mapping's address (and size).
		{rule: "R9", name: "unmap inside a mapping", op: backend.OpUnmap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Unmap(f.off(1), f.g) }},
		{rule: "R9", name: "unmap with another size", op: backend.OpUnmap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Unmap(f.base, f.g) }},
		{rule: "R9", name: "unmap where nothing is mapped", op: backend.OpUnmap, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.Unmap(f.off(4), f.g) }},
		// R10: access calls name exactly one mapping and valid locations.
		{rule: "R10", name: "set access with another size", op: backend.OpSetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.SetAccess(f.base, f.g, rw0) }},
		{rule: "R10", name: "set access inside a mapping", op: backend.OpSetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.SetAccess(f.off(1), f.g, rw0) }},
		{rule: "R10", name: "set access without descriptors", op: backend.OpSetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.SetAccess(f.base, 2*f.g, nil) }},
		{rule: "R10", name: "set access with unknown flags", op: backend.OpSetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				return f.e.SetAccess(f.base, 2*f.g, []backend.AccessDesc{{Location: dev(0), Flags: 2}})
			}},
		{rule: "R10", name: "set access for a bad device", op: backend.OpSetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				// The valid first descriptor must not be applied either.
				return f.e.SetAccess(f.base, 2*f.g, []backend.AccessDesc{
					{Location: dev(1), Flags: backend.AccessRead}, {Location: dev(5), Flags: backend.AccessRead}})
			}},
		{rule: "R10", name: "get access for a bad location", op: backend.OpGetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error {
				_, err := f.e.GetAccess(f.base, backend.Location{Type: 9})
				return err
			}},
		{rule: "R10", name: "get access of unmapped memory", op: backend.OpGetAccess, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.GetAccess(f.off(4), dev(0)); return err }},
		// R11: MINIMUM or RECOMMENDED.
		{rule: "R11", name: "unknown granularity option", op: backend.OpGranularity, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.Granularity(devProp(0), 2); return err }},
		// R12: retain by a mapping's address.
		{rule: "R12", name: "retain inside a mapping", op: backend.OpRetain, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.RetainHandle(f.off(1)); return err }},
		{rule: "R12", name: "retain unmapped memory", op: backend.OpRetain, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.RetainHandle(f.off(4)); return err }},
		// R14: address range of mapped or MallocHost memory only.
		{rule: "R14", name: "address range of reserved, unmapped memory", op: backend.OpAddressRange, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, _, err := f.e.AddressRange(f.off(2)); return err }},
		{rule: "R14", name: "address range past a host block", op: backend.OpAddressRange, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, _, err := f.e.AddressRange(f.hp + 3*4096); return err }},
		// R15: export once, device memory this process made.
		{rule: "R15", name: "export twice", op: backend.OpExport, kind: backend.ErrInvalidArgument,
			setup: exportH2(backend.ShareDefault),
			call:  func(f *fix) error { _, err := f.e.Export(f.h2, backend.ShareDisablePidValidation); return err }},
		{rule: "R15", name: "export with unknown flags", op: backend.OpExport, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.Export(f.h2, 2); return err }},
		{rule: "R15", name: "export host memory", op: backend.OpExport, kind: backend.ErrNotSupported,
			setup: func(t *testing.T, f *fix) {
				var err error
				f.x, err = f.e.CreatePhysical(f.g, hostProp(backend.PageHuge))
				require.NoError(t, err)
			},
			call: func(f *fix) error { _, err := f.e.Export(f.x, backend.ShareDefault); return err }},
		{rule: "R15", name: "export an imported handle", op: backend.OpExport, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				exportH2(backend.ShareDisablePidValidation)(t, f)
				var err error
				f.x, err = f.b.Import(f.sh, 0)
				require.NoError(t, err)
			},
			call: func(f *fix) error { _, err := f.b.Export(f.x, backend.ShareDefault); return err }},
		{rule: "R15", name: "import twice into one process", op: backend.OpImport, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				exportH2(backend.ShareDisablePidValidation)(t, f)
				_, err := f.b.Import(f.sh, 0)
				require.NoError(t, err)
			},
			call: func(f *fix) error { _, err := f.b.Import(f.sh, 1); return err }},
		// R16: the pid whitelist.
		{rule: "R16", name: "import without being whitelisted", op: backend.OpImport, kind: backend.ErrNotPermitted,
			setup: func(t *testing.T, f *fix) {
				exportH2(backend.ShareDefault)(t, f)
				require.NoError(t, f.e.SetPids(f.sh, []int32{3000}))
			},
			call: func(f *fix) error { _, err := f.b.Import(f.sh, 0); return err }},
		{rule: "R16", name: "whitelist another process's export", op: backend.OpSetPids, kind: backend.ErrNotPermitted,
			setup: exportH2(backend.ShareDefault),
			call:  func(f *fix) error { return f.b.SetPids(f.sh, []int32{2000}) }},
		{rule: "R16", name: "whitelist nobody", op: backend.OpSetPids, kind: backend.ErrInvalidArgument,
			setup: exportH2(backend.ShareDefault),
			call:  func(f *fix) error { return f.e.SetPids(f.sh, nil) }},
		{rule: "R16", name: "whitelist a bad pid", op: backend.OpSetPids, kind: backend.ErrInvalidArgument,
			setup: exportH2(backend.ShareDefault),
			call:  func(f *fix) error { return f.e.SetPids(f.sh, []int32{2000, -1}) }},
		{rule: "R16", name: "whitelist an unknown shareable handle", op: backend.OpSetPids, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.SetPids(12345, []int32{2000}) }},
		// R17: import from another process, while the memory exists.
		{rule: "R17", name: "import into the exporting process", op: backend.OpImport, kind: backend.ErrInvalidArgument,
			setup: exportH2(backend.ShareDisablePidValidation),
			call:  func(f *fix) error { _, err := f.e.Import(f.sh, 0); return err }},
		{rule: "R17", name: "import after the exporter freed", op: backend.OpImport, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				exportH2(backend.ShareDisablePidValidation)(t, f)
				require.NoError(t, f.e.FreePhysical(f.h2))
			},
			call: func(f *fix) error { _, err := f.b.Import(f.sh, 0); return err }},
		{rule: "R17", name: "import onto a bad device", op: backend.OpImport, kind: backend.ErrInvalidArgument,
			setup: exportH2(backend.ShareDisablePidValidation),
			call:  func(f *fix) error { _, err := f.b.Import(f.sh, 2); return err }},
		// R18: pinned host memory.
		{rule: "R18", name: "malloc host size 0", op: backend.OpMallocHost, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.MallocHost(0); return err }},
		{rule: "R18", name: "free host inside a block", op: backend.OpFreeHost, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.FreeHost(f.hp + 64) }},
		{rule: "R18", name: "free host with dev sync of a non-block", op: backend.OpFreeHost, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.FreeHostWithDevSync(f.base) }},
		// R19: host registration.
		{rule: "R19", name: "register misaligned", op: backend.OpHostRegister, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.HostRegister(f.hp+4096+64, 64, backend.HostRegisterMapped) }},
		{rule: "R19", name: "register IOMEMORY", op: backend.OpHostRegister, kind: backend.ErrNotSupported,
			call: func(f *fix) error { return f.e.HostRegister(f.hp+4096, 4096, backend.HostRegisterIOMemory) }},
		{rule: "R19", name: "register READONLY", op: backend.OpHostRegister, kind: backend.ErrNotSupported,
			call: func(f *fix) error { return f.e.HostRegister(f.hp+4096, 4096, backend.HostRegisterReadOnly) }},
		{rule: "R19", name: "register unknown flags", op: backend.OpHostRegister, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.HostRegister(f.hp+4096, 4096, 8) }},
		{rule: "R19", name: "register size 0", op: backend.OpHostRegister, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.HostRegister(f.hp+4096, 0, backend.HostRegisterMapped) }},
		{rule: "R19", name: "register twice", op: backend.OpHostRegister, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.HostRegister(f.hp, 2*4096, backend.HostRegisterPinned) }},
		{rule: "R19", name: "device pointer of unregistered memory", op: backend.OpHostDevicePointer, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { _, err := f.e.HostGetDevicePointer(f.hp + 4096); return err }},
		{rule: "R19", name: "device pointer of pinned-only memory", op: backend.OpHostDevicePointer, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				require.NoError(t, f.e.HostRegister(f.hp+2*4096, 4096, backend.HostRegisterPinned))
			},
			call: func(f *fix) error { _, err := f.e.HostGetDevicePointer(f.hp + 2*4096); return err }},
		{rule: "R19", name: "unregister inside a registration", op: backend.OpHostUnregister, kind: backend.ErrInvalidArgument,
			setup: func(t *testing.T, f *fix) {
				require.NoError(t, f.e.HostRegister(f.hp+4096, 2*4096, backend.HostRegisterMapped))
			},
			call: func(f *fix) error { return f.e.HostUnregister(f.hp + 2*4096) }},
		{rule: "R19", name: "free a block that is still registered", op: backend.OpFreeHost, kind: backend.ErrInvalidArgument,
			call: func(f *fix) error { return f.e.FreeHost(f.hp) }},
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.rule] = true
		t.Run(r.rule+"/"+r.name, func(t *testing.T) {
			f := newFix(t, r.opts...)
			if r.setup != nil {
				r.setup(t, f)
			}
			before := snapshot(f.e, f.b)
			calls, fails := f.e.Calls(r.op)+f.b.Calls(r.op), f.e.Failures(r.op)+f.b.Failures(r.op)
			free0, _, err := f.e.MemGetInfo(0)
			require.NoError(t, err)
			sim := f.e.SimulatedTime() + f.b.SimulatedTime()

			err = r.call(f)
			t.Log(err)
			requireErr(t, err, r.op, r.kind, r.rule)

			assert.Equal(t, before, snapshot(f.e, f.b), "a rejected call changed the state")
			assert.Equal(t, calls+1, f.e.Calls(r.op)+f.b.Calls(r.op), "call not counted")
			assert.Equal(t, fails+1, f.e.Failures(r.op)+f.b.Failures(r.op), "failure not counted")
			assert.Equal(t, sim, f.e.SimulatedTime()+f.b.SimulatedTime(), "a failed call was charged")
			free1, _, err := f.e.MemGetInfo(0)
			require.NoError(t, err)
			assert.Equal(t, free0, free1)
		})
	}
	// R8 and R13 reject nothing; their tests are TestR8... and TestR13...
	for _, r := range []string{"R1", "R2", "R3", "R4", "R5", "R6", "R7", "R9", "R10", "R11", "R12", "R14", "R15", "R16", "R17", "R18", "R19"} {
		assert.True(t, seen[r], "no row for %s", r)
	}
}
