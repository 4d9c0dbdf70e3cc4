package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/drivers"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

// backendChoices lists the --backend values for the help text.
var backendChoices = strings.Join(drivers.Names(), "|")

// pickBackend resolves --backend, falling back to the config's backend key,
// and rejects flags that only the emulator can honour.
func pickBackend(f replayFlags, cfg allocator.Config) (string, error) {
	name := f.backend
	if name == "" {
		name = cfg.Backend
	}
	if name == "" || name == "native" {
		name = drivers.DefaultName
	}
	found := false
	for _, n := range drivers.Names() {
		found = found || n == name
	}
	if !found {
		return "", usagef("--backend %q: want one of %s", name, strings.Join(drivers.Names(), ", "))
	}
	if name == drivers.DefaultName {
		return name, nil
	}
	for _, c := range []struct {
		set  bool
		flag string
	}{{f.capacity != "", "--capacity"}, {f.compare, "--compare"}, {f.minCap, "--min-capacity"}, {f.svg != "", "--svg"}, {f.check, "--check"}} {
		if c.set {
			return "", usagef("%s needs the emulated backend, not %s", c.flag, name)
		}
	}
	return name, nil
}

// replayOnBackend replays the input on a real driver, scaled to fit its
// device, and prints the device report.
func replayOnBackend(name string, cfg allocator.Config, in *input, asJSON bool, stdout io.Writer) error {
	events, err := in.all()
	if err != nil {
		return err
	}
	d, err := drivers.Open(name, drivers.Options{})
	if err != nil {
		return err
	}
	defer drivers.Close(d)
	rep, err := replay.RunOnDriver(d, events, replay.DeviceOptions{Config: cfg})
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "%s\n%s\n", in.name, rep)
	for _, p := range rep.Pools {
		fmt.Fprintf(b, "  %-16s %d allocs: peak live %s, peak allocated %s, peak reserved %s; %s reserved at end\n",
			p.Pool, p.Allocs, replay.FormatBytes(p.PeakLive), replay.FormatBytes(p.PeakAllocated),
			replay.FormatBytes(p.PeakReserved), replay.FormatBytes(p.EndReserved))
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}
