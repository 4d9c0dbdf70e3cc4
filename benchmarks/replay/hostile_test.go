package replay_test

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/benchmarks/replay"
	"github.com/vmmalloc/vmmalloc/benchmarks/trace"
)

// Small files that name many things: every stream, allocation
// or event a trace names costs the replay (its engine, the allocator and
// the emulator) Go heap, so a file of a few hundred kilobytes could once
// hold gigabytes. The bound is per input byte: peak heap ≤
// replayHeapPerByte × file bytes + replayHeapBase.
//
// Measured (Go heap per input byte at the end of the replay, where these
// shapes peak; per unit in parentheses): 128 (491) for streams
// synchronized once, 327 (1,294) for streams that allocate once (the
// allocator's state and block records, the emulator's stream, physical
// handle and mapping of the 2 MiB each stream's growth maps; the fixed
// state weighs more in this smaller file), 131 (614) for one block
// recorded on many streams, 27 (82) for small blocks never freed, 10 (87)
// for sparse ids. Before the heap's free indexes were sparse the first
// three were 2,210, 2,306 and 1,841 per byte (8.5 to 9.1 KB a stream):
// a 383,508-byte file held 847 MB. The bound is 1.5 times the
// worst measured; the base covers the emulator's and allocator's fixed
// state (the reservation's granule map, 0.6 MiB) and the samples.
const (
	replayHeapPerByte = 512
	replayHeapBase    = 4 << 20
)

// hostileShape writes a binary trace of n units of one hostile shape.
type hostileShape struct {
	name   string
	n      int // units (streams, allocations)
	events func(n int) []trace.Event
}

func hostileShapes() []hostileShape {
	return []hostileShape{
		// 100,000 streams named once each, 383,508 bytes.
		{"streams synchronized once", 100_000, func(n int) []trace.Event {
			ev := make([]trace.Event, n)
			for i := range ev {
				ev[i] = trace.Event{Kind: trace.StreamSync, Stream: uint64(i + 1)}
			}
			return ev
		}},
		// Each stream allocates once, so each holds a block and a free
		// rest. Fewer than the other shapes: growth on a new stream walks
		// the other streams (reclaim.go), so the replay is quadratic in
		// streams.
		{"streams allocating once", 3_000, func(n int) []trace.Event {
			ev := make([]trace.Event, n)
			for i := range ev {
				ev[i] = trace.Event{Kind: trace.Alloc, ID: uint64(i + 1), Size: 64, Stream: uint64(i + 1)}
			}
			return ev
		}},
		// One block used by many streams, then freed: each stream gets
		// state and an event.
		{"one block recorded on many streams", 50_000, func(n int) []trace.Event {
			ev := []trace.Event{{Kind: trace.Alloc, ID: 1, Size: 512}}
			for i := range n {
				ev = append(ev, trace.Event{Kind: trace.RecordStream, ID: 1, Stream: uint64(i + 1)})
			}
			return append(ev, trace.Event{Kind: trace.Free, ID: 1})
		}},
		// Many small live blocks on one stream: a block record, an address
		// table slot and a replay slot each.
		{"small blocks never freed", 200_000, func(n int) []trace.Event {
			ev := make([]trace.Event, n)
			for i := range ev {
				ev[i] = trace.Event{Kind: trace.Alloc, ID: uint64(i + 1), Size: 512}
			}
			return ev
		}},
		// Ids far apart: every allocation lands in the replay's id map.
		{"sparse ids", 100_000, func(n int) []trace.Event {
			ev := make([]trace.Event, n)
			for i := range ev {
				ev[i] = trace.Event{Kind: trace.Alloc, ID: uint64(i+1) << 40, Size: 512}
			}
			return ev
		}},
	}
}

func encode(t testing.TB, ev []trace.Event) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := trace.NewWriter(&buf)
	for _, e := range ev {
		require.NoError(t, w.Write(e))
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// replayPeakHeap replays a binary trace and returns the most Go heap in use
// above what was in use before, sampled (after a collection) at every
// progress report and once after the last event, before the replay lets
// its allocator and emulator go.
func replayPeakHeap(t testing.TB, data []byte) (uint64, *replay.Report) {
	t.Helper()
	before := heapInUse()
	var peak uint64
	r, err := trace.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	rep, err := replay.Run(r, replay.Options{Progress: func(int64) {
		peak = max(peak, heapInUse())
	}})
	require.NoError(t, err)
	if peak < before {
		return 0, rep
	}
	return peak - before, rep
}

// TestHostileFilesBoundedHeap: a replay holds at most a fixed multiple of
// its file's size in Go heap, whatever the file names (383 KB naming
// 100,000 streams may not hold hundreds of MB).
func TestHostileFilesBoundedHeap(t *testing.T) {
	for _, sh := range hostileShapes() {
		t.Run(sh.name, func(t *testing.T) {
			n := sh.n
			if testing.Short() {
				n /= 10
			}
			data := encode(t, sh.events(n))
			peak, rep := replayPeakHeap(t, data)
			t.Logf("%d bytes, %d units: peak heap %d (%.0f per byte, %.0f per unit)",
				len(data), n, peak, float64(peak)/float64(len(data)), float64(peak)/float64(n))
			assert.LessOrEqual(t, peak, replayHeapPerByte*uint64(len(data))+replayHeapBase,
				"%.0f bytes of heap per input byte", float64(peak)/float64(len(data)))
			assert.True(t, rep.Complete)
			assert.Zero(t, rep.OOMs)
		})
	}
}

// BenchmarkHostileHeap reports the Go heap a replay holds per input byte and
// per unit (stream, allocation) for each hostile shape.
func BenchmarkHostileHeap(b *testing.B) {
	for _, sh := range hostileShapes() {
		b.Run(sh.name, func(b *testing.B) {
			data := encode(b, sh.events(sh.n))
			var peak uint64
			for b.Loop() {
				peak, _ = replayPeakHeap(b, data)
			}
			b.ReportMetric(float64(peak)/float64(len(data)), "heap-B/input-B")
			b.ReportMetric(float64(peak)/float64(sh.n), "heap-B/unit")
		})
	}
}
