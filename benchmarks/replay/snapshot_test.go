package replay

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload"
)

// TestSnapshotRoundTrip is the proof that snapshots carry the run: a
// replay writes a PyTorch snapshot, vmmalloc's own importer reads it back,
// and replaying the imported trace with the same policy reaches the same
// peak allocated and reserved bytes, exactly.
//
// The workloads have no record_stream: the importer frees at
// free_completed (when PyTorch could reuse the block), so a block whose
// free waited on another stream would count as allocated for longer in
// the second run. Nor do they call empty_cache, which PyTorch's format
// cannot express.
func TestSnapshotRoundTrip(t *testing.T) {
	training, err := workload.TransformerTraining(smallTraining(), 3)
	require.NoError(t, err)
	mixCfg := workload.DefaultMixConfig()
	mixCfg.Allocs, mixCfg.RecordStreamProb, mixCfg.EmptyCacheProb = 3000, 0, 0
	mix, err := workload.RandomMix(mixCfg, 5)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		events []trace.Event
		config string
	}{
		{"training expandable", training, ""},
		{"training classic", training, "expandable_segments:False"},
		{"mix expandable two streams", mix, ""},
		{"mix classic two streams", mix, "expandable_segments:False"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.config)
			var snap bytes.Buffer
			orig, err := Run(trace.NewSliceReader(tc.events), Options{Config: cfg, Snapshot: &snap, MaxSamples: -1})
			require.NoError(t, err)
			require.Zero(t, orig.OOMs)

			pt, err := trace.ImportPyTorchSnapshot(bytes.NewReader(snap.Bytes()), 0)
			require.NoError(t, err)
			assert.Equal(t, int(orig.Allocs), pt.Allocs)
			assert.Equal(t, 0, pt.UnmatchedFrees)
			assert.Nil(t, pt.UnknownActions)
			assert.Zero(t, pt.ReservedBaseline, "every unmap follows its map")
			assert.Equal(t, orig.PeakReserved, pt.PeakReserved, "reserved curve of the trace")
			assert.Equal(t, orig.EndReserved, pt.SnapshotReserved, "segments at snapshot time")
			assert.Equal(t, orig.EndAllocated, pt.SnapshotAllocated)
			assert.Equal(t, "vmmalloc", pt.Settings["backend"])

			again, err := Run(pt.Reader(), Options{Config: cfg, MaxSamples: -1})
			require.NoError(t, err)
			assert.Equal(t, orig.PeakAllocated, again.PeakAllocated, "peak allocated")
			assert.Equal(t, orig.PeakReserved, again.PeakReserved, "peak reserved")
			assert.Equal(t, orig.PeakRequested, again.PeakRequested, "peak requested")
			assert.Equal(t, orig.Allocs, again.Allocs)
		})
	}
}

func TestSnapshotOptions(t *testing.T) {
	var snap bytes.Buffer
	_, err := Run(trace.NewSliceReader(nil), Options{Snapshot: &snap, SnapshotEntries: -1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	assert.Zero(t, snap.Len(), "nothing written on bad options")
}

// smallTraining is a short training run: 4 layers, 5 steps.
func smallTraining() workload.TrainingConfig {
	c := workload.DefaultTrainingConfig()
	c.Layers, c.Steps = 4, 5
	return c
}

// TestSnapshotRoundTripRealTraces runs the round trip on the real PyTorch
// traces (skipped when they are absent): replaying a vmmalloc-written
// snapshot of a replayed PyTorch trace reproduces its peaks exactly.
func TestSnapshotRoundTripRealTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("replays real traces")
	}
	for _, name := range []string{"cs336_ctx128_forward.pickle", "cs336_small_forward_bf16.pickle", "cs336_ctx128_fullstep.pickle", "llama7b_offload_4streams.pickle", "cs336_gpt2small_compiled_train.pickle", "cs336_medium_ctx1024_train.pickle"} {
		t.Run(name, func(t *testing.T) {
			pt := loadSnapshot(t, sharedTrace(t, name))
			var snap bytes.Buffer
			// The program's own cache releases (llama's 39) are left out:
			// PyTorch's snapshot format has no empty_cache action to carry
			// them, so the written snapshot could not replay them.
			orig, err := Run(pt.Reader(), Options{Snapshot: &snap, MaxSamples: -1, IgnoreReleases: true})
			require.NoError(t, err)
			back, err := trace.ImportPyTorchSnapshot(bytes.NewReader(snap.Bytes()), 0)
			require.NoError(t, err)
			again, err := Run(back.Reader(), Options{MaxSamples: -1})
			require.NoError(t, err)
			t.Logf("%s: %d events, snapshot %d bytes, peak allocated %d / %d, peak reserved %d / %d",
				name, orig.Events, snap.Len(), orig.PeakAllocated, again.PeakAllocated, orig.PeakReserved, again.PeakReserved)
			assert.Equal(t, orig.PeakAllocated, again.PeakAllocated)
			assert.Equal(t, orig.PeakReserved, again.PeakReserved)
			assert.Equal(t, orig.PeakReserved, back.PeakReserved)
			assert.Zero(t, back.Releases, "a vmmalloc snapshot's unmaps are not program releases")
		})
	}
}
