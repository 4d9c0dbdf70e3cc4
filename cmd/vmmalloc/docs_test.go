package main

import (
	"encoding/xml"
	"errors"
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

// TestDocsPictures checks the plots docs/traces.md shows: produced by the
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
