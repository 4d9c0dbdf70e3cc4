package acl_test

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/conformance"
)

func newDriver(t *testing.T) backend.Driver { return hostView{open(t), main_} }

func other(t *testing.T, d backend.Driver) backend.Driver {
	return openPeer(t, d.(hostView).Driver)
}

// TestConformance runs the backend suite through the binding over the test
// double, two devices, exact memory accounting.
func TestConformance(t *testing.T) {
	needDouble(t)
	conformance.Run(t, newDriver, conformance.ExactMemInfo(), conformance.OtherProcess(other))
}

// TestConformanceStrict runs it again with the double failing every call
// made without the right device current on the calling thread, which proves
// the binding sets the context for every call from any goroutine.
func TestConformanceStrict(t *testing.T) {
	needDouble(t)
	main_.strictMode(t)
	peer.strictMode(t)
	conformance.Run(t, newDriver, conformance.ExactMemInfo(), conformance.OtherProcess(other))
}
