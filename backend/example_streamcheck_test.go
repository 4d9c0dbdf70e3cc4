package backend_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// An allocator validates every stream a caller hands it, and asks again
// for a stream it has seen: a stream destroyed since is refused with a
// *StreamError, and Gone tells a destroyed stream from a driver call on a
// live one that failed.
func ExampleStreamValidator() {
	drv, err := emulated.New()
	if err != nil {
		panic(err)
	}
	defer drv.Close()
	v := backend.NewStreamValidator(drv, 0) // streams of device 0
	s, _ := drv.StreamCreate(0)
	dev, err := v.Validate(s)
	fmt.Println("live:", dev, err)
	_ = drv.StreamDestroy(s)
	_, err = v.Validate(s)
	var se *backend.StreamError
	fmt.Println("destroyed:", errors.As(err, &se), se.Reason, v.Gone(s))
	_, err = v.Validate(0)
	fmt.Println(err)
	// Output:
	// live: 0 <nil>
	// destroyed: true unknown true
	// stream 0 names no stream (pass one made by StreamCreate)
}
