package integrity

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
)

// SleepOptions sizes a SleepCycles run. Zero fields take the defaults in
// parentheses.
type SleepOptions struct {
	Config string // allocator config ("large_segment_size_mb:2": blocks span several handles)
	Cycles int    // sleep/wake cycles (6)
	Seed   uint64 // random seed (1)
}

// SleepResult is what a SleepCycles run did.
type SleepResult struct {
	Cycles   int
	Verified int64 // bytes read back and compared
	Freed    int   // weight blocks freed while their pool slept
}

// SleepCycles proves that sleep and wake keep contents byte-exact on
// device 0 of d: a weights pool (Offload, pinned buffers from
// allocator/host) and a KV-cache pool (Discard) sleep and wake Cycles
// times while a third pool allocates in the memory they gave back; every
// live weight block is read back after every wake, one is freed while
// asleep in each cycle, and the KV blocks are written again after each
// wake (mapped and writable at their old addresses). At the end the
// allocator and the host allocator are closed and the invariants checked.
// It skips when d cannot copy.
func SleepCycles(t testing.TB, d backend.Driver, o SleepOptions) SleepResult {
	t.Helper()
	if o.Cycles == 0 {
		o.Cycles = 6
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Config == "" {
		o.Config = "large_segment_size_mb:2"
	}
	chk := handlecheck.New(d)
	d = chk.Driver()
	c, ok := d.(backend.Copier)
	if !ok {
		t.Skipf("integrity: %s driver does not implement backend.Copier", d.Name())
	}
	cfg, err := allocator.ParseConfig(o.Config)
	require.NoError(t, err)
	a, err := allocator.New(d, cfg)
	require.NoError(t, err)
	defer func() { _ = a.Close() }()
	s := a.DefaultStream()
	if err := c.CopyHtoD(0, nil, s); err != nil {
		t.Skipf("integrity: copies unsupported: %v", err)
	}
	pinned, err := host.New(d, host.DefaultConfig())
	require.NoError(t, err)
	defer func() { _ = pinned.Close() }()
	weights, err := a.NewPool(allocator.PoolOptions{Name: "weights"})
	require.NoError(t, err)
	kv, err := a.NewPool(allocator.PoolOptions{Name: "kv_cache"})
	require.NoError(t, err)
	other, err := a.NewPool(allocator.PoolOptions{Name: "train"})
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(o.Seed, 18))
	type live struct {
		p    uintptr
		data []byte
	}
	write := func(p uintptr, n int) live {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		require.NoError(t, c.CopyHtoD(p, b, s))
		return live{p, b}
	}
	var res SleepResult
	check := func(l live) {
		got := make([]byte, len(l.data))
		require.NoError(t, c.CopyDtoH(got, l.p, s))
		require.True(t, bytes.Equal(l.data, got), "block %#x+%d lost its contents across sleep and wake", l.p, len(l.data))
		res.Verified += int64(len(got))
	}
	var ws []live
	for range 4 + 2*o.Cycles {
		n := 1 + rng.IntN(64<<10)
		if rng.IntN(2) == 0 {
			n = 1<<20 + rng.IntN(5<<20) // spans several 2 MiB handles
		}
		p, err := weights.Malloc(uint64(n), 0)
		require.NoError(t, err)
		ws = append(ws, write(p, n))
	}
	k, err := kv.Malloc(3<<20, 0)
	require.NoError(t, err)
	for cycle := range o.Cycles {
		require.NoError(t, weights.Sleep(allocator.SleepOptions{Mode: allocator.Offload, Host: pinned, KeepHostBuffers: cycle%2 == 0}))
		require.NoError(t, kv.Sleep(allocator.SleepOptions{Mode: allocator.Discard}))
		require.NoError(t, a.Check())
		g, err := other.Malloc(uint64(1+rng.IntN(8<<20)), 0)
		require.NoError(t, err)
		scratch := write(g, 4096)
		i := rng.IntN(len(ws))
		require.NoError(t, a.Free(ws[i].p)) // freed while asleep: its backup is dropped
		ws = append(ws[:i], ws[i+1:]...)
		res.Freed++
		require.NoError(t, weights.Wake())
		require.NoError(t, kv.Wake())
		require.NoError(t, a.Check())
		for _, l := range ws {
			check(l)
		}
		check(scratch)
		check(write(k, 3<<20))
		require.NoError(t, a.Free(g))
		require.NoError(t, chk.Err(), "cycle %d", res.Cycles)
		res.Cycles++
	}
	for _, l := range ws {
		require.NoError(t, a.Free(l.p))
	}
	require.NoError(t, a.Free(k))
	require.NoError(t, a.Check())
	require.NoError(t, a.Close())
	require.NoError(t, pinned.Close())
	require.NoError(t, chk.Err())
	if in, ok := d.(backend.Introspector); ok {
		_, maps, handles := in.LiveRanges(0)
		require.Empty(t, maps, "mappings left after Close")
		require.Zero(t, handles, "handles left after Close")
	}
	return res
}
