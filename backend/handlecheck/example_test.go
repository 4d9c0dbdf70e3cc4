package handlecheck_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
)

// Example wraps a driver, maps a handle and then frees it while it is
// still mapped: the checker refuses the free and records it.
func Example() {
	e, _ := emulated.New(emulated.WithCapacity(64 << 20))
	defer e.Close()
	chk := handlecheck.New(e)
	d := chk.Driver() // hand this to the code under test (allocator.New, ...)

	va, _ := d.ReserveAddress(2 << 20)
	h, _ := d.CreatePhysical(2<<20, backend.DeviceProp(0))
	_ = d.Map(va, 2<<20, h)
	err := d.FreePhysical(h)
	var v *handlecheck.Violation
	fmt.Println(errors.As(err, &v), v.Kind, errors.Is(err, backend.ErrInvalidArgument))
	fmt.Println(len(chk.Violations()), "violation recorded")

	_ = d.Unmap(va, 2<<20)
	fmt.Println(d.FreePhysical(h), d.ReleaseAddress(va, 2<<20))
	// Output:
	// true freed while mapped true
	// 1 violation recorded
	// <nil> <nil>
}
