package trace_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

func ExampleWriter() {
	var buf bytes.Buffer
	w := trace.NewWriter(&buf)
	_ = w.SetInfo(trace.Info{Name: "tiny"})
	for _, e := range []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 4096},
		{Kind: trace.Alloc, ID: 2, Size: 1 << 20, TimeNs: 1500},
		{Kind: trace.Free, ID: 1, TimeNs: 2000},
	} {
		if err := w.Write(e); err != nil {
			fmt.Println(err)
		}
	}
	if err := w.Close(); err != nil {
		fmt.Println(err)
	}
	fmt.Println(buf.Len(), "bytes")

	r, err := trace.NewReader(&buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("name:", r.Info().Name)
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(e)
	}
	// Output:
	// 39 bytes
	// name: tiny
	// alloc 1 4096 s=0 t=0
	// alloc 2 1048576 s=0 t=1500
	// free 1 t=2000
}

func ExampleNewTextWriter() {
	w := trace.NewTextWriter(os.Stdout)
	_ = w.SetInfo(trace.Info{Source: "example"})
	_ = w.Write(trace.Event{Kind: trace.Alloc, ID: 17, Size: 1048576, TimeNs: 123})
	_ = w.Write(trace.Event{Kind: trace.RecordStream, ID: 17, Stream: 2})
	_ = w.Write(trace.Event{Kind: trace.StreamSync, Stream: 2})
	_ = w.Write(trace.Event{Kind: trace.Free, ID: 17})
	_ = w.Write(trace.Event{Kind: trace.EmptyCache})
	// An allocation in a CUDA graph's private pool, PyTorch's (1, 0).
	_ = w.Write(trace.Event{Kind: trace.Alloc, ID: 18, Size: 4096, TimeNs: 200, Pool: trace.PoolID{1, 0}})
	_ = w.Close()
	// Output:
	// # vmmalloc-trace v2
	// # source: example
	// alloc 17 1048576 s=0 t=123
	// record 17 s=2
	// sync s=2
	// free 17
	// empty_cache
	// alloc 18 4096 s=0 t=200 pool=1,0
}

func ExampleOpen() {
	const text = `# vmmalloc-trace v2
# name: hand-written
alloc 1 1000
alloc 2 3000   # the big one
free 1
alloc 3 500
`
	r, err := trace.Open(strings.NewReader(text))
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := trace.Summarize(r)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.(trace.InfoReader).Info().Name)
	fmt.Printf("allocs=%d frees=%d peak=%d live=%d\n", s.Allocs, s.Frees, s.PeakLiveBytes, s.LiveBytes)
	// Output:
	// hand-written
	// allocs=3 frees=1 peak=4000 live=3500
}

func ExampleSummarize() {
	events := []trace.Event{
		{Kind: trace.Alloc, ID: 1, Size: 100},
		{Kind: trace.Alloc, ID: 2, Size: 200},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Free, ID: 1}, // double free
	}
	s, err := trace.Summarize(trace.NewSliceReader(events))
	fmt.Println(s.PeakLiveBytes, s.Events)
	fmt.Println(err)
	// Output:
	// 300 3
	// trace: inconsistent trace: event 3 (free 1): id 1 is not live
}

func ExampleImportRMMLog() {
	const log = `Thread,Time,Action,Pointer,Size,Stream
1,08:00:00.000000,allocate,0x7f0000000000,1024,0x0
1,08:00:00.000010,allocate failure,(nil),1099511627776,0x0
1,08:00:00.000020,free,0x7f0000000000,1024,0x0
`
	tr, err := trace.ImportRMMLog(strings.NewReader(log))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range tr.Events {
		fmt.Println(e)
	}
	fmt.Println("failures:", tr.Failures)
	// Output:
	// alloc 1 1024 s=0 t=0
	// free 1 t=20000
	// failures: 1
}

func ExampleImportPyTorchSnapshot() {
	dir, err := trace.SharedDir() // the real traces are not part of the repository
	if err != nil {
		return
	}
	f, err := os.Open(filepath.Join(dir, "cs336_ctx128_forward.pickle"))
	if err != nil {
		return
	}
	defer f.Close()
	tr, err := trace.ImportPyTorchSnapshot(f, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d allocs, peak live %.2f GB, PyTorch reserved %.2f GB\n",
		tr.Allocs, float64(tr.PeakLive)/1e9, float64(tr.PeakReserved)/1e9)
}

// ExampleSharedDir finds the real traces: $VMMALLOC_TRACES when it is set
// (here, a folder made for the example), else shared/traces beside the
// module root; a test skips on ErrNoSharedDir.
func ExampleSharedDir() {
	dir, err := os.MkdirTemp("", "traces")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	if old, ok := os.LookupEnv(trace.SharedDirEnv); ok {
		defer os.Setenv(trace.SharedDirEnv, old)
	} else {
		defer os.Unsetenv(trace.SharedDirEnv)
	}

	os.Setenv(trace.SharedDirEnv, dir)
	got, err := trace.SharedDir()
	fmt.Println(got == dir, err)

	os.Setenv(trace.SharedDirEnv, filepath.Join(dir, "missing"))
	_, err = trace.SharedDir()
	fmt.Println(errors.Is(err, trace.ErrNoSharedDir))
	// Output:
	// true <nil>
	// true
}
