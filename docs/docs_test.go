package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
)

// root is the repository root, seen from this package's directory.
const root = ".."

// repoFiles lists the repository's files (slash-separated, relative to
// root): git's tracked and not ignored files where git knows the tree,
// else every file under root but hidden directories.
func repoFiles(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f == "" {
				continue
			}
			if st, err := os.Lstat(filepath.Join(root, f)); err == nil && st.Mode().IsRegular() {
				files = append(files, f)
			}
		}
		require.NotEmpty(t, files)
		return files
	}
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") && d.Name() != ".ci" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// docFiles are the documents the check covers: README.md and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs := []string{"README.md"}
	for _, f := range repoFiles(t) {
		if strings.HasPrefix(f, "docs/") && strings.HasSuffix(f, ".md") {
			docs = append(docs, f)
		}
	}
	slices.Sort(docs[1:])
	require.Greater(t, len(docs), 1, "docs/ has documents")
	return docs
}

func read(t *testing.T, f string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
	require.NoError(t, err)
	return string(b)
}

// block is a fenced code block of a document.
type block struct {
	lang string
	line int // of the opening fence, 1-based
	text string
}

// parse splits a Markdown document into its fenced code blocks and its
// prose lines (code blocks blanked out, so that links and headings in
// them are not taken for the document's).
func parse(doc string) (blocks []block, prose []string) {
	var cur *block
	for i, l := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 1}
			prose = append(prose, "")
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
			prose = append(prose, "")
		case cur != nil:
			cur.text += l + "\n"
			prose = append(prose, "")
		default:
			prose = append(prose, l)
		}
	}
	return blocks, prose
}

// slug is GitHub's anchor for a heading: lower case, punctuation but
// hyphens and underscores dropped, spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a document, duplicates numbered as
// GitHub numbers them.
func anchors(prose []string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimLeft(l, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		h = strings.ReplaceAll(strings.TrimSpace(h), "`", "")
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var (
	codeSpan = regexp.MustCompile("`[^`]*`")
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
)

// TestLinksResolve: every relative link of README.md and docs/*.md names a
// file of the repository, and its #anchor a heading of that file.
func TestLinksResolve(t *testing.T) {
	files := map[string]bool{}
	dirs := map[string]bool{}
	for _, f := range repoFiles(t) {
		files[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	docAnchors := map[string]map[string]bool{}
	for _, d := range docFiles(t) {
		_, prose := parse(read(t, d))
		docAnchors[d] = anchors(prose)
	}
	links := 0
	for _, d := range docFiles(t) {
		_, prose := parse(read(t, d))
		for i, l := range prose {
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				where := fmt.Sprintf("%s:%d: %s", d, i+1, target)
				if file == "" {
					file = d
				} else {
					file = path.Clean(path.Join(path.Dir(d), file))
				}
				if !assert.True(t, files[file] || dirs[file], "%s: no such file", where) || anchor == "" {
					continue
				}
				a, ok := docAnchors[file]
				if !assert.True(t, ok, "%s: an anchor into a file the check does not parse", where) {
					continue
				}
				assert.True(t, a[anchor], "%s: no heading with that anchor", where)
			}
		}
	}
	assert.Greater(t, links, 20, "links checked")
}

// normLines is text as lines with runs of white space made one space,
// empty lines dropped.
func normLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

// contains reports whether want is a contiguous run of src.
func contains(src, want []string) bool {
	for i := 0; i+len(want) <= len(src); i++ {
		if slices.Equal(src[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// TestGoSnippetsCompiled: every Go snippet of README.md and docs/*.md is a
// contiguous run of lines (white space aside) of a Go file in a directory
// that go test compiles and runs (one with a _test.go file): an example,
// a test, or the quick start's program. A snippet that is a whole
// program throws no value away into _.
func TestGoSnippetsCompiled(t *testing.T) {
	tested := map[string]bool{}
	var goFiles []string
	for _, f := range repoFiles(t) {
		if strings.HasSuffix(f, "_test.go") {
			tested[path.Dir(f)] = true
		}
		if strings.HasSuffix(f, ".go") {
			goFiles = append(goFiles, f)
		}
	}
	sources := map[string][]string{}
	for _, f := range goFiles {
		if tested[path.Dir(f)] {
			sources[f] = normLines(read(t, f))
		}
	}
	snippets := 0
	for _, d := range docFiles(t) {
		blocks, _ := parse(read(t, d))
		for _, b := range blocks {
			if b.lang != "go" {
				continue
			}
			snippets++
			want := normLines(b.text)
			found := ""
			for f, src := range sources {
				if contains(src, want) {
					found = f
					break
				}
			}
			assert.NotEmpty(t, found, "%s:%d: Go snippet is in no tested Go file:\n%s", d, b.line, b.text)
			if strings.HasPrefix(b.text, "package main") {
				for _, l := range want {
					assert.False(t, strings.HasPrefix(l, "_ =") || strings.Contains(l, ", _ :=") || strings.HasPrefix(l, "_, "),
						"%s:%d: the whole program throws a value away: %s", d, b.line, l)
				}
			}
		}
	}
	assert.Greater(t, snippets, 15, "snippets checked")
}

var (
	declared  = regexp.MustCompile(`\b(vmmalloc_\w+)\s*\(`)
	entryName = regexp.MustCompile(`\bvmmalloc_\w+`)
)

// TestPythonSnippetsNameExports: every libvmmalloc entry point a Python
// snippet names is one the library's header, cmd/libvmmalloc/vmmalloc.h,
// declares (shim.c implements it, and the C tests call it).
func TestPythonSnippetsNameExports(t *testing.T) {
	exports := map[string]bool{}
	for _, m := range declared.FindAllStringSubmatch(read(t, "cmd/libvmmalloc/vmmalloc.h"), -1) {
		exports[m[1]] = true
	}
	require.Contains(t, exports, "vmmalloc_alloc")
	names := 0
	for _, d := range docFiles(t) {
		blocks, _ := parse(read(t, d))
		for _, b := range blocks {
			if b.lang != "python" {
				continue
			}
			for _, n := range entryName.FindAllString(b.text, -1) {
				names++
				assert.True(t, exports[n], "%s:%d: %s is not declared in cmd/libvmmalloc/vmmalloc.h", d, b.line, n)
			}
		}
	}
	assert.Greater(t, names, 5, "entry points checked")
}

// TestReadmeCommandsAreCI: the README's "Commands" section gives the demo
// and the test command, each an indented code line, and .ci/run runs both
// as they are written there.
func TestReadmeCommandsAreCI(t *testing.T) {
	_, sec, ok := strings.Cut(read(t, "README.md"), "\n## Commands\n")
	require.True(t, ok, "README has a Commands section")
	sec, _, _ = strings.Cut(sec, "\n## ")
	var cmds []string
	for _, l := range strings.Split(sec, "\n") {
		if strings.HasPrefix(l, "    ") && strings.TrimSpace(l) != "" {
			cmds = append(cmds, strings.TrimSpace(l))
		}
	}
	require.Equal(t, []string{"go run ./cmd/vmmalloc replay", "go test -race -timeout 30m ./..."}, cmds)
	ci := map[string]bool{}
	for _, l := range strings.Split(read(t, ".ci/run"), "\n") {
		ci[strings.TrimSpace(l)] = true
	}
	for _, c := range cmds {
		assert.True(t, ci[c], ".ci/run does not run %q as a line of its own", c)
	}
}

// TestReadmeConfigTable: the README's configuration table lists exactly
// the keys the parser accepts, in allocator.ConfigKeys' order.
func TestReadmeConfigTable(t *testing.T) {
	_, sec, ok := strings.Cut(read(t, "README.md"), "\n## Configuration\n")
	require.True(t, ok, "README has a Configuration section")
	sec, _, _ = strings.Cut(sec, "\n## ")
	var keys []string
	for _, l := range strings.Split(sec, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		keys = append(keys, strings.Trim(strings.TrimSpace(cells[1]), "`"))
	}
	assert.Equal(t, allocator.ConfigKeys(), keys)
}

// internalIssue is a reference to this project's own tracker: "issue"
// with a number. Upstream references are written owner/repo#N and do
// not match.
var internalIssue = regexp.MustCompile(`[Ii]ssues? #?[0-9]+`)

// TestNoInternalIssueNumbers: no file of the repository names an issue of
// this project's tracker; code and docs say what behaviour they pin.
func TestNoInternalIssueNumbers(t *testing.T) {
	checked := 0
	for _, f := range repoFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		require.NoError(t, err)
		if bytes.IndexByte(b, 0) >= 0 {
			continue // binary
		}
		checked++
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, len(b)+1)
		for n := 1; sc.Scan(); n++ {
			if m := internalIssue.FindString(sc.Text()); m != "" {
				t.Errorf("%s:%d: %q names an internal issue; say what behaviour is meant", f, n, m)
			}
		}
		require.NoError(t, sc.Err(), f)
	}
	assert.Greater(t, checked, 100, "files checked")
}

// TestSlug pins the anchor rules the link check relies on.
func TestSlug(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Install", "install"},
		{"Sleep and wake (vLLM sleep mode, torch_memory_saver)", "sleep-and-wake-vllm-sleep-mode-torch_memory_saver"},
		{"PyTorch and torch_npu (libvmmalloc.so)", "pytorch-and-torch_npu-libvmmallocso"},
		{"The OOM ladder: 3 rungs", "the-oom-ladder-3-rungs"},
	} {
		assert.Equal(t, c.want, slug(c.in), c.in)
	}
	a := anchors([]string{"## A", "## A", "# B c", "#nope", "### A"})
	assert.Equal(t, map[string]bool{"a": true, "a-1": true, "a-2": true, "b-c": true}, a)
}
