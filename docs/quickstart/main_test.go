package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQuickStart runs the README's quick start as `go run` would: it
// completes, and its summary shows the 64 MiB block allocated and freed
// again, with nothing left allocated.
func TestQuickStart(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out))
	var allocated string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| Allocated memory ") {
			allocated = strings.Join(strings.Fields(l), " ")
		}
	}
	assert.Equal(t, "| Allocated memory | 0 B | 64 MiB | 64 MiB | 64 MiB |", allocated)
}
