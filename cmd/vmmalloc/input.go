package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// Input formats.
const (
	fmtAuto    = "auto"
	fmtBinary  = "binary"
	fmtText    = "text"
	fmtPyTorch = "pytorch"
	fmtRMM     = "rmm"
)

// errUnknownFormat reports input whose format cannot be recognised.
var errUnknownFormat = errors.New("unrecognised trace format")

// input is an opened trace: either a stream (binary or text, read as
// replayed) or events imported whole (PyTorch snapshot, RMM log).
type input struct {
	name    string              // path as given ("-" for stdin)
	format  string              // one of the fmt* constants (never auto)
	info    trace.Info          // header metadata, if any
	stream  trace.EventReader   // binary/text: the streaming reader
	events  []trace.Event       // pytorch/rmm: the imported events
	pytorch *trace.PyTorchTrace // set for PyTorch snapshots
	rmm     *trace.RMMTrace     // set for RMM logs
	size    int64               // input size in bytes; 0 if unknown
	read    *countingReader     // bytes consumed so far (streams)
	closer  io.Closer
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (in *input) Close() error {
	if in.closer != nil {
		return in.closer.Close()
	}
	return nil
}

// reader returns an EventReader over the input's events.
func (in *input) reader() trace.EventReader {
	if in.stream != nil {
		return in.stream
	}
	return trace.NewSliceReader(in.events)
}

// all returns every event, reading the stream to its end if needed.
func (in *input) all() ([]trace.Event, error) {
	if in.stream != nil {
		ev, err := trace.ReadAll(in.stream)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", in.name, err)
		}
		in.events, in.stream = ev, nil
	}
	return in.events, nil
}

// fraction is how much of the input has been consumed, in [0,1], given
// the events replayed so far; -1 if unknown.
func (in *input) fraction(done int64) float64 {
	switch {
	case in.stream == nil && len(in.events) > 0:
		return min(1, float64(done)/float64(len(in.events)))
	case in.stream != nil && in.size > 0 && in.read != nil:
		return min(1, float64(in.read.n)/float64(in.size))
	}
	return -1
}

// parseFormat validates a --format value.
func parseFormat(s string) (string, error) {
	switch strings.ToLower(s) {
	case fmtAuto, "":
		return fmtAuto, nil
	case fmtBinary, "bin":
		return fmtBinary, nil
	case fmtText, "txt":
		return fmtText, nil
	case fmtPyTorch, "pickle":
		return fmtPyTorch, nil
	case fmtRMM, "csv":
		return fmtRMM, nil
	}
	return "", fmt.Errorf("unknown format %q (want auto, binary, text, pytorch or rmm)", s)
}

// detect chooses the format of a file from its first bytes and its name:
// the binary magic, a text header, a pickle PROTO opcode, a .pickle/.pkl
// name, a .csv name or a CSV header naming an Action column.
func detect(name string, head []byte) (string, error) {
	ext := strings.ToLower(filepath.Ext(name))
	switch {
	case bytes.HasPrefix(head, []byte(trace.Magic)):
		return fmtBinary, nil
	case len(head) > 0 && head[0] == '#':
		return fmtText, nil
	case len(head) > 0 && head[0] == 0x80: // pickle PROTO
		return fmtPyTorch, nil
	case ext == ".pickle" || ext == ".pkl":
		return fmtPyTorch, nil
	case ext == ".csv":
		return fmtRMM, nil
	}
	line, _, _ := bytes.Cut(head, []byte("\n"))
	if bytes.Contains(line, []byte(",")) && bytes.Contains(bytes.ToLower(line), []byte("action")) {
		return fmtRMM, nil
	}
	if len(head) == 0 {
		return "", fmt.Errorf("%w: %s is empty", errUnknownFormat, name)
	}
	return "", fmt.Errorf("%w: %s is not a vmmalloc trace (binary or text), a PyTorch snapshot pickle or an RMM CSV log", errUnknownFormat, name)
}

// openInput opens path ("-" for stdin) in the given format (fmtAuto
// detects it); device selects the device of a PyTorch snapshot.
func openInput(path, format string, device int, stdin io.Reader) (*input, error) {
	in := &input{name: path}
	var src io.Reader
	if path == "-" {
		if stdin == nil {
			stdin = os.Stdin
		}
		src = stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		if st, err := f.Stat(); err == nil {
			if st.IsDir() {
				_ = f.Close()
				return nil, fmt.Errorf("%s is a directory", path)
			}
			in.size = st.Size()
		}
		src, in.closer = f, f
	}
	in.read = &countingReader{r: src}
	br := bufio.NewReaderSize(in.read, 64<<10)
	if format == fmtAuto {
		head, err := br.Peek(512)
		if err != nil && err != io.EOF && !errors.Is(err, bufio.ErrBufferFull) {
			_ = in.Close()
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if format, err = detect(path, head); err != nil {
			_ = in.Close()
			return nil, err
		}
	}
	in.format = format
	var err error
	switch format {
	case fmtBinary, fmtText:
		var r trace.EventReader
		if format == fmtBinary {
			r, err = trace.NewReader(br)
		} else {
			r, err = trace.NewTextReader(br)
		}
		if err == nil {
			in.stream = r
			if ir, ok := r.(trace.InfoReader); ok {
				in.info = ir.Info()
			}
		}
	case fmtPyTorch:
		var pt *trace.PyTorchTrace
		if pt, err = trace.ImportPyTorchSnapshot(br, device); err == nil {
			in.pytorch, in.events, in.info = pt, pt.Events, pt.Info
		}
	case fmtRMM:
		var rt *trace.RMMTrace
		if rt, err = trace.ImportRMMLog(br); err == nil {
			in.rmm, in.events, in.info = rt, rt.Events, rt.Info
		}
	default:
		err = fmt.Errorf("unknown format %q", format)
	}
	if err != nil {
		_ = in.Close()
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if in.info.Name == "" && path != "-" {
		// A file name may hold line breaks, which no trace can store.
		in.info.Name = strings.Map(func(r rune) rune {
			if r == '\r' || r == '\n' {
				return ' '
			}
			return r
		}, strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)))
	}
	return in, nil
}
