package host

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	def := DefaultConfig()
	with := func(f func(*Config)) Config {
		c := def
		f(&c)
		return c
	}
	for _, tc := range []struct {
		in   string
		want Config
		err  string
	}{
		{in: "", want: def},
		{in: " pinned_use_host_register : True ", want: with(func(c *Config) { c.UseHostRegister = true })},
		{in: "pinned_use_host_register:0,pinned_roundup_power2_divisions:8", want: def},
		{in: "pinned_roundup_power2_divisions:1,", want: with(func(c *Config) { c.RoundupDivisions = 1 })},
		{in: "expandable_segments:False", want: with(func(c *Config) { c.ExpandableSegments = false })},
		{in: "pinned_release_on_grow:True", want: with(func(c *Config) { c.ReleaseOnGrow = true })},
		{in: "pinned_budget_mb:0", want: with(func(c *Config) { c.PinnedBudgetMB = 0 })},
		{in: "pinned_budget_mb:1024,expandable_segments:false", want: with(func(c *Config) { c.PinnedBudgetMB, c.ExpandableSegments = 1024, false })},
		{in: "pinned_use_host_register:yes", err: `pinned_use_host_register: bad value "yes"`},
		{in: "expandable_segments:maybe", err: `expandable_segments: bad value "maybe"`},
		{in: "pinned_budget_mb:-1", err: `pinned_budget_mb: bad value "-1"`},
		{in: "pinned_budget_mb:1.5", err: `pinned_budget_mb: bad value "1.5"`},
		{in: "pinned_roundup_power2_divisions:16", err: `bad value "16": want 1, 2, 4 or 8`},
		{in: "pinned_roundup_power2_divisions", err: `"pinned_roundup_power2_divisions" has no value`},
		{in: "pinned_num_register_threads:8", err: "pinned_num_register_threads: not supported"},
		{in: "max_split_size_mb:20", err: `unknown key "max_split_size_mb"`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseConfig(tc.in)
			if tc.err != "" {
				require.ErrorIs(t, err, ErrInvalidConfig)
				assert.Contains(t, err.Error(), tc.err)
				assert.Equal(t, Config{}, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			again, err := ParseConfig(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, again, "String round trip")
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv(EnvVar, "pinned_roundup_power2_divisions:2")
	cfg, err := ConfigFromEnv()
	require.NoError(t, err)
	assert.Equal(t, 2, cfg.RoundupDivisions)
}
