package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/stats"
	"github.com/vmmalloc/vmmalloc/stats/memviz"
)

// snapshotFile is an output file for a PyTorch memory snapshot, created
// before the replay that writes it and removed if anything fails. A path
// ending in .html gets a self-contained page that opens the viewer
// (memviz.EmbedHTML); the pickle is then buffered until finish.
type snapshotFile struct {
	path string
	f    *os.File
	html *bytes.Buffer // the pickle, for an .html path; else nil
}

// createSnapshot creates path; entries is checked here so that a bad
// value is a usage error before any work.
func createSnapshot(path string, entries int) (*snapshotFile, error) {
	if entries < 1 || entries > stats.MaxHistoryEntries {
		return nil, usagef("--snapshot-entries %d: want 1..%d", entries, stats.MaxHistoryEntries)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	sf := &snapshotFile{path: path, f: f}
	if strings.EqualFold(filepath.Ext(path), ".html") {
		sf.html = new(bytes.Buffer)
	}
	return sf, nil
}

// finish closes the file, and removes it when err (the replay's error) or
// the close fails.
func (s *snapshotFile) finish(err error) error {
	if s == nil {
		return err
	}
	if err == nil && s.html != nil {
		err = memviz.EmbedHTML(s.f, s.html.Bytes())
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(s.path)
		return err
	}
	return nil
}

// writer is the file as an io.Writer, or nil for a nil snapshotFile (so
// that replay.Options.Snapshot stays a nil interface).
func (s *snapshotFile) writer() io.Writer {
	if s == nil {
		return nil
	}
	if s.html != nil {
		return s.html
	}
	return s.f
}

// convertToPyTorch replays in with the policy conf and writes the PyTorch
// memory snapshot of the run to out: the allocator's segments at the end
// and its history (alloc, free, segment map/unmap) over the whole run.
func convertToPyTorch(in *input, conf, out string, entries int, stderr io.Writer) (err error) {
	if out == "-" {
		return usagef("--to pytorch needs -o file")
	}
	cfg, err := allocator.ParseConfig(conf)
	if err != nil {
		return usagef("--config: %w", err)
	}
	sf, err := createSnapshot(out, entries)
	if err != nil {
		return err
	}
	defer func() { err = sf.finish(err) }()
	rep, err := replay.Run(in.reader(), replay.Options{Config: cfg, Snapshot: sf.writer(), SnapshotEntries: entries, MaxSamples: -1})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "replayed %d events (%s): peak allocated %s, peak reserved %s\n", rep.Events, policyLabel(conf, cfg),
		replay.FormatBytes(rep.PeakAllocated), replay.FormatBytes(rep.PeakReserved))
	return nil
}
