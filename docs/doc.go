// Package docs holds vmmalloc's documentation beyond README.md: the design
// overview, a guide per use, and the measured results. It has no code; its
// test is the documentation check CI runs with every other test:
//
//   - every relative link of README.md and docs/*.md resolves, #anchors
//     included (GitHub's heading slugs);
//   - every Go snippet is a run of lines of a Go file that go test
//     compiles (an example or a test, or the quick start's program, which
//     its own test runs), so snippets cannot drift from the API;
//   - every libvmmalloc entry point a Python snippet names is declared in
//     cmd/libvmmalloc/vmmalloc.h;
//   - README.md's configuration table lists exactly the keys the
//     config parser accepts (allocator.ConfigKeys);
//   - the two commands of README.md's "Commands" section are lines of
//     .ci/run, which runs them;
//   - no file names this project's own tracker: an internal issue number
//     means nothing to a reader (upstream references, written owner/repo#N,
//     are fine).
package docs
