//go:build unix

package cuda_test

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/backend/conformance"
)

// TestMisuse runs the edge-argument table through the binding against the
// C test double: every call fails with a backend sentinel, changes nothing
// and leaves nothing behind (openDouble checks the double at the end).
func TestMisuse(t *testing.T) {
	d, _ := openDouble(t, nil)
	conformance.Misuse(t, d)
}
