package fuzz

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSleepWakeSeedReaches runs the sleep_wake seed in FuzzAllocator's
// harness (private pools, no real memory) and in FuzzRealMemory's (the
// default pool, real memory, contents checked) and requires that it
// reaches what it was written for: a Malloc and RecordStream refused in
// an asleep pool, a sleep's unmap failing and rolling back, a handle whose
// free failed kept for Wake, a duplicate Wake refused, and (real memory)
// an offload to pinned memory woken with its contents checked.
func TestSleepWakeSeedReaches(t *testing.T) {
	for _, hc := range []harnessConfig{
		{conf: "handle_cache_mb:64", capacity: 512 * mib, streams: 3, manual: true, pools: true},
		{conf: realConfigs[0], capacity: 32 * mib, real: true, streams: 2, manual: true},
	} {
		h := newHarness(t, hc)
		h.keepTrace = true
		h.run(seedProgs()["sleep_wake"])
		h.finish()
		tr := strings.Join(h.trace, "\n")
		for _, want := range []string{
			") in asleep pool", "RecordStream(", "injected UnmapMem fault fired", "kept for Wake", "pool is awake",
		} {
			assert.Contains(t, tr, want, "real=%v", hc.real)
		}
		if hc.real {
			assert.Contains(t, tr, "Sleep(pool 0, mode 1, pinned true, keep true)\nFree(")
		} else {
			assert.Contains(t, tr, "sleep needs expandable segments")
		}
	}
}
