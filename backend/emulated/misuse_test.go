package emulated_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/conformance"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// TestMisuse runs the edge-argument table over the emulator, in both
// memory modes (only real memory has a Copier that moves bytes).
func TestMisuse(t *testing.T) {
	for name, opts := range map[string][]emulated.Option{
		"accounting": nil,
		"real":       {emulated.WithRealMemory(), emulated.WithCapacity(1 << 30)},
	} {
		t.Run(name, func(t *testing.T) {
			e, err := emulated.New(opts...)
			require.NoError(t, err)
			defer e.Close()
			conformance.Misuse(t, e)
			require.Empty(t, e.Violations())
		})
	}
}
