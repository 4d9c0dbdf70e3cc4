package emulated_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// otherProcess gives the conformance suite a second process of d's world.
func otherProcess(t *testing.T, d backend.Driver) backend.Driver {
	e := d.(*emulated.Emulator)
	b, err := e.Process(e.Pid() + 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// newFor returns a constructor for the suite that also asserts, at the end
// of each case, that the case left no violation behind.
func newFor(opts ...emulated.Option) func(t *testing.T) backend.Driver {
	return func(t *testing.T) backend.Driver {
		e, err := emulated.New(opts...)
		require.NoError(t, err)
		t.Cleanup(func() {
			require.Empty(t, e.Violations())
			require.NoError(t, e.Close())
		})
		return e
	}
}

func TestConformanceAccounting(t *testing.T) {
	conformance.Run(t, newFor(), conformance.ExactMemInfo(), conformance.OtherProcess(otherProcess))
}

func TestConformanceAccountingTwoDevices(t *testing.T) {
	conformance.Run(t, newFor(emulated.WithDevices(2), emulated.WithCapacity(1*emulated.GiB)),
		conformance.ExactMemInfo(), conformance.OtherProcess(otherProcess))
}

func TestConformanceRealMemory(t *testing.T) {
	if _, err := emulated.New(emulated.WithRealMemory()); err != nil {
		t.Skipf("real memory unavailable: %v", err)
	}
	conformance.Run(t, newFor(emulated.WithRealMemory(), emulated.WithDevices(2)),
		conformance.ExactMemInfo(), conformance.OtherProcess(otherProcess))
}
