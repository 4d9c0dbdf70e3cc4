package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
)

// incompleteError reports a replay that ran out of device memory: it could
// not do what the trace did (exit status exitIncomplete).
type incompleteError struct{ err error }

func (e incompleteError) Error() string { return e.err.Error() }
func (e incompleteError) Unwrap() error { return e.err }

// cliConfig is the allocator config of a command: $VMMALLOC_CONF, then
// --config over it (a key given in both takes --config's value). It
// returns the parsed config and the combined string ("" when neither is
// set). A bad key or value is a usage error naming where it came from and,
// for an unknown key, listing the valid ones.
func cliConfig(flagValue string) (allocator.Config, string, error) {
	env := strings.TrimSpace(os.Getenv(allocator.EnvVar))
	flagValue = strings.TrimSpace(flagValue)
	if _, err := allocator.ParseConfig(env); err != nil {
		return allocator.Config{}, "", usagef("%s=%q: %w%s", allocator.EnvVar, env, err, keysHint(err))
	}
	if _, err := allocator.ParseConfig(flagValue); err != nil {
		return allocator.Config{}, "", usagef("--config: %w%s", err, keysHint(err))
	}
	base, _ := allocator.ParseConfig(env)
	cfg, err := allocator.ParseConfigOver(base, flagValue)
	if err != nil { // each parsed alone; together they may still conflict
		return allocator.Config{}, "", usagef("%s with --config: %w", allocator.EnvVar, err)
	}
	// The label names the flag's settings last, as they win.
	return cfg, strings.Trim(env+","+flagValue, ","), nil
}

// keysHint lists the valid config keys after an unknown-key error.
func keysHint(err error) string {
	if !strings.Contains(err.Error(), "unknown key") {
		return ""
	}
	return " (valid keys: " + strings.Join(allocator.ConfigKeys(), ", ") + ")"
}

// traceIssues counts what a replay skipped because the trace itself is
// inconsistent (not because of the policy).
type traceIssues struct {
	unknownFrees    int64 // frees of ids never allocated (PyTorch: allocated before recording began)
	duplicateAllocs int64 // allocs of ids still live
	skippedRecords  int64 // record_stream of ids not live
}

func issuesOf(rep *replay.Report, in *input) traceIssues {
	ti := traceIssues{unknownFrees: rep.SkippedFrees, duplicateAllocs: rep.DuplicateAllocs, skippedRecords: rep.SkippedRecords}
	if in != nil && in.pytorch != nil {
		ti.unknownFrees += int64(in.pytorch.UnmatchedFrees)
	}
	return ti
}

// check turns the issues into a --strict error, or nil.
func (ti traceIssues) check() error {
	var parts []string
	if ti.unknownFrees > 0 {
		parts = append(parts, replay.FormatCount(ti.unknownFrees)+" frees of unknown blocks")
	}
	if ti.duplicateAllocs > 0 {
		parts = append(parts, replay.FormatCount(ti.duplicateAllocs)+" allocations of blocks already live")
	}
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("--strict: the trace has %s", strings.Join(parts, " and "))
}

// warn writes the issues to stderr as warnings, one line each.
func (ti traceIssues) warn(w io.Writer, cmd string) {
	if ti.unknownFrees > 0 {
		fmt.Fprintf(w, "%s: warning: skipped %s frees of unknown blocks (allocated before the trace began?); --strict makes this an error\n",
			cmd, replay.FormatCount(ti.unknownFrees))
	}
	if ti.duplicateAllocs > 0 {
		fmt.Fprintf(w, "%s: warning: skipped %s allocations of blocks already live; --strict makes this an error\n",
			cmd, replay.FormatCount(ti.duplicateAllocs))
	}
	if ti.skippedRecords > 0 {
		fmt.Fprintf(w, "%s: warning: skipped %s record_stream events of blocks not live\n", cmd, replay.FormatCount(ti.skippedRecords))
	}
}

// oomMessage describes a replay that ran out of memory.
func oomMessage(rep *replay.Report) string {
	name := rep.Policy
	if name == "" {
		name = "replay"
	}
	return fmt.Sprintf("%s: out of memory on %s of %s allocations on a %s device (first at event %s)",
		name, replay.FormatCount(rep.OOMs), replay.FormatCount(rep.Allocs), replay.FormatBytes(rep.Capacity), replay.FormatCount(rep.FirstOOMEvent))
}

// cleanMessage drops the package prefixes ("vmmalloc: ", "replay: ")
// that wrapped errors carry inside the message, so that a line reads
// "vmmalloc replay: --config: invalid config: …" rather than repeating
// them.
func cleanMessage(msg string) string {
	parts := strings.Split(msg, ": ")
	out := parts[:0]
	for _, p := range parts {
		if p == "vmmalloc" || p == "replay" {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ": ")
}

// version is what --version prints: the module version (or "(devel)"
// for a build from a checkout), the VCS revision when known, and the Go
// version.
func version() string {
	v, rev := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("vmmalloc %s%s %s/%s %s", v, rev, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// isIncomplete reports whether err is an incompleteError.
func isIncomplete(err error) bool {
	var ie incompleteError
	return errors.As(err, &ie)
}
