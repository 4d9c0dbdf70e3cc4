package integrity_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/integrity"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// recorder is a testing.TB whose failures are recorded instead of ending
// the test, so that Run's own failures can be asserted.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); r.FailNow() }
func (r *recorder) FailNow()                          { runtime.Goexit() }

// run calls integrity.Run on its own goroutine (FailNow ends it).
func (r *recorder) run(d backend.Driver, o integrity.Options) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		integrity.Run(r, d, o)
	}()
	<-done
}

// TestRunMisuse: options that would make a run do nothing fail it, and a
// run that fails part-way (a copy fault) still gives back everything it
// allocated.
func TestRunMisuse(t *testing.T) {
	for _, o := range []integrity.Options{{Ops: -1}, {Workers: -2}, {MaxLive: -1}, {VerifyEvery: -1}} {
		e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(1<<30))
		require.NoError(t, err)
		r := &recorder{TB: t}
		r.run(e, o)
		assert.True(t, r.failed, "%+v", o)
		assert.Contains(t, fmt.Sprint(r.msgs), "negative", "%+v", o)
		assert.Zero(t, e.Live().Reservations, "nothing was reserved")
		require.NoError(t, e.Close())
	}

	e, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(1<<30))
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.FailNth(backend.OpMemcpy, 40, backend.ErrUnavailable))
	r := &recorder{TB: t}
	r.run(e, integrity.Options{Ops: 100, Workers: 2})
	assert.True(t, r.failed, "the copy fault fails the run")
	live := e.Live()
	assert.Zero(t, live.Reservations+live.Mappings+live.Handles, "a failed run leaves the driver empty: %+v", live)
}
