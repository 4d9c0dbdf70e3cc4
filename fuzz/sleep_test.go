package fuzz

import (
	"errors"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
)

// Sleep and wake in the harness.
//
// An operation byte of kClearFaults (index 30 of opTable) with its high
// bit set (0x9e, 0xbe, 0xde, 0xfe) decodes as a sleep or wake of a pool,
// so that inputs made before these operations existed keep their
// meaning: the encoder writes opTable indexes (below 32), and no input of
// the corpus has such a byte at an operation (checked when they were
// added: the seeds' operation bytes of 0x80 and above are 0x9f, 0xdc,
// 0xe8 and 0xfc). Its argument byte x picks the pool (x>>2), the call
// (x&3 == 3: Wake, else Sleep) and, for Sleep, the mode (0x80: Offload,
// else Discard), the host memory (0x40: pinned, from allocator/host, on
// real memory; else Go memory) and KeepHostBuffers (0x20).
//
// The model: a pool is asleep from a Sleep that returns nil (or an error
// wrapping segment.ErrHandleNotFreed) to a Wake that returns nil. While
// it is, its Malloc must return ErrPoolAsleep and change nothing, a
// RecordStream of its blocks must return ErrPoolAsleep without a driver
// call, its Free works; its live blocks are neither checked for their
// pattern nor required to be registered with the hook (they are
// unmapped). Every Sleep or Wake error is typed; with no fault injected
// only these are allowed: Sleep of a classic pool (ErrInvalidPool), an
// offload where the emulator cannot copy (ErrNotSupported), a Wake the
// device has no room for (*OutOfMemoryError), a call refused by the
// state (ErrPoolAsleep, ErrPoolAwake). A failed Sleep leaves the pool
// awake, a failed Wake asleep. After a Wake, offloaded blocks must hold
// their patterns (verify); discarded ones are written again. finish
// frees everything, wakes every pool still asleep and requires an empty
// device as before.

// isSleepOp reports whether operation byte op is a sleep or wake.
func isSleepOp(op byte) bool { return op&0x80 != 0 && opTable[op%32] == kClearFaults }

// sleepOpByte is the operation byte of a sleep or wake (the encoder's).
const sleepOpByte = 0xfe

// pinnedHost is the harness's pinned host allocator, made on first use.
func (h *harness) pinnedHost() allocator.HostAllocator {
	if h.pinned == nil {
		p, err := host.New(h.e, host.DefaultConfig())
		if err != nil {
			h.fatalf("host.New: %v", err)
		}
		h.pinned = p
	}
	return h.pinned
}

// sleepOp runs a Sleep or Wake (see above).
func (h *harness) sleepOp(x byte) {
	pi := int(x>>2&7) % len(h.pools)
	p := h.pools[pi]
	before := p.SleepState()
	marks := h.callMarks()
	var err error
	wake := x&3 == 3
	var mode allocator.SleepMode
	if wake {
		h.logf("Wake(pool %d)", pi)
		err = p.Wake()
	} else {
		o := allocator.SleepOptions{KeepHostBuffers: x&0x20 != 0}
		if x&0x80 != 0 {
			o.Mode = allocator.Offload
			if x&0x40 != 0 && h.cfg.real {
				o.Host = h.pinnedHost()
			}
		}
		mode = o.Mode
		h.logf("Sleep(pool %d, mode %d, pinned %v, keep %v)", pi, o.Mode, o.Host != nil, o.KeepHostBuffers)
		err = p.Sleep(o)
	}
	fired := h.fired(marks)
	after := p.SleepState()
	if err != nil {
		h.logf("  -> %v", err)
		if !typed(err) {
			h.fatalf("Sleep/Wake returned an untyped error: %v", err)
		}
	}
	switch {
	case wake && err == nil:
		if before != allocator.Asleep || after != allocator.Awake {
			h.fatalf("Wake of a pool %s succeeded and left it %s", before, after)
		}
		if h.cfg.real && h.sleepMode[pi] == allocator.Discard {
			for _, b := range h.live {
				if b.pool == pi {
					h.fill(b)
				}
			}
		}
	case wake:
		switch {
		case before == allocator.Awake:
			if !errors.Is(err, allocator.ErrPoolAwake) {
				h.fatalf("Wake of an awake pool: want ErrPoolAwake, got %v", err)
			}
		case after != allocator.Asleep:
			h.fatalf("failed Wake left the pool %s: %v", after, err)
		case !fired:
			var oom *allocator.OutOfMemoryError
			if !errors.As(err, &oom) {
				h.fatalf("Wake failed with no fault injected and not out of memory: %v", err)
			}
		}
	case err == nil:
		if before != allocator.Awake || after != allocator.Asleep {
			h.fatalf("Sleep of a pool %s succeeded and left it %s", before, after)
		}
		h.sleepMode[pi] = mode
	case before != allocator.Awake:
		if !errors.Is(err, allocator.ErrPoolAsleep) {
			h.fatalf("Sleep of a pool %s: want ErrPoolAsleep, got %v", before, err)
		}
	case errors.Is(err, segment.ErrHandleNotFreed):
		if after != allocator.Asleep || !fired {
			h.fatalf("Sleep with a handle not freed left the pool %s (fault fired: %v): %v", after, fired, err)
		}
		h.sleepMode[pi] = mode
	case after != allocator.Awake:
		h.fatalf("failed Sleep left the pool %s: %v", after, err)
	case !fired && !errors.Is(err, allocator.ErrInvalidPool) && !errors.Is(err, backend.ErrNotSupported):
		h.fatalf("Sleep failed with no fault injected: %v", err)
	}
	h.asleep[pi] = after != allocator.Awake
}

// asleepMalloc checks a Malloc in an asleep pool: refused, nothing
// changed, no driver call.
func (h *harness) asleepMalloc(size uint64, arg backend.Stream, pool int) {
	h.logf("Malloc(%d, stream %d) in asleep pool %d", size, arg, pool)
	before, calls := h.a.Stats(), h.e.CallCounts()
	_, err := h.pools[pool].Malloc(size, arg)
	if !errors.Is(err, allocator.ErrPoolAsleep) {
		h.fatalf("Malloc in an asleep pool: want ErrPoolAsleep, got %v", err)
	}
	if h.a.Stats() != before || h.e.CallCounts() != calls {
		h.fatalf("Malloc in an asleep pool changed the statistics or called the driver")
	}
}

// asleepRecord checks a RecordStream of a block of an asleep pool.
func (h *harness) asleepRecord(b *liveBlock, s backend.Stream) {
	h.logf("RecordStream(%#x, %d) in asleep pool %d", b.ptr, s, b.pool)
	calls := h.e.CallCounts()
	if err := h.a.RecordStream(b.ptr, s); !errors.Is(err, allocator.ErrPoolAsleep) {
		h.fatalf("RecordStream of an asleep pool's block: want ErrPoolAsleep, got %v", err)
	}
	if h.e.CallCounts() != calls {
		h.fatalf("RecordStream of an asleep pool's block called the driver")
	}
}

// wakeAll wakes every pool still asleep (finish, with every block freed
// and the cache emptied, so the device has room).
func (h *harness) wakeAll() {
	for i, p := range h.pools {
		if !h.asleep[i] {
			continue
		}
		h.logf("Wake(pool %d) at finish", i)
		if err := p.Wake(); err != nil {
			h.fatalf("Wake of pool %d at finish: %v", i, err)
		}
		h.asleep[i] = false
	}
}
