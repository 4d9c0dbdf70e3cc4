package host

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// faultOps are the driver primitives the host allocator calls.
var faultOps = []backend.Op{
	backend.OpMallocHost, backend.OpFreeHost, backend.OpHostRegister, backend.OpHostUnregister,
	backend.OpHostDevicePointer, backend.OpEventCreate, backend.OpEventRecord, backend.OpEventQuery,
	backend.OpEventSync, backend.OpStreamSync, backend.OpEventDestroy,
}

// hostModel is the reference: what the caller holds, and which ranges
// device work may still touch.
type hostModel struct {
	live     map[uintptr]uint64 // allocated pointer → nbytes asked for
	order    []uintptr          // live pointers, in allocation order
	busy     []busyRange        // freed ranges with work pending on a recorded stream
	launched map[backend.Stream]int
	regs     map[uintptr]bool // registered slots of own memory
}

// busyRange is a freed block that device work queued on stream up to
// position seq still uses.
type busyRange struct {
	p, end uintptr
	stream backend.Stream
	seq    int
}

// fuzzHost drives one allocator with the operations encoded in data,
// comparing with the model after each and with the driver at checkpoints.
// With faultN > 0, the faultN-th call of faultOp fails.
// faultN < 0 runs the sweep's baseline. A sweep (faultN ≠ 0) skips the
// in-between checks, which call the driver too, so that the armed fault
// stays armed until it fires. It returns how many calls of faultOp failed and
// how many calls of each primitive were made, up to the final check.
func fuzzHost(t *testing.T, data []byte, faultOp backend.Op, faultN int) (failed int64, calls emulated.CallCounts) {
	if len(data) < 2 {
		return 0, calls
	}
	mode, data := data[0], data[1:]
	conf := "expandable_segments:False"
	if mode&16 != 0 {
		// Expandable segments register OS memory, which the emulator's
		// host capacity does not count: a budget of three chunks makes
		// the out-of-memory ladder climb instead.
		conf = "expandable_segments:True,pinned_budget_mb:6"
	}
	if mode&1 != 0 {
		conf += ",pinned_use_host_register:True"
	}
	conf += fmt.Sprintf(",pinned_roundup_power2_divisions:%d", 1<<(mode>>1&3))
	randomFaults := mode&8 != 0
	a, e := newHost(t, conf, emulated.WithManualCompletion(), emulated.WithHostCapacity(2*mib))
	m := &hostModel{live: map[uintptr]uint64{}, launched: map[backend.Stream]int{}, regs: map[uintptr]bool{}}
	var streams, dead []backend.Stream // dead: destroyed by the fuzzer
	for i := 0; i < 3; i++ {
		s, err := e.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	own := mmapPages(t, 4*16*kib)
	arm := func(seed uint64) {
		if randomFaults {
			for i, op := range faultOps {
				require.NoError(t, e.FailRandom(op, 0.05, seed+uint64(i), backend.ErrOutOfMemory))
			}
		}
	}
	arm(1)
	if faultN > 0 {
		kind := backend.ErrOutOfMemory // climbs the OOM ladder where Malloc sees it
		if faultN%2 == 0 {
			kind = backend.ErrUnavailable
		}
		require.NoError(t, e.FailNth(faultOp, faultN, kind))
	}
	failures := func() int64 {
		var n int64
		for _, op := range faultOps {
			n += e.Failures(op)
		}
		return n
	}
	completed := func(s backend.Stream) int {
		n, err := e.Pending(s)
		if err != nil { // destroyed, with no work left
			return m.launched[s]
		}
		return m.launched[s] - n
	}
	pick := func(b byte) (uintptr, bool) {
		if len(m.order) == 0 {
			return 0, false
		}
		return m.order[int(b)%len(m.order)], true
	}
	drop := func(p uintptr) {
		delete(m.live, p)
		for i, q := range m.order {
			if q == p {
				m.order = append(m.order[:i], m.order[i+1:]...)
				break
			}
		}
	}
	// faulted reports whether the call that just ran hit an injected
	// fault; if not, err must be nil.
	expectOK := func(what string, f0 int64, err error) bool {
		if failures() != f0 {
			if err != nil {
				var be *backend.Error
				require.True(t, errors.As(err, &be) || errors.Is(err, ErrOutOfMemory), "%s: %v", what, err)
			}
			return err != nil
		}
		require.NoError(t, err, what)
		return false
	}
	sizes := []uint64{1, 4 * kib, 5000, 12 * kib, 64 * kib, 100 * kib, 256 * kib, 1 * mib, 3 * mib}
	for len(data) >= 3 {
		op, x, y := data[0], data[1], data[2]
		data = data[3:]
		f0 := failures()
		switch op % 10 {
		case 0, 1: // Malloc
			size := sizes[int(x)%len(sizes)] + uint64(y)
			p, err := a.Malloc(size)
			if err != nil {
				if !errors.Is(err, ErrOutOfMemory) {
					expectOK("Malloc", f0, err)
				}
				break
			}
			require.Zero(t, p%pageSize)
			for q, n := range m.live {
				require.False(t, p < q+uintptr(n) && q < p+uintptr(size), "Malloc %#x+%d overlaps live %#x+%d", p, size, q, n)
			}
			for _, br := range m.busy {
				if completed(br.stream) < br.seq {
					require.False(t, p < br.end && br.p < p+uintptr(size), "Malloc %#x reuses memory work on stream %d still uses", p, br.stream)
				}
			}
			m.live[p] = size
			m.order = append(m.order, p)
		case 2, 3: // Free
			p, ok := pick(x)
			if !ok {
				break
			}
			a.mu.Lock()
			var uses []backend.Stream
			for _, ss := range a.lookup(p).uses {
				uses = append(uses, ss.stream)
			}
			a.mu.Unlock()
			if expectOK("Free", f0, a.Free(p)) {
				require.Equal(t, int64(len(m.live)), a.Stats().Allocation.Current, "failed Free changed the allocation count")
				break
			}
			for _, s := range uses {
				m.busy = append(m.busy, busyRange{p: p, end: p + uintptr(m.live[p]), stream: s, seq: m.launched[s]})
			}
			drop(p)
			require.ErrorIs(t, a.Free(p), ErrDoubleFree)

		case 4: // work on a stream, recorded
			p, ok := pick(x)
			if !ok {
				break
			}
			if y&0x40 != 0 && len(dead) > 0 { // a destroyed stream: refused, the block unchanged
				a.mu.Lock()
				uses := len(a.lookup(p).uses)
				a.mu.Unlock()
				require.ErrorIs(t, a.RecordStream(p, dead[int(y)%len(dead)]), ErrInvalidStream)
				a.mu.Lock()
				require.Len(t, a.lookup(p).uses, uses)
				a.mu.Unlock()
				break
			}
			s := streams[int(y)%len(streams)]
			if !a.cfg.UseHostRegister && a.exp == nil { // the emulator sees host work only on MallocHost memory
				require.NoError(t, e.Launch(s, p, m.live[p]))
				m.launched[s]++
			}
			require.NoError(t, a.RecordStream(p, s))
		case 5: // work completes, or the stream is destroyed and replaced
			s := streams[int(x)%len(streams)]
			if y == 255 {
				require.NoError(t, e.StreamDestroy(s))
				dead = append(dead, s)
				ns, err := e.StreamCreate(0)
				require.NoError(t, err)
				streams[int(x)%len(streams)] = ns
				break
			}
			n, err := e.Pending(s)
			require.NoError(t, err)
			if n = min(n, int(y%4)+1); n > 0 {
				require.NoError(t, e.CompleteN(s, n))
			}
		case 6:
			expectOK("EmptyCache", f0, a.EmptyCache())
		case 7: // device address
			p, ok := pick(x)
			if !ok {
				break
			}
			off := uintptr(y) * 61 % uintptr(m.live[p])
			d, err := a.DevicePointer(p + off)
			if !expectOK("DevicePointer", f0, err) {
				require.NotZero(t, d)
			}
		case 8: // register or unregister a slot of own memory
			slot := own + uintptr(x%4)*16*kib
			if m.regs[slot] {
				if !expectOK("Unregister", f0, a.Unregister(slot)) {
					delete(m.regs, slot)
				}
				break
			}
			flags := backend.HostRegisterMapped
			if y&1 != 0 {
				flags = backend.HostRegisterPinned
			}
			if !expectOK("Register", f0, a.Register(slot, uint64(y%16+1)*kib, flags)) {
				m.regs[slot] = true
			}
		case 9: // bad input, then a full check with faults disarmed
			require.Error(t, a.Free(uintptr(x)<<12+uintptr(y)))
			if faultN != 0 {
				break
			}
			e.ClearFaults()
			mustCheck(t, a, e)
			arm(uint64(x)<<8 | uint64(y))
		}
		require.Equal(t, int64(len(m.live)), a.Stats().Allocation.Current)
	}
	failed, calls = e.Failures(faultOp), e.CallCounts()
	e.ClearFaults()
	mustCheck(t, a, e)
	for _, p := range m.order {
		require.NoError(t, a.Free(p))
	}
	mustCheck(t, a, e)
	require.NoError(t, a.Close())
	assertNothingHeld(t, e)
	return failed, calls
}

func FuzzHostAllocator(f *testing.F) {
	f.Add([]byte{0, 0, 3, 0, 4, 0, 1, 2, 0, 0, 5, 0, 3, 0, 0, 0, 0, 0, 9, 1, 1})
	f.Add([]byte{8, 0, 3, 0, 0, 5, 0, 4, 0, 1, 7, 0, 9, 2, 0, 0, 6, 0, 0, 8, 1, 3, 9, 0, 0})
	f.Add([]byte{9, 1, 2, 3, 0, 7, 7, 4, 0, 2, 8, 0, 4, 2, 1, 1, 6, 1, 1, 5, 2, 2, 0, 8, 0, 9, 3, 3})
	f.Add([]byte{14, 0, 8, 0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 2, 0, 0, 2, 0, 0, 2, 0, 0, 0, 7, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 4, 1, 0, 5, 0, 255, 2, 0, 0, 4, 0, 0, 2, 0, 0, 9, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = fuzzHost(t, data, 0, 0)
	})
}

// TestFaultSweep fails the n-th call of each primitive in turn, for every n
// up to 40, during a fixed pseudo-random scenario: every failure must leave
// the allocator consistent with the model and the driver, and Close must
// leave nothing behind. The scenario is deterministic up to the failing
// call, so the fault fires whenever the run without faults makes that many
// calls.
func TestFaultSweep(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	scenario := make([]byte, 900)
	for i := range scenario {
		scenario[i] = byte(r.UintN(256))
	}
	for _, mode := range []byte{0, 1, 4, 16} {
		data := append([]byte{mode}, scenario...)
		var base emulated.CallCounts
		t.Run(fmt.Sprintf("mode%d/none", mode), func(t *testing.T) { _, base = fuzzHost(t, data, 0, -1) })
		swept := 0
		for _, op := range faultOps {
			for n := 1; n <= 40 && int64(n) <= base[op]; n++ {
				swept++
				t.Run(fmt.Sprintf("mode%d/%v/%d", mode, op, n), func(t *testing.T) {
					failed, _ := fuzzHost(t, data, op, n)
					require.Positive(t, failed, "the fault did not fire")
				})
			}
		}
		t.Logf("mode %d: %d faults swept; calls without faults: %v", mode, swept, base)
		// Expandable segments (mode 16) pin a chunk per 2 MiB, so the
		// scenario makes fewer driver calls to fail.
		require.Greater(t, swept, map[bool]int{false: 100, true: 60}[mode&16 != 0])
	}
}
