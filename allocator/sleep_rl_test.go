package allocator_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// sizeOnlyCopier is the emulator without real memory with copies that
// check their device range is mapped and move nothing: the RL scenario at
// full size (16 GiB) exercises every driver call of sleep and wake, and
// the real-memory run below checks the bytes at a scaled-down size.
type sizeOnlyCopier struct {
	*emulated.Emulator
	copied uint64
}

func (c *sizeOnlyCopier) mapped(va uintptr, n int) error {
	base, size, err := c.AddressRange(va)
	if err != nil {
		return err
	}
	if va+uintptr(n) > base+uintptr(size) {
		// Spans several handles: check each.
		return c.mapped(base+uintptr(size), n-int(base+uintptr(size)-va))
	}
	return nil
}

func (c *sizeOnlyCopier) CopyHtoD(dst uintptr, src []byte, s backend.Stream) error {
	c.copied += uint64(len(src))
	return c.mapped(dst, len(src))
}

func (c *sizeOnlyCopier) CopyDtoH(dst []byte, src uintptr, s backend.Stream) error {
	c.copied += uint64(len(dst))
	return c.mapped(src, len(dst))
}

// TestSleepRLColocation is the reinforcement-learning colocation pattern:
// a rollout pool (weights, offloaded; KV cache, discarded) and a training
// pool alternate on a device too small for both, 50 times. The device
// never holds more than its capacity, the weights are intact after every
// wake (real memory), and neither device nor pinned host memory grows
// across cycles.
func TestSleepRLColocation(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		name                  string
		real                  bool
		capacity, weights, kv uint64
		train                 uint64
		cycles                int
	}{
		{"16GiB", false, 16 * gib, 8 * gib, 4 * gib, 10 * gib, 50},
		{"real 64MiB", true, 64 << 20, 32 << 20, 16 << 20, 40 << 20, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := []emulated.Option{emulated.WithCapacity(c.capacity), emulated.WithHostCapacity(2 * c.capacity)}
			if c.real {
				opts = append(opts, emulated.WithRealMemory())
			}
			e, err := emulated.New(opts...)
			require.NoError(t, err)
			var drv backend.Driver = e
			var copier backend.Copier = e
			if !c.real {
				sc := &sizeOnlyCopier{Emulator: e}
				drv, copier = sc, sc
			}
			a, err := allocator.New(drv, allocator.DefaultConfig())
			require.NoError(t, err)
			pinned, err := host.New(drv, host.DefaultConfig())
			require.NoError(t, err)
			weightsPool, err := a.NewPool(allocator.PoolOptions{Name: "weights"})
			require.NoError(t, err)
			kvPool, err := a.NewPool(allocator.PoolOptions{Name: "kv_cache"})
			require.NoError(t, err)
			trainPool, err := a.NewPool(allocator.PoolOptions{Name: "train"})
			require.NoError(t, err)
			s := a.DefaultStream()

			// The weights: a few tensors, one spanning many handles.
			var weights []uintptr
			var pattern [][]byte
			for i, n := range []uint64{c.weights / 2, c.weights / 4, c.weights/4 - 1<<20, 1 << 20} {
				p, err := weightsPool.Malloc(n, 0)
				require.NoError(t, err)
				weights = append(weights, p)
				if c.real {
					b := make([]byte, n)
					_, _ = rand.NewChaCha8([32]byte{byte(i)}).Read(b)
					require.NoError(t, copier.CopyHtoD(p, b, s))
					pattern = append(pattern, b)
				}
			}
			kv, err := kvPool.Malloc(c.kv, 0)
			require.NoError(t, err)

			used := func() uint64 {
				free, total, err := e.MemGetInfo(0)
				require.NoError(t, err)
				return total - free
			}
			var peakDevice uint64
			var hostAfterFirst, deviceAfterFirst uint64
			for cycle := 0; cycle < c.cycles; cycle++ {
				// Rollout done: weights to the host, KV cache dropped.
				require.NoError(t, weightsPool.Sleep(allocator.SleepOptions{Mode: allocator.Offload, Host: pinned, KeepHostBuffers: true}))
				require.NoError(t, kvPool.Sleep(allocator.SleepOptions{Mode: allocator.Discard}))
				peakDevice = max(peakDevice, used())

				// Training step: 10 GiB of activations and gradients.
				g, err := trainPool.Malloc(c.train, 0)
				require.NoError(t, err, "cycle %d: the rollout's memory is free for training", cycle)
				peakDevice = max(peakDevice, used())
				require.NoError(t, a.Free(g))

				// Rollout again: the wake takes back the trainer's cache.
				require.NoError(t, weightsPool.Wake(), "cycle %d", cycle)
				require.NoError(t, kvPool.Wake(), "cycle %d", cycle)
				peakDevice = max(peakDevice, used())
				require.LessOrEqual(t, peakDevice, c.capacity)
				if c.real {
					for i, p := range weights {
						got := make([]byte, len(pattern[i]))
						require.NoError(t, copier.CopyDtoH(got, p, s))
						require.True(t, bytes.Equal(pattern[i], got), "cycle %d: weight %d corrupted", cycle, i)
					}
				}
				require.NoError(t, a.Check())
				hostNow := uint64(pinned.Stats().ReservedBytes.Current)
				if cycle == 0 {
					hostAfterFirst, deviceAfterFirst = hostNow, used()
				} else {
					assert.Equal(t, hostAfterFirst, hostNow, "cycle %d: pinned host memory grew", cycle)
					assert.Equal(t, deviceAfterFirst, used(), "cycle %d: device memory grew", cycle)
				}
			}
			assert.LessOrEqual(t, hostAfterFirst, c.weights+c.weights/8, "pinned memory is about the weights' size")
			assert.GreaterOrEqual(t, hostAfterFirst, c.weights-(1<<20))
			t.Logf("%s: peak device %d MiB of %d; pinned host %d MiB; %d cycles", c.name, peakDevice>>20, c.capacity>>20, hostAfterFirst>>20, c.cycles)
			for _, p := range weights {
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, a.Free(kv))
			require.NoError(t, a.Close())
			require.NoError(t, pinned.Close())
			live := e.Live()
			assert.Zero(t, live.Handles+live.Mappings+live.Reservations, fmt.Sprintf("%+v", live))
		})
	}
}
