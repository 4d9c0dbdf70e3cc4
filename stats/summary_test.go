package stats

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wantFixtureSummary is Summary(fixture(), 1, false), worked out by hand
// from the deltas in fixture.
const wantFixtureSummary = `|==============================================================================|
|                     vmmalloc memory summary, device ID 1                     |
|------------------------------------------------------------------------------|
|            Device OOMs: 2            |           Alloc retries: 1            |
|==============================================================================|
|          Metric          | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|------------------------------------------------------------------------------|
| Allocated memory         |     30 MiB |     40 MiB |     40 MiB |     10 MiB |
|       from large pool    |     30 MiB |     40 MiB |     40 MiB |     10 MiB |
|       from small pool    |    1.5 KiB |    1.5 KiB |    1.5 KiB |        0 B |
|------------------------------------------------------------------------------|
| Active memory            |     40 MiB |     40 MiB |     40 MiB |        0 B |
|       from large pool    |     40 MiB |     40 MiB |     40 MiB |        0 B |
|       from small pool    |    1.5 KiB |    1.5 KiB |    1.5 KiB |        0 B |
|------------------------------------------------------------------------------|
| Requested memory         |     30 MiB |     40 MiB |     40 MiB |     10 MiB |
|       from large pool    |     30 MiB |     40 MiB |     40 MiB |     10 MiB |
|       from small pool    |    1.5 KiB |    1.5 KiB |    1.5 KiB |        0 B |
|------------------------------------------------------------------------------|
| Device reserved memory   |     44 MiB |     44 MiB |     64 MiB |     20 MiB |
|       from large pool    |     42 MiB |     42 MiB |     62 MiB |     20 MiB |
|       from small pool    |    2.0 MiB |    2.0 MiB |    2.0 MiB |        0 B |
|------------------------------------------------------------------------------|
| Non-releasable memory    |    2.0 MiB |    2.0 MiB |    2.0 MiB |        0 B |
|       from large pool    |        0 B |        0 B |        0 B |        0 B |
|       from small pool    |    2.0 MiB |    2.0 MiB |    2.0 MiB |        0 B |
|------------------------------------------------------------------------------|
| Allocations              |          2 |          3 |          3 |          1 |
|       from large pool    |          1 |          2 |          2 |          1 |
|       from small pool    |          1 |          1 |          1 |          0 |
|------------------------------------------------------------------------------|
| Active allocs            |          3 |          3 |          3 |          0 |
|       from large pool    |          2 |          2 |          2 |          0 |
|       from small pool    |          1 |          1 |          1 |          0 |
|------------------------------------------------------------------------------|
| Device reserved segments |          3 |          3 |          4 |          1 |
|       from large pool    |          2 |          2 |          3 |          1 |
|       from small pool    |          1 |          1 |          1 |          0 |
|------------------------------------------------------------------------------|
| Non-releasable allocs    |          1 |          1 |          1 |          0 |
|       from large pool    |          0 |          0 |          0 |          0 |
|       from small pool    |          1 |          1 |          1 |          0 |
|------------------------------------------------------------------------------|
| Oversize allocations     |          1 |          2 |          2 |          1 |
|------------------------------------------------------------------------------|
| Oversize segments        |          1 |          1 |          1 |          0 |
|==============================================================================|
|                              Driver operations                               |
|------------------------------------------------------------------------------|
| Device maps              |          5 | Device unmaps           |          1 |
| Handles created          |         23 | Handles freed           |         10 |
| Handles reused           |         11 | Stream syncs            |          4 |
| All-stream syncs         |          3 | Max split size          |     64 MiB |
|==============================================================================|
`

func TestSummaryFull(t *testing.T) {
	assert.Equal(t, wantFixtureSummary, Summary(fixture(), 1, false))
}

func TestSummaryAbbreviatedDropsPoolRows(t *testing.T) {
	got := Summary(fixture(), 1, true)
	var want []string
	for _, l := range strings.SplitAfter(wantFixtureSummary, "\n") {
		if !strings.Contains(l, "from large pool") && !strings.Contains(l, "from small pool") {
			want = append(want, l)
		}
	}
	assert.Equal(t, strings.Join(want, ""), got)
	assert.Equal(t, 36, strings.Count(got, "\n"))
}

func TestSummaryRows(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(d *DeviceStats)
		device int
		want   []string // lines that must appear verbatim
	}{
		{
			name:  "zero",
			setup: func(*DeviceStats) {},
			want: []string{
				"|                     vmmalloc memory summary, device ID 0                     |",
				"|            Device OOMs: 0            |           Alloc retries: 0            |",
				"| Allocated memory         |        0 B |        0 B |        0 B |        0 B |",
				"| Allocations              |          0 |          0 |          0 |          0 |",
				"| All-stream syncs         |          0 | Max split size          |  unlimited |",
			},
		},
		{
			name:   "20 MiB allocated on device 7",
			device: 7,
			setup: func(d *DeviceStats) {
				d.AllocatedBytes.Add(LargePool, 20<<20)
				d.Allocation.Add(LargePool, 1)
			},
			want: []string{
				"|                     vmmalloc memory summary, device ID 7                     |",
				"| Allocated memory         |     20 MiB |     20 MiB |     20 MiB |        0 B |",
				"|       from large pool    |     20 MiB |     20 MiB |     20 MiB |        0 B |",
				"|       from small pool    |        0 B |        0 B |        0 B |        0 B |",
				"| Allocations              |          1 |          1 |          1 |          0 |",
			},
		},
		{
			name: "units from bytes to GiB",
			setup: func(d *DeviceStats) {
				d.ReservedBytes[AllPools] = Stat{Current: 9, Peak: 1023, Allocated: 3 << 30, Freed: 1<<30 + 1<<29}
			},
			want: []string{
				"| Device reserved memory   |        9 B |     1023 B |    3.0 GiB |    1.5 GiB |",
			},
		},
		{
			name: "negative current keeps its sign",
			setup: func(d *DeviceStats) {
				d.ActiveBytes.Add(SmallPool, -2048)
				d.Active.Add(SmallPool, -1)
			},
			want: []string{
				"| Active memory            |   -2.0 KiB |        0 B |        0 B |    2.0 KiB |",
				"| Active allocs            |         -1 |          0 |          0 |          1 |",
			},
		},
		{
			name: "extreme values widen the column but are not cut",
			setup: func(d *DeviceStats) {
				d.ActiveBytes[AllPools] = Stat{Current: math.MinInt64, Peak: math.MaxInt64}
				d.Allocation[AllPools] = Stat{Current: math.MaxInt64}
			},
			want: []string{
				"| Active memory            |   -8.0 EiB |    8.0 EiB |        0 B |        0 B |",
				"| Allocations              | 9223372036854775807 |          0 |          0 |          0 |",
			},
		},
		{
			name: "driver counters",
			setup: func(d *DeviceStats) {
				d.NumDeviceAlloc, d.NumDeviceFree = 120, 80
				d.HandlesCreated, d.HandlesFreed, d.HandlesReused = 70, 30, 50
				d.NumStreamSyncs, d.NumSyncAllStreams = 6, 2
				d.MaxSplitSize = 200 << 20
				d.NumOOMs, d.NumAllocRetries = 12, 345
			},
			want: []string{
				"|           Device OOMs: 12            |          Alloc retries: 345           |",
				"| Device maps              |        120 | Device unmaps           |         80 |",
				"| Handles created          |         70 | Handles freed           |         30 |",
				"| Handles reused           |         50 | Stream syncs            |          6 |",
				"| All-stream syncs         |          2 | Max split size          |    200 MiB |",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &DeviceStats{}
			tt.setup(d)
			lines := strings.Split(Summary(d, tt.device, false), "\n")
			for _, w := range tt.want {
				assert.Contains(t, lines, w)
			}
		})
	}
}

func TestSummaryLayout(t *testing.T) {
	for _, abbreviated := range []bool{false, true} {
		out := Summary(fixture(), 12345, abbreviated)
		require.True(t, strings.HasSuffix(out, "|\n"))
		for i, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			assert.Len(t, l, 80, "line %d: %q", i, l)
			assert.True(t, strings.HasPrefix(l, "|") && strings.HasSuffix(l, "|"), "line %d: %q", i, l)
		}
	}
}

func TestSummaryNilIsZero(t *testing.T) {
	assert.Equal(t, Summary(&DeviceStats{}, 2, false), Summary(nil, 2, false))
	assert.Equal(t, Summary(&DeviceStats{}, 2, true), Summary(nil, 2, true))
}

func TestSummaryDoesNotModify(t *testing.T) {
	d := fixture()
	before := *d
	_ = Summary(d, 0, false)
	assert.Equal(t, before, *d)
}
