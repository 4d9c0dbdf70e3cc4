package allocator

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	def := DefaultConfig()
	cases := []struct {
		in    string
		check func(t *testing.T, c Config)
	}{
		{"", func(t *testing.T, c Config) { assert.Equal(t, def, c) }},
		{"expandable_segments:False", func(t *testing.T, c Config) { assert.False(t, c.ExpandableSegments) }},
		{" expandable_segments : true ", func(t *testing.T, c Config) { assert.True(t, c.ExpandableSegments) }},
		{"max_split_size_mb:128", func(t *testing.T, c Config) { assert.Equal(t, uint64(128<<20), c.MaxSplitSize) }},
		{"max_non_split_rounding_mb:0", func(t *testing.T, c Config) { assert.Zero(t, c.MaxNonSplitRounding) }},
		{"large_segment_size_mb:64,small_segment_size_mb:4", func(t *testing.T, c Config) {
			assert.Equal(t, uint64(64<<20), c.LargeSegmentSize)
			assert.Equal(t, uint64(4<<20), c.SmallSegmentSize)
		}},
		{"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8", func(t *testing.T, c Config) {
			assert.Equal(t, 0.6, c.GarbageCollectionThreshold)
			assert.Equal(t, 0.8, c.PerProcessMemoryFraction)
		}},
		{"release_threshold_mb:512", func(t *testing.T, c Config) { assert.Equal(t, uint64(512<<20), c.ReleaseThreshold) }},
		{"release_threshold_mb:none", func(t *testing.T, c Config) { assert.Equal(t, uint64(math.MaxUint64), c.ReleaseThreshold) }},
		{"roundup_power2_divisions:4", func(t *testing.T, c Config) {
			for _, d := range c.RoundupPower2Divisions {
				assert.Equal(t, 4, d)
			}
		}},
		{"roundup_power2_divisions:[256:1,512:2,>:8]", func(t *testing.T, c Config) {
			assert.Equal(t, 0, c.RoundupPower2Divisions[7])
			assert.Equal(t, 1, c.RoundupPower2Divisions[8])
			assert.Equal(t, 2, c.RoundupPower2Divisions[9])
			assert.Equal(t, 8, c.RoundupPower2Divisions[10])
			assert.Equal(t, 8, c.RoundupPower2Divisions[15])
		}},
		{"max_segments_per_pool:1,handle_cache_mb:0,backend:native", func(t *testing.T, c Config) {
			assert.Equal(t, 1, c.MaxSegmentsPerPool)
			assert.Zero(t, c.HandleCacheSize)
			assert.Equal(t, "native", c.Backend)
		}},
		{"expandable_handle_mb:128", func(t *testing.T, c Config) { assert.Equal(t, uint64(128<<20), c.ExpandableHandleSize) }},
		{"expandable_handle_mb:0", func(t *testing.T, c Config) { assert.Zero(t, c.ExpandableHandleSize) }},
		{"backend:cuda", func(t *testing.T, c Config) { assert.Equal(t, "cuda", c.Backend) }},
		{"backend:emulated", func(t *testing.T, c Config) { assert.Equal(t, "emulated", c.Backend) }},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			cfg, err := ParseConfig(c.in)
			require.NoError(t, err)
			c.check(t, cfg)
			// String round-trips.
			again, err := ParseConfig(cfg.String())
			require.NoError(t, err, cfg.String())
			assert.Equal(t, cfg, again)
		})
	}
}

func TestParseConfigErrorsNameTheKey(t *testing.T) {
	cases := []struct{ in, mention string }{
		{"bogus:1", "bogus"},
		{"expandable_segments", "expandable_segments"},
		{"expandable_segments:maybe", "maybe"},
		{"max_split_size_mb:10", "max_split_size_mb"},
		{"max_split_size_mb:-5", "max_split_size_mb"},
		{"max_split_size_mb:abc", "abc"},
		{"garbage_collection_threshold:1.0", "garbage_collection_threshold"},
		{"garbage_collection_threshold:NaN", "garbage_collection_threshold"},
		{"per_process_memory_fraction:0", "per_process_memory_fraction"},
		{"per_process_memory_fraction:1.5", "per_process_memory_fraction"},
		{"roundup_power2_divisions:3", "roundup_power2_divisions"},
		{"roundup_power2_divisions:[256:1,128:2]", "128"},
		{"roundup_power2_divisions:[3:1]", "3"},
		{"roundup_power2_divisions:[256:1", "roundup_power2_divisions"},
		{"roundup_power2_divisions:[]", "roundup_power2_divisions"},
		{"large_segment_size_mb:0", "large_segment_size_mb"},
		{"small_segment_size_mb:64,large_segment_size_mb:20", "small_segment_size_mb"},
		{"backend:cudaMallocAsync", "backend"},
		{"expandable_handle_mb:-1", "expandable_handle_mb"},
		{"expandable_handle_mb:1.5", "expandable_handle_mb"},
		{"max_segments_per_pool:0", "max_segments_per_pool"},
		{"pinned_use_cuda_host_register:True", "pinned_use_cuda_host_register"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			_, err := ParseConfig(c.in)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.mention)
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv(EnvVar, "expandable_segments:False,max_split_size_mb:64")
	c, err := ConfigFromEnv()
	require.NoError(t, err)
	assert.False(t, c.ExpandableSegments)
	assert.Equal(t, uint64(64<<20), c.MaxSplitSize)
	t.Setenv(EnvVar, "nope:1")
	_, err = ConfigFromEnv()
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// TestParseConfigDuplicateKey: a key set twice is an error naming the key,
// whatever the two values (PyTorch lets the last one win silently).
func TestParseConfigDuplicateKey(t *testing.T) {
	for _, tc := range []struct{ in, key string }{
		{"max_split_size_mb:128,max_split_size_mb:128", "max_split_size_mb"},
		{"expandable_segments:True, expandable_segments :False", "expandable_segments"},
		{"roundup_power2_divisions:[256:1,>:8],garbage_collection_threshold:0.5,roundup_power2_divisions:4", "roundup_power2_divisions"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c, err := ParseConfig(tc.in)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.key)
			assert.Contains(t, err.Error(), "more than once")
			assert.Equal(t, Config{}, c)
		})
	}
}

func TestParseConfigOver(t *testing.T) {
	base, err := ParseConfig("expandable_segments:False,max_split_size_mb:64")
	require.NoError(t, err)
	c, err := ParseConfigOver(base, "max_split_size_mb:128")
	require.NoError(t, err)
	assert.False(t, c.ExpandableSegments, "a key s leaves alone keeps base's value")
	assert.Equal(t, uint64(128<<20), c.MaxSplitSize, "a key s sets wins")
	_, err = ParseConfigOver(base, "max_split_size_mb:128,max_split_size_mb:256")
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max_split_size_mb is set more than once")
	zero, err := ParseConfigOver(base, "bogus:1")
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Equal(t, Config{}, zero)
}

// TestParsePairs: the shared key:value grammar splits outside brackets,
// trims, and refuses a missing value or a repeated key with the caller's
// sentinel, before set sees the pair.
func TestParsePairs(t *testing.T) {
	mine := errors.New("mine")
	for _, tc := range []struct {
		in    string
		pairs []string
		err   string
	}{
		{"", nil, ""},
		{" a : 1 ,, b:[1:2,>:8] ", []string{"a=1", "b=[1:2,>:8]"}, ""},
		{"a:1,b", []string{"a=1"}, `mine: "b" has no value (want key:value)`},
		{"a:1,a:2", []string{"a=1"}, "mine: a is set more than once"},
	} {
		var got []string
		err := ParsePairs(tc.in, mine, func(k, v string) error { got = append(got, k+"="+v); return nil })
		assert.Equal(t, tc.pairs, got, "%q", tc.in)
		if tc.err == "" {
			assert.NoError(t, err, "%q", tc.in)
			continue
		}
		require.ErrorIs(t, err, mine, "%q", tc.in)
		assert.EqualError(t, err, tc.err)
	}
	setErr := errors.New("set refused")
	require.ErrorIs(t, ParsePairs("a:1", mine, func(k, v string) error { return setErr }), setErr)
}
