package trace

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTextInfoAgreesWithWriters: whatever Info the text reader accepts,
// both writers accept (so converting a trace that reads never fails), and
// what the writers refuse the reader refuses too, naming the line.
func TestTextInfoAgreesWithWriters(t *testing.T) {
	long := strings.Repeat("v", maxInfoValue)
	tests := []struct {
		name  string
		lines string // Info lines between the header and one event
		want  Info   // when the reader accepts
		err   string // when it refuses: substring of the error
	}{
		{"plain", "# name: gpt\n# device: cuda:0\n", Info{Name: "gpt", Device: "cuda:0"}, ""},
		{"CRLF line ends", "# name: gpt\r\n# source: here\r\n", Info{Name: "gpt", Source: "here"}, ""},
		{"surrounding space trimmed", "#   name :   a b  \n", Info{Name: "a b"}, ""},
		{"4096 bytes", "# source: " + long + "\n", Info{Source: long}, ""},
		{"4097 bytes", "# source: " + long + "w\n", Info{}, "line 2: info source is 4097 bytes (limit 4096)"},
		{"carriage return inside", "# name: a\rb\n", Info{}, "line 2: info name contains a line break"},
		{"carriage return inside, third line", "# name: a\n# device: x\ry\n", Info{}, "line 3: info device contains a line break"},
		{"unknown key is a comment", "# note: a\rb " + long + "\n# name: n\n", Info{Name: "n"}, ""},
		{"no colon is a comment", "# just words\r here\n", Info{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := TextHeader + "\n" + tc.lines + "alloc 1 8 s=0 t=0\n"
			info, events, err := decodeText(t, in)
			if tc.err != "" {
				require.ErrorIs(t, err, ErrCorrupt)
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, info)
			require.Len(t, events, 1)

			// Both writers take it, and the text round trip is exact.
			require.NoError(t, NewWriter(&bytes.Buffer{}).SetInfo(info))
			out := encodeText(t, info, events)
			info2, events2, err := decodeText(t, out)
			require.NoError(t, err)
			assert.Equal(t, info, info2)
			assert.Equal(t, events, events2)
		})
	}
}

// TestInfoRuleSharedByWriters: the writers refuse exactly what the readers
// refuse.
func TestInfoRuleSharedByWriters(t *testing.T) {
	tests := []struct {
		info Info
		ok   bool
	}{
		{Info{Name: strings.Repeat("n", maxInfoValue)}, true},
		{Info{Name: strings.Repeat("n", maxInfoValue+1)}, false},
		{Info{Source: "a\rb"}, false},
		{Info{Device: "a\nb"}, false},
		{Info{Device: "tab\tand # hash"}, true},
	}
	for _, tc := range tests {
		errBin := NewWriter(&bytes.Buffer{}).SetInfo(tc.info)
		errText := NewTextWriter(&bytes.Buffer{}).SetInfo(tc.info)
		if tc.ok {
			assert.NoError(t, errBin)
			assert.NoError(t, errText)
			continue
		}
		assert.ErrorIs(t, errBin, ErrInvalidInfo)
		assert.ErrorIs(t, errText, ErrInvalidInfo)
	}
}
