package allocator_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// normLines is text as lines with runs of white space made one space,
// empty lines dropped.
func normLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

// TestReadmeIntegrationSnippets checks that every Go snippet of the
// README's section "Integrating vmmalloc into a Go framework" is a
// contiguous run of lines of one of the runnable examples it cites, so
// that every snippet compiles and runs.
func TestReadmeIntegrationSnippets(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, sec, ok := strings.Cut(string(readme), "\n## Integrating vmmalloc into a Go framework\n")
	require.True(t, ok, "README has the section")
	sec, _, _ = strings.Cut(sec, "\n## ")
	var sources [][]string
	for _, f := range []string{"example_integrate_test.go", "gorgonia/example_test.go"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		sources = append(sources, normLines(string(b)))
	}
	n := 0
	for rest := sec; ; n++ {
		var snip string
		if _, rest, ok = strings.Cut(rest, "```go\n"); !ok {
			break
		}
		snip, rest, ok = strings.Cut(rest, "```")
		require.True(t, ok)
		want := normLines(snip)
		found := false
		for _, src := range sources {
			for i := 0; i+len(want) <= len(src) && !found; i++ {
				found = strings.Join(src[i:i+len(want)], "\n") == strings.Join(want, "\n")
			}
		}
		require.True(t, found, "README snippet %d is not in the examples:\n%s", n, snip)
	}
	require.GreaterOrEqual(t, n, 10, "snippets checked")
}
