package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/stats"
)

// blockStream is the stream id the heap labels the block at p with, from
// Snapshot; 0 when no block starts at p.
func blockStream(t *testing.T, a *Allocator, p uintptr) uint64 {
	t.Helper()
	for _, sg := range a.Snapshot().Segments {
		for _, b := range sg.Blocks {
			if b.Address == p {
				return b.Stream
			}
		}
	}
	return 0
}

// TestReleasedStateNotReusedDuringWait: while a Malloc on s waits for s
// without the lock (defrag before a growth), ReleaseStream(s) returns and
// a new stream s2 is learnt. The state s had may be kept for reuse, but
// not handed to s2 while the Malloc still holds it: the Malloc must fail
// with ErrInvalidStream, or succeed with a block of s, never one of s2
// (which s2 would reuse while work queued on s still uses it).
func TestReleasedStateNotReusedDuringWait(t *testing.T) {
	d := newGateDriver(t, emulated.WithManualCompletion())
	a, err := New(d, DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	var ptrs []uintptr
	for i := 0; i < 8; i++ {
		p, err := a.Malloc(20<<20, s)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
	}
	for i := 0; i < len(ptrs); i += 2 {
		require.NoError(t, a.Free(ptrs[i]))
	}
	d.hold(s, nil)
	type result struct {
		p   uintptr
		err error
	}
	grown := make(chan result, 1)
	go func() {
		p, err := a.Malloc(100<<20, s) // defrag: waits for s with holes marked
		grown <- result{p, err}
	}()
	<-d.entered
	require.NoError(t, within(t, "ReleaseStream", func() error { return a.ReleaseStream(s) }))
	s2, err := d.StreamCreate(0)
	require.NoError(t, err)
	var q uintptr
	require.NoError(t, within(t, "Malloc on a new stream", func() (err error) {
		q, err = a.Malloc(1<<20, s2)
		return err
	}))
	d.release()
	r := <-grown
	if r.err != nil {
		assert.ErrorIs(t, r.err, ErrInvalidStream)
	} else {
		assert.NotEqual(t, uint64(s2), blockStream(t, a, r.p), "Malloc on s returned a block of s2")
		require.NoError(t, a.Free(r.p))
	}
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Check())
	for i := 1; i < len(ptrs); i += 2 {
		require.NoError(t, a.Free(ptrs[i]))
	}
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.Stats().Active[stats.AllPools].Current)
	assert.Zero(t, reserved(a))
	assert.Empty(t, d.Violations())
	require.NoError(t, a.Check())
	_ = backend.Stream(0)
}
