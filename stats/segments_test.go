package stats

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSegmentTable(t *testing.T) {
	tests := []struct {
		name string
		snap Snapshot
		want string
	}{
		{
			name: "empty",
			snap: Snapshot{},
			want: "" +
				"Address             Device  Pool            Total     Mapped  Allocated  Blocks  Expandable\n" +
				"Total (0)                                     0 B        0 B        0 B       0\n",
		},
		{
			name: "sorted by device then address",
			snap: Snapshot{Segments: []SegmentInfo{
				{Device: 1, Address: 0x20000000, TotalSize: 20 << 20, MappedSize: 20 << 20, AllocatedSize: 1536,
					Pool: LargePool, Blocks: make([]BlockInfo, 2)},
				{Device: 0, Address: 0x7f0000000000, TotalSize: 90 << 30, MappedSize: 40 << 20, AllocatedSize: 20 << 20,
					Pool: LargePool, IsExpandable: true, PageSize: 20 << 20, Blocks: make([]BlockInfo, 3)},
				{Device: 0, Address: 0x10000, TotalSize: 2 << 20, MappedSize: 2 << 20, Pool: SmallPool,
					Blocks: make([]BlockInfo, 1)},
			}},
			want: "" +
				"Address             Device  Pool            Total     Mapped  Allocated  Blocks  Expandable\n" +
				"0x10000                  0  small_pool    2.0 MiB    2.0 MiB        0 B       1  no\n" +
				"0x7f0000000000           0  large_pool     90 GiB     40 MiB     20 MiB       3  yes\n" +
				"0x20000000               1  large_pool     20 MiB     20 MiB    1.5 KiB       2  no\n" +
				"Total (3)                                  90 GiB     62 MiB     20 MiB       6\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]SegmentInfo(nil), tt.snap.Segments...)
			assert.Equal(t, tt.want, SegmentTable(tt.snap))
			assert.Equal(t, before, tt.snap.Segments, "input order untouched")
		})
	}
}
