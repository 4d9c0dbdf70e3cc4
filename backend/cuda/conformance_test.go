//go:build unix

package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

// double builds (once) and resets the C test double, or skips the test when
// no C compiler is available.
func double(t testing.TB) (*cudatest.Double, string) {
	t.Helper()
	path, err := cudatest.Shared()
	if err != nil {
		t.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	dbl.Reset()
	return dbl, path
}

// openDouble opens the binding over a freshly reset double; the case ends by
// closing it and checking that the double holds nothing the case created.
func openDouble(t testing.TB, setup func(*cudatest.Double)) (*cuda.Driver, *cudatest.Double) {
	t.Helper()
	dbl, path := double(t)
	dbl.RequireContext(true) // every call must come with the device's context
	if setup != nil {
		setup(dbl)
	}
	d, err := cuda.Open(cuda.WithLibrary(path))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, d.Close())
		// A handle whose memfd someone closed is an error of the case (or
		// of one before it: Reset finds those), whatever else happened.
		require.NoError(t, dbl.BackingError())
		if t.Skipped() || t.Failed() {
			return // a case cut short leaves its objects; the next Reset drops them
		}
		live := dbl.Live()
		require.Zero(t, live.Reservations+live.Mappings+live.Handles+live.HostBlocks+live.Registrations,
			"the case left driver objects behind: %+v", live)
	})
	return d, dbl
}

// withWork gives the conformance suite control of the double's streams
// (conformance.Workload), which enables its event-ordering case: events
// must report pending work (CUDA_ERROR_NOT_READY) through the binding.
type withWork struct {
	*cuda.Driver
	dbl *cudatest.Double
}

func (w withWork) Hold(s backend.Stream) error { return w.dbl.Hold(uintptr(s)) }

func (w withWork) Launch(s backend.Stream, _ uintptr, _ uint64) error {
	return w.dbl.Launch(uintptr(s))
}

func (w withWork) CompleteN(s backend.Stream, n int) error { return w.dbl.Complete(uintptr(s), n) }

func TestConformanceDouble(t *testing.T) {
	conformance.Run(t, func(t *testing.T) backend.Driver {
		d, dbl := openDouble(t, nil)
		return withWork{d, dbl}
	}, conformance.ExactMemInfo())
}

func TestConformanceDoubleOneDevice(t *testing.T) {
	conformance.Run(t, func(t *testing.T) backend.Driver {
		d, _ := openDouble(t, func(dbl *cudatest.Double) {
			require.NoError(t, dbl.SetDeviceCount(1))
			require.NoError(t, dbl.SetGranularity(64<<10, 2<<20))
			require.NoError(t, dbl.SetCapacity(-1, 64<<20))
		})
		return d
	}, conformance.ExactMemInfo())
}
