package rl_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload/rl"
)

// sizeOnly is the emulator without real memory with copies that check
// their device range is mapped and move nothing: the scenario at full
// size exercises every driver call of sleep and wake.
type sizeOnly struct{ *emulated.Emulator }

func (c sizeOnly) mapped(va uintptr, n int) error {
	for n > 0 {
		base, size, err := c.AddressRange(va)
		if err != nil {
			return err
		}
		step := min(n, int(base+uintptr(size)-va))
		va, n = va+uintptr(step), n-step
	}
	return nil
}
func (c sizeOnly) CopyHtoD(dst uintptr, src []byte, _ backend.Stream) error {
	return c.mapped(dst, len(src))
}
func (c sizeOnly) CopyDtoH(dst []byte, src uintptr, _ backend.Stream) error {
	return c.mapped(src, len(dst))
}

func TestGenerateDeterministicAndRoundTrips(t *testing.T) {
	a, err := rl.Generate(rl.DefaultConfig(), 7)
	require.NoError(t, err)
	b, err := rl.Generate(rl.DefaultConfig(), 7)
	require.NoError(t, err)
	assert.Equal(t, a, b)
	c, err := rl.Generate(rl.DefaultConfig(), 8)
	require.NoError(t, err)
	assert.NotEqual(t, a, c, "the seed changes the sizes")
	var buf bytes.Buffer
	require.NoError(t, rl.Write(&buf, a))
	back, err := rl.Read(&buf)
	require.NoError(t, err)
	assert.Equal(t, a, back)
}

func TestReadRejects(t *testing.T) {
	for _, in := range []string{
		"alloc weights 2 100\n",                  // ids start at 1
		"alloc gpu 1 100\n",                      // unknown pool
		"free 1\n",                               // not live
		"wake train\n",                           // awake already
		"sleep train offload\nalloc train 1 5\n", // alloc in an asleep pool
		"sleep train maybe\n",
		"alloc weights 1 -3\n",
		"step\n",
	} {
		_, err := rl.Read(bytes.NewBufferString(in))
		assert.ErrorIs(t, err, rl.ErrInvalid, "%q", in)
	}
	for _, c := range []rl.Config{
		{},
		func() rl.Config { c := rl.DefaultConfig(); c.Train = c.TrainState; return c }(),
		func() rl.Config { c := rl.DefaultConfig(); c.Train = c.Device; return c }(),
		func() rl.Config { c := rl.DefaultConfig(); c.WeightTensors = 0; return c }(),
	} {
		_, err := rl.Generate(c, 1)
		assert.ErrorIs(t, err, rl.ErrInvalid, "%+v", c)
	}
}

// TestReplayFullSize replays the default scenario (16 GiB device, 50
// steps) with copies that move nothing: the device never holds more than
// its capacity, although rollout and trainer together need 22 GiB; pinned
// host memory does not grow across steps and is the offloaded bytes
// (weights and trainer state); the pools' mapped memory at each step's
// start does not grow either (the device holds beside it the handle
// cache, within its budget).
func TestReplayFullSize(t *testing.T) {
	cfg := rl.DefaultConfig()
	ops, err := rl.Generate(cfg, 1)
	require.NoError(t, err)
	e, err := emulated.New(emulated.WithCapacity(cfg.Device), emulated.WithHostCapacity(2*cfg.Device))
	require.NoError(t, err)
	drv := sizeOnly{e}
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	pinned, err := host.New(drv, host.DefaultConfig())
	require.NoError(t, err)
	used := func() (uint64, error) { f, total, err := e.MemGetInfo(0); return total - f, err }
	var reserved []uint64 // the pools' mapped bytes at each step's start
	r, err := rl.Replay(a, drv, ops, rl.ReplayOptions{Host: pinned, KeepHostBuffers: true, Used: used,
		AfterOp: func(_ int, op rl.Op) {
			if op.Kind == rl.Step && op.ID > 0 {
				reserved = append(reserved, a.MemoryReserved())
			}
		}})
	require.NoError(t, err)
	assert.Equal(t, cfg.Steps, r.Steps)
	assert.LessOrEqual(t, r.PeakDevice, cfg.Device)
	assert.Greater(t, r.PeakDevice, cfg.Train, "the trainer's peak was on the device")
	require.Len(t, r.DeviceAfterStep, cfg.Steps-1)
	require.Len(t, reserved, cfg.Steps-1)
	budget := allocator.DefaultConfig().HandleCacheSize
	for i := range r.DeviceAfterStep {
		assert.Equal(t, r.HostAfterStep[0], r.HostAfterStep[i], "step %d: host memory grew", i+1)
		assert.Equal(t, reserved[0], reserved[i], "step %d: the pools' mapped memory grew", i+1)
		// Beside the pools' mapped memory the device holds the
		// allocator's cached handles, within their budget.
		assert.LessOrEqual(t, r.DeviceAfterStep[i], reserved[i]+budget, "step %d", i+1)
	}
	assert.LessOrEqual(t, reserved[0], cfg.Weights+cfg.KV+cfg.Sampling)
	t.Logf("at steps 1 and %d: device %d and %d MiB, pools %d and %d MiB; peak %d MiB of %d; pinned peak %d MiB",
		len(reserved), r.DeviceAfterStep[0]>>20, r.DeviceAfterStep[len(reserved)-1]>>20, reserved[0]>>20, reserved[len(reserved)-1]>>20,
		r.PeakDevice>>20, cfg.Device>>20, r.PeakHost>>20)
	assert.GreaterOrEqual(t, uint64(r.PeakHost), cfg.Weights+cfg.TrainState)
	assert.LessOrEqual(t, uint64(r.PeakHost), (cfg.Weights+cfg.TrainState)*9/8)
	assert.Equal(t, 3*cfg.Steps+1, r.Sleeps)
	require.NoError(t, a.Close())
	require.NoError(t, pinned.Close())
	live := e.Live()
	assert.Zero(t, live.Handles+live.Mappings+live.Reservations)
}

// TestReplayRealMemory replays the scenario at 1/256 of its size over
// the emulator's real memory with the check patterns: every kept tensor
// (weights, trainer state) has its bytes after every wake.
func TestReplayRealMemory(t *testing.T) {
	cfg := rl.DefaultConfig().Scaled(256)
	cfg.Steps = 10
	ops, err := rl.Generate(cfg, 3)
	require.NoError(t, err)
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(cfg.Device))
	if err != nil {
		t.Skip(err)
	}
	a, err := allocator.New(e, allocator.DefaultConfig())
	require.NoError(t, err)
	defer a.Close()
	pinned, err := host.New(e, host.DefaultConfig())
	require.NoError(t, err)
	defer pinned.Close()
	r, err := rl.Replay(a, e, ops, rl.ReplayOptions{Host: pinned, Check: true})
	require.NoError(t, err)
	assert.Zero(t, r.Corrupted)
	assert.Equal(t, cfg.Steps, r.Steps)
	assert.Positive(t, r.PeakHost)
}

// BenchmarkRLColocation replays the scenario at 1/64 of its size (a 256
// MiB device) over real memory, keeping pinned buffers or not, and
// reports the sleep and wake time, the peak device and host bytes, and
// the backups held while the rollout runs.
func BenchmarkRLColocation(b *testing.B) {
	for _, keep := range []bool{true, false} {
		name := "keep=false"
		if keep {
			name = "keep=true"
		}
		b.Run(name, func(b *testing.B) {
			cfg := rl.DefaultConfig().Scaled(64)
			cfg.Steps = 5
			ops, err := rl.Generate(cfg, 1)
			if err != nil {
				b.Fatal(err)
			}
			var r rl.Result
			for range b.N {
				e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(cfg.Device), emulated.WithHostCapacity(cfg.Device))
				if err != nil {
					b.Skip(err)
				}
				a, err := allocator.New(e, allocator.DefaultConfig())
				if err != nil {
					b.Fatal(err)
				}
				pinned, err := host.New(e, host.DefaultConfig())
				if err != nil {
					b.Fatal(err)
				}
				used := func() (uint64, error) { f, total, err := e.MemGetInfo(0); return total - f, err }
				if r, err = rl.Replay(a, e, ops, rl.ReplayOptions{Host: pinned, KeepHostBuffers: keep, Used: used}); err != nil {
					b.Fatal(err)
				}
				_ = a.Close()
				_ = pinned.Close()
			}
			b.ReportMetric(float64(r.SleepTime.Microseconds())/float64(r.Sleeps), "µs/sleep")
			b.ReportMetric(float64(r.WakeTime.Microseconds())/float64(r.Wakes), "µs/wake")
			b.ReportMetric(float64(r.PeakDevice)/float64(cfg.Device), "peak/device")
			b.ReportMetric(float64(r.PeakHost)/(1<<20), "peak_host_MiB")
			// Backups held while the rollout runs (the trainer's state,
			// plus the weights' kept buffers with keep=true).
			b.ReportMetric(float64(r.HostAfterStep[len(r.HostAfterStep)-1])/(1<<20), "host_in_rollout_MiB")
		})
	}
}
