package host

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Config
		err  string
	}{
		{in: "", want: Config{RoundupDivisions: 8}},
		{in: " pinned_use_host_register : True ", want: Config{UseHostRegister: true, RoundupDivisions: 8}},
		{in: "pinned_use_host_register:0,pinned_roundup_power2_divisions:8", want: Config{RoundupDivisions: 8}},
		{in: "pinned_roundup_power2_divisions:1,", want: Config{RoundupDivisions: 1}},
		{in: "pinned_use_host_register:yes", err: `pinned_use_host_register: bad value "yes"`},
		{in: "pinned_roundup_power2_divisions:16", err: `bad value "16": want 1, 2, 4 or 8`},
		{in: "pinned_roundup_power2_divisions", err: `"pinned_roundup_power2_divisions" has no value`},
		{in: "pinned_num_register_threads:8", err: "pinned_num_register_threads: not supported"},
		{in: "expandable_segments:True", err: `unknown key "expandable_segments"`},
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
