package host

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

// TestClosedBeforeArguments: after Close every method that can fail
// returns ErrClosed, whatever its arguments, and calls no driver; a bad
// argument is not reported first (the device allocator's contract; Check
// too).
func TestClosedBeforeArguments(t *testing.T) {
	for _, conf := range []string{"expandable_segments:False", "expandable_segments:True"} {
		t.Run(conf, func(t *testing.T) { testClosedBeforeArguments(t, conf) })
	}
}

// testClosedBeforeArguments is TestClosedBeforeArguments under policy conf.
func testClosedBeforeArguments(t *testing.T, conf string) {
	a, e := newHost(t, conf)
	require.NoError(t, a.Close())
	cases := []struct {
		name string
		call func() error
	}{
		{"Malloc 0", func() error { _, err := a.Malloc(0); return err }},
		{"Malloc 2^64-1", func() error { _, err := a.Malloc(math.MaxUint64); return err }},
		{"Free 0", func() error { return a.Free(0) }},
		{"RecordStream 0, stream 0", func() error { return a.RecordStream(0, 0) }},
		{"DevicePointer 0", func() error { _, err := a.DevicePointer(0); return err }},
		{"Register 0", func() error { return a.Register(0, 4*kib, backend.HostRegisterMapped) }},
		{"Register misaligned", func() error { return a.Register(1, 4*kib, backend.HostRegisterMapped) }},
		{"Register size 0", func() error { return a.Register(4*kib, 0, backend.HostRegisterMapped) }},
		{"Register bad flags", func() error { return a.Register(4*kib, 4*kib, 3) }},
		{"Unregister ^0", func() error { return a.Unregister(^uintptr(0)) }},
		{"RecordStream ^0, stream ^0", func() error { return a.RecordStream(^uintptr(0), ^backend.Stream(0)) }},
		{"EmptyCache", a.EmptyCache},
		{"Check", a.Check}, // ErrClosed too, not nil
		{"MallocWith 0, AllowPageable", func() error { _, err := a.MallocWith(0, MallocOptions{AllowPageable: true}); return err }},
		{"RecordHistory -1", func() error { return a.RecordHistory(-1) }},
		{"Close", a.Close},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[strings.Fields(tc.name)[0]] = true
		t.Run(tc.name, func(t *testing.T) {
			calls := e.CallCounts()
			require.ErrorIs(t, tc.call(), ErrClosed)
			assert.Equal(t, calls, e.CallCounts())
		})
	}
	// Every method that returns an error is in the table.
	errType := reflect.TypeFor[error]()
	typ := reflect.TypeOf(a)
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		if n := m.Type.NumOut(); n > 0 && m.Type.Out(n-1) == errType {
			assert.True(t, covered[m.Name], "%s is not tried after Close", m.Name)
		}
	}
}

// TestDriverFaultsChangeNothing: a driver call that fails inside Malloc,
// DevicePointer, Register or Unregister leaves the statistics and the
// driver as they were (Check agrees), and the same call then succeeds.
func TestDriverFaultsChangeNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   backend.Op
		kind error
		call func(a *Allocator, own uintptr) error
	}{
		{"Malloc: MallocHost", backend.OpMallocHost, backend.ErrUnavailable, func(a *Allocator, _ uintptr) error { _, err := a.Malloc(64 * kib); return err }},
		{"DevicePointer: HostRegister", backend.OpHostRegister, backend.ErrUnavailable, func(a *Allocator, _ uintptr) error { return devPtr(a) }},
		{"DevicePointer: HostGetDevicePointer", backend.OpHostDevicePointer, backend.ErrUnavailable, func(a *Allocator, _ uintptr) error { return devPtr(a) }},
		{"Register: HostRegister", backend.OpHostRegister, backend.ErrUnavailable, func(a *Allocator, own uintptr) error {
			return a.Register(own, 8*kib, backend.HostRegisterMapped)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, e := newHost(t, "")
			own := mmapPages(t, 16*kib)
			// DevicePointer cases need a live block made before the fault.
			p, err := a.Malloc(4 * kib)
			require.NoError(t, err)
			before := a.Stats()
			require.NoError(t, e.FailNth(tc.op, 1, tc.kind))
			err = tc.call(a, own)
			require.ErrorIs(t, err, tc.kind)
			assert.Equal(t, before, a.Stats())
			mustCheck(t, a, e)
			require.NoError(t, tc.call(a, own), "the retry succeeds")
			mustCheck(t, a, e)
			require.NoError(t, a.Free(p))
		})
	}
}

// devPtr asks for the device address of the newest allocated block.
func devPtr(a *Allocator) error {
	a.mu.Lock()
	var p uintptr
	for _, b := range a.sortedBlocks() {
		if b.state == stateAllocated && !b.pageable {
			p = b.ptr
		}
	}
	a.mu.Unlock()
	_, err := a.DevicePointer(p + 100)
	return err
}

// TestConcurrentRandomFaults: eight goroutines allocate, record streams,
// ask for device pointers, free and empty the cache while every host and
// event primitive fails at random (-race). Each error wraps the injected
// kind or ErrOutOfMemory; a failed Free leaves the block allocated and is
// retried; at the end, faults cleared, everything frees and Check holds.
func TestConcurrentRandomFaults(t *testing.T) {
	a, e := newHost(t, "")
	var streams []backend.Stream
	for range 3 {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	for i, op := range []backend.Op{backend.OpMallocHost, backend.OpFreeHost, backend.OpHostRegister, backend.OpHostUnregister,
		backend.OpHostDevicePointer, backend.OpEventCreate, backend.OpEventDestroy, backend.OpEventRecord, backend.OpEventQuery,
		backend.OpEventSync, backend.OpStreamSync, backend.OpDeviceSync} {
		require.NoError(t, e.FailRandom(op, 0.05, uint64(i)+1, backend.ErrUnavailable))
	}
	ok := func(err error) bool {
		return err == nil || errors.Is(err, backend.ErrUnavailable) || errors.Is(err, ErrOutOfMemory)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 11))
			var live []uintptr
			for range 300 {
				if len(live) > 0 && r.IntN(2) == 0 {
					j := r.IntN(len(live))
					p := live[j]
					if r.IntN(2) == 0 {
						assert.True(t, ok(a.RecordStream(p, streams[r.IntN(len(streams))])))
					}
					if r.IntN(4) == 0 {
						_, err := a.DevicePointer(p + 1)
						assert.True(t, ok(err), "DevicePointer: %v", err)
					}
					if err := a.Free(p); err != nil {
						assert.True(t, ok(err), "Free: %v", err)
						continue
					}
					live = append(live[:j], live[j+1:]...)
					continue
				}
				p, err := a.Malloc(1 + r.Uint64N(128*kib))
				if err != nil {
					assert.True(t, ok(err), "Malloc: %v", err)
					continue
				}
				live = append(live, p)
				if r.IntN(40) == 0 {
					assert.True(t, ok(a.EmptyCache()))
				}
			}
			for len(live) > 0 {
				if err := a.Free(live[0]); err != nil {
					assert.True(t, ok(err), "Free: %v", err)
					continue
				}
				live = live[1:]
			}
		}()
	}
	wg.Wait()
	var failed int64
	for op := backend.OpGranularity; op <= backend.OpDeviceSync; op++ {
		failed += e.Failures(op)
	}
	assert.Greater(t, failed, int64(10), "faults were injected")
	e.ClearFaults()
	require.NoError(t, a.EmptyCache())
	mustCheck(t, a, e)
	assert.Zero(t, a.Stats().Allocation.Current)
}

// TestParseConfigMisuse: bad configuration strings are refused naming the
// key, as the device allocator's are; a key set twice included.
func TestParseConfigMisuse(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"pinned_use_host_register:True,pinned_use_host_register:False", "more than once"},
		{"pinned_roundup_power2_divisions:2, pinned_roundup_power2_divisions :2", "more than once"},
		{"pinned_use_host_register", "no value"},
		{"pinned_use_host_register:", "no value"},
		{":True", "unknown key"},
		{"pinned_use_host_register:maybe", "pinned_use_host_register"},
		{"pinned_roundup_power2_divisions:3", "pinned_roundup_power2_divisions"},
		{"pinned_roundup_power2_divisions:-1", "pinned_roundup_power2_divisions"},
		{"pinned_roundup_power2_divisions:99999999999999999999", "pinned_roundup_power2_divisions"},
		{"expandable_segments:yes", "expandable_segments"},
		{"pinned_budget_mb:-5", "pinned_budget_mb"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c, err := ParseConfig(tc.in)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, Config{}, c)
		})
	}
	c, err := ParseConfig(" , pinned_use_host_register:True,,")
	require.NoError(t, err)
	assert.True(t, c.UseHostRegister)
}

// TestCloseDuringUse: Close races Malloc, RecordStream, DevicePointer and
// Free (-race); every call returns nil or ErrClosed, and the driver holds
// nothing afterwards.
func TestCloseDuringUse(t *testing.T) {
	for round := range 4 {
		a, e := newHost(t, "")
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		okOrClosed := func(err error) bool { return err == nil || errors.Is(err, ErrClosed) }
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 200 {
					p, err := a.Malloc(uint64(1+i) << 10)
					if !assert.True(t, okOrClosed(err), "Malloc: %v", err) || err != nil {
						return
					}
					assert.True(t, okOrClosed(a.RecordStream(p, s)))
					if i%7 == 0 {
						_, err := a.DevicePointer(p)
						assert.True(t, okOrClosed(err), "DevicePointer: %v", err)
					}
					assert.True(t, okOrClosed(a.Free(p)))
				}
			}()
		}
		for range round * 50 {
			_ = a.Stats()
		}
		require.NoError(t, a.Close())
		wg.Wait()
		assertNothingHeld(t, e)
		require.NoError(t, e.StreamDestroy(s))
	}
}
