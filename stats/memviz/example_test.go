package memviz_test

import (
	"bytes"
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/pickle"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// Example records an allocator's memory history and writes the snapshot
// that https://pytorch.org/memory_viz opens (drag the file onto the page).
func Example() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	_ = a.RecordHistory(allocator.HistoryOptions{MaxEntries: 100_000, Stacks: true})

	p, _ := a.Malloc(3<<20, 0)
	q, _ := a.Malloc(1<<20, 0)
	_ = a.Free(p)

	var buf bytes.Buffer // or an *os.File named snapshot.pickle
	if err := memviz.Write(&buf, a.MemorySnapshot()); err != nil {
		fmt.Println(err)
		return
	}
	v, _ := pickle.Decode(buf.Bytes())
	for _, e := range v.(map[string]any)["device_traces"].([]any)[0].([]any) {
		e := e.(map[string]any)
		fmt.Println(e["action"], e["size"])
	}
	_ = a.Free(q)
	// Output:
	// segment_map 4194304
	// alloc 3145728
	// segment_map 2097152
	// alloc 1048576
	// free_requested 3145728
	// free_completed 3145728
}
