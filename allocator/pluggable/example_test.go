package pluggable_test

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/pluggable"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// A Library serves a framework's calls: here over the emulator, as the C
// library serves PyTorch's over the CUDA driver.
func Example() {
	drv, _ := emulated.New(emulated.WithDevices(2))
	l := pluggable.New(pluggable.Options{Driver: drv, Log: io.Discard})
	defer l.Close()

	p, _ := l.Alloc(3<<20, 1, 0, allocator.PoolID{}) // device 1, default stream
	if err := l.Free(p, 0); err != nil {             // the wrong device: refused
		fmt.Println("refused:", err != nil)
	}
	_ = l.Free(p, 1)

	_, err := l.Alloc(1<<40, 1, 0, allocator.PoolID{})
	fmt.Println("1 TiB:", err != nil, l.LastError() != "")

	b, _ := l.StatsJSON(1)
	var st map[string]int64
	_ = json.Unmarshal(b, &st)
	fmt.Println("allocations made:", st["allocation.all.allocated"], "live:", st["allocation.all.current"])
	// Output:
	// refused: true
	// 1 TiB: true true
	// allocations made: 1 live: 0
}
