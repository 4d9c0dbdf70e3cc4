package fuzz

import (
	"fmt"
	"strings"
	"testing"
)

// FuzzAllocator runs operation sequences against the default configuration
// (expandable segments) on a 512 MiB device, with three streams besides the
// default one, every stream held until the input completes its work, and
// three private pools (a limited, an isolated and a classic one) that
// Mallocs draw from, watched by a registrar hook (pools_test.go).
func FuzzAllocator(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newHarness(t, harnessConfig{
			conf: "handle_cache_mb:64", capacity: 512 * mib, streams: 3, manual: true, pools: true,
		})
		h.run(data)
		h.finish()
	})
}

// configFor decodes the first four bytes of a FuzzAllocatorConfig input into
// a harness configuration; the rest are operations.
func configFor(b [4]byte) harnessConfig {
	var kv []string
	add := func(format string, args ...any) { kv = append(kv, fmt.Sprintf(format, args...)) }
	expandable := b[0]&1 == 0
	add("expandable_segments:%v", expandable)
	small := []int{2, 4}[b[0]>>1&1]
	large := []int{20, 2, 8, 6}[b[0]>>2&3]
	large = max(large, small)
	add("small_segment_size_mb:%d,large_segment_size_mb:%d", small, large)
	if ms := []int{0, 20, 64, 128}[b[0]>>4&3]; ms != 0 {
		add("max_split_size_mb:%d", ms)
	}
	add("max_non_split_rounding_mb:%d", []int{20, 0}[b[0]>>6&1])
	if rt := []int{-1, 0, 4, 64}[b[1]&3]; rt >= 0 {
		add("release_threshold_mb:%d", rt)
	}
	add("handle_cache_mb:%d", []int{0, 8, 256, 0}[b[1]>>2&3])
	add("max_segments_per_pool:%d", []int{2, 1}[b[1]>>4&1])
	if d := []string{"", "2", "4", "[1:1,2:4,>:8]"}[b[1]>>5&3]; d != "" {
		add("roundup_power2_divisions:%s", d)
	}
	if df := []string{"", "off", "0", "0.5"}[b[2]>>4&3]; df != "" {
		add("defrag_threshold:%s", df)
	}
	if eh := []int{-1, 0, 8, 24}[b[2]>>6&3]; eh >= 0 {
		add("expandable_handle_mb:%d", eh)
	}
	if fr := []string{"", "0.75", "0.5", ""}[b[2]&3]; fr != "" {
		add("per_process_memory_fraction:%s", fr)
		if gc := []string{"", "0.5", "0.8", ""}[b[2]>>2&3]; gc != "" {
			add("garbage_collection_threshold:%s", gc)
		}
	}
	return harnessConfig{
		conf:      strings.Join(kv, ","),
		capacity:  []uint64{256 * mib, 512 * mib, 1 * gib, 384 * mib}[b[3]&3],
		streams:   int(b[3]>>2&3) + 1,
		closeLive: b[3]&0x10 != 0,
		manual:    b[3]&0x20 == 0,
		pools:     b[3]&0x40 != 0,
	}
}

// FuzzAllocatorConfig is FuzzAllocator over a configuration chosen by the
// input's first four bytes: expandable or classic segments, page sizes,
// max_split_size, release threshold, handle cache, VA budget, rounding,
// defragmentation, growth handle size, memory fraction and garbage collection, capacity,
// streams, whether streams are held, whether the allocator is closed
// with blocks still allocated, and whether private pools and a registrar
// hook take part (pools_test.go).
func FuzzAllocatorConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var cb [4]byte
		copy(cb[:], data)
		h := newHarness(t, configFor(cb))
		if len(data) > 4 {
			h.run(data[4:])
		}
		h.finish()
	})
}

// realConfigs are the allocator configurations FuzzRealMemory chooses from:
// pages of 1 and 2 MiB (the emulator's granularity is 64 KiB).
var realConfigs = []string{
	"small_segment_size_mb:1,large_segment_size_mb:2,handle_cache_mb:4",
	"small_segment_size_mb:1,large_segment_size_mb:2,handle_cache_mb:0,release_threshold_mb:2",
	"expandable_segments:False,small_segment_size_mb:1,large_segment_size_mb:2",
	"small_segment_size_mb:2,large_segment_size_mb:2,max_segments_per_pool:1,roundup_power2_divisions:4",
}

// FuzzRealMemory runs operation sequences over the real-memory backing
// (Linux) on a 32 MiB device: every live block holds a pattern unique to
// it, verified after every operation. The first byte chooses the
// configuration.
func FuzzRealMemory(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var c byte
		if len(data) > 0 {
			c, data = data[0], data[1:]
		}
		h := newHarness(t, harnessConfig{
			conf: realConfigs[int(c)%len(realConfigs)], capacity: 32 * mib, real: true,
			streams: 2, manual: c&0x80 == 0,
		})
		h.run(data)
		h.finish()
	})
}
