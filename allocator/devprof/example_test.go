package devprof_test

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/google/pprof/profile"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/devprof"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// Example writes a device-memory profile; `go tool pprof -top devmem.pb.gz`
// then lists the functions holding device memory.
func Example() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	_ = a.RecordHistory(allocator.HistoryOptions{MaxEntries: 10_000, Stacks: true})
	for range 3 {
		_, _ = a.Malloc(64<<20, 0)
	}

	var buf bytes.Buffer // or an *os.File named devmem.pb.gz
	_ = devprof.Write(&buf, a)
	p, _ := profile.Parse(&buf)
	for _, s := range p.Sample {
		fmt.Println(s.Location[0].Line[0].Function.Name, s.Label["pool"], s.Value[3]>>20, "MiB in use")
	}
	// Output:
	// github.com/vmmalloc/vmmalloc/allocator/devprof_test.Example [large_pool] 192 MiB in use
}

// ExampleHandler mounts the profile next to net/http/pprof's handlers.
func ExampleHandler() {
	drv, _ := emulated.New()
	a, _ := allocator.New(drv, allocator.DefaultConfig())
	defer a.Close()
	mux := http.NewServeMux()
	mux.Handle("/debug/pprof/devmem", devprof.Handler(a))
	// go tool pprof http://localhost:6060/debug/pprof/devmem
	_ = mux
}
