//go:build unix

package cuda_test

import (
	"errors"
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
)

// ExampleOpen opens the CUDA driver, falling back to a clear message where
// there is none (as on this example's machine: the path does not exist).
func ExampleOpen() {
	d, err := cuda.Open(cuda.WithLibrary("/nonexistent/libcuda.so.1"))
	if errors.Is(err, backend.ErrUnavailable) {
		fmt.Println("no CUDA driver; use the emulated backend")
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	fmt.Println(d.DeviceCount(), "devices")
	// Output: no CUDA driver; use the emulated backend
}

// ExampleShareable shows how a shareable handle carries an fd and a size,
// and how an importer rebuilds one around the fd it received.
func ExampleShareable() {
	sh := cuda.Shareable(7, 20<<20) // what Export returns: fd 7, 20 MiB
	// Fd 7 is the exporting Driver's, closed when the handle is freed:
	// BorrowedFD only reads the number. Driver.ShareableFile gives an fd of
	// one's own (a duplicate) to pass on and close.
	fmt.Println(cuda.BorrowedFD(sh), cuda.ShareableSize(sh)>>20, "MiB")
	// The importer got the fd as its fd 3 (e.g. through SCM_RIGHTS):
	local := cuda.Shareable(3, cuda.ShareableSize(sh))
	fmt.Println(cuda.BorrowedFD(local), cuda.ShareableSize(local)>>20, "MiB")
	// Output:
	// 7 20 MiB
	// 3 20 MiB
}
