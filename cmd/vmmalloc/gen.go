package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

func cmdGen(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gen", "[flags]", stdout)
	kind := fs.String("kind", "training", "workload: "+strings.Join(workload.Names(), ", ")+", or rl (sleep/wake colocation program)")
	seed := fs.Int64("seed", workload.DefaultSeed, "random seed")
	run := fs.Bool("run", false, "with --kind rl: replay the program over the emulator's real memory (scaled by --scale) and print what it held")
	scale := fs.Uint64("scale", 256, "with --kind rl --run: divide the scenario's sizes by this")
	format := fs.String("format", "", "output format: binary or text (default: text for a .txt output, else binary)")
	out := fs.String("o", "-", "output `file` (- for stdout)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if *kind == "rl" {
		return genRL(*seed, *run, *scale, *out, stdout, stderr)
	}
	if *run {
		return usagef("--run replays --kind rl programs only")
	}
	outFmt, err := outputFormat(*format, *out)
	if err != nil {
		return err
	}
	if outFmt == fmtPyTorch {
		return usagef("gen writes binary or text traces; replay one with --snapshot for a PyTorch snapshot")
	}
	events, info, err := workload.Generate(*kind, *seed)
	if err != nil {
		if errors.Is(err, workload.ErrInvalidConfig) {
			return usageError{err}
		}
		return err
	}
	if err := writeTrace(*out, outFmt, info, trace.NewSliceReader(events), stdout); err != nil {
		return err
	}
	if *out != "-" {
		fmt.Fprintf(stderr, "wrote %s events (%s, seed %d) to %s\n", replay.FormatCount(int64(len(events))), *kind, *seed, *out)
	}
	return nil
}

func cmdConvert(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("convert", "[flags] input", stdout)
	from := fs.String("format", fmtAuto, "input format: auto, binary, text, pytorch or rmm")
	to := fs.String("to", "", "output format: binary, text or pytorch (default: text for a .txt output, pytorch for .pickle, else binary)")
	conf := fs.String("config", "", "with --to pytorch: the allocator `config` the trace is replayed with")
	entries := fs.Int("snapshot-entries", replay.DefaultSnapshotEntries, "with --to pytorch: newest history entries kept")
	out := fs.String("o", "-", "output `file` (- for stdout)")
	device := fs.Int("device", 0, "device index of a PyTorch snapshot")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one input, got %d", len(pos))
	}
	inFmt, err := parseFormat(*from)
	if err != nil {
		return usageError{err}
	}
	outFmt, err := outputFormat(*to, *out)
	if err != nil {
		return err
	}
	if *device < 0 {
		return usagef("--device %d: want ≥ 0", *device)
	}
	if *out != "-" && pos[0] != "-" && sameFile(pos[0], *out) {
		return usagef("input and output are the same file %s", *out)
	}
	in, err := openInput(pos[0], inFmt, *device, os.Stdin)
	if err != nil {
		return err
	}
	defer in.Close()
	if outFmt == fmtPyTorch {
		return convertToPyTorch(in, *conf, *out, *entries, stderr)
	}
	if err := writeTrace(*out, outFmt, in.info, in.reader(), stdout); err != nil {
		return err
	}
	if *out != "-" {
		fmt.Fprintf(stderr, "converted %s (%s) to %s (%s)\n", pos[0], in.format, *out, outFmt)
	}
	return nil
}

// outputFormat resolves an output format flag, defaulting by extension.
func outputFormat(flagVal, out string) (string, error) {
	switch strings.ToLower(flagVal) {
	case "":
		if strings.EqualFold(filepath.Ext(out), ".txt") {
			return fmtText, nil
		}
		if strings.EqualFold(filepath.Ext(out), ".pickle") {
			return fmtPyTorch, nil
		}
		return fmtBinary, nil
	case fmtBinary, "bin":
		return fmtBinary, nil
	case fmtText, "txt":
		return fmtText, nil
	case fmtPyTorch:
		return fmtPyTorch, nil
	}
	return "", usagef("unknown output format %q (want binary, text or pytorch)", flagVal)
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// writeTrace writes every event of r to path ("-" for stdout) in format.
// On error a partly written file is removed.
func writeTrace(path, format string, info trace.Info, r trace.EventReader, stdout io.Writer) (err error) {
	var w io.Writer = stdout
	if path == "-" {
		if format == fmtBinary && isTerminal(stdout) {
			return usagef("refusing to write a binary trace to a terminal: use -o file or --format text")
		}
	} else {
		f, cerr := os.Create(path)
		if cerr != nil {
			return cerr
		}
		defer func() { // err is the named result
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				_ = os.Remove(path)
			}
		}()
		w = f
	}
	var tw interface {
		trace.EventWriter
		SetInfo(trace.Info) error
	}
	if format == fmtText {
		tw = trace.NewTextWriter(w)
	} else {
		tw = trace.NewWriter(w)
	}
	if err := tw.SetInfo(info); err != nil {
		return err
	}
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading input: %w", err)
		}
		if err := tw.Write(e); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
