package acl_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/acl"
)

// Open fails with one clear error on a machine without the CANN toolkit, so
// a program can fall back to another backend.
func ExampleOpen() {
	_, err := acl.Open(acl.WithLibrary("/nonexistent/libascendcl.so"))
	fmt.Println(errors.Is(err, acl.ErrLibrary))
	// Output:
	// true
}

// The VMM lifecycle on an Ascend device, and a copy that proves the memory
// holds data. (Not run: it needs libascendcl.so.)
func ExampleDriver() {
	d, err := acl.Open() // $VMMALLOC_LIBASCENDCL or libascendcl.so
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	prop := backend.DeviceProp(0)
	g, _ := d.Granularity(prop, backend.GranularityMinimum)
	va, _ := d.ReserveAddress(4 * g)
	h, _ := d.CreatePhysical(g, prop)
	_ = d.Map(va, g, h)
	_ = d.SetAccess(va, g, []backend.AccessDesc{{Location: prop.Location, Flags: backend.AccessReadWrite}})
	s, _ := d.StreamCreate(0)
	_ = d.CopyHtoD(va, []byte("hello"), s)
	got := make([]byte, 5)
	_ = d.CopyDtoH(got, va, s)
	fmt.Println(string(got))
	_ = d.StreamDestroy(s)
	_ = d.Unmap(va, g)
	_ = d.FreePhysical(h)
	_ = d.ReleaseAddress(va, 4*g)
}

// Backends are chosen by capability: the ACL driver implements every
// optional interface.
func ExampleKind() {
	fmt.Println(acl.Kind(207001) == backend.ErrOutOfMemory, acl.Kind(207006) == backend.ErrNotPermitted)
	var d backend.Driver = (*acl.Driver)(nil)
	_, ipc := d.(backend.IPC)
	_, host := d.(backend.HostMemory)
	_, cp := d.(backend.Copier)
	_, sync := d.(backend.DeviceSynchronizer)
	_, in := d.(backend.Introspector)
	fmt.Println(ipc, host, cp, sync, in)
	// Output:
	// true true
	// true true true true true
}
