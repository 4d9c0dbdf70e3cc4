package memviz

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
)

// ViewerURL is the memory viewer module a WriteHTML page loads.
const ViewerURL = "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js"

// WriteHTML writes s as a self-contained page, as torch.cuda._memory_viz
// does: the snapshot pickle embedded in base64 (padded with zero bytes to a
// multiple of three, which the viewer's decoder needs), opened in the
// "Active Memory Timeline" view by the viewer module loaded from ViewerURL
// (so the browser needs network access). On a validation error nothing is
// written.
func WriteHTML(w io.Writer, s Snapshot) error {
	var pk bytes.Buffer
	if err := Write(&pk, s); err != nil {
		return err
	}
	return EmbedHTML(w, pk.Bytes())
}

// EmbedHTML writes the page of WriteHTML around a snapshot pickle already
// written (by Write or allocator.WriteSnapshot). pickle is not modified.
func EmbedHTML(w io.Writer, pickle []byte) error {
	pad := (3 - len(pickle)%3) % 3 // zero bytes after STOP: never read
	data := make([]byte, len(pickle)+pad)
	copy(data, pickle)
	var b bytes.Buffer
	b.WriteString("<!DOCTYPE html>\n<html>\n<head><meta charset=\"utf-8\"><title>vmmalloc memory snapshot</title></head>\n<body>\n<script type=\"module\">\n")
	fmt.Fprintf(&b, "import {add_local_files} from %q;\n", ViewerURL)
	b.WriteString("add_local_files([{name: \"snapshot.pickle\", base64: \"")
	b.WriteString(base64.StdEncoding.EncodeToString(data))
	b.WriteString("\"}], \"Active Memory Timeline\");\n</script>\n</body>\n</html>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("memviz: write: %w", err)
	}
	return nil
}
