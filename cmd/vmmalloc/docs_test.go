package main

import (
	"encoding/xml"
	"errors"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

// svgCounts parses an SVG file and counts its elements and legend texts.
func svgCounts(t *testing.T, path string) (map[string]int, []string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	d := xml.NewDecoder(f)
	counts := map[string]int{}
	var texts []string
	inText := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return counts, texts
		}
		require.NoError(t, err, "%s is well-formed", path)
		switch x := tok.(type) {
		case xml.StartElement:
			counts[x.Name.Local]++
			inText = x.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(x))
			}
		case xml.EndElement:
			inText = false
		}
	}
}

// TestDocsPictures checks the plots the README shows: produced by the
// commands it gives, one line per policy plus live bytes, and one marker
// per run of the sweep.
func TestDocsPictures(t *testing.T) {
	policies := replay.DefaultPolicies()
	els, texts := svgCounts(t, "docs/compare.svg")
	assert.Equal(t, len(policies)+1, els["polyline"], "a line per policy and the live bytes")
	joined := strings.Join(texts, "\n")
	for _, p := range policies {
		assert.Contains(t, joined, "reserved: "+p.Name)
	}
	assert.Contains(t, joined, "GiB")

	els, texts = svgCounts(t, "docs/sweep.svg")
	markers := els["circle"] + els["polygon"] + els["rect"] - 3 // background, frame, clip path
	assert.Equal(t, 2*3*len(policies), markers, "3 workloads × %d policies, each a point and a legend entry", len(policies))
	assert.Contains(t, strings.Join(texts, "\n"), "driver calls")

	md, err := os.ReadFile("docs/sweep.md")
	require.NoError(t, err)
	assert.Equal(t, 2+3*len(policies), strings.Count(string(md), "\n"))
}

// TestReadmeExample checks the README's Go example: it parses and type
// checks against this module, and throws no value away into _.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(readme), "```go\n")
	require.True(t, ok, "README has a Go example")
	src, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "README.go", src, parser.ParseComments)
	require.NoError(t, err)
	var imports []string
	for _, im := range f.Imports {
		imports = append(imports, strings.Trim(im.Path.Value, `"`))
	}
	assert.Contains(t, imports, "github.com/vmmalloc/vmmalloc/allocator")
	assert.Contains(t, imports, "github.com/vmmalloc/vmmalloc/backend/emulated")
	ast.Inspect(f, func(n ast.Node) bool {
		if as, ok := n.(*ast.AssignStmt); ok {
			for _, l := range as.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Name == "_" {
					t.Errorf("README example discards a value at %s", fset.Position(as.Pos()))
				}
			}
		}
		return true
	})
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	_, err = conf.Check("main", fset, []*ast.File{f}, nil)
	assert.NoError(t, err, "the README example type-checks")
}
