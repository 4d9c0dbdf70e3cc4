// Command quickstart is the quick start of README.md, which shows this
// file from its package clause on: one allocator over the emulated device,
// a block used by two streams, and the memory_summary()-style table.
// go test ./docs/... runs it.
package main

import (
	"fmt"
	"io"
	"log"
	"os"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(w io.Writer) error {
	// The emulated device; real drivers plug in through backend.Driver.
	drv, err := emulated.New(emulated.WithCapacity(80 << 30))
	if err != nil {
		return err
	}
	defer drv.Close()
	cfg, err := allocator.ConfigFromEnv() // $VMMALLOC_CONF, e.g. "expandable_segments:True"
	if err != nil {
		return err
	}
	a, err := allocator.New(drv, cfg)
	if err != nil {
		return err
	}
	defer a.Close()

	s, err := drv.StreamCreate(0)
	if err != nil {
		return err
	}
	other, err := drv.StreamCreate(0)
	if err != nil {
		return err
	}
	p, err := a.Malloc(64<<20, s) // device pointer (uintptr) for work on stream s
	if err != nil {
		return err
	}
	if err := a.RecordStream(p, other); err != nil { // also used by work on other
		return err
	}
	if err := a.Free(p); err != nil {
		return err
	}
	// After RecordStream and Free the memory stays active (not reusable)
	// until the work queued on other so far completes; Synchronize(other)
	// waits for it.
	if err := a.Synchronize(other); err != nil {
		return err
	}
	fmt.Fprint(w, a.Summary()) // memory_summary()-style table
	// Hand a stream's cache back before destroying it.
	if err := a.ReleaseStream(other); err != nil {
		return err
	}
	return drv.StreamDestroy(other)
}
