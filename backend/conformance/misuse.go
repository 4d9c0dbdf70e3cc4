package conformance

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
)

// Misuse calls every primitive of d (and of its optional IPC, HostMemory
// and Copier capabilities) with arguments from the edges of their domains
// — 0, ^0, sizes whose rounding to the granularity overflows, ranges that
// wrap the address space, unknown handles, streams, events and devices —
// around one live reservation, mapping, stream and event. Each call must
// fail with an error wrapping a backend sentinel (errors.Is), must not
// panic, and must leave what the driver holds (backend.Introspector)
// unchanged. Everything Misuse creates is released before it returns.
func Misuse(t *testing.T, d backend.Driver) {
	t.Helper()
	prop := backend.PhysicalProp{Location: backend.Location{Type: backend.LocationDevice}, Attr: backend.PageHuge}
	g, err := d.Granularity(prop, backend.GranularityMinimum)
	require.NoError(t, err)
	va, err := d.ReserveAddress(4 * g)
	require.NoError(t, err)
	h, err := d.CreatePhysical(g, prop)
	require.NoError(t, err)
	require.NoError(t, d.Map(va, g, h))
	rw := []backend.AccessDesc{{Location: prop.Location, Flags: backend.AccessReadWrite}}
	require.NoError(t, d.SetAccess(va, g, rw))
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	ev, err := d.EventCreate(0)
	require.NoError(t, err)
	defer func() {
		assert.NoError(t, d.EventDestroy(ev))
		assert.NoError(t, d.StreamDestroy(s))
		assert.NoError(t, d.Unmap(va, g))
		assert.NoError(t, d.FreePhysical(h))
		assert.NoError(t, d.ReleaseAddress(va, 4*g))
	}()

	const maxU = math.MaxUint64
	const maxP = ^uintptr(0)
	wrapSize := maxU - g + 2 // rounds up past 2^64
	badDev := []int{-1, d.DeviceCount(), math.MaxInt32, math.MinInt}
	type row struct {
		name string
		call func() error
	}
	rows := []row{
		{"ReserveAddress 0", func() error { _, err := d.ReserveAddress(0); return err }},
		{"ReserveAddress 2^64-1", func() error { _, err := d.ReserveAddress(maxU); return err }},
		{"ReserveAddress rounding overflows", func() error { _, err := d.ReserveAddress(wrapSize); return err }},
		{"ReleaseAddress 0", func() error { return d.ReleaseAddress(0, g) }},
		{"ReleaseAddress ^0", func() error { return d.ReleaseAddress(maxP, g) }},
		{"ReleaseAddress wrong size", func() error { return d.ReleaseAddress(va, maxU) }},
		{"ReleaseAddress interior", func() error { return d.ReleaseAddress(va+uintptr(g), g) }},
		{"CreatePhysical 0", func() error { _, err := d.CreatePhysical(0, prop); return err }},
		{"CreatePhysical 2^64-1", func() error { _, err := d.CreatePhysical(maxU, prop); return err }},
		{"CreatePhysical rounding overflows", func() error { _, err := d.CreatePhysical(wrapSize, prop); return err }},
		{"CreatePhysical unaligned", func() error { _, err := d.CreatePhysical(g+1, prop); return err }},
		{"CreatePhysical bad attr", func() error {
			_, err := d.CreatePhysical(g, backend.PhysicalProp{Location: prop.Location, Attr: backend.PageAttr(99)})
			return err
		}},
		{"FreePhysical 0", func() error { return d.FreePhysical(0) }},
		{"FreePhysical ^0", func() error { return d.FreePhysical(backend.Handle(maxU)) }},
		{"Map at 0", func() error { return d.Map(0, g, h) }},
		{"Map wraps", func() error { return d.Map(maxP-uintptr(g)+1, g, h) }},
		{"Map size 2^64-1", func() error { return d.Map(va+uintptr(g), maxU, h) }},
		{"Map size 0", func() error { return d.Map(va+uintptr(g), 0, h) }},
		{"Map unknown handle", func() error { return d.Map(va+uintptr(g), g, backend.Handle(maxU)) }},
		{"Map over the mapping", func() error { return d.Map(va, g, h) }},
		{"Unmap 0", func() error { return d.Unmap(0, g) }},
		{"Unmap ^0", func() error { return d.Unmap(maxP, maxU) }},
		{"Unmap wraps", func() error { return d.Unmap(va, maxU) }},
		{"Unmap unmapped", func() error { return d.Unmap(va+uintptr(g), g) }},
		{"SetAccess wraps", func() error { return d.SetAccess(va, maxU, rw) }},
		{"SetAccess 0", func() error { return d.SetAccess(0, g, rw) }},
		{"SetAccess unmapped", func() error { return d.SetAccess(va+uintptr(g), g, rw) }},
		{"GetAccess 0", func() error { _, err := d.GetAccess(0, prop.Location); return err }},
		{"GetAccess ^0", func() error { _, err := d.GetAccess(maxP, prop.Location); return err }},
		{"AddressRange 0", func() error { _, _, err := d.AddressRange(0); return err }},
		{"AddressRange ^0", func() error { _, _, err := d.AddressRange(maxP); return err }},
		{"RetainHandle 0", func() error { _, err := d.RetainHandle(0); return err }},
		{"RetainHandle unmapped", func() error { _, err := d.RetainHandle(va + uintptr(2*g)); return err }},
		{"HandleProperties ^0", func() error { _, _, err := d.HandleProperties(backend.Handle(maxU)); return err }},
		{"StreamDestroy 0", func() error { return d.StreamDestroy(0) }},
		{"StreamDestroy ^0", func() error { return d.StreamDestroy(backend.Stream(maxU)) }},
		{"StreamSynchronize ^0", func() error { return d.StreamSynchronize(backend.Stream(maxU)) }},
		{"StreamDevice ^0", func() error { _, err := d.StreamDevice(backend.Stream(maxU)); return err }},
		{"EventDestroy ^0", func() error { return d.EventDestroy(backend.Event(maxU)) }},
		{"EventRecord unknown event", func() error { return d.EventRecord(backend.Event(maxU), s) }},
		{"EventRecord unknown stream", func() error { return d.EventRecord(ev, backend.Stream(maxU)) }},
		{"EventQuery ^0", func() error { _, err := d.EventQuery(backend.Event(maxU)); return err }},
		{"EventSynchronize ^0", func() error { return d.EventSynchronize(backend.Event(maxU)) }},
	}
	for _, dev := range badDev {
		rows = append(rows,
			row{fmt.Sprintf("MemGetInfo %d", dev), func() error { _, _, err := d.MemGetInfo(dev); return err }},
			row{fmt.Sprintf("StreamCreate %d", dev), func() error { _, err := d.StreamCreate(dev); return err }},
			row{fmt.Sprintf("EventCreate %d", dev), func() error { _, err := d.EventCreate(dev); return err }},
			row{fmt.Sprintf("CreatePhysical on device %d", dev), func() error {
				_, err := d.CreatePhysical(g, backend.PhysicalProp{Location: backend.Location{Type: backend.LocationDevice, ID: dev}, Attr: prop.Attr})
				return err
			}},
			row{fmt.Sprintf("Granularity on device %d", dev), func() error {
				_, err := d.Granularity(backend.PhysicalProp{Location: backend.Location{Type: backend.LocationDevice, ID: dev}, Attr: prop.Attr}, backend.GranularityMinimum)
				return err
			}})
		if ds, ok := d.(backend.DeviceSynchronizer); ok {
			rows = append(rows, row{fmt.Sprintf("DeviceSynchronize %d", dev), func() error { return ds.DeviceSynchronize(dev) }})
		}
	}
	if hm, ok := d.(backend.HostMemory); ok {
		rows = append(rows,
			row{"MallocHost 0", func() error { _, err := hm.MallocHost(0); return err }},
			row{"MallocHost 2^64-1", func() error { _, err := hm.MallocHost(maxU); return err }},
			row{"MallocHost 2^64-4095", func() error { _, err := hm.MallocHost(maxU - 4094); return err }},
			row{"FreeHost 0", func() error { return hm.FreeHost(0) }},
			row{"FreeHost ^0", func() error { return hm.FreeHost(maxP) }},
			row{"FreeHostWithDevSync ^0", func() error { return hm.FreeHostWithDevSync(maxP) }},
			row{"HostRegister 0", func() error { return hm.HostRegister(0, 4096, backend.HostRegisterMapped) }},
			row{"HostRegister wraps", func() error { return hm.HostRegister(maxP&^4095, 8192, backend.HostRegisterMapped) }},
			row{"HostRegister 2^64-1 bytes", func() error { return hm.HostRegister(4096, maxU, backend.HostRegisterMapped) }},
			row{"HostGetDevicePointer 0", func() error { _, err := hm.HostGetDevicePointer(0); return err }},
			row{"HostUnregister ^0", func() error { return hm.HostUnregister(maxP) }})
	}
	if ipc, ok := d.(backend.IPC); ok {
		rows = append(rows,
			row{"Export ^0", func() error { _, err := ipc.Export(backend.Handle(maxU), 0); return err }},
			row{"SetPids ^0", func() error { return ipc.SetPids(maxU, []int32{1}) }},
			row{"Import ^0", func() error { _, err := ipc.Import(maxU, 0); return err }},
			row{"Import on device -1", func() error { _, err := ipc.Import(maxU, -1); return err }})
	}
	if cp, ok := d.(backend.Copier); ok {
		one := []byte{1}
		rows = append(rows,
			row{"CopyHtoD to 0", func() error { return cp.CopyHtoD(0, one, s) }},
			row{"CopyHtoD wraps", func() error { return cp.CopyHtoD(maxP, []byte{1, 2}, s) }},
			row{"CopyHtoD past the mapping", func() error { return cp.CopyHtoD(va+uintptr(g)-1, []byte{1, 2}, s) }},
			row{"CopyHtoD unknown stream", func() error { return cp.CopyHtoD(va, one, backend.Stream(maxU)) }},
			row{"CopyDtoH from ^0", func() error { return cp.CopyDtoH(one, maxP, s) }},
			row{"CopyDtoD 2^64-1 bytes", func() error { return cp.CopyDtoD(va, va, maxU, s) }},
			row{"CopyDtoD from 0", func() error { return cp.CopyDtoD(va, 0, 1, s) }},
			row{"Memset 2^64-1 bytes", func() error { return cp.Memset(va, 7, maxU, s) }},
			row{"Memset at ^0", func() error { return cp.Memset(maxP, 7, 1, s) }})
	}

	intro, _ := d.(backend.Introspector)
	held := func() string {
		if intro == nil {
			return ""
		}
		r, m, n := intro.LiveRanges(0)
		return fmt.Sprint(r, m, n)
	}
	kinds := []error{backend.ErrInvalidArgument, backend.ErrOutOfMemory, backend.ErrNotSupported, backend.ErrNotPermitted, backend.ErrUnavailable}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			before := held()
			var err error
			require.NotPanics(t, func() { err = r.call() })
			require.Error(t, err)
			known := false
			for _, k := range kinds {
				known = known || errors.Is(err, k)
			}
			assert.True(t, known, "%v wraps no backend sentinel", err)
			assert.Equal(t, before, held(), "a rejected call changed what the driver holds")
		})
	}
}
