package benchmarks

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
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
	slow    backend.Stream
	wait    time.Duration
	mapCost time.Duration // wall time of every Map (a real cuMemMap of a large handle)
}

func (d *slowSync) Map(va uintptr, size uint64, h backend.Handle) error {
	if d.mapCost > 0 {
		time.Sleep(d.mapCost)
	}
	return d.Emulator.Map(va, size, h)
}

func (d *slowSync) StreamSynchronize(s backend.Stream) error {
	if s == d.slow {
		time.Sleep(d.wait)
	}
	return d.Emulator.StreamSynchronize(s)
}

// BenchmarkMallocFreeDuringWait measures the latency of cache-hit
// Malloc+Free pairs on one stream while another goroutine works on
// another stream. Sub-benchmarks by what the other goroutine does per
// iteration:
//
//   - other=grow-wait: a growth whose defrag waits 20 ms for its stream
//     (the stream's free handles are unmapped after a synchronize), then
//     an EmptyCache that waits 20 ms again;
//   - other=release-wait: it allocates and frees two 20 MiB blocks on its
//     stream and hands the stream back with ReleaseStream, whose
//     synchronize takes 20 ms, twice;
//   - other=grow: the growth's calls with synchronizes that return at once,
//     then a 40 ms sleep outside the allocator: what is left is the
//     driver calls (map, unmap, handle create and release) and the
//     allocator's own work;
//   - other=slow-map: eight times, a 40 MiB growth on its stream (two
//     handles) whose driver Map takes 2 ms each, a Free and a Synchronize
//     of its stream that unmaps them again (release_threshold_mb:0; the
//     measured stream's memory stays mapped): 32 ms of maps per
//     iteration, made without the allocator's mutex;
//   - other=idle: it sleeps 40 ms and calls nothing: the control, what the
//     machine itself (scheduler, timer, other processes) costs the
//     measuring goroutine.
//
// The measuring goroutine issues a pair every 50 µs, open loop: a pair's
// latency runs from when it was due, so pairs held up behind a stalled
// lock all count (no coordinated omission). It reports, over every pair,
// p50, p99 and max of that latency (p50-ns, p99-ns, max-ns), p99 and max
// of the pair's own duration, from its first call to its return
// (svc-p99-ns, svc-max-ns: time waiting for the allocator's mutex counts
// here, time the goroutine was not running before the pair does not),
// the synchronizes made (waits/op) and the garbage collections during the
// run (gc/op). The latency slice is allocated before the timer starts.
// With GOMAXPROCS=2 (the CI machine: 2 cores) the spinning measurer, the
// other goroutine and the Go runtime share two threads.
func BenchmarkMallocFreeDuringWait(b *testing.B) {
	for _, mode := range []string{"grow-wait", "release-wait", "grow", "slow-map", "idle"} {
		b.Run("other="+mode, func(b *testing.B) { benchDuringWait(b, mode) })
	}
}

func benchDuringWait(b *testing.B, mode string) {
	e, err := emulated.New()
	require.NoError(b, err)
	drv := &slowSync{Emulator: e}
	if strings.HasSuffix(mode, "-wait") {
		drv.wait = 20 * time.Millisecond
	}
	cfg := allocator.DefaultConfig()
	if mode == "slow-map" {
		cfg.ReleaseThreshold = 0 // Synchronize(slow) unmaps the slow stream's free handles
	}
	a, err := allocator.New(drv, cfg)
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
	var ptrs [8]uintptr
	grow := func() {
		for i := range ptrs {
			q, err := a.Malloc(20*mib, slow)
			require.NoError(b, err)
			ptrs[i] = q
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
	switch mode {
	case "release-wait":
		grow = func() {
			for range 2 {
				for i := range 2 {
					q, err := a.Malloc(20*mib, slow)
					require.NoError(b, err)
					ptrs[i] = q
				}
				for i := range 2 {
					require.NoError(b, a.Free(ptrs[i]))
				}
				require.NoError(b, a.ReleaseStream(slow))
			}
		}
	case "slow-map":
		drv.mapCost = 2 * time.Millisecond
		grow = func() {
			for range 8 {
				q, err := a.Malloc(40*mib, slow)
				require.NoError(b, err)
				require.NoError(b, a.Free(q))
				require.NoError(b, a.Synchronize(slow))
			}
		}
	case "grow":
		calls := grow
		grow = func() { calls(); time.Sleep(40 * time.Millisecond) }
	case "idle":
		grow = func() { time.Sleep(40 * time.Millisecond) }
	}

	const period = 50 * time.Microsecond
	// Each iteration takes about 40 ms with the waits (800 pairs); room
	// for four times that, so that append never copies while measuring.
	n := b.N*4*int(40*time.Millisecond/period) + 1024
	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		lat     = make([]time.Duration, 0, n)
		svc     = make([]time.Duration, 0, n)
		pairErr error
	)
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	syncs0 := a.Stats().NumStreamSyncs
	started := make(chan struct{})
	wg.Add(1)
	b.ResetTimer()
	go func() {
		defer wg.Done()
		close(started)
		due := time.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for time.Now().Before(due) { // spin: a sleep would overshoot
			}
			start := time.Now()
			q, err := a.Malloc(4096, fast)
			if err == nil {
				err = a.Free(q)
			}
			end := time.Now()
			lat = append(lat, end.Sub(due))
			svc = append(svc, end.Sub(start))
			if err != nil {
				pairErr = err
				return
			}
			due = due.Add(period)
		}
	}()
	<-started
	for i := 0; i < b.N; i++ {
		grow()
	}
	close(stop)
	wg.Wait()
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	syncs := a.Stats().NumStreamSyncs - syncs0
	require.NoError(b, pairErr)
	require.NotEmpty(b, lat)
	at := func(d []time.Duration, q float64) float64 {
		return float64(d[int(q*float64(len(d)-1))].Nanoseconds())
	}
	slices.Sort(lat)
	slices.Sort(svc)
	b.ReportMetric(at(lat, 0.50), "p50-ns")
	b.ReportMetric(at(lat, 0.99), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(at(svc, 0.99), "svc-p99-ns")
	b.ReportMetric(float64(svc[len(svc)-1].Nanoseconds()), "svc-max-ns")
	b.ReportMetric(float64(syncs)/float64(b.N), "waits/op")
	b.ReportMetric(float64(ms1.NumGC-ms0.NumGC)/float64(b.N), "gc/op")
}

// BenchmarkMallocFreeTwoStreams measures cache-hit Malloc+Free throughput
// with one goroutine on one stream and with two goroutines on two streams
// (each its own stream, so no block is shared): pairs/s over the whole
// run, all goroutines together. One device mutex serialises both, so two
// goroutines gain nothing while the critical section is the whole pair.
// The control, allocators=2, gives each goroutine its own allocator (and
// emulator): no shared lock or data, so its figure is what the machine
// allows two goroutines at best.
func BenchmarkMallocFreeTwoStreams(b *testing.B) {
	for _, c := range []struct{ goroutines, allocators int }{{1, 1}, {2, 1}, {2, 2}} {
		name := fmt.Sprintf("goroutines=%d", c.goroutines)
		if c.allocators > 1 {
			name += fmt.Sprintf("/allocators=%d", c.allocators)
		}
		b.Run(name, func(b *testing.B) {
			allocs := make([]*allocator.Allocator, c.goroutines)
			streams := make([]backend.Stream, c.goroutines)
			for i := range streams {
				if i < c.allocators {
					a, e := newAllocator(b, "")
					defer a.Close()
					allocs[i] = a
					s, err := e.StreamCreate(0)
					require.NoError(b, err)
					streams[i] = s
				} else {
					allocs[i] = allocs[0]
					s, err := allocs[0].Driver().StreamCreate(0)
					require.NoError(b, err)
					streams[i] = s
				}
				p, err := allocs[i].Malloc(4096, streams[i])
				require.NoError(b, err)
				require.NoError(b, allocs[i].Free(p))
			}
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i := range streams {
				wg.Add(1)
				go func(a *allocator.Allocator, s backend.Stream) {
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
				}(allocs[i], streams[i])
			}
			wg.Wait()
			b.ReportMetric(float64(c.goroutines*b.N)/time.Since(start).Seconds(), "pairs/s")
		})
	}
}
