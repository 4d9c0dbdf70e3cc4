package emulated_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// at is the cost of one call of op on n bytes under m.
func at(m emulated.CostModel, op backend.Op, n uint64) time.Duration {
	return m.PerCall[op] + time.Duration(float64(m.PerGiB[op])*float64(n)/float64(GiB))
}

func TestCostProfiles(t *testing.T) {
	ns := time.Nanosecond
	for _, tc := range []struct {
		name string
		op   backend.Op
		n    uint64
		want time.Duration
	}{
		// The sources' figures at 2 MiB.
		{"a100", backend.OpCreate, 2 * MiB, 193 * time.Microsecond},
		{"a100", backend.OpMap, 2 * MiB, 1450 * ns},
		{"a100", backend.OpSetAccess, 2 * MiB, 36 * time.Microsecond},
		{"a100", backend.OpUnmap, 2 * MiB, 25600 * ns},
		{"a100", backend.OpReserve, 8 * GiB, 19 * time.Microsecond},
		{"gpu2", backend.OpCreate, 2 * MiB, 7600 * ns},
		{"gpu2", backend.OpMap, 2 * MiB, 1050 * ns},
		{"gpu2", backend.OpSetAccess, 2 * MiB, 20800 * ns},
		{"gpu2", backend.OpUnmap, 2 * MiB, 11500 * ns},
		// The H200 fit, per call + per GiB.
		{"h200", backend.OpCreate, GiB, 15900*ns + 138600*ns},
		{"h200", backend.OpMap, GiB, 2500 * ns},
		{"h200", backend.OpSetAccess, 0, 32200 * ns},
		{"h200", backend.OpSetAccess, GiB, 32200*ns + 121*time.Microsecond},
		{"h200", backend.OpUnmap, GiB, 21700*ns + 48*time.Microsecond},
		{"h200", backend.OpFree, GiB, 15400*ns + 642*time.Microsecond},
		{"h200", backend.OpReserve, GiB, 2300 * ns},
		{"h200", backend.OpRelease, GiB, 1800 * ns},
		// The per-GiB terms the A100 borrows from the H200.
		{"a100", backend.OpCreate, 2*MiB + GiB, 193*time.Microsecond + 138600*ns},
		{"a100", backend.OpFree, GiB, 15400*ns + 642*time.Microsecond},
		{"legacy", backend.OpCreate, GiB, 60 * time.Microsecond},
		{"legacy", backend.OpMap, 0, 10 * time.Microsecond},
	} {
		p, ok := emulated.NamedCostProfile(tc.name)
		require.True(t, ok, tc.name)
		assert.Equal(t, tc.want, at(p.Model, tc.op, tc.n), "%s %v %d", tc.name, tc.op, tc.n)
	}
	assert.Equal(t, "a100", emulated.DefaultCostProfile)
	assert.Equal(t, "a100", emulated.CostProfileNames()[0])
	for _, name := range emulated.CostProfileNames() {
		p, ok := emulated.NamedCostProfile(name)
		require.True(t, ok)
		assert.Equal(t, name, p.Name)
		assert.NotEmpty(t, p.Source)
		for op := range backend.NumOps {
			assert.Positive(t, p.Model.PerCall[op], "%s: %v costs nothing", name, op)
		}
	}
	_, ok := emulated.NamedCostProfile("b200")
	assert.False(t, ok)
	assert.Equal(t, emulated.LegacyCostModel(), mustProfile(t, "legacy").Model)
	assert.Equal(t, mustProfile(t, "a100").Model, emulated.DefaultCostModel())
}

func mustProfile(t testing.TB, name string) emulated.CostProfile {
	t.Helper()
	p, err := emulated.LoadCostProfile(name)
	require.NoError(t, err)
	return p
}

func TestCostProfileFile(t *testing.T) {
	dir := t.TempDir()
	for _, name := range emulated.CostProfileNames() {
		p := mustProfile(t, name)
		var b bytes.Buffer
		require.NoError(t, emulated.WriteCostProfile(&b, p))
		path := filepath.Join(dir, name+".json")
		require.NoError(t, os.WriteFile(path, b.Bytes(), 0o600))
		q, err := emulated.LoadCostProfile(path)
		require.NoError(t, err)
		assert.Equal(t, p, q, name)
	}
	// A file with a base: the ops it lists replace the base's.
	q, err := emulated.ReadCostProfile(strings.NewReader(`{"format":"vmmalloc-cost-profile/1","name":"mine","base":"legacy",
		"ops":{"MallocPhysical":{"per_call_ns":5000,"per_gib_ns":7}}}`))
	require.NoError(t, err)
	want := emulated.LegacyCostModel()
	want.PerCall[backend.OpCreate], want.PerGiB[backend.OpCreate] = 5000, 7
	assert.Equal(t, emulated.CostProfile{Name: "mine", Model: want}, q)
	// Without a base, unlisted ops cost nothing.
	q, err = emulated.ReadCostProfile(strings.NewReader(`{"format":"vmmalloc-cost-profile/1","ops":{"MapMem":{"per_call_ns":3}}}`))
	require.NoError(t, err)
	var m emulated.CostModel
	m.PerCall[backend.OpMap] = 3
	assert.Equal(t, m, q.Model)

	for _, tc := range []struct{ name, in string }{
		{"empty", ``},
		{"not json", `{`},
		{"no format", `{"ops":{}}`},
		{"other version", `{"format":"vmmalloc-cost-profile/2","ops":{}}`},
		{"unknown field", `{"format":"vmmalloc-cost-profile/1","ops":{},"x":1}`},
		{"unknown op", `{"format":"vmmalloc-cost-profile/1","ops":{"cuMemCreate":{"per_call_ns":1}}}`},
		{"negative", `{"format":"vmmalloc-cost-profile/1","ops":{"MapMem":{"per_call_ns":-1}}}`},
		{"negative per GiB", `{"format":"vmmalloc-cost-profile/1","ops":{"MapMem":{"per_call_ns":1,"per_gib_ns":-1}}}`},
		{"above an hour", `{"format":"vmmalloc-cost-profile/1","ops":{"MapMem":{"per_call_ns":3600000000001}}}`},
		{"unknown base", `{"format":"vmmalloc-cost-profile/1","base":"b200","ops":{}}`},
		{"trailing data", `{"format":"vmmalloc-cost-profile/1","ops":{}} {}`},
		{"long name", `{"format":"vmmalloc-cost-profile/1","name":"` + strings.Repeat("x", 5000) + `","ops":{}}`},
		{"too large", `{"format":"vmmalloc-cost-profile/1","source":"` + strings.Repeat("x", 1<<20) + `","ops":{}}`},
	} {
		_, err := emulated.ReadCostProfile(strings.NewReader(tc.in))
		assert.ErrorIs(t, err, emulated.ErrBadCostProfile, tc.name)
	}
	_, err = emulated.LoadCostProfile(filepath.Join(dir, "missing.json"))
	assert.ErrorIs(t, err, emulated.ErrBadCostProfile)
}

func TestFitCost(t *testing.T) {
	us := time.Microsecond
	line := func(a, b time.Duration, sizes ...uint64) []emulated.CostSample {
		var s []emulated.CostSample
		for _, n := range sizes {
			s = append(s, emulated.CostSample{Bytes: n, Latency: a + time.Duration(float64(b)*float64(n)/float64(GiB))})
		}
		return s
	}
	for _, tc := range []struct {
		name         string
		samples      []emulated.CostSample
		call, perGiB time.Duration
	}{
		{"exact line", line(16*us, 128*us, 2*MiB, 64*MiB, 512*MiB, GiB), 16 * us, 128 * us},
		{"one size: the mean", []emulated.CostSample{{2 * MiB, 10 * us}, {2 * MiB, 20 * us}}, 15 * us, 0},
		{"falling: the mean", []emulated.CostSample{{2 * MiB, 30 * us}, {GiB, 10 * us}}, 20 * us, 0},
		{"through zero", []emulated.CostSample{{GiB, 10 * us}, {2 * GiB, 30 * us}}, 0, 14 * us},
		{"noisy", []emulated.CostSample{{2 * MiB, 15 * us}, {2 * MiB, 17 * us}, {512 * MiB, 80 * us}, {512 * MiB, 82 * us}}, 15_745 * time.Nanosecond, 130_510 * time.Nanosecond},
	} {
		c, g, err := emulated.FitCost(tc.samples)
		require.NoError(t, err, tc.name)
		assert.InDelta(t, float64(tc.call), float64(c), 1, tc.name)
		assert.InDelta(t, float64(tc.perGiB), float64(g), 1, tc.name)
	}
	_, _, err := emulated.FitCost(nil)
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
	_, _, err = emulated.FitCost([]emulated.CostSample{{MiB, -1}})
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
}

// FuzzCostProfile: any input is read without a panic, and a profile read
// is written and read back unchanged.
func FuzzCostProfile(f *testing.F) {
	for _, name := range emulated.CostProfileNames() {
		var b bytes.Buffer
		require.NoError(f, emulated.WriteCostProfile(&b, mustProfile(f, name)))
		f.Add(b.Bytes())
	}
	f.Add([]byte(`{"format":"vmmalloc-cost-profile/1","base":"h200","ops":{"MapMem":{"per_call_ns":3,"per_gib_ns":9}}}`))
	f.Add([]byte(`{"format":"vmmalloc-cost-profile/1","ops":{"MapMem":{"per_call_ns":-3}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := emulated.ReadCostProfile(bytes.NewReader(data))
		if err != nil {
			require.ErrorIs(t, err, emulated.ErrBadCostProfile)
			return
		}
		var b bytes.Buffer
		require.NoError(t, emulated.WriteCostProfile(&b, p))
		q, err := emulated.ReadCostProfile(&b)
		require.NoError(t, err)
		require.Equal(t, p, q)
	})
}
