package replay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSweepOnProgress checks that every run reports its stages in order,
// with events counted up to the trace's length, before its OnDone, and
// that the calls are serialised: the callbacks share plain (unlocked)
// state, which -race would flag if two ran at once.
func TestSweepOnProgress(t *testing.T) {
	traces, policies := sweepGrid()
	traces[0].Events = synth(150_000, 23) // long enough for mid-replay calls (every 65536 events)
	var (
		seen     = map[int][]SweepProgress{} // unlocked on purpose
		finished = map[int]bool{}
	)
	_, err := Sweep(context.Background(), traces, policies, SweepOptions{
		Options:  Options{MinCapacity: true},
		Parallel: 4,
		OnProgress: func(p SweepProgress) {
			assert.False(t, finished[p.Index], "progress after OnDone of run %d", p.Index)
			seen[p.Index] = append(seen[p.Index], p)
		},
		OnDone: func(r SweepRun) { finished[r.Index] = true },
	})
	require.NoError(t, err)
	require.Len(t, seen, 6)
	for idx, ps := range seen {
		tr, pol := traces[idx/len(policies)], policies[idx%len(policies)]
		n := int64(len(tr.Events))
		var want []SweepProgress
		base := SweepProgress{Trace: tr.Name, Policy: pol.Name, Index: idx, Total: 6, EventsTotal: n}
		add := func(st SweepStage, ev int64) {
			p := base
			p.Stage, p.Events = st, ev
			want = append(want, p)
		}
		add(SweepReplaying, 0)
		for k := int64(progressEvery); k < n; k += progressEvery {
			add(SweepReplaying, k)
		}
		add(SweepReplaying, n)
		add(SweepSearching, n)
		assert.Equal(t, want, ps, "run %d", idx)
	}
}

func TestSweepStageString(t *testing.T) {
	for _, tc := range []struct {
		s    SweepStage
		want string
	}{{SweepReplaying, "replay"}, {SweepSearching, "min-capacity search"}, {7, "SweepStage(7)"}} {
		assert.Equal(t, tc.want, tc.s.String())
	}
}
