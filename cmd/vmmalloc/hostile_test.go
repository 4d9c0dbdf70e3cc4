package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// Hostile inputs: each replay and convert either handles or
// refuses with one clear line, never dying (an 87-byte pickle used to make
// convert die with "fatal error: out of memory").
func TestHostileInputs(t *testing.T) {
	dir := t.TempDir()
	long4 := func(n int) string { // LONG4 of n bytes, positive, too big for int64
		return "\x8b" + string(binary.LittleEndian.AppendUint32(nil, uint32(n))) + strings.Repeat("\x5a", n)
	}
	binUnicode := func(n int) string {
		return "X" + string(binary.LittleEndian.AppendUint32(nil, uint32(n))) + strings.Repeat("s", n)
	}
	dupKey := "N" + strings.Repeat("2\x86", 40) // a tuple with 2^40 leaves, 81 bytes
	files := map[string]string{
		// 87 bytes: {((...),(...)): None}, the key 40 levels deep.
		"dupkey.pickle": "\x80\x04}" + dupKey + "Ns.",
		// The same key inside an otherwise valid (empty) snapshot.
		"dupkey-snapshot.pickle": "\x80\x04}X\x0d\x00\x00\x00device_traces](]es\x8c\x01x}" + dupKey + "Nss.",
		// allocator_settings whose printed values are a cyclic list and a
		// tuple with 2^60 leaves (fmt would never finish printing them).
		"settings.pickle": "\x80\x04}X\x0d\x00\x00\x00device_traces](]esX\x12\x00\x00\x00allocator_settings}(" +
			"X\x17\x00\x00\x00PYTORCH_CUDA_ALLOC_CONF]\x94h\x00a" +
			"X\x13\x00\x00\x00expandable_segmentsN" + strings.Repeat("2\x86", 60) + "us.",
		// A 1 MiB int set as a key 1000 times.
		"bigint.pickle": "\x80\x04}" + long4(1<<20) + "\x940" + strings.Repeat("h\x00Ns", 1000) + ".",
		// A 1 MiB str key of 300000 dicts (budget).
		"bigkey.pickle": "\x80\x04](" + binUnicode(1<<20) + "\x940" + strings.Repeat("}h\x00Ns", 300_000) + "e.",
		// A text trace whose Info holds a carriage return.
		"info-cr.txt": trace.TextHeader + "\n# name: a\rb\nalloc 1 8 s=0 t=0\n",
		// A text trace with a name no trace can store (a line break).
		"odd\nname.txt": trace.TextHeader + "\nalloc 1 8 s=0 t=0\nfree 1\n",
	}
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644))
	}
	require.Len(t, files["dupkey.pickle"], 87)

	tests := []struct {
		file string
		code int
		want string // substring of the one-line error; "" for success
	}{
		{"dupkey.pickle", exitFailure, "top level is a dict with non-str keys"},
		{"dupkey-snapshot.pickle", exitOK, ""},
		{"settings.pickle", exitOK, ""},
		{"bigint.pickle", exitFailure, "top level is a dict with non-str keys"},
		{"bigkey.pickle", exitFailure, "exceeds the key hashing budget"},
		{"info-cr.txt", exitFailure, "line 2: info name contains a line break"},
		{"odd\nname.txt", exitOK, ""},
	}
	for _, tc := range tests {
		for _, cmd := range []string{"replay", "convert"} {
			t.Run(cmd+" "+tc.file, func(t *testing.T) {
				args := []string{cmd, filepath.Join(dir, tc.file)}
				if cmd == "convert" {
					args = append(args, "-o", filepath.Join(dir, "out.bin"))
				}
				code, _, stderr := runCLI(args...)
				assert.Equal(t, tc.code, code, "stderr: %s", stderr)
				assert.NotContains(t, stderr, "goroutine")
				assert.NotContains(t, stderr, "fatal error")
				if tc.want == "" {
					return
				}
				assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
				assert.True(t, strings.HasPrefix(stderr, "vmmalloc"), stderr)
				assert.Contains(t, stderr, tc.want)
			})
		}
	}

	// The converted odd-named trace reads back, its name made storable.
	f, err := os.Open(filepath.Join(dir, "out.bin"))
	require.NoError(t, err)
	defer f.Close()
	r, err := trace.NewReader(f)
	require.NoError(t, err)
	assert.Equal(t, "odd name", r.Info().Name)
	ev, err := trace.ReadAll(r)
	require.NoError(t, err)
	assert.Len(t, ev, 2)
}
