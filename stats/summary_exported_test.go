package stats

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSummaryExported: the driver section gains a row of exported handles
// and exporter-held bytes only when there are any, and it keeps the
// table's width.
func TestSummaryExported(t *testing.T) {
	d := &DeviceStats{}
	assert.NotContains(t, Summary(d, 0, false), "Exported handles")
	for _, tc := range []struct {
		handles, held int64
		want          string
	}{
		{12, 768 << 20, "| Exported handles         |         12 | Held by exporters       |    768 MiB |"},
		{3, 0, "| Exported handles         |          3 | Held by exporters       |        0 B |"},
	} {
		d.ExportedHandles, d.ExporterHeldBytes = tc.handles, tc.held
		out := Summary(d, 0, true)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		assert.Contains(t, lines, tc.want)
		for i, l := range lines {
			assert.Len(t, l, 80, "line %d: %q", i, l)
		}
	}
}
