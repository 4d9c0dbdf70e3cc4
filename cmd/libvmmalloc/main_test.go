package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/pluggable"
	"github.com/vmmalloc/vmmalloc/backend"
)

// brokenDriver panics in every method but DeviceCount (its embedded
// Driver is nil): a stand-in for a bug anywhere below the entry points.
type brokenDriver struct{ backend.Driver }

func (brokenDriver) DeviceCount() int { return 1 }

// TestPanicBecomesError: a panic below an entry point comes back as its
// error return and a last error, not as a crash of the C caller.
func TestPanicBecomesError(t *testing.T) {
	libOnce.Do(func() {}) // no VMMALLOC_CONF: the Library is this one
	old := lib
	lib = pluggable.New(pluggable.Options{Driver: brokenDriver{}, Log: io.Discard})
	defer func() { lib = old }()

	assert.Zero(t, alloc(4096, 0, 0, allocator.PoolID{}))
	assert.Contains(t, lastError(), "vmmalloc_alloc: internal error (recovered panic)")
	lib.SetLastError("")
	free(0x1000, 0)
	assert.Contains(t, lastError(), "vmmalloc_free: internal error (recovered panic)")
	assert.Equal(t, -1, call("vmmalloc_empty_cache", func(l *pluggable.Library) error { return l.EmptyCache(0) }))
	assert.Contains(t, lastError(), "vmmalloc_empty_cache: internal error (recovered panic)")
	assert.Nil(t, statsJSON(0))
	assert.Contains(t, lastError(), "vmmalloc_stats_json: internal error (recovered panic)")
	require.Equal(t, 0, call("vmmalloc_init", func(l *pluggable.Library) error { return l.Init(1) }))
}
