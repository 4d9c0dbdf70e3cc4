package allocator

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// Sleep/wake endurance (vllm#21336: 10.9 GiB lost in three sleep
// cycles). sleepCycles runs cycles of: random Mallocs and Frees of a
// pool's churn blocks while awake, a Sleep, random Frees while asleep, a
// Wake, and a check of every live block's bytes (Offload: their contents;
// Discard with Poison: PoisonByte; Memset: zeros; the discarded ones are
// written again). Every checkpointEvery cycles it frees every churn block
// and empties the pool's cache before the sleep, so that the pool holds
// only its weights (allocated once, never freed), and after the wake
// measures the device memory in use (MemGetInfo), the pinned host memory
// (the emulator's host accounting; with KeepHostBuffers the buffers kept
// for the next sleep) and the Go heap after a GC: what leaks across
// cycles shows there as growth from one checkpoint to the next.

// cycleMark is what a checkpoint measures, in bytes.
type cycleMark struct {
	cycle                int
	device, pinned, heap uint64
}

// endurance is one sleep mode the endurance runs use.
type endurance struct {
	name string
	opts SleepOptions // Host is set by sleepCycles
}

var endurances = []endurance{
	{"offload", SleepOptions{Mode: Offload}},
	{"offload+keep", SleepOptions{Mode: Offload, KeepHostBuffers: true}},
	{"discard+poison", SleepOptions{Mode: Discard, Poison: true}},
	{"memset", SleepOptions{Mode: Memset}},
}

const checkpointEvery = 10

// sleepCycles runs n cycles and returns the checkpoints (cycle 0, 10,
// 20, ...). Contents are checked after every Wake; Check every
// checkpoint.
func sleepCycles(tb testing.TB, n int, en endurance, seed uint64) []cycleMark {
	const mib = 1 << 20
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(256*mib))
	require.NoError(tb, err)
	defer e.Close()
	cfg, err := ParseConfig("large_segment_size_mb:2,small_segment_size_mb:2")
	require.NoError(tb, err)
	a, err := New(e, cfg)
	require.NoError(tb, err)
	defer a.Close()
	s := a.DefaultStream()
	host := newPinnedHost(e)
	opts := en.opts
	if opts.Mode == Offload {
		opts.Host = host
	}
	p, err := a.NewPool(PoolOptions{Name: "rollout"})
	require.NoError(tb, err)
	rng := rand.New(rand.NewPCG(seed, 11))

	type blk struct {
		p    uintptr
		data []byte
	}
	scratch := make([]byte, 8*mib)
	var seq uint64
	write := func(b blk) { require.NoError(tb, e.CopyHtoD(b.p, b.data, s)) }
	alloc := func(sz uint64) blk {
		ptr, err := p.Malloc(sz, 0)
		require.NoError(tb, err)
		// A 4 KiB random head, repeated: unique per block, cheap to make
		// and to compare under the race detector.
		seq++
		data := make([]byte, sz)
		head := data[:min(sz, 4096)]
		for i := range head {
			head[i] = byte(rng.Uint32())
		}
		binaryLE(head, seq)
		for k := len(head); k < len(data); k *= 2 {
			copy(data[k:], data[:k])
		}
		b := blk{p: ptr, data: data}
		write(b)
		return b
	}
	size := func() uint64 {
		if rng.IntN(3) == 0 {
			return uint64(256<<10 + rng.IntN(2*mib))
		}
		return uint64(512 + rng.IntN(64<<10))
	}
	weights := []blk{alloc(3*mib + 100), alloc(700), alloc(2 * mib), alloc(40 << 10)}
	var churn []blk
	drop := func(i int) {
		require.NoError(tb, a.Free(churn[i].p))
		churn[i] = churn[len(churn)-1]
		churn[len(churn)-1] = blk{} // no reference to its data left
		churn = churn[:len(churn)-1]
	}
	fill, filled := wakeFill(opts)
	filler := bytes.Repeat([]byte{fill}, len(scratch))
	check := func(bs []blk) {
		for _, b := range bs {
			got := scratch[:len(b.data)]
			require.NoError(tb, e.CopyDtoH(got, b.p, s))
			switch {
			case opts.Mode == Offload:
				if !bytes.Equal(got, b.data) {
					tb.Fatalf("block %#x+%d lost its contents", b.p, len(b.data))
				}
			case filled:
				if !bytes.Equal(got, filler[:len(got)]) {
					i := bytes.IndexFunc(got, func(r rune) bool { return r != rune(fill) })
					tb.Fatalf("block %#x reads %#x at byte %d after wake, want %#x", b.p, got[max(i, 0)], i, fill)
				}
				write(b) // the framework loads it again
			}
		}
	}
	marks := make([]cycleMark, 0, n/checkpointEvery+2) // not counted as growth
	for cycle := 0; cycle <= n; cycle++ {
		mark := cycle%checkpointEvery == 0 || cycle == n
		if mark {
			// Only the weights, no free cache: every checkpoint's sleep
			// and wake see the same pool.
			for len(churn) > 0 {
				drop(len(churn) - 1)
			}
			require.NoError(tb, p.EmptyCache())
		} else {
			for k := rng.IntN(6); k > 0 && len(churn) < 12; k-- {
				churn = append(churn, alloc(size()))
			}
			for k := rng.IntN(4); k > 0 && len(churn) > 0; k-- {
				drop(rng.IntN(len(churn)))
			}
		}
		require.NoError(tb, p.Sleep(opts))
		for k := rng.IntN(3); k > 0 && len(churn) > 0; k-- {
			drop(rng.IntN(len(churn))) // freed while asleep
		}
		require.NoError(tb, p.Wake())
		check(weights)
		check(churn)
		if mark {
			require.NoError(tb, a.Check())
			free, _, err := e.MemGetInfo(0)
			require.NoError(tb, err)
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			marks = append(marks, cycleMark{cycle: cycle, device: 256*mib - free, pinned: e.Live().HostBytes, heap: ms.HeapAlloc})
		}
	}
	for _, b := range weights {
		require.NoError(tb, a.Free(b.p))
	}
	require.NoError(tb, p.Close())
	require.Zero(tb, host.Live())
	return marks
}

// binaryLE writes v's low bytes at the start of b.
func binaryLE(b []byte, v uint64) {
	for i := 0; i < len(b) && i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

// growth is the growth of each measure from the checkpoint at cycle 10 to
// the last one, in bytes (negative: shrank).
func growth(marks []cycleMark) (device, pinned, heap int64) {
	if len(marks) < 3 {
		return 0, 0, 0
	}
	first, last := marks[1], marks[len(marks)-1]
	return int64(last.device) - int64(first.device), int64(last.pinned) - int64(first.pinned), int64(last.heap) - int64(first.heap)
}

// TestSleepWakeEndurance: a bounded run of sleepCycles per mode (100
// cycles; 30 with -short or -race): the device memory and the pinned host memory
// at every checkpoint from cycle 10 on are exactly what they were at
// cycle 10, the Go heap within 1 MiB of it, and every live block's bytes
// are right after every wake. BenchmarkSleepWakeCycles runs 1,000.
func TestSleepWakeEndurance(t *testing.T) {
	n := 100
	if testing.Short() || raceEnabled {
		n = 30 // -race makes each cycle's copies and checks ten times slower
	}
	for _, en := range endurances {
		t.Run(en.name, func(t *testing.T) {
			marks := sleepCycles(t, n, en, 7)
			base := marks[1]
			require.Equal(t, checkpointEvery, base.cycle)
			for _, m := range marks[1:] {
				require.Equal(t, base.device, m.device, "device memory in use at cycle %d", m.cycle)
				require.Equal(t, base.pinned, m.pinned, "pinned host memory at cycle %d", m.cycle)
				require.InDelta(t, float64(base.heap), float64(m.heap), 1<<20, "Go heap at cycle %d", m.cycle)
			}
			if en.opts.Mode != Offload || !en.opts.KeepHostBuffers {
				require.Zero(t, base.pinned, "no pinned memory held while awake")
			}
		})
	}
}

// BenchmarkSleepWakeCycles runs b.N sleep/wake cycles of sleepCycles per
// mode and reports the growth of the device memory in use, the pinned
// host memory and the Go heap from the checkpoint at cycle 10 to the end
// (bytes; 0 is flat), and the most device and pinned memory a checkpoint
// saw (the weights' handles; with KeepHostBuffers their kept backups). The
// full endurance run:
//
//	go test -run '^$' -bench SleepWakeCycles -benchtime 1000x ./allocator/
func BenchmarkSleepWakeCycles(b *testing.B) {
	for _, en := range endurances {
		b.Run(en.name, func(b *testing.B) {
			marks := sleepCycles(b, b.N, en, 7)
			dev, pin, heap := growth(marks)
			var maxDev, maxPin uint64
			for _, m := range marks {
				maxDev, maxPin = max(maxDev, m.device), max(maxPin, m.pinned)
			}
			b.ReportMetric(float64(dev), "device-growth-B")
			b.ReportMetric(float64(pin), "pinned-growth-B")
			b.ReportMetric(float64(heap), "heap-growth-B")
			b.ReportMetric(float64(maxDev)/(1<<20), "device-ckpt-max-MiB")
			b.ReportMetric(float64(maxPin)/(1<<20), "pinned-ckpt-max-MiB")
			b.ReportMetric(float64(len(marks)), "checkpoints")
		})
	}
}
