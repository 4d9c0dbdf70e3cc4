package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
)

func TestMain(m *testing.M) {
	// The tests set VMMALLOC_CONF themselves; the caller's must not leak in.
	_ = os.Unsetenv(allocator.EnvVar)
	runTestChild()
	os.Exit(m.Run())
}

// allKeys is the list the CLI prints after an unknown config key.
var allKeys = "(valid keys: " + strings.Join(allocator.ConfigKeys(), ", ") + ")"

// TestReplayOutcomes checks the exit status, the stdout report and every
// stderr line of replays whose trace or device is not what the replay
// needs.
func TestReplayOutcomes(t *testing.T) {
	f := fixtures(t)
	tests := []struct {
		name   string
		env    string // VMMALLOC_CONF
		args   []string
		code   int
		stdout []string // substrings of stdout; nil: stdout must be empty
		stderr []string // stderr, line by line (each a substring of its line)
	}{
		{"out of memory", "", []string{"replay", "--capacity", "2MiB", f["trace.bin"]}, exitIncomplete,
			[]string{"OOMs              1 (retries"},
			[]string{`vmmalloc replay: expandable (default): out of memory on 1 of 2 allocations on a 2.00 MiB device (first at event 0): the replay did not complete (--capacity to give it more, --min-capacity to find how much it needs, --allow-oom to accept this)`}},
		{"out of memory, JSON", "", []string{"replay", "--json", "--capacity", "2MiB", f["trace.bin"]}, exitIncomplete,
			[]string{`"ooms": 1`},
			[]string{"out of memory on 1 of 2 allocations"}},
		{"out of memory allowed", "", []string{"replay", "--allow-oom", "--capacity", "2MiB", f["trace.bin"]}, exitOK,
			[]string{"OOMs              1"},
			[]string{"vmmalloc replay: warning: expandable (default): out of memory on 1 of 2 allocations on a 2.00 MiB device"}},
		{"out of memory with a capacity search", "", []string{"replay", "--min-capacity", "--capacity", "2MiB", f["trace.bin"]}, exitOK,
			[]string{"min capacity      6.00 MiB"},
			[]string{"vmmalloc replay: warning: expandable (default): out of memory"}},
		{"unknown free warns", "", []string{"replay", f["orphan.txt"]}, exitOK,
			[]string{"1 unknown frees"},
			[]string{"vmmalloc replay: warning: skipped 1 frees of unknown blocks (allocated before the trace began?); --strict makes this an error"}},
		{"unknown free strict", "", []string{"replay", "--strict", f["orphan.txt"]}, exitFailure,
			[]string{"1 unknown frees"},
			[]string{"vmmalloc replay: --strict: the trace has 1 frees of unknown blocks"}},
		{"duplicate alloc warns", "", []string{"replay", f["dup.txt"]}, exitOK,
			[]string{"1 duplicate allocs"},
			[]string{"vmmalloc replay: warning: skipped 1 allocations of blocks already live; --strict makes this an error"}},
		{"duplicate alloc strict", "", []string{"replay", "--strict", f["dup.txt"]}, exitFailure,
			[]string{"1 duplicate allocs"},
			[]string{"vmmalloc replay: --strict: the trace has 1 allocations of blocks already live"}},
		{"PyTorch free of an earlier block warns", "", []string{"replay", f["orphan.pickle"]}, exitOK,
			[]string{"1 frees of blocks allocated before the trace began were skipped"},
			[]string{"vmmalloc replay: warning: skipped 1 frees of unknown blocks"}},
		{"PyTorch free of an earlier block strict", "", []string{"replay", "--strict", f["orphan.pickle"]}, exitFailure,
			[]string{"(pytorch"},
			[]string{"vmmalloc replay: --strict: the trace has 1 frees of unknown blocks"}},
		{"clean trace is silent", "", []string{"replay", "--strict", f["trace.bin"]}, exitOK,
			[]string{"peak reserved"}, nil},
		{"samples without json", "", []string{"replay", "--samples", f["trace.bin"]}, exitUsage,
			nil, []string{"vmmalloc replay: --samples needs --json"}},
		{"VMMALLOC_CONF honoured", "expandable_segments:False", []string{"replay", f["trace.bin"]}, exitOK,
			[]string{"\nexpandable_segments:False (expandable_segments:False,"}, nil},
		{"--config over VMMALLOC_CONF", "expandable_segments:False,max_split_size_mb:64", []string{"replay", "--config", "max_split_size_mb:128", f["trace.bin"]}, exitOK,
			[]string{"max_split_size_mb:128,max_non_split"}, nil},
		{"VMMALLOC_CONF in compare", "large_segment_size_mb:4", []string{"replay", "--compare", f["trace.bin"]}, exitOK,
			[]string{"  custom                = large_segment_size_mb:4\n"}, nil},
		{"VMMALLOC_CONF unknown key", "bogus:1", []string{"replay", f["trace.bin"]}, exitUsage,
			nil, []string{`vmmalloc replay: VMMALLOC_CONF="bogus:1": invalid config: unknown key "bogus" ` + allKeys}},
		{"--config unknown key", "", []string{"replay", "--config", "nope:1"}, exitUsage,
			nil, []string{`vmmalloc replay: --config: invalid config: unknown key "nope" ` + allKeys}},
		{"--config bad value lists no keys", "", []string{"replay", "--config", "max_split_size_mb:1"}, exitUsage,
			nil, []string{`vmmalloc replay: --config: invalid config: max_split_size_mb: bad value "1": want 20..16777216`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(allocator.EnvVar, tc.env)
			code, stdout, stderr := runCLI(tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", stderr)
			if tc.stdout == nil {
				assert.Empty(t, stdout)
			}
			for _, w := range tc.stdout {
				assert.Contains(t, stdout, w)
			}
			var lines []string
			if stderr != "" {
				lines = strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			}
			require.Len(t, lines, len(tc.stderr), "stderr: %q", stderr)
			for i, w := range tc.stderr {
				assert.Contains(t, lines[i], w)
			}
		})
	}
}

// TestNoDoubledPrefixes checks that library errors do not repeat the
// command's prefix inside the message.
func TestNoDoubledPrefixes(t *testing.T) {
	f := fixtures(t)
	for _, args := range [][]string{
		{"replay", "--config", "nope:1"},
		{"replay", "--capacity", "1MiB", "--min-capacity", "--config", "per_process_memory_fraction:0.5", f["trace.bin"]},
		{"replay", f["hostile.pickle"]},
		{"replay", f["garbage.dat"]},
		{"sweep", "--policy", "x=nope:1", f["trace.bin"]},
	} {
		_, _, stderr := runCLI(args...)
		require.NotEmpty(t, stderr, "%v", args)
		_, rest, ok := strings.Cut(stderr, ": ")
		require.True(t, ok, stderr)
		assert.NotContains(t, rest, "vmmalloc: ", stderr)
		assert.NotContains(t, rest, "replay: ", stderr)
	}
	assert.Equal(t, `--config: invalid config: unknown key "x"`, cleanMessage(`--config: vmmalloc: invalid config: unknown key "x"`))
	assert.Equal(t, "policy \"a\": invalid options: b", cleanMessage("replay: policy \"a\": replay: invalid options: b"))
	assert.Equal(t, "open replay.bin: no such file", cleanMessage("open replay.bin: no such file"))
}

func TestCompareSVGOverlaysEveryPolicy(t *testing.T) {
	f := fixtures(t)
	svg := filepath.Join(f["dir"], "cmp.svg")
	code, stdout, stderr := runCLI("replay", "--compare", "--svg", svg, f["snap.pickle"])
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "classic-split128")
	doc, err := os.ReadFile(svg)
	require.NoError(t, err)
	s := string(doc)
	// six policies, live bytes and PyTorch's recorded curve
	assert.Equal(t, 8, strings.Count(s, "<polyline "))
	for _, name := range []string{"expandable", "classic", "expandable-page2M", "expandable-page64M", "classic-split128", "expandable-release256"} {
		assert.Contains(t, s, ">reserved: "+name+"</text>")
	}
	assert.Contains(t, s, ">PyTorch reserved (recorded)</text>")
	assert.Contains(t, s, " GiB</text>")
}

func TestSweepCommand(t *testing.T) {
	f := fixtures(t)
	prefix := filepath.Join(f["dir"], "grid")
	code, stdout, stderr := runCLI("sweep", "--parallel", "2", "-o", prefix,
		"--policy", "expandable=", "--policy", "classic=expandable_segments:False",
		f["trace.bin"], f["trace.txt"], f["snap.pickle"])
	require.Equal(t, exitOK, code, stderr)

	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	require.Len(t, lines, 2+6, stderr)
	assert.Equal(t, "sweeping 3 traces × 2 policies", lines[0])
	seen := map[string]bool{}
	for _, l := range lines[1:7] {
		assert.Regexp(t, `^\[[1-6]/6\] (tiny|trace|snap) × (expandable|classic): min capacity [0-9.]+ [KMG]iB \([0-9.]+× peak live [0-9.]+ [KMG]iB\), [0-9,]+ driver calls \([0-9.]+(µs|ms|s) simulated\), `, l)
		seen[l[:strings.Index(l, "]")]] = true
	}
	assert.Len(t, seen, 6, "one progress line per run")
	assert.Equal(t, "wrote "+prefix+".md, "+prefix+".csv and "+prefix+".svg", lines[7])

	md, err := os.ReadFile(prefix + ".md")
	require.NoError(t, err)
	assert.Equal(t, stdout, string(md), "the table printed is the table written")
	rows := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, rows, 2+6)
	assert.True(t, strings.HasPrefix(rows[2], "| tiny | expandable | `defaults` | 3.00 MiB |"), rows[2])
	assert.True(t, strings.HasPrefix(rows[7], "| snap | classic | `expandable_segments:False` | 1.50 GiB |"), rows[7])

	cf, err := os.Open(prefix + ".csv")
	require.NoError(t, err)
	defer cf.Close()
	recs, err := csv.NewReader(cf).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 7)
	assert.Equal(t, []string{"snap", "classic", "expandable_segments:False", "1610612736"}, recs[6][:4])

	svg, err := os.ReadFile(prefix + ".svg")
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(svg, []byte("<svg ")))
	assert.Contains(t, string(svg), ">driver calls</text>")
	assert.Contains(t, string(svg), ">classic · snap</text>")
}

func TestSweepCommandErrors(t *testing.T) {
	f := fixtures(t)
	prefix := filepath.Join(f["dir"], "bad")
	tests := []struct {
		name string
		env  string
		args []string
		code int
		want string
	}{
		{"no traces", "", []string{"sweep"}, exitUsage, "vmmalloc sweep: want at least one trace"},
		{"bad policy flag", "", []string{"sweep", "--policy", "x", f["trace.bin"]}, exitUsage, "want name=config"},
		{"policy twice", "", []string{"sweep", "--policy", "x=", "--policy", "x=", f["trace.bin"]}, exitUsage, `policy "x" given twice`},
		{"bad policy config", "", []string{"sweep", "--policy", "x=nope:1", f["trace.bin"]}, exitUsage, `--policy x: invalid config: unknown key "nope" ` + allKeys},
		{"bad env", "nope:1", []string{"sweep", f["trace.bin"]}, exitUsage, `VMMALLOC_CONF="nope:1": invalid config: unknown key "nope"`},
		{"negative parallel", "", []string{"sweep", "--parallel", "-1", f["trace.bin"]}, exitUsage, "--parallel -1"},
		{"bad capacity", "", []string{"sweep", "--capacity", "lots", f["trace.bin"]}, exitUsage, "--capacity"},
		{"missing trace", "", []string{"sweep", "-o", prefix, f["trace.bin"], f["missing"]}, exitFailure, "no such file"},
		{"hostile trace", "", []string{"sweep", "-o", prefix, f["hostile.pickle"]}, exitFailure, "forbidden opcode"},
		{"strict", "", []string{"sweep", "--strict", "-o", prefix, "--policy", "e=", f["orphan.txt"]}, exitFailure, "trace orphan: --strict: the trace has 1 frees of unknown blocks"},
		{"unwritable output", "", []string{"sweep", "-o", filepath.Join(f["missing"], "x"), "--policy", "e=", f["trace.bin"]}, exitFailure, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(allocator.EnvVar, tc.env)
			code, _, stderr := runCLI(tc.args...)
			assert.Equal(t, tc.code, code, stderr)
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			last := lines[len(lines)-1]
			assert.True(t, strings.HasPrefix(last, "vmmalloc sweep: "), last)
			assert.Contains(t, last, tc.want)
		})
	}
	_, err := os.Stat(prefix + ".md")
	assert.True(t, os.IsNotExist(err), "a failed sweep writes no table")
}

func TestSweepHonoursEnv(t *testing.T) {
	f := fixtures(t)
	t.Setenv(allocator.EnvVar, "large_segment_size_mb:4")
	code, stdout, stderr := runCLI("sweep", "-o", filepath.Join(f["dir"], "env"), f["trace.bin"])
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "| tiny | custom | `large_segment_size_mb:4` |")
	assert.Equal(t, 2+7, strings.Count(stdout, "\n"), "custom plus the six default policies")
}

func TestGenCountsWithSeparators(t *testing.T) {
	code, _, stderr := runCLI("gen", "-o", filepath.Join(t.TempDir(), "g.bin"))
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `^wrote [0-9]{1,3}(,[0-9]{3})+ events \(training, seed 1\) to `, stderr)
}

func TestJSONStillParsesWithWarnings(t *testing.T) {
	f := fixtures(t)
	code, stdout, stderr := runCLI("replay", "--json", f["orphan.txt"])
	require.Equal(t, exitOK, code)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &m))
	assert.Equal(t, 1.0, m["skipped_frees"])
	assert.Contains(t, stderr, "warning: skipped 1 frees")
}
