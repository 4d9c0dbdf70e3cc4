// Package rl generates and replays the reinforcement-learning colocation
// pattern (verl, OpenRLHF, slime, SGLang and vLLM in one process): a
// rollout engine and a trainer alternate on a device too small for both,
// each putting its memory to sleep while the other runs (vLLM's sleep
// mode, torch_memory_saver; vmmalloc's Pool.Sleep and Pool.Wake).
//
// Three pools: "weights" (the rollout model's weights, offloaded to
// pinned host memory at sleep), "kv_cache" (the KV cache, allocated once
// and discarded at sleep, as vLLM's level-1 sleep drops it) and "train"
// (the trainer's parameters and optimizer state, offloaded, and its
// activations and gradients, allocated and freed within each step). One
// step: rollout (sampling buffers in the KV pool, allocated and freed),
// then the rollout pools sleep, the train pool wakes, a training step
// allocates and frees its activations, the train pool sleeps, the
// rollout pools wake. The default config is vLLM-style RL colocation: a 16
// GiB device, 8 GiB of weights, 4 GiB of KV cache, a trainer needing 10
// GiB (2 GiB of state), 50 steps.
//
// A program ([]Op) is a pure function of its Config and seed
// (math/rand/v2 PCG): the same inputs give the same operations. Write and
// Read keep it in a line-oriented text form, so that a program is
// replayable from a file (vmmalloc gen --kind rl). Replay runs it against
// an allocator and reports what the device and the host held.
package rl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
)

// ErrInvalid reports a config out of range or a program that does not
// parse or does not hold together.
var ErrInvalid = errors.New("rl: invalid config or program")

// Config sizes the scenario. Sizes are bytes.
type Config struct {
	Device        uint64 // device capacity the scenario is sized for
	Weights       uint64 // rollout weights (offloaded)
	WeightTensors int    // the weights' tensors
	KV            uint64 // KV cache (discarded)
	KVBlocks      int    // the KV cache's allocations
	Sampling      uint64 // rollout's transient buffers per step, at most
	TrainState    uint64 // trainer's parameters and optimizer state (offloaded)
	Train         uint64 // trainer's peak: state plus activations and gradients
	Steps         int    // alternations
}

// DefaultConfig is the RL colocation scenario of the package comment.
func DefaultConfig() Config {
	return Config{
		Device: 16 << 30, Weights: 8 << 30, WeightTensors: 291, KV: 4 << 30, KVBlocks: 32,
		Sampling: 256 << 20, TrainState: 2 << 30, Train: 10 << 30, Steps: 50,
	}
}

// Validate reports a config the scenario cannot be built from: a zero
// size or count, a trainer smaller than its state, or a rollout or a
// trainer that alone does not fit the device.
func (c Config) Validate() error {
	switch {
	case c.Device == 0 || c.Weights == 0 || c.KV == 0 || c.TrainState == 0 || c.Steps <= 0:
		return fmt.Errorf("%w: zero size or steps: %+v", ErrInvalid, c)
	case c.WeightTensors <= 0 || c.KVBlocks <= 0 || uint64(c.WeightTensors) > c.Weights || uint64(c.KVBlocks) > c.KV:
		return fmt.Errorf("%w: tensor counts %d, %d", ErrInvalid, c.WeightTensors, c.KVBlocks)
	case c.Train <= c.TrainState:
		return fmt.Errorf("%w: trainer peak %d not above its state %d", ErrInvalid, c.Train, c.TrainState)
	case c.Weights+c.KV+c.Sampling > c.Device-c.Device/16 || c.Train > c.Device-c.Device/16:
		return fmt.Errorf("%w: rollout (%d) or trainer (%d) alone does not fit %d bytes with room to spare", ErrInvalid, c.Weights+c.KV+c.Sampling, c.Train, c.Device)
	case c.Steps > 100_000 || c.WeightTensors > 1_000_000 || c.KVBlocks > 1_000_000:
		return fmt.Errorf("%w: program too long", ErrInvalid)
	}
	return nil
}

// Scaled is c with every size divided by div (counts and steps kept), for
// a run over real memory.
func (c Config) Scaled(div uint64) Config {
	if div <= 1 {
		return c
	}
	c.Device /= div
	c.Weights /= div
	c.KV /= div
	c.Sampling /= div
	c.TrainState /= div
	c.Train /= div
	return c
}

// Pool names the scenario's pools.
type Pool uint8

const (
	Weights Pool = iota // rollout weights: offloaded
	KVCache             // KV cache: discarded
	Train               // trainer: state offloaded, activations transient
	numPools
)

var poolNames = [numPools]string{"weights", "kv_cache", "train"}

func (p Pool) String() string {
	if p < numPools {
		return poolNames[p]
	}
	return fmt.Sprintf("Pool(%d)", uint8(p))
}

// Kind is an operation's kind.
type Kind uint8

const (
	Alloc Kind = iota + 1 // allocate Size bytes in Pool as tensor ID
	Free                  // free tensor ID
	Sleep                 // put Pool to sleep (Offload: back its tensors up)
	Wake                  // wake Pool
	Step                  // step ID begins
)

var kindNames = map[Kind]string{Alloc: "alloc", Free: "free", Sleep: "sleep", Wake: "wake", Step: "step"}

// Op is one operation of a program.
type Op struct {
	Kind    Kind
	Pool    Pool   // Alloc, Sleep, Wake
	ID      uint64 // Alloc, Free: the tensor (1, 2, … in Alloc order); Step: its index
	Size    uint64 // Alloc: bytes
	Offload bool   // Sleep: back up the pool's tensors (else discard them)
	Keep    bool   // Tensor the pool's contents must keep across sleeps (Alloc)
}

// Generate builds the program of c with seed.
func Generate(c Config, seed int64) ([]Op, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	g := &gen{rng: rand.New(rand.NewPCG(uint64(seed), 0x726c636f))}
	// Set-up: the rollout's weights and KV cache, the trainer's state
	// (the trainer sleeps first).
	split := func(total uint64, n int) []uint64 {
		// n sizes summing to total, uneven (embeddings and layers).
		w := make([]uint64, n)
		var sum uint64
		for i := range w {
			w[i] = 1 + uint64(g.rng.IntN(1000))
			sum += w[i]
		}
		out := make([]uint64, n)
		var used uint64
		for i := range w {
			out[i] = max(1, total*w[i]/sum)
			used += out[i]
		}
		if used < total {
			out[0] += total - used
		}
		return out
	}
	var weights, kv, state []uint64
	for _, n := range split(c.Weights, c.WeightTensors) {
		weights = append(weights, g.alloc(Weights, n, true))
	}
	for _, n := range split(c.KV, c.KVBlocks) {
		kv = append(kv, g.alloc(KVCache, n, false))
	}
	for _, n := range split(c.TrainState, 8) {
		state = append(state, g.alloc(Train, n, true))
	}
	g.ops = append(g.ops, Op{Kind: Sleep, Pool: Train, Offload: true})
	// The rollout's sampling buffers: the same shapes every step, as a
	// rollout of fixed batch and sequence length makes.
	var sampling []uint64
	for i, n := 0, 2+g.rng.IntN(6); i < n && c.Sampling >= uint64(n); i++ {
		sampling = append(sampling, 1+g.rng.Uint64N(c.Sampling/uint64(n)))
	}
	for step := 0; step < c.Steps; step++ {
		g.ops = append(g.ops, Op{Kind: Step, ID: uint64(step)})
		var tmp []uint64
		for _, n := range sampling {
			tmp = append(tmp, g.alloc(KVCache, n, false))
		}
		for _, id := range tmp {
			g.free(id)
		}
		g.ops = append(g.ops, Op{Kind: Sleep, Pool: Weights, Offload: true}, Op{Kind: Sleep, Pool: KVCache},
			Op{Kind: Wake, Pool: Train})
		// Training: activations forward, freed backward.
		var acts []uint64
		for _, n := range split(c.Train-c.TrainState, 24) {
			acts = append(acts, g.alloc(Train, n, false))
		}
		for i := len(acts) - 1; i >= 0; i-- {
			g.free(acts[i])
		}
		g.ops = append(g.ops, Op{Kind: Sleep, Pool: Train, Offload: true}, Op{Kind: Wake, Pool: Weights}, Op{Kind: Wake, Pool: KVCache})
	}
	// Tear-down: the rollout's tensors go first, so that the trainer's
	// wake (its state and its cached activations) fits.
	for _, ids := range [][]uint64{kv, weights} {
		for _, id := range ids {
			g.free(id)
		}
	}
	g.ops = append(g.ops, Op{Kind: Wake, Pool: Train})
	for _, id := range state {
		g.free(id)
	}
	return g.ops, nil
}

type gen struct {
	rng  *rand.Rand
	ops  []Op
	next uint64
}

func (g *gen) alloc(p Pool, n uint64, keep bool) uint64 {
	g.next++
	g.ops = append(g.ops, Op{Kind: Alloc, Pool: p, ID: g.next, Size: n, Keep: keep})
	return g.next
}

func (g *gen) free(id uint64) { g.ops = append(g.ops, Op{Kind: Free, ID: id}) }

// Write writes ops one per line: "alloc POOL ID SIZE [keep]", "free ID",
// "sleep POOL offload|discard", "wake POOL", "step N".
func Write(w io.Writer, ops []Op) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "# vmmalloc rl colocation program v1")
	for _, o := range ops {
		switch o.Kind {
		case Alloc:
			keep := ""
			if o.Keep {
				keep = " keep"
			}
			fmt.Fprintf(bw, "alloc %s %d %d%s\n", o.Pool, o.ID, o.Size, keep)
		case Free:
			fmt.Fprintf(bw, "free %d\n", o.ID)
		case Sleep:
			mode := "discard"
			if o.Offload {
				mode = "offload"
			}
			fmt.Fprintf(bw, "sleep %s %s\n", o.Pool, mode)
		case Wake:
			fmt.Fprintf(bw, "wake %s\n", o.Pool)
		case Step:
			fmt.Fprintf(bw, "step %d\n", o.ID)
		default:
			return fmt.Errorf("%w: op kind %d", ErrInvalid, o.Kind)
		}
	}
	return bw.Flush()
}

// Read parses what Write wrote (blank lines and # comments skipped) and
// checks that the program holds together: tensor ids 1, 2, … in Alloc
// order, every Free of a live tensor, a Sleep of an awake pool, a Wake of
// an asleep one, no Alloc in an asleep pool. A bad line or program is an
// error wrapping ErrInvalid, with its line number.
func Read(r io.Reader) ([]Op, error) {
	sc := bufio.NewScanner(r)
	pool := func(s string) (Pool, bool) {
		for i, n := range poolNames {
			if n == s {
				return Pool(i), true
			}
		}
		return 0, false
	}
	var ops []Op
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("%w: line %d: %s: %q", ErrInvalid, line, why, sc.Text())
		}
		var o Op
		var ok bool
		var err error
		switch {
		case f[0] == "alloc" && (len(f) == 4 || len(f) == 5 && f[4] == "keep"):
			o = Op{Kind: Alloc, Keep: len(f) == 5}
			if o.Pool, ok = pool(f[1]); !ok {
				return nil, bad("unknown pool")
			}
			if o.ID, err = strconv.ParseUint(f[2], 10, 64); err == nil {
				o.Size, err = strconv.ParseUint(f[3], 10, 64)
			}
		case f[0] == "free" && len(f) == 2:
			o = Op{Kind: Free}
			o.ID, err = strconv.ParseUint(f[1], 10, 64)
		case f[0] == "sleep" && len(f) == 3 && (f[2] == "offload" || f[2] == "discard"):
			o = Op{Kind: Sleep, Offload: f[2] == "offload"}
			if o.Pool, ok = pool(f[1]); !ok {
				return nil, bad("unknown pool")
			}
		case f[0] == "wake" && len(f) == 2:
			o = Op{Kind: Wake}
			if o.Pool, ok = pool(f[1]); !ok {
				return nil, bad("unknown pool")
			}
		case f[0] == "step" && len(f) == 2:
			o = Op{Kind: Step}
			o.ID, err = strconv.ParseUint(f[1], 10, 64)
		default:
			return nil, bad("not an operation")
		}
		if err != nil {
			return nil, bad(err.Error())
		}
		ops = append(ops, o)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := check(ops); err != nil {
		return nil, err
	}
	return ops, nil
}

// check requires that ops hold together (see Read).
func check(ops []Op) error {
	var asleep [numPools]bool
	live := map[uint64]Pool{}
	next := uint64(1)
	for i, o := range ops {
		bad := func(why string) error { return fmt.Errorf("%w: op %d (%v): %s", ErrInvalid, i+1, o, why) }
		switch o.Kind {
		case Alloc:
			if o.ID != next || o.Size == 0 || asleep[o.Pool] {
				return bad("want the next id, a size, an awake pool")
			}
			next++
			live[o.ID] = o.Pool
		case Free:
			if _, ok := live[o.ID]; !ok {
				return bad("not a live tensor")
			}
			delete(live, o.ID)
		case Sleep, Wake:
			if asleep[o.Pool] != (o.Kind == Wake) {
				return bad("pool in the wrong state")
			}
			asleep[o.Pool] = o.Kind == Sleep
		}
	}
	return nil
}

// Result is what Replay saw.
type Result struct {
	Steps int
	// PeakDevice is the most device memory in use (the driver's total
	// minus free) after any operation; DeviceAfterStep that at the end of
	// every step but the last (it must not grow).
	PeakDevice      uint64
	DeviceAfterStep []uint64
	// PeakHost is the most pinned host memory the backups held
	// (allocator Stats().HostBackupBytes); HostAfterStep after each step.
	PeakHost      int64
	HostAfterStep []int64
	// Sleeps, Wakes, SleepTime, WakeTime: calls and wall time.
	Sleeps, Wakes       int
	SleepTime, WakeTime time.Duration
	// Corrupted counts kept tensors whose check pattern changed across
	// a sleep (only with ReplayOptions.Check).
	Corrupted int
}

// ReplayOptions configures Replay.
type ReplayOptions struct {
	// Host is the pinned host allocator of the backups (nil: Go memory).
	Host allocator.HostAllocator
	// KeepHostBuffers is SleepOptions.KeepHostBuffers of every Sleep.
	KeepHostBuffers bool
	// Check writes 16 bytes at the start and end of every kept tensor and
	// checks them after each wake (needs a Copier that moves bytes).
	Check bool
	// Used reports the device memory in use (e.g. total − free from the
	// driver's MemGetInfo).
	Used func() (uint64, error)
	// AfterOp, if set, is called after every operation that succeeded.
	AfterOp func(i int, op Op)
}

// Replay runs ops on a, in three new pools named as the scenario's, and
// returns what it saw. Copies for the checks go through c on a's default
// stream. The pools are closed at the end; an error stops the replay.
func Replay(a *allocator.Allocator, c backend.Copier, ops []Op, o ReplayOptions) (Result, error) {
	var r Result
	if err := check(ops); err != nil {
		return r, err
	}
	var pools [numPools]*allocator.Pool
	for i := range pools {
		p, err := a.NewPool(allocator.PoolOptions{Name: poolNames[i]})
		if err != nil {
			return r, err
		}
		pools[i] = p
		defer func() { _ = p.Close() }()
	}
	type tensor struct {
		ptr  uintptr
		size uint64
		pool Pool
		keep bool
		tag  [16]byte
	}
	live := map[uint64]*tensor{}
	s := a.DefaultStream()
	pattern := func(t *tensor, id uint64) {
		for i := range t.tag {
			t.tag[i] = byte(id*131 + uint64(i)*7 + 1)
		}
	}
	ends := func(t *tensor) []uintptr {
		n := min(t.size, 16)
		return []uintptr{t.ptr, t.ptr + uintptr(t.size-n)}
	}
	observe := func() error {
		if o.Used != nil {
			u, err := o.Used()
			if err != nil {
				return err
			}
			r.PeakDevice = max(r.PeakDevice, u)
		}
		r.PeakHost = max(r.PeakHost, a.Stats().HostBackupBytes)
		return nil
	}
	endStep := func() error {
		if r.Steps == 0 {
			return nil
		}
		var u uint64
		if o.Used != nil {
			var err error
			if u, err = o.Used(); err != nil {
				return err
			}
		}
		r.DeviceAfterStep = append(r.DeviceAfterStep, u)
		r.HostAfterStep = append(r.HostAfterStep, a.Stats().HostBackupBytes)
		return nil
	}
	for i, op := range ops {
		var err error
		switch op.Kind {
		case Alloc:
			t := &tensor{size: op.Size, pool: op.Pool, keep: op.Keep}
			if t.ptr, err = pools[op.Pool].Malloc(op.Size, 0); err == nil {
				live[op.ID] = t
				if o.Check && t.keep {
					pattern(t, op.ID)
					for _, at := range ends(t) {
						if err = c.CopyHtoD(at, t.tag[:min(t.size, 16)], s); err != nil {
							break
						}
					}
				}
			}
		case Free:
			t := live[op.ID]
			delete(live, op.ID)
			err = a.Free(t.ptr)
		case Sleep:
			mode := allocator.Discard
			if op.Offload {
				mode = allocator.Offload
			}
			t0 := time.Now()
			err = pools[op.Pool].Sleep(allocator.SleepOptions{Mode: mode, Host: o.Host, KeepHostBuffers: o.KeepHostBuffers})
			r.SleepTime += time.Since(t0)
			r.Sleeps++
		case Wake:
			t0 := time.Now()
			err = pools[op.Pool].Wake()
			r.WakeTime += time.Since(t0)
			r.Wakes++
			if err == nil && o.Check {
				got := make([]byte, 16)
				for _, t := range live {
					if t.pool != op.Pool || !t.keep {
						continue
					}
					for _, at := range ends(t) {
						n := min(t.size, 16)
						if err = c.CopyDtoH(got[:n], at, s); err != nil {
							break
						}
						if string(got[:n]) != string(t.tag[:n]) {
							r.Corrupted++
						}
					}
				}
			}
		case Step:
			err = endStep()
			r.Steps++
		}
		if err == nil {
			err = observe()
		}
		if err == nil && o.AfterOp != nil {
			o.AfterOp(i, op)
		}
		if err != nil {
			return r, fmt.Errorf("rl: op %d (%s): %w", i+1, kindNames[op.Kind], err)
		}
	}
	return r, nil
}
