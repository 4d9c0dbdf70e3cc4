package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// noAutoGC turns the garbage collector's own cycles off for the test, so
// that only the ladder's (and the test's) collections free dropped
// Buffers and the figures the test asserts are exact.
func noAutoGC(t *testing.T) {
	old := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// dropBuffers allocates n Buffers of size bytes on s one after another and
// drops each without freeing it. It returns the first error.
func dropBuffers(a *Allocator, n int, size uint64, s backend.Stream) error {
	for i := range n {
		b, err := a.NewBuffer(size, s)
		if err != nil {
			return fmt.Errorf("buffer %d: %w", i, err)
		}
		if b.Ptr() == 0 || b.Size() != size {
			return fmt.Errorf("buffer %d: %#x, %d bytes", i, b.Ptr(), b.Size())
		}
	}
	return nil
}

// collectAll collects until no owned Buffer is left: the Buffers the
// caller dropped are all unreachable, so one collection finds them.
func collectAll(t *testing.T, a *Allocator) {
	t.Helper()
	_, err := a.CollectBuffers()
	require.NoError(t, err)
	st := a.Stats()
	require.Zero(t, st.OwnedBytes, "owned bytes after a collection")
	require.Zero(t, a.MemoryAllocated(), "allocated bytes after a collection")
}

// The device holds 4 buffers; 200 are allocated and dropped. The ladder
// collects the dropped ones whenever the device is full.
func TestBufferDroppedCollectedOnOOM(t *testing.T) {
	noAutoGC(t)
	const size = 2 << 20
	a, e := newAlloc(t, "", emulated.WithCapacity(4*size))
	require.NoError(t, dropBuffers(a, 200, size, 0))
	st := a.Stats()
	assert.Zero(t, st.NumOOMs)
	// Each collection finds the 4 buffers that filled the device (the one
	// asked for is not yet allocated): 196 collections of 4 buffers, but
	// the first after 4 allocations.
	assert.Equal(t, int64(49), st.NumOwnedCollections)
	assert.Equal(t, int64(196*size), st.OwnedReclaimedBytes)
	assert.Equal(t, int64(4*size), st.OwnedBytes, "the last 4 are not collected yet")
	mustCheck(t, a, e)
	collectAll(t, a)
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryReserved())
	mustCheck(t, a, e)
}

// With owned_buffer_gc off, the same loop fails on the 5th buffer with an
// OutOfMemoryError that names what the dropped buffers hold.
func TestBufferGCOffReportsOwned(t *testing.T) {
	noAutoGC(t)
	const size = 2 << 20
	a, e := newAlloc(t, "owned_buffer_gc:False", emulated.WithCapacity(4*size))
	err := dropBuffers(a, 200, size, 0)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Contains(t, err.Error(), "buffer 4:")
	var oom *OutOfMemoryError
	require.True(t, errors.As(err, &oom))
	assert.Equal(t, uint64(4*size), oom.Owned)
	assert.False(t, oom.OwnedGC)
	assert.Contains(t, oom.Error(), "8.0 MiB is held by owned buffers not yet freed, collectable by the garbage collector once unreachable (owned_buffer_gc is off)")
	st := a.Stats()
	assert.Zero(t, st.NumOwnedCollections)
	assert.Equal(t, int64(1), st.NumOOMs)
	mustCheck(t, a, e)
	// Nothing leaked: a collection returns all of it.
	n, err := a.CollectBuffers()
	require.NoError(t, err)
	assert.Equal(t, uint64(4*size), n)
	collectAll(t, a)
	mustCheck(t, a, e)
}

// Buffers kept reachable fill the device: the ladder's collection finds
// nothing, and the OutOfMemoryError says they are reachable.
func TestBufferReachableNotCollected(t *testing.T) {
	noAutoGC(t)
	const size = 2 << 20
	a, e := newAlloc(t, "", emulated.WithCapacity(4*size))
	var kept []*Buffer
	for range 4 {
		b, err := a.NewBuffer(size, 0)
		require.NoError(t, err)
		kept = append(kept, b)
	}
	_, err := a.NewBuffer(size, 0)
	var oom *OutOfMemoryError
	require.True(t, errors.As(err, &oom), "%v", err)
	assert.Equal(t, uint64(4*size), oom.Owned)
	assert.True(t, oom.OwnedGC)
	assert.Contains(t, oom.Error(), "8.0 MiB is still held by owned buffers after a garbage collection")
	st := a.Stats()
	assert.Equal(t, int64(1), st.NumOwnedCollections)
	assert.Zero(t, st.OwnedReclaimedBytes)
	for _, b := range kept {
		require.NoError(t, b.Free(), "still allocated: the collection freed none")
	}
	assert.Zero(t, a.MemoryAllocated())
	mustCheck(t, a, e)
}

// Buffers kept alive across many collections keep their memory and their
// contents; the dropped ones never overlap them.
func TestBufferKeptAliveNeverFreed(t *testing.T) {
	const size = 256 << 10
	a, e := newAlloc(t, "", emulated.WithRealMemory(), emulated.WithCapacity(4<<20))
	fill := func(b *Buffer, v byte) {
		require.NoError(t, e.CopyHtoD(b.Ptr(), bytes.Repeat([]byte{v}, size), b.Stream()))
	}
	var kept []*Buffer
	for i := range 3 {
		b, err := a.NewBuffer(size, 0)
		require.NoError(t, err)
		fill(b, byte(0xa0+i))
		kept = append(kept, b)
	}
	overlaps := func(p uintptr) bool {
		for _, k := range kept {
			if p < k.Ptr()+uintptr(size) && k.Ptr() < p+uintptr(size) {
				return true
			}
		}
		return false
	}
	for i := range 300 {
		b, err := a.NewBuffer(size, 0)
		require.NoError(t, err, "buffer %d", i)
		require.False(t, overlaps(b.Ptr()), "buffer %d at %#x overlaps a kept one", i, b.Ptr())
		fill(b, byte(i))
	}
	require.Positive(t, a.Stats().NumOwnedCollections+a.Stats().OwnedReclaimedBytes, "the device filled up")
	for i, k := range kept {
		mem := make([]byte, size)
		require.NoError(t, e.CopyDtoH(mem, k.Ptr(), k.Stream()))
		require.Equal(t, bytes.Repeat([]byte{byte(0xa0 + i)}, size), mem, "kept buffer %d", i)
	}
	_, err := a.CollectBuffers()
	require.NoError(t, err)
	assert.Equal(t, uint64(3*size), uint64(a.Stats().OwnedBytes), "only the kept ones are left")
	for _, k := range kept {
		require.NoError(t, k.Free())
	}
	collectAll(t, a)
	mustCheck(t, a, e)
}

// Goroutines on their own streams drop buffers, free others explicitly
// (twice), and collect, all at once, on a device that holds a few dozen.
// A Malloc may lose the memory its collection returned to another
// goroutine's (as any out-of-memory ladder under contention may), so out
// of memory is allowed here; anything else, a race, a leak or a broken
// invariant is not.
func TestBufferConcurrentStreams(t *testing.T) {
	const (
		size    = 1 << 20
		workers = 4
		each    = 100
	)
	a, e := newAlloc(t, "", emulated.WithCapacity(32*size))
	var wg sync.WaitGroup
	errs := make([]error, workers+1)
	ooms := make([]int, workers)
	var streams []backend.Stream
	for w := range workers {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
		wg.Go(func() {
			for i := range each {
				b, err := a.NewBuffer(size+uint64(w)*4096, s)
				if errors.Is(err, ErrOutOfMemory) {
					ooms[w]++
					continue
				}
				if err != nil {
					errs[w] = fmt.Errorf("worker %d buffer %d: %w", w, i, err)
					return
				}
				if i%3 == 0 { // some are freed explicitly, twice
					if err := errors.Join(b.Free(), b.Free()); err != nil {
						errs[w] = err
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for range 10 {
			if _, err := a.CollectBuffers(); err != nil {
				errs[workers] = err
				return
			}
		}
	})
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	t.Logf("out of memory %v times of %d per worker; %d collections by the ladder", ooms, each, a.Stats().NumOwnedCollections)
	collectAll(t, a)
	mustCheck(t, a, e)
	for _, s := range streams {
		require.NoError(t, a.ReleaseStream(s))
		require.NoError(t, e.StreamDestroy(s))
	}
}

func TestBufferMisuse(t *testing.T) {
	a, e := newAlloc(t, "")
	s, err := e.StreamCreate(0)
	require.NoError(t, err)

	b, err := a.NewBuffer(4096, 0)
	require.NoError(t, err)
	assert.Equal(t, a.DefaultStream(), b.Stream(), "stream 0 is the default stream")
	assert.Equal(t, 0, b.Device())
	require.NoError(t, b.RecordStream(s))
	require.NoError(t, b.Free())
	require.NoError(t, b.Free(), "Free is idempotent")
	require.ErrorIs(t, b.RecordStream(s), ErrDoubleFree)
	require.ErrorIs(t, a.Free(b.Ptr()), ErrDoubleFree, "the allocator freed it once")

	_, err = a.NewBuffer(0, 0)
	require.ErrorIs(t, err, ErrInvalidSize)
	assert.Zero(t, a.Stats().OwnedBytes, "a failed NewBuffer records nothing")

	live, err := a.NewBuffer(4096, s)
	require.NoError(t, err)
	require.NoError(t, a.Synchronize(s))
	require.NoError(t, a.Close())
	require.ErrorIs(t, live.Free(), ErrClosed)
	require.ErrorIs(t, live.Free(), ErrClosed)
	_, err = a.NewBuffer(4096, 0)
	require.ErrorIs(t, err, ErrClosed)
	_, err = a.CollectBuffers()
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, e.StreamDestroy(s))
}

func TestConfigOwnedBufferGC(t *testing.T) {
	c, err := ParseConfig("")
	require.NoError(t, err)
	assert.True(t, c.OwnedBufferGC, "on by default")
	c, err = ParseConfig("owned_buffer_gc:False")
	require.NoError(t, err)
	assert.False(t, c.OwnedBufferGC)
	assert.Contains(t, c.String(), "owned_buffer_gc:False")
	back, err := ParseConfig(c.String())
	require.NoError(t, err)
	assert.Equal(t, c, back)
	_, err = ParseConfig("owned_buffer_gc:maybe")
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "owned_buffer_gc")
}
