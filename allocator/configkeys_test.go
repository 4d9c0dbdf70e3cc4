package allocator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// setKeys reads the keys Config.set switches on from config.go, so that
// ConfigKeys cannot fall behind the parser.
func setKeys(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, 0)
	require.NoError(t, err)
	var keys []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "set" || fn.Recv == nil {
			continue
		}
		for _, st := range fn.Body.List {
			sw, ok := st.(*ast.SwitchStmt)
			if !ok {
				continue
			}
			for _, cc := range sw.Body.List {
				for _, e := range cc.(*ast.CaseClause).List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						k, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						keys = append(keys, k)
					}
				}
			}
		}
	}
	require.NotEmpty(t, keys, "found Config.set's switch")
	return keys
}

func TestConfigKeysMatchParser(t *testing.T) {
	keys := ConfigKeys()
	assert.ElementsMatch(t, setKeys(t), keys)
	for _, k := range keys {
		_, err := ParseConfig(k + ":%bogus%")
		require.ErrorIs(t, err, ErrInvalidConfig, k)
		assert.NotContains(t, err.Error(), "unknown key", k)
	}
	_, err := ParseConfig("no_such_key:1")
	assert.Contains(t, err.Error(), `unknown key "no_such_key"`)

	// Every key String writes is listed.
	c := DefaultConfig()
	c.MaxSplitSize, c.GarbageCollectionThreshold, c.PerProcessMemoryFraction = 128<<20, 0.5, 0.5
	c.RoundupPower2Divisions[0] = 4
	for _, kv := range splitTop(c.String()) {
		k, _, _ := strings.Cut(kv, ":")
		assert.True(t, slices.Contains(keys, k), "String writes %q", k)
	}

	keys[0] = "changed"
	assert.Equal(t, "expandable_segments", ConfigKeys()[0], "ConfigKeys returns a copy")
}
