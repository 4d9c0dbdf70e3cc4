package conformance_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func newEmulated(t *testing.T) *emulated.Emulator {
	e, err := emulated.New(emulated.WithDevices(2), emulated.WithCapacity(1<<30))
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func TestRunEmulated(t *testing.T) {
	conformance.Run(t, func(t *testing.T) backend.Driver { return newEmulated(t) },
		conformance.ExactMemInfo(),
		conformance.OtherProcess(func(t *testing.T, d backend.Driver) backend.Driver {
			b, err := d.(*emulated.Emulator).Process(4242)
			require.NoError(t, err)
			return b
		}))
}

// lenientUnmap ignores the size Unmap is given.
type lenientUnmap struct{ *emulated.Emulator }

func (d lenientUnmap) Unmap(va uintptr, _ uint64) error {
	for _, m := range d.Mappings() {
		if m.VA == va {
			return d.Emulator.Unmap(va, m.Size)
		}
	}
	return d.Emulator.Unmap(va, 0)
}

// eagerAccess maps memory accessible, as ACL's MapMem does.
type eagerAccess struct{ *emulated.Emulator }

func (d eagerAccess) GetAccess(va uintptr, loc backend.Location) (backend.AccessFlags, error) {
	if _, err := d.Emulator.GetAccess(va, loc); err != nil {
		return 0, err
	}
	return backend.AccessReadWrite, nil
}

// plainErrors loses the *backend.Error of failed reservations.
type plainErrors struct{ *emulated.Emulator }

func (d plainErrors) ReserveAddress(size uint64) (uintptr, error) {
	va, err := d.Emulator.ReserveAddress(size)
	if err != nil {
		return 0, backend.ErrInvalidArgument
	}
	return va, nil
}

// lenientCopy writes wherever it is told, accessible or not (as far as the
// memory allows), and reports success.
type lenientCopy struct{ *emulated.Emulator }

func (d lenientCopy) CopyHtoD(dst uintptr, src []byte, s backend.Stream) error {
	_ = d.Emulator.CopyHtoD(dst, src, s)
	return nil
}

var broken = map[string]func(e *emulated.Emulator) backend.Driver{
	"lenient-copy": func(*emulated.Emulator) backend.Driver {
		e, err := emulated.New(emulated.WithDevices(2), emulated.WithCapacity(1<<30), emulated.WithRealMemory())
		if err != nil {
			panic(err) // the child process fails, and so does the parent's check
		}
		return lenientCopy{e}
	},
	"lenient-unmap": func(e *emulated.Emulator) backend.Driver { return lenientUnmap{e} },
	"eager-access":  func(e *emulated.Emulator) backend.Driver { return eagerAccess{e} },
	"plain-errors":  func(e *emulated.Emulator) backend.Driver { return plainErrors{e} },
}

// TestSuiteCatchesBrokenDrivers runs the suite, in a child process, against
// drivers that each break one contract, and expects exactly the case
// checking that contract to fail.
func TestSuiteCatchesBrokenDrivers(t *testing.T) {
	if name := os.Getenv("CONFORMANCE_BROKEN"); name != "" {
		conformance.Run(t, func(t *testing.T) backend.Driver { return broken[name](newEmulated(t)) })
		return
	}
	for name, fails := range map[string]string{
		"lenient-unmap": "UnmapMismatch",
		"eager-access":  "AccessUntilSetAccess",
		"plain-errors":  "ReserveRelease",
		"lenient-copy":  "CopierRejects",
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesBrokenDrivers$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "CONFORMANCE_BROKEN="+name)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "the suite passed a broken driver:\n%s", out)
			assert.Contains(t, string(out), "--- FAIL: TestSuiteCatchesBrokenDrivers/"+fails+" ")
			assert.Contains(t, string(out), "--- PASS: TestSuiteCatchesBrokenDrivers/Lifecycle ")
		})
	}
}
