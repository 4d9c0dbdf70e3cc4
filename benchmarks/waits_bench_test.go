package benchmarks

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// slowSync is the emulator whose StreamSynchronize of one stream takes a
// fixed wall time, as a real synchronize lasts as long as the kernels
// queued on the stream.
type slowSync struct {
	*emulated.Emulator
	slow backend.Stream
	wait time.Duration
}

func (d *slowSync) StreamSynchronize(s backend.Stream) error {
	if s == d.slow {
		time.Sleep(d.wait)
	}
	return d.Emulator.StreamSynchronize(s)
}

// BenchmarkMallocFreeDuringWait measures the latency of cache-hit
// Malloc+Free pairs on one stream while another goroutine's growth on
// another stream waits 20 ms for that stream (defrag before growth: the
// stream's free handles are unmapped after a synchronize). Each iteration
// is one such growth (and an EmptyCache, which waits again). The other
// goroutine issues a pair every 50 µs throughout, open loop: a pair's
// latency runs from when it was due, so pairs held up behind a stalled
// lock all count (no coordinated omission). It reports p50, p99 and max
// latency (p50-ns, p99-ns, max-ns) and waits/op, the synchronizes made,
// to show the waits happened.
func BenchmarkMallocFreeDuringWait(b *testing.B) {
	e, err := emulated.New()
	require.NoError(b, err)
	drv := &slowSync{Emulator: e, wait: 20 * time.Millisecond}
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(b, err)
	defer a.Close()
	slow, err := drv.StreamCreate(0)
	require.NoError(b, err)
	fast, err := drv.StreamCreate(0)
	require.NoError(b, err)
	drv.slow = slow
	p, err := a.Malloc(4096, fast)
	require.NoError(b, err)
	require.NoError(b, a.Free(p))

	// One growth that waits: 20 MiB blocks on the slow stream with every
	// other one freed leave free handles in holes; a 100 MiB request then
	// finds mapped memory above its defrag limit and unmaps the holes,
	// after synchronising the slow stream, before it grows.
	const mib = 1 << 20
	grow := func() {
		var ptrs []uintptr
		for i := 0; i < 8; i++ {
			q, err := a.Malloc(20*mib, slow)
			require.NoError(b, err)
			ptrs = append(ptrs, q)
		}
		for i := 0; i < len(ptrs); i += 2 {
			require.NoError(b, a.Free(ptrs[i]))
		}
		big, err := a.Malloc(100*mib, slow)
		require.NoError(b, err)
		require.NoError(b, a.Free(big))
		for i := 1; i < len(ptrs); i += 2 {
			require.NoError(b, a.Free(ptrs[i]))
		}
		require.NoError(b, a.EmptyCache())
	}

	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		lat     []time.Duration
		pairErr error
	)
	const period = 50 * time.Microsecond
	wg.Add(1)
	go func() {
		defer wg.Done()
		due := time.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for time.Now().Before(due) { // spin: a sleep would overshoot
			}
			q, err := a.Malloc(4096, fast)
			if err == nil {
				err = a.Free(q)
			}
			lat = append(lat, time.Since(due))
			if err != nil {
				pairErr = err
				return
			}
			due = due.Add(period)
		}
	}()
	syncs0 := a.Stats().NumStreamSyncs
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		grow()
	}
	b.StopTimer()
	syncs := a.Stats().NumStreamSyncs - syncs0
	close(stop)
	wg.Wait()
	require.NoError(b, pairErr)
	require.NotEmpty(b, lat)
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) }
	b.ReportMetric(at(0.50), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(float64(syncs)/float64(b.N), "waits/op")
}

// BenchmarkMallocFreeTwoStreams measures cache-hit Malloc+Free throughput
// with one goroutine on one stream and with two goroutines on two streams
// (each its own stream, so no block is shared): pairs/s over the whole
// run, all goroutines together. One device mutex serialises both, so two
// goroutines gain nothing while the critical section is the whole pair.
func BenchmarkMallocFreeTwoStreams(b *testing.B) {
	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			a, e := newAllocator(b, "")
			defer a.Close()
			streams := make([]backend.Stream, g)
			for i := range streams {
				s, err := e.StreamCreate(0)
				require.NoError(b, err)
				streams[i] = s
				p, err := a.Malloc(4096, s)
				require.NoError(b, err)
				require.NoError(b, a.Free(p))
			}
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for _, s := range streams {
				wg.Add(1)
				go func(s backend.Stream) {
					defer wg.Done()
					for i := 0; i < b.N; i++ {
						p, err := a.Malloc(4096, s)
						if err == nil {
							err = a.Free(p)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}(s)
			}
			wg.Wait()
			b.ReportMetric(float64(g*b.N)/time.Since(start).Seconds(), "pairs/s")
		})
	}
}
