package integrity_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/integrity"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func newReal(t *testing.T) *emulated.Emulator {
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(256<<20), emulated.WithGranularity(64<<10))
	if err != nil {
		t.Skipf("real memory unavailable: %v", err)
	}
	t.Cleanup(func() {
		assert.Empty(t, e.Violations())
		require.NoError(t, e.Close())
	})
	return e
}

func TestEmulatedRealMemory(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:False", "expandable_segments:True,handle_cache_mb:0,release_threshold_mb:0"} {
		t.Run(conf, func(t *testing.T) {
			r := integrity.Run(t, newReal(t), integrity.Options{Config: conf, Ops: 300})
			assert.Greater(t, r.Mallocs, 300, "three workers of 300 operations each allocate")
			assert.Equal(t, r.Mallocs, r.Frees, "every block is freed")
			assert.Positive(t, r.Verified)
			assert.Positive(t, r.PeakReserved)
		})
	}
}

// corrupting overwrites the first byte of every new block's memory after
// the allocator handed it out and the test wrote its pattern, through a
// second Copier call: Run must notice.
type corrupting struct {
	*emulated.Emulator
	n int
}

func (c *corrupting) CopyHtoD(dst uintptr, src []byte, s backend.Stream) error {
	if err := c.Emulator.CopyHtoD(dst, src, s); err != nil || len(src) == 0 {
		return err
	}
	c.n++
	if c.n == 40 {
		return c.Emulator.Memset(dst, src[0]^0xff, 1, s)
	}
	return nil
}

func TestDetectsCorruption(t *testing.T) {
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		integrity.Run(ft, &corrupting{Emulator: newReal(t)}, integrity.Options{Ops: 100, Workers: 1})
	}()
	require.True(t, ft.failed, "a corrupted block went unnoticed")
	assert.Contains(t, ft.msg, "corrupted at byte 0")
}

// reusingIDs hands out, at its second CreatePhysical, the id of the first
// handle (still live: the allocator caches what it maps), as a driver whose
// handles a stray close merged would.
type reusingIDs struct {
	*emulated.Emulator
	n     int
	first backend.Handle
}

func (r *reusingIDs) CreatePhysical(size uint64, prop backend.PhysicalProp) (backend.Handle, error) {
	h, err := r.Emulator.CreatePhysical(size, prop)
	if err != nil {
		return h, err
	}
	r.n++
	switch r.n {
	case 1:
		r.first = h
	case 2:
		return r.first, nil
	}
	return h, nil
}

// TestRunsUnderHandleCheck: Run drives the allocator through the
// handle-lifetime checker, so a driver that hands out a live handle's id
// again fails the run by name, even though the allocator survives the
// refused call.
func TestRunsUnderHandleCheck(t *testing.T) {
	ft := &fakeT{TB: t}
	e := newReal(t)
	func() {
		defer func() { _ = recover() }()
		integrity.Run(ft, &reusingIDs{Emulator: e}, integrity.Options{Ops: 100, Workers: 1, Config: "large_segment_size_mb:2"})
	}()
	require.True(t, ft.failed, "a reused handle id went unnoticed")
	assert.Contains(t, ft.msg, "id reused while live")
	for _, h := range e.Handles() { // the handle the checker kept from the allocator
		_ = e.FreePhysical(h.Handle)
	}
}

// fakeT records a failure instead of failing the test.
type fakeT struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeT) Errorf(format string, args ...any) {
	f.failed = true
	f.msg += fmt.Sprintf(format, args...)
}

func (f *fakeT) FailNow() { panic("FailNow") }

// TestSleepCyclesRealMemory runs the sleep/wake integrity test over the
// emulator's real memory.
func TestSleepCyclesRealMemory(t *testing.T) {
	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(256<<20))
	if err != nil {
		t.Skipf("no real memory: %v", err)
	}
	for _, conf := range []string{"", "large_segment_size_mb:2", "large_segment_size_mb:2,expandable_handle_mb:4,handle_cache_mb:0"} {
		r := integrity.SleepCycles(t, e, integrity.SleepOptions{Config: conf})
		require.Equal(t, 6, r.Cycles)
		require.Positive(t, r.Verified)
		require.Empty(t, e.Violations())
	}
}
