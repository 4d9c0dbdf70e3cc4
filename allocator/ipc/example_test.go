package ipc_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// Export an allocation from one process, import it in another (the
// emulator's processes share its devices), and see a process that is not
// whitelisted refused.
func Example() {
	exporter, _ := emulated.New(emulated.WithRealMemory())
	defer exporter.Close()
	importer, _ := exporter.Process(2000)
	stranger, _ := exporter.Process(3000)

	a, _ := allocator.New(exporter, allocator.DefaultConfig())
	defer a.Close()
	s, _ := exporter.StreamCreate(0)
	p, _ := a.Malloc(1<<20, s)
	_ = exporter.CopyHtoD(p, []byte("hello"), s)

	x, _ := ipc.NewExporter(a)
	exp, err := x.Export(p, ipc.ExportOptions{Pids: []int32{importer.Pid()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	wire, _ := exp.MarshalBinary() // send it any way you like
	var d ipc.Descriptor
	if err := d.UnmarshalBinary(wire); err != nil {
		fmt.Println(err)
		return
	}

	m, err := ipc.Import(importer, d, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	si, _ := importer.StreamCreate(0)
	got := make([]byte, 5)
	_ = importer.CopyDtoH(got, m.Ptr, si)
	fmt.Printf("importer reads %q from %d bytes\n", got, m.Size)

	_, err = ipc.Import(stranger, d, 0)
	fmt.Println("stranger refused:", errors.Is(err, backend.ErrNotPermitted))

	_ = importer.StreamDestroy(si)
	_ = m.Close()
	_ = exp.Close()
	_ = a.Free(p)
	_ = x.Close()
	_ = exporter.StreamDestroy(s)
	// Output:
	// importer reads "hello" from 1048576 bytes
	// stranger refused: true
}

// A descriptor travels as JSON too; decoding validates it.
func ExampleDescriptor_UnmarshalJSON() {
	var d ipc.Descriptor
	err := d.UnmarshalJSON([]byte(`{"device":0,"size":4096,"offset":0,"handles":[{"shareable":4294967297,"size":2097152,"offset":0}]}`))
	fmt.Println(err, d.Span())
	err = d.UnmarshalJSON([]byte(`{"device":0,"size":4096,"offset":0,"handles":[]}`))
	fmt.Println(errors.Is(err, ipc.ErrBadDescriptor))
	// Output:
	// <nil> 2097152
	// true
}
