package fuzz

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
)

// configKeys are the keys ParseConfig knows.
var configKeys = []string{
	"expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
	"large_segment_size_mb", "small_segment_size_mb", "handle_cache_mb",
	"release_threshold_mb", "garbage_collection_threshold", "per_process_memory_fraction",
	"max_segments_per_pool", "roundup_power2_divisions", "backend", "defrag_threshold",
	"expandable_handle_mb",
}

// namesInput reports whether an error message names part of the input s:
// a quoted, non-empty substring of s (as %q writes it), a known key that s
// contains, or "" when s has an entry with an empty key.
func namesInput(msg, s string) bool {
	for i := 0; i < len(msg); i++ {
		if msg[i] != '"' {
			continue
		}
		q, err := strconv.QuotedPrefix(msg[i:])
		if err != nil {
			continue
		}
		u, err := strconv.Unquote(q)
		if err == nil && u != "" && strings.Contains(s, u) {
			return true
		}
		if err == nil && u == "" && hasEmptyKey(s) {
			return true
		}
		i += len(q) - 1
	}
	for _, k := range configKeys {
		if strings.Contains(s, k) && strings.Contains(msg, k+":") {
			return true
		}
	}
	return false
}

// hasEmptyKey reports whether some comma-separated entry of s has only
// space before its colon, or is only space.
func hasEmptyKey(s string) bool {
	for _, kv := range strings.Split(s, ",") {
		k, _, _ := strings.Cut(kv, ":")
		if strings.TrimSpace(k) == "" && strings.TrimSpace(kv) != "" {
			return true
		}
	}
	return false
}

// FuzzParseConfig: ParseConfig never panics; every error wraps
// ErrInvalidConfig and names the bad key or value; every config it accepts
// is valid and round-trips through Config.String.
func FuzzParseConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := allocator.ParseConfig(s)
		if err != nil {
			require.ErrorIs(t, err, allocator.ErrInvalidConfig)
			require.True(t, namesInput(err.Error(), s), "error %q names nothing of %q", err, s)
			return
		}
		require.NoError(t, cfg.Validate())
		str := cfg.String()
		back, err := allocator.ParseConfig(str)
		require.NoError(t, err, "String() = %q of %q does not parse", str, s)
		require.Equal(t, cfg, back, "%q → %q", s, str)
		require.Equal(t, str, back.String())
	})
}

func TestNamesInput(t *testing.T) {
	cases := []struct {
		msg, in string
		want    bool
	}{
		{`vmmalloc: invalid config: unknown key "foo"`, "foo:1", true},
		{`vmmalloc: invalid config: max_split_size_mb: bad value "x"`, "max_split_size_mb:x", true},
		{`vmmalloc: invalid config: small_segment_size_mb: larger than`, "small_segment_size_mb:40", true},
		{`vmmalloc: invalid config: something is wrong`, "max_split_size_mb:x", false},
		{`vmmalloc: invalid config: unknown key "bar"`, "foo:1", false},
		{`vmmalloc: invalid config: "" has no value`, " :", true},
		{`vmmalloc: invalid config: "" has no value`, "a:1", false},
	}
	for _, c := range cases {
		require.Equal(t, c.want, namesInput(c.msg, c.in), "%q / %q", c.msg, c.in)
	}
}
