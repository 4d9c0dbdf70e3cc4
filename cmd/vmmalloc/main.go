// Command vmmalloc is vmmalloc's study tool: it replays allocation traces
// through the caching allocator over the emulated device and reports how
// much memory the workload really needs under each policy.
//
// Usage:
//
//	vmmalloc replay [flags] [trace]     replay a trace (default: the built-in training workload)
//	vmmalloc sweep [flags] trace...     replay every trace under every policy, in parallel
//	vmmalloc gen [flags]                write a generated workload as a trace
//	vmmalloc convert [flags] input      convert a trace between formats
//	vmmalloc --version                  print the version
//
// replay reads vmmalloc binary and text traces, PyTorch memory snapshots
// (torch.cuda.memory._dump_snapshot pickles) and RAPIDS RMM CSV logs; the
// format is detected from the content and the file name. Its flags:
//
//	--config s       allocator config (PYTORCH_CUDA_ALLOC_CONF style, e.g. expandable_segments:False),
//	                 applied over $VMMALLOC_CONF
//	--capacity n     emulated device memory (80GiB default; units accepted)
//	--min-capacity   search the smallest capacity the trace fits in
//	--compare        replay the default policy set, search each one's minimum capacity, print a table
//	--allow-oom      exit 0 even if the replay ran out of memory
//	--strict         fail on frees of unknown blocks and allocations of live ones
//	--json           print the report as JSON (--samples adds the time series)
//	--svg file       write a plot of memory over time (every policy with --compare)
//	--releases=false ignore the cache releases the trace records (a PyTorch snapshot's segment frees)
//	--backend name   replay on emulated (default), cuda or acl (backend/drivers;
//	                 also the config's backend key); a device replay scales the
//	                 trace to fit the device and takes none of the emulator-only flags
//	--snapshot file  write a PyTorch memory snapshot of the replay (open it at pytorch.org/memory_viz;
//	                 a .html file is a page that opens the viewer itself)
//
// sweep replays a grid of policies × traces, one run per core at a time,
// searching each run's minimum capacity; it prints a Markdown table and
// writes PREFIX.md, PREFIX.csv and PREFIX.svg (min capacity against driver
// calls). gen writes --kind training|inference|mix|multistream with --seed in --format
// binary|text to -o. convert reads any input format and writes binary or
// text (--to, or from the -o extension: .txt is text), or, with --to
// pytorch (or a .pickle output), replays the trace with --config and
// writes the PyTorch memory snapshot of the run.
//
// Sizes are printed in binary units (MiB, GiB) and counts with thousands
// separators. Warnings (skipped frees, out-of-memory allowed) go to
// stderr. Errors are one line on stderr, and the exit status says what
// happened: 0 success, 1 bad input, I/O error or --strict violation,
// 2 usage error, 3 internal error, 4 the replay ran out of device memory
// (unless --allow-oom, --min-capacity or --compare).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit statuses.
const (
	exitOK       = 0
	exitFailure  = 1 // bad input, I/O or replay error
	exitUsage    = 2 // bad command line
	exitInternal = 3 // a bug: recovered panic
	// exitIncomplete: the replay ran out of device memory, so it could not
	// do what the trace did (and its figures are not the trace's).
	exitIncomplete = 4
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError marks an error as a command-line mistake (exit status 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

const mainUsage = `vmmalloc — caching-allocator studies over an emulated device

Usage:
  vmmalloc replay [flags] [trace]   replay a trace (default: the built-in training workload)
  vmmalloc sweep [flags] trace...   replay every trace under every policy, in parallel
  vmmalloc gen [flags]              write a generated workload as a trace
  vmmalloc convert [flags] input    convert a trace between formats
  vmmalloc --version                print the version

Exit status: 0 ok, 1 failure, 2 usage, 3 internal error, 4 out of device memory.

Run "vmmalloc <command> -h" for a command's flags.
`

// run is the whole command: it parses args, runs a subcommand and returns
// the exit status. Errors are written to stderr as one line.
func run(args []string, stdout, stderr io.Writer) (code int) {
	cmd := "vmmalloc"
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "%s: internal error: %s\n", cmd, oneLine(fmt.Sprint(r)))
			code = exitInternal
		}
	}()
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return exitUsage
	}
	var sub func([]string, io.Writer, io.Writer) error
	switch args[0] {
	case "replay":
		sub = cmdReplay
	case "sweep":
		sub = cmdSweep
	case "gen":
		sub = cmdGen
	case "convert":
		sub = cmdConvert
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version())
		return exitOK
	default:
		fmt.Fprintf(stderr, "vmmalloc: unknown command %q (want replay, sweep, gen or convert)\n", args[0])
		return exitUsage
	}
	cmd = "vmmalloc " + args[0]
	err := sub(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: %s\n", cmd, cleanMessage(oneLine(err.Error())))
	var ue usageError
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case isIncomplete(err):
		return exitIncomplete
	}
	return exitFailure
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// flagSet is a subcommand's flags: it reports errors through its caller
// (never by printing) and prints its usage to stdout on -h.
type flagSet struct {
	*flag.FlagSet
	synopsis string
	stdout   io.Writer
}

func newFlagSet(name, synopsis string, stdout io.Writer) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, synopsis: synopsis, stdout: stdout}
}

// usage prints the subcommand's synopsis and flags to stdout.
func (fs *flagSet) usage() {
	fmt.Fprintf(fs.stdout, "Usage: vmmalloc %s %s\n\nFlags:\n", fs.Name(), fs.synopsis)
	fs.SetOutput(fs.stdout)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// parseArgs parses flags that may come before, between or after the
// positional arguments, which it returns. Everything after "--" is
// positional.
func parseArgs(fs *flagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.usage()
				return nil, err
			}
			return nil, usageError{fmt.Errorf("%w (see -h)", err)}
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
