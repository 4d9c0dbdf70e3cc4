package acl_test

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/backend/conformance"
)

// TestMisuse runs the edge-argument table through the binding against the
// C test double: every call fails with a backend sentinel, changes nothing
// and leaves nothing behind (open checks the double after Close).
func TestMisuse(t *testing.T) {
	conformance.Misuse(t, open(t))
}
