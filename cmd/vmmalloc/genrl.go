package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
	"github.com/vmmalloc/vmmalloc/benchmarks/workload/rl"
)

// genRL writes the RL colocation program (package rl) for seed, or with
// run replays it, its sizes divided by scale, over the emulator's real
// memory with check patterns on the kept tensors, and prints what the
// device and the pinned host memory held.
func genRL(seed int64, run bool, scale uint64, out string, stdout, stderr io.Writer) error {
	cfg := rl.DefaultConfig()
	if run {
		if scale == 0 {
			return usagef("--scale 0: want ≥ 1")
		}
		cfg = cfg.Scaled(scale)
		if cfg.Device < 16<<20 {
			return usagef("--scale %d leaves a %d-byte device; want at least 16 MiB", scale, cfg.Device)
		}
	}
	ops, err := rl.Generate(cfg, seed)
	if err != nil {
		if errors.Is(err, rl.ErrInvalid) {
			return usageError{err}
		}
		return err
	}
	if !run {
		w := stdout
		if out != "-" {
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		if err := rl.Write(w, ops); err != nil {
			return err
		}
		if out != "-" {
			fmt.Fprintf(stderr, "wrote %d operations (rl, seed %d) to %s\n", len(ops), seed, out)
		}
		return nil
	}
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(cfg.Device), emulated.WithHostCapacity(cfg.Device))
	if err != nil {
		return err
	}
	defer e.Close()
	a, err := allocator.New(e, allocator.DefaultConfig())
	if err != nil {
		return err
	}
	defer a.Close()
	pinned, err := host.New(e, host.DefaultConfig())
	if err != nil {
		return err
	}
	defer pinned.Close()
	used := func() (uint64, error) { f, total, err := e.MemGetInfo(0); return total - f, err }
	r, err := rl.Replay(a, e, ops, rl.ReplayOptions{Host: pinned, KeepHostBuffers: true, Check: true, Used: used})
	if err != nil {
		return err
	}
	mib := func(n uint64) float64 { return float64(n) / (1 << 20) }
	fmt.Fprintf(stdout, "rl colocation, 1/%d scale: device %.0f MiB, weights %.0f MiB (offloaded), KV cache %.0f MiB (discarded), trainer %.0f MiB (%.0f MiB state offloaded), %d steps\n",
		scale, mib(cfg.Device), mib(cfg.Weights), mib(cfg.KV), mib(cfg.Train), mib(cfg.TrainState), r.Steps)
	fmt.Fprintf(stdout, "peak device %.1f MiB (%.1f%% of capacity), peak pinned backups %.1f MiB\n",
		mib(r.PeakDevice), 100*float64(r.PeakDevice)/float64(cfg.Device), mib(uint64(r.PeakHost)))
	fmt.Fprintf(stdout, "%d sleeps, %.3f ms each; %d wakes, %.3f ms each; %d kept tensors corrupted\n",
		r.Sleeps, float64(r.SleepTime.Microseconds())/1e3/float64(max(r.Sleeps, 1)),
		r.Wakes, float64(r.WakeTime.Microseconds())/1e3/float64(max(r.Wakes, 1)), r.Corrupted)
	if r.Corrupted > 0 {
		return fmt.Errorf("rl: %d kept tensors lost their contents", r.Corrupted)
	}
	return nil
}
