package host

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func benchHost(b *testing.B, conf string) (*Allocator, *emulated.Emulator) {
	e, err := emulated.New()
	require.NoError(b, err)
	cfg, err := ParseConfig(conf)
	require.NoError(b, err)
	a, err := New(e, cfg)
	require.NoError(b, err)
	b.Cleanup(func() { _ = a.Close() })
	return a, e
}

// BenchmarkCacheHit is Malloc+Free of a size that is cached, with 1,000
// other blocks live: no driver call, no Go allocation. Under each policy;
// with expandable segments a 256 KiB block comes from the per-size fast
// cache and a 4 MiB one from the block heap (split, then coalesced).
func BenchmarkCacheHit(b *testing.B) {
	for _, tc := range []struct {
		name, conf string
		size       uint64
	}{
		{"classes/256KiB", "expandable_segments:False", 256 << 10},
		{"expandable/256KiB", "expandable_segments:True", 256 << 10},
		{"classes/4MiB", "expandable_segments:False", 4 << 20},
		{"expandable/4MiB", "expandable_segments:True", 4 << 20},
	} {
		b.Run(tc.name, func(b *testing.B) {
			a, e := benchHost(b, tc.conf+",pinned_budget_mb:0")
			for i := 0; i < 1000; i++ {
				_, err := a.Malloc(uint64(1+i%64) * 4096)
				require.NoError(b, err)
			}
			p, err := a.Malloc(tc.size)
			require.NoError(b, err)
			require.NoError(b, a.Free(p))
			calls := e.CallCounts()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				p, err := a.Malloc(tc.size)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if e.CallCounts() != calls {
				b.Fatal("the cache-hit path called the driver")
			}
		})
	}
}

// BenchmarkCacheHitRecordStream adds RecordStream on one stream to every
// allocation: Free records a pooled event, and the next Malloc polls it
// (EventQuery).
func BenchmarkCacheHitRecordStream(b *testing.B) {
	a, e := benchHost(b, "")
	s, err := e.StreamCreate(0)
	require.NoError(b, err)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, err := a.Malloc(256 << 10)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.RecordStream(p, s); err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(a.Stats().NumEventsCreate), "events-created")
}

// BenchmarkUncached is the miss path: Malloc of a new block and its release
// (EmptyCache), against BenchmarkRawMallocHost, the driver calls alone.
// sim-ns/op is the emulator's default cost model's time for the calls made.
func BenchmarkUncached(b *testing.B) {
	for _, conf := range []string{"", "pinned_use_host_register:True"} {
		name := "MallocHost"
		if conf != "" {
			name = "HostRegister"
		}
		b.Run(name, func(b *testing.B) {
			e, err := emulated.New(emulated.WithCostModel(emulated.DefaultCostModel()))
			require.NoError(b, err)
			cfg, err := ParseConfig(conf)
			require.NoError(b, err)
			a, err := New(e, cfg)
			require.NoError(b, err)
			defer a.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				p, err := a.Malloc(256 << 10)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
				if err := a.EmptyCache(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(e.SimulatedTime().Nanoseconds())/float64(b.N), "sim-ns/op")
		})
	}
}

// BenchmarkRawMallocHost is MallocHost+FreeHost on the emulator.
func BenchmarkRawMallocHost(b *testing.B) {
	e, err := emulated.New(emulated.WithCostModel(emulated.DefaultCostModel()))
	require.NoError(b, err)
	var hm backend.HostMemory = e
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, err := hm.MallocHost(256 << 10)
		if err != nil {
			b.Fatal(err)
		}
		if err := hm.FreeHost(p); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(e.SimulatedTime().Nanoseconds())/float64(b.N), "sim-ns/op")
}

// BenchmarkCachedVsRaw is the workload the cache is for: a 256 KiB staging
// buffer taken and given back, through the allocator (one MallocHost in
// all) and straight from the driver (one MallocHost+FreeHost each time);
// sim-ns/op is the driver time the cost model charges.
func BenchmarkCachedVsRaw(b *testing.B) {
	b.Run("cached", func(b *testing.B) {
		e, err := emulated.New(emulated.WithCostModel(emulated.DefaultCostModel()))
		require.NoError(b, err)
		a, err := New(e, DefaultConfig())
		require.NoError(b, err)
		defer a.Close()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			p, err := a.Malloc(256 << 10)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(e.SimulatedTime().Nanoseconds())/float64(b.N), "sim-ns/op")
	})
}
