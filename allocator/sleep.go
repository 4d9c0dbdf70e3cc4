package allocator

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/arena"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/segment"
	"github.com/vmmalloc/vmmalloc/stats"
)

// Sleep and wake of a pool (vLLM's sleep mode, torch_memory_saver's
// pause/resume): the pool's physical memory is given back to the driver
// and its addresses kept, so every pointer into it, and every graph
// captured on them, is valid again after Wake.
//
//	           Sleep                         (asleep: Malloc → ErrPoolAsleep,
//	awake ───────────────▶ sleeping ───────▶ asleep  RecordStream refused,
//	  ▲   wait for the pool's   back up, unmap,  │     Free works and drops
//	  │   streams               free handles     │     the block's backup,
//	  │                                          │     Close works once
//	  │                                          │     nothing is allocated)
//	  │                                          │ Wake
//	  └──────────────────── waking ◀─────────────┘
//	      restore backups,         create handles, map them at
//	      report Mapped to hooks   the old offsets, set access
//
// A failure anywhere in sleeping (a stream synchronize, a pinned
// allocation, a copy, an unmap, a hook is not asked) goes back to awake
// with every handle mapped where it was and its contents untouched: the
// handles are unmapped with segment.UnmapKeep, so until they are freed
// they can be mapped back as they were. A failure anywhere in waking (no
// memory after the out-of-memory ladder, a create, map, access or copy
// failing, a hook refusing) goes back to asleep with every backup intact
// and every handle it made freed. The one step that cannot be undone is
// a handle's FreePhysical: one that fails leaves the pool asleep with the
// handle kept (still holding its bytes), Sleep returns an error wrapping
// segment.ErrHandleNotFreed, and Wake maps that handle back instead of a
// fresh one.
//
// What the pool keeps while asleep: its blocks in the heap, allocated and
// free, so no other pool's growth takes their address space (growth maps
// only unmapped address space); the handle layout (sleptRun: offset and
// size of every handle), which Wake recreates exactly, so releases after
// Wake unmap whole handles as before; the backups of its allocated blocks
// (Offload), keyed by address. Its reserved bytes drop by what it
// unmapped (Stats: AsleepBytes), so the memory fraction cap and every
// other pool see the memory free at once. Releases (Allocator.EmptyCache,
// the out-of-memory ladder, Synchronize, ReleaseStream, reclaim) skip a
// pool that is not awake (releasable, releaseBlock); the pool's own
// EmptyCache, Wake without room for it and Close forget its free cache
// (dropFreeRuns: runs holding only free blocks become unmapped address
// space in the heap, no driver call but the free of a kept handle).
//
// Locking: Sleep and Wake make their driver calls with Allocator.mu
// dropped (waitUnlocked), as a growth does (mapGrowth): Sleep's stream
// synchronizes, then one window with the pinned allocations, the backup
// copies, the Unmapped reports, the unmaps (Segment.BeginUnmap under mu,
// UnmapOp.Run without, EndUnmapKeep under mu again) and the FreePhysical
// calls; Wake's one window with the creates, the maps and SetAccess
// (Segment.BeginMapKept, KeptMap.Run, EndMapKept), the restore copies and
// the Mapped reports, its bytes counted in mappingBytes and a ticket in
// growths meanwhile; the frees of pinned buffers. So cache hits on other
// pools and streams go on during a sleep or wake (TestSleepWakeDriver-
// CallsWithoutLock). Both start with quiesceWaits, so no growth or
// release of the pool is in flight, and set the state first, so no
// Malloc or RecordStream of the pool starts, no release touches it and a
// second Sleep or Wake of it is refused (ErrSleepInProgress) while mu is
// dropped; the segments refuse any other map or unmap of the ranges in
// flight. Rollbacks after a failed window (a sleep's handles mapped back)
// run under mu, as a failed growth's do.
//
// Backups are per run of adjacent allocated blocks: one pinned buffer and
// one copy each, whatever the number of tensors (a model's weights,
// allocated one after another, are one run per segment).

// SleepState is a pool's place in the sleep/wake state machine.
type SleepState int32

const (
	// Awake: the pool's memory is mapped; every call works.
	Awake SleepState = iota
	// Sleeping: Sleep is running.
	Sleeping
	// Asleep: the pool's physical memory is given back, its addresses
	// kept.
	Asleep
	// Waking: Wake is running.
	Waking
)

func (s SleepState) String() string {
	switch s {
	case Awake:
		return "awake"
	case Sleeping:
		return "sleeping"
	case Asleep:
		return "asleep"
	case Waking:
		return "waking"
	}
	return fmt.Sprintf("SleepState(%d)", int32(s))
}

// SleepMode says what of a pool's allocated memory survives Sleep.
type SleepMode int

const (
	// Discard drops the contents: after Wake the allocations are at
	// their addresses with undefined bytes (KV caches, activations).
	// vLLM's sleep level 2, and level 1 for tags not in offload_tags;
	// torch_memory_saver with enable_cpu_backup=False.
	Discard SleepMode = iota
	// Offload copies the bytes of every allocated block (its requested
	// size, not the free cache) to pinned host memory at Sleep and back
	// at Wake (weights). vLLM's level 1 for offload_tags;
	// torch_memory_saver's enable_cpu_backup=True.
	Offload
	// Memset drops the contents as Discard does, and Wake zero-fills the
	// pool's memory (a Memset on the restore stream) before it returns:
	// after Wake every byte of the pool reads 0. TensorRT-LLM's MEMSET
	// restore mode; for a framework that relies on zeroed buffers (a
	// paged KV cache's block table) across a sleep. The fill is the
	// driver's (backend.Copier's Memset): a Wake whose fill fails leaves
	// the pool asleep and returns the driver's error, as a failed restore
	// does.
	Memset
)

func (m SleepMode) String() string {
	switch m {
	case Discard:
		return "discard"
	case Offload:
		return "offload"
	case Memset:
		return "memset"
	}
	return fmt.Sprintf("SleepMode(%d)", int(m))
}

// PoisonByte is the byte SleepOptions.Poison fills discarded memory with
// at Wake: a float32 or bfloat16 of 0xFF bytes is a NaN, an integer -1,
// so a framework that reads memory it discarded finds out.
const PoisonByte = 0xFF

// HostAllocator is the pinned host memory backups are made in: a
// *host.Allocator (package allocator/host) satisfies it. Its Malloc must
// return memory the process can read and write.
type HostAllocator interface {
	Malloc(size uint64) (uintptr, error)
	Free(ptr uintptr) error
}

// SleepOptions configures one Sleep.
type SleepOptions struct {
	// Mode says what survives (Discard or Offload).
	Mode SleepMode
	// Host is the pinned host allocator of the backups (Offload). nil
	// makes them in Go memory: pageable, so a real device copies it
	// through a staging buffer, at a fraction of pinned bandwidth.
	Host HostAllocator
	// KeepHostBuffers keeps the pinned buffers after Wake, for the next
	// Sleep to copy into without allocating (torch_memory_saver's
	// retained backups: fast re-sleep, at the cost of host memory the
	// size of the backups while awake). false gives them back at Wake.
	// A kept buffer is used by a backup of exactly its size (the same
	// tensors slept again); buffers kept and not used by a Sleep are
	// given back at its end, so the host memory kept is never more than
	// the last sleep's backups.
	KeepHostBuffers bool
	// Stream is the stream the copies are made on (0: the default
	// stream). The pool's own streams are synchronized first either way.
	Stream backend.Stream
	// Poison (a debug option) makes Wake fill the memory whose contents
	// the sleep discarded with PoisonByte before it returns: in Discard,
	// the pool's whole memory; in Offload, all but the restored backups
	// (the free cache, the bytes past each block's requested size, the
	// blocks freed while asleep). Not with Memset, which zero-fills.
	Poison bool
}

var (
	// ErrPoolAsleep: the pool is not awake (Malloc, RecordStream and
	// ShareSpans of its memory, Sleep of a pool already asleep, Close).
	ErrPoolAsleep = errors.New("vmmalloc: pool is asleep")
	// ErrPoolAwake: Wake of a pool that is awake (a duplicate wake).
	ErrPoolAwake = errors.New("vmmalloc: pool is awake")
	// ErrSleepInProgress: Sleep or Wake of a pool another Sleep or Wake
	// is running on.
	ErrSleepInProgress = errors.New("vmmalloc: sleep or wake of the pool in progress")
	// ErrPoolExported: Sleep of a pool with memory exported to other
	// processes (ShareSpans): a peer maps its handles, which a sleep
	// would free under it.
	ErrPoolExported = errors.New("vmmalloc: pool has memory exported over IPC")
)

// poolSleep is a pool's sleep record. Allocator.mu guards every field.
type poolSleep struct {
	state SleepState
	opts  SleepOptions // of the last Sleep
	// runs are the handles the pool had mapped, in the order Sleep
	// unmapped them (ascending address per segment): what Wake maps.
	runs []sleptRun
	// bytes are the nbytes asleep per size class (index as a.classes).
	bytes [2]uint64
	// backups are the host copies of the pool's allocated bytes, one per
	// run of adjacent allocated blocks, ascending by address.
	backups []backupRun
	// backupOf maps the address of every allocated block backed up to
	// its run's index in backups.
	backupOf map[uintptr]int
	// spare are pinned buffers not holding a backup: kept after Wake
	// (KeepHostBuffers) and backups of blocks freed while asleep.
	spare []*hostBuf
}

// sleptRun is one handle of a sleeping pool: where it was mapped, and
// the handle itself while it is kept (its FreePhysical failed), else 0.
type sleptRun struct {
	sg   *seg
	off  uint64 // from sg.base
	size uint64 // nbytes
	held backend.Handle
}

// backupRun is the host copy of a run of adjacent allocated blocks: the
// buf.n bytes from addr.
type backupRun struct {
	addr uintptr
	buf  *hostBuf // nil once every block of the run was freed (the buffer went to spare)
	live int      // the run's blocks still allocated
}

// hostBuf is one host buffer: pinned (from host, at ptr) or Go memory.
type hostBuf struct {
	host HostAllocator // nil: mem is Go memory
	ptr  uintptr
	size uint64 // capacity, nbytes
	n    uint64 // nbytes of the backup it holds
	mem  []byte
}

// bytes is the buffer's first n bytes as a slice, for the Copier.
func (b *hostBuf) bytes(n uint64) []byte {
	if b.host == nil {
		return b.mem[:n]
	}
	// The address is the host allocator's pinned memory, outside the Go
	// heap; reinterpret it without a uintptr→Pointer conversion.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&b.ptr))
	return unsafe.Slice((*byte)(p), n)
}

// SleepState reports the pool's state.
func (p *Pool) SleepState() SleepState {
	a := p.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.sleep == nil {
		return Awake
	}
	return p.sleep.state
}

// notAwake is the error of a call refused because pool p is not awake.
// mu held.
func (p *Pool) notAwake() error {
	return fmt.Errorf("%w: pool %q is %s", ErrPoolAsleep, p.name, p.sleep.state)
}

// Sleep gives the pool's physical memory back to the driver and keeps its
// addresses (vLLM's sleep, torch_memory_saver's pause). It waits for the
// work queued on the pool's streams (with the allocator's mutex dropped),
// copies the bytes of every allocated block to host memory if o.Mode is
// Offload, reports the pool's ranges to the segment hooks as unmapped,
// unmaps every handle of the pool and frees it. The device's free memory
// rises by the pool's reserved bytes, which other pools can map at once.
// A stream with work on the pool's memory that was destroyed without
// ReleaseStream cannot be waited for by itself: Sleep then waits for the
// whole device (backend.DeviceSynchronizer), and without that refuses
// with ErrInvalidStream, the pool awake.
//
// Until Wake: the pool's Malloc and RecordStream on its memory return
// ErrPoolAsleep before they look at their other arguments (so with no
// driver call); Free of its pointers works, and the Free of the last
// block a backup holds gives the backup's host memory back at once
// (TestSleepFreeReleasesBackup); the pointers must not be used by device
// work. Close of an asleep pool with nothing allocated needs no Wake.
//
// Wake maps back every handle Sleep unmapped, free cache included where
// the device has room, so a pool that sleeps between steps of the same
// shape wakes with no growth to do. The free cache is optional: a device
// without room for it still wakes the handles that hold allocations
// (TestWakeFreeCacheOptional). To give the free cache back for good,
// call EmptyCache before Sleep, or the pool's EmptyCache while it is
// asleep (Allocator.EmptyCache skips an asleep pool): Wake then maps only
// the handles that hold allocations (TestEmptyCacheBeforeSleep).
//
// On error the pool is awake as before, its memory mapped with its
// contents, except where the error wraps segment.ErrHandleNotFreed: the
// pool is asleep and the handle whose free failed is kept for Wake. Sleep
// of a pool that is not awake returns ErrPoolAsleep (ErrSleepInProgress
// while another Sleep or Wake runs), of a pool with memory exported
// (ShareSpans) ErrPoolExported, and of a classic pool ErrInvalidPool.
func (p *Pool) Sleep(o SleepOptions) error {
	a := p.a
	a.mu.Lock()
	defer a.unlock()
	// The state is checked before quiesceWaits too, so that a Sleep or
	// Wake during another one's driver calls is refused at once.
	for q := 0; q < 2; q++ {
		if err := p.live(); err != nil {
			return err
		}
		if sl := p.sleep; sl != nil && sl.state != Awake {
			if sl.state == Sleeping || sl.state == Waking {
				return fmt.Errorf("%w: pool %q is %s", ErrSleepInProgress, p.name, sl.state)
			}
			return p.notAwake()
		}
		if q == 0 {
			a.quiesceWaits()
		}
	}
	if !p.expandable {
		return fmt.Errorf("%w: pool %q: sleep needs expandable segments", ErrInvalidPool, p.name)
	}
	if o.Mode != Discard && o.Mode != Offload && o.Mode != Memset {
		return fmt.Errorf("%w: SleepOptions.Mode: %d", ErrInvalidConfig, o.Mode)
	}
	if o.Poison && o.Mode == Memset {
		return fmt.Errorf("%w: SleepOptions.Poison with Memset: the memory is zero-filled", ErrInvalidConfig)
	}
	if o.Host != nil && !reflect.TypeOf(o.Host).Comparable() {
		// Buffers are matched to their allocator by ==.
		return fmt.Errorf("%w: SleepOptions.Host: %T is not comparable (use a pointer)", ErrInvalidConfig, o.Host)
	}
	var c backend.Copier
	if o.Mode != Discard || o.Poison {
		var ok bool
		if c, ok = a.drv.(backend.Copier); !ok {
			return fmt.Errorf("%w: the %s driver cannot copy or set memory (backend.Copier), so it cannot %s: %w", ErrInvalidConfig, a.drv.Name(), o.Mode, backend.ErrNotSupported)
		}
	}
	s := o.Stream
	if s == 0 {
		s = a.defaultS
	}
	if c != nil {
		if _, err := a.stream(s); err != nil {
			return err
		}
	}
	if p.sleep == nil {
		p.sleep = &poolSleep{}
	}
	sl := p.sleep
	_ = a.stepsEvent(p, false) // the step diverges; the plan serves again after Wake
	sl.state, sl.opts = Sleeping, o
	p.asleep = true
	a.setSleepOff()
	err := a.sleep(p, sl, c, s)
	if sl.state == Sleeping { // rolled back
		sl.state = Awake
		p.asleep = false
		a.setSleepOff()
	}
	return err
}

// sleep is Sleep's work once the state is Sleeping; on failure before the
// first handle is freed it restores everything and leaves the state
// Sleeping (Sleep makes it Awake). mu held (dropped in windows).
//
// Its driver work runs in one window with mu dropped: the pinned
// allocations and backup copies, the Unmapped reports, the unmaps (begun
// under mu with Segment.BeginUnmap, so the segment refuses any other map
// or unmap of the ranges, and ended with EndUnmapKeep) and, once every
// unmap succeeded, the FreePhysical calls. A failure before the frees
// maps the kept handles back under mu, as a failed growth's rollback.
func (a *Allocator) sleep(p *Pool, sl *poolSleep, c backend.Copier, s backend.Stream) error {
	if a.exportedIn(p) {
		return fmt.Errorf("%w: pool %q", ErrPoolExported, p.name)
	}
	for _, st := range a.poolStreams(p) {
		a.counters.StreamSyncs++
		err := a.waitUnlocked(func() error { return a.drv.StreamSynchronize(st) })
		if err == nil {
			continue
		}
		if !a.streamGone(st) {
			return fmt.Errorf("vmmalloc: sleep of pool %q: synchronize stream %d: %w", p.name, st, err)
		}
		// Destroyed behind the allocator's back: its queued work still
		// runs, and only a device-wide wait can see it end (and every
		// other stream's with it).
		ds, ok := a.drv.(backend.DeviceSynchronizer)
		if !ok {
			return fmt.Errorf("vmmalloc: sleep of pool %q: %w: stream %d was destroyed with work the sleep cannot wait for: %w", p.name, ErrInvalidStream, st, errNoDeviceSync)
		}
		a.counters.StreamSyncs++
		if err := a.waitUnlocked(func() error { return ds.DeviceSynchronize(a.dev) }); err != nil {
			return fmt.Errorf("vmmalloc: sleep of pool %q: synchronize device %d (stream %d destroyed): %w", p.name, a.dev, st, err)
		}
		break
	}
	if a.pending > 0 {
		a.processEvents()
	}
	ranges, pending := a.poolRanges(p)
	if pending > 0 {
		return fmt.Errorf("%w: pool %q has %d frees pending on work the sleep cannot wait for", ErrPoolBusy, p.name, pending)
	}
	// The backups: the requested bytes of every run of adjacent
	// allocated blocks, one copy and one buffer each, in buffers kept
	// from an earlier sleep where one fits.
	var plan []backupPlan
	if sl.opts.Mode == Offload {
		plan = a.planBackups(ranges)
	}
	bufs := make([]*hostBuf, len(plan))
	for i, pl := range plan {
		bufs[i] = sl.takeSpare(pl.n, sl.opts.Host)
	}
	// Begin the unmaps: the segments refuse any other map or unmap of
	// the ranges until they end.
	ums := make([]sleepUnmap, 0, len(ranges))
	for _, r := range ranges {
		sg := a.segAt(r.Addr)
		op, err := sg.s.BeginUnmap(uint64(r.Addr-sg.base), r.Size)
		if err != nil {
			for _, u := range ums {
				_, _ = u.sg.s.EndUnmapKeep(u.op) // unrun: nothing unmapped
			}
			a.spareBufs(sl, bufs)
			return fmt.Errorf("vmmalloc: sleep of pool %q: %w: %w", p.name, ErrCorrupt, err)
		}
		ums = append(ums, sleepUnmap{sg: sg, op: op, hs: op.KeptHandles()})
	}
	hs := a.hookList()
	var rs []SegmentRange
	if hs != nil {
		rs = ranges
	}
	host := sl.opts.Host
	var (
		copied   bool    // the backups are made and the Unmapped reports sent
		freeErrs []error // per handle, in ums order: its FreePhysical's failure
		freed    int64
	)
	err := a.waitUnlocked(func() error {
		for i, pl := range plan {
			if bufs[i] == nil {
				b, err := newHostBuf(host, pl.n)
				if err != nil {
					return err
				}
				bufs[i] = b
			}
			bufs[i].n = pl.n
			if err := c.CopyDtoH(bufs[i].bytes(pl.n), pl.addr, s); err != nil {
				return fmt.Errorf("back up [%#x, +%#x): %w", pl.addr, pl.n, err)
			}
		}
		reportUnmapped(hs, rs) // idle now, still mapped
		copied = true
		for _, u := range ums {
			if u.op.Run(); u.op.Err() != nil {
				return u.op.Err()
			}
		}
		for _, u := range ums {
			for _, k := range u.hs {
				ferr := a.drv.FreePhysical(k.Handle)
				if ferr == nil {
					freed++
				}
				freeErrs = append(freeErrs, ferr)
			}
		}
		return nil
	})
	// End the unmaps: the handles unmapped are the sleep's to keep.
	var kept []sleptRun
	for _, u := range ums {
		ks, _ := u.sg.s.EndUnmapKeep(u.op) // err: the window's own
		for _, k := range ks {
			kept = append(kept, sleptRun{sg: u.sg, off: k.Off, size: k.Size, held: k.Handle})
		}
	}
	a.counters.HandlesFreed += freed
	if err != nil {
		// Nothing was freed (frees follow every unmap): map back what
		// was unmapped, with its bytes.
		rerr := a.remapKept(kept)
		if hs != nil && copied {
			_ = a.waitUnlocked(func() error {
				for _, r := range rs {
					_ = reportMapped(hs, r) // best effort: mapped again either way
				}
				return nil
			})
		}
		a.spareBufs(sl, bufs)
		return errors.Join(fmt.Errorf("vmmalloc: sleep of pool %q: %w", p.name, err), rerr)
	}
	// Past the point of return: the pool is asleep.
	var ferrs []error
	for i := range kept {
		r := &kept[i]
		if freeErrs[i] == nil {
			r.held = 0
			continue
		}
		ferrs = append(ferrs, fmt.Errorf("%w: handle at %#x kept for Wake: %w", segment.ErrHandleNotFreed, r.sg.base+uintptr(r.off), freeErrs[i]))
	}
	sl.state = Asleep
	sl.runs = kept
	a.countSlept(p, sl, -1)
	a.histSleep(p, sl, true)
	sl.backups = make([]backupRun, 0, len(plan))
	sl.backupOf = make(map[uintptr]int, len(plan))
	for i, pl := range plan {
		br := backupRun{addr: pl.addr, buf: bufs[i]}
		for _, ad := range pl.blocks {
			if id := a.heap.Lookup(ad); id != arena.NoBlock && a.ownerOf(id).pool == p && a.heap.State(id) == arena.Allocated {
				sl.backupOf[ad] = len(sl.backups)
				br.live++
			} // else freed while the copies ran
		}
		if br.live == 0 {
			sl.spare = append(sl.spare, br.buf)
			continue
		}
		sl.backups = append(sl.backups, br)
	}
	// Buffers neither kept for a backup nor needed: no growth across
	// cycles. A failure keeps them for a retry; the sleep is done.
	_ = a.freeSpares(sl)
	if len(ferrs) > 0 {
		return fmt.Errorf("vmmalloc: sleep of pool %q: %w", p.name, errors.Join(ferrs...))
	}
	return nil
}

// sleepUnmap is one range Sleep unmaps: its segment, the unmap in flight,
// and the handles it covers.
type sleepUnmap struct {
	sg *seg
	op *segment.UnmapOp
	hs []segment.KeptHandle
}

// backupPlan is one backup Sleep makes: the n bytes at addr, from the
// first byte of the first of blocks (adjacent allocated blocks, by
// address) to the last requested byte of the last.
type backupPlan struct {
	addr   uintptr
	n      uint64
	blocks []uintptr
}

// planBackups lists the runs of adjacent allocated blocks in ranges (the
// pool's memory): one copy each, of the bytes from the first block's
// start to the last block's last requested byte; the padding of the
// blocks inside a run is copied with them, free blocks are not. mu held.
func (a *Allocator) planBackups(ranges []SegmentRange) []backupPlan {
	var plan []backupPlan
	for _, r := range ranges {
		open := false
		var end uintptr // the open run's last block's end
		for id := a.heap.Find(r.Addr); id != arena.NoBlock; id = a.heap.Next(id) {
			b, _ := a.heap.Block(id)
			if b.Addr >= r.Addr+uintptr(r.Size) {
				break
			}
			if b.State != arena.Allocated {
				open = false
				continue
			}
			if !open || b.Addr != end {
				plan = append(plan, backupPlan{addr: b.Addr})
				open = true
			}
			pl := &plan[len(plan)-1]
			pl.n = uint64(b.Addr-pl.addr) + b.Requested
			pl.blocks = append(pl.blocks, b.Addr)
			end = b.End()
		}
	}
	return plan
}

// spareBufs puts the buffers of a failed Sleep back to the spares, and
// gives them back unless the options keep them. mu held.
func (a *Allocator) spareBufs(sl *poolSleep, bufs []*hostBuf) {
	for _, b := range bufs {
		if b != nil {
			sl.spare = append(sl.spare, b)
		}
	}
	if !sl.opts.KeepHostBuffers {
		_ = a.freeSpares(sl) // a failure keeps them for a retry
	}
}

// Wake maps the memory of a sleeping pool again at exactly its old
// addresses (vLLM's wake_up, torch_memory_saver's resume): it makes
// fresh handles of the old sizes (the out-of-memory ladder first takes
// back other pools' free memory if the device has too little), maps them
// where the old ones were, sets their access, copies the backups back
// (Offload), and reports the ranges to the segment hooks as mapped before
// it returns. Then every pointer of the pool works as before; discarded
// contents are undefined.
//
// The free cache is optional: if the device has no room for the whole
// pool even after the out-of-memory ladder took back other pools' free
// memory, the free cache is given up (as the pool's EmptyCache would)
// and only the handles that hold allocations are mapped; a pool with
// nothing allocated then maps nothing. If the memory cannot be had, Wake returns an
// *OutOfMemoryError; on any
// error the pool stays asleep with every backup intact and nothing
// leaked, and Wake can be called again. Wake of an awake pool returns
// ErrPoolAwake, during another Sleep or Wake ErrSleepInProgress.
func (p *Pool) Wake() error {
	a := p.a
	a.mu.Lock()
	defer a.unlock()
	var sl *poolSleep
	for q := 0; q < 2; q++ { // before and after quiesceWaits, as Sleep
		if err := p.live(); err != nil {
			return err
		}
		sl = p.sleep
		if sl == nil || sl.state == Awake {
			return fmt.Errorf("%w: pool %q", ErrPoolAwake, p.name)
		}
		if sl.state != Asleep {
			return fmt.Errorf("%w: pool %q is %s", ErrSleepInProgress, p.name, sl.state)
		}
		if q == 0 {
			a.quiesceWaits()
		}
	}
	sl.state = Waking
	err := a.wake(p, sl)
	if sl.state == Waking {
		sl.state = Asleep
	}
	return err
}

// wake is Wake's work once the state is Waking; on failure it leaves the
// pool as it was asleep and the state Waking (Wake makes it Asleep). mu
// held (dropped in windows).
func (a *Allocator) wake(p *Pool, sl *poolSleep) error {
	total := sl.bytes[0] + sl.bytes[1]
	ladder := func() {
		// The ladder: cached handles, then every awake pool's free
		// memory (releaseAll skips pools that are not awake).
		for _, st := range a.statsOf(p) {
			st.NumAllocRetries++
		}
		_ = errors.Join(a.trimCaches(), a.releaseAll())
	}
	// dropCache gives the free cache up (as the pool's EmptyCache
	// would): what is left holds allocations. It reports whether there
	// was any to give up.
	dropCache := func() bool {
		if a.freeRuns(sl) == 0 {
			return false
		}
		_ = a.dropFreeRuns(p, sl)
		total = sl.bytes[0] + sl.bytes[1]
		return true
	}
	if a.overCap(total) {
		ladder()
		if a.overCap(total) && (!dropCache() || a.overCap(total)) {
			return a.wakeOOM(p, total, nil)
		}
	}
	// Everything, then after the ladder everything again, then only what
	// holds allocations: the free cache is optional.
	oom, err := a.wakeRuns(p, sl, total)
	if oom {
		ladder()
		oom, err = a.wakeRuns(p, sl, total)
	}
	if oom && dropCache() {
		oom, err = a.wakeRuns(p, sl, total)
	}
	if oom {
		return a.wakeOOM(p, total, err)
	}
	if err != nil {
		var hk *SegmentHookError
		if errors.As(err, &hk) {
			return err
		}
		return fmt.Errorf("vmmalloc: wake of pool %q: %w", p.name, err)
	}
	sl.state = Awake
	p.asleep = false
	a.setSleepOff()
	a.countSlept(p, sl, +1)
	a.histSleep(p, sl, false)
	sl.runs = nil
	for _, b := range sl.backups {
		if b.buf != nil {
			sl.spare = append(sl.spare, b.buf)
		}
	}
	sl.backups, sl.backupOf = nil, nil
	if !sl.opts.KeepHostBuffers {
		// The pool is awake; a buffer whose free failed stays a spare
		// for a retry.
		_ = a.freeSpares(sl)
	}
	return nil
}

// wakeRuns maps sl's runs again, restores the backups and reports the
// ranges to the hooks, in one window with mu dropped, as a growth maps
// (mapGrowth): the runs are begun under mu (Segment.BeginMapKept: the
// segments refuse any other map or unmap of them), their total counts in
// mappingBytes (the memory fraction cap) and has a ticket in growths (a
// Malloc that needs memory meanwhile waits for it rather than declare an
// out-of-memory); without mu it creates a handle for every run not held,
// maps and sets access on each, copies the backups back and reports the
// Mapped ranges, and on any failure undoes all of it in reverse (the
// hooks told Unmapped, the runs unmapped, the fresh handles freed);
// under mu again it records what is mapped and counts the calls. On
// success the runs are mapped; on failure nothing is, and a fresh handle
// whose free failed is kept as its run's held handle, for the next Wake.
// oom reports that a handle creation found the device out of memory.
// mu held (dropped once).
func (a *Allocator) wakeRuns(p *Pool, sl *poolSleep, total uint64) (oom bool, err error) {
	n := len(sl.runs)
	ms := make([]*segment.KeptMap, 0, n)
	for _, r := range sl.runs {
		m, berr := r.sg.s.BeginMapKept(r.off, r.size)
		if berr != nil {
			for i, m := range ms {
				_ = sl.runs[i].sg.s.EndMapKept(m) // unrun: nothing mapped
			}
			return false, fmt.Errorf("%w: %w", ErrCorrupt, berr)
		}
		ms = append(ms, m)
	}
	runs := slices.Clone(sl.runs) // read without mu
	fresh := make([]backend.Handle, n)
	c, _ := a.drv.(backend.Copier)
	opts := sl.opts
	s := sl.opts.Stream
	if s == 0 {
		s = a.defaultS
	}
	var todo []backupRun // the backups to restore, ascending
	for _, b := range sl.backups {
		if b.buf != nil {
			todo = append(todo, b)
		}
	}
	hs := a.hookList()
	var rs []SegmentRange
	if hs != nil {
		rs = a.wakeRanges(p, sl)
	}
	a.growSeq++
	ticket := a.growSeq
	a.growths = append(a.growths, ticket)
	a.mappingBytes += total
	var created, freed int64
	err = a.waitUnlocked(func() error {
		accepted, err := func() ([]SegmentRange, error) {
			for i, r := range runs {
				if r.held != 0 {
					continue
				}
				h, cerr := a.drv.CreatePhysical(r.size, r.sg.s.Prop())
				if cerr != nil {
					oom = isOOM(cerr)
					return nil, fmt.Errorf("create %d-byte handle for %#x: %w", r.size, r.sg.base+uintptr(r.off), cerr)
				}
				created++
				fresh[i] = h
			}
			for i, m := range ms {
				h := fresh[i]
				if h == 0 {
					h = runs[i].held
				}
				if merr := m.Run(h); merr != nil {
					return nil, merr
				}
			}
			if fill, ok := wakeFill(opts); ok {
				// Before the restores, on their stream: what is not
				// restored reads fill.
				for _, r := range runs {
					va := r.sg.base + uintptr(r.off)
					if merr := c.Memset(va, fill, r.size, s); merr != nil {
						return nil, fmt.Errorf("fill [%#x, +%#x) with %#x: %w", va, r.size, fill, merr)
					}
				}
			}
			for _, t := range todo {
				if cerr := c.CopyHtoD(t.addr, t.buf.bytes(t.buf.n), s); cerr != nil {
					return nil, fmt.Errorf("restore [%#x, +%#x): %w", t.addr, t.buf.n, cerr)
				}
			}
			var accepted []SegmentRange
			for _, r := range rs {
				if herr := reportMapped(hs, r); herr != nil {
					return accepted, herr
				}
				accepted = append(accepted, r)
			}
			return nil, nil
		}()
		if err == nil {
			return nil
		}
		// Roll back: nothing of the wake stays.
		reportUnmapped(hs, accepted)
		var rerrs []error
		for i := len(ms) - 1; i >= 0; i-- {
			var uerr error
			for try := 0; try < rollbackTries && ms[i].Mapped(); try++ {
				uerr = ms[i].Undo()
			}
			if ms[i].Mapped() {
				rerrs = append(rerrs, fmt.Errorf("rollback incomplete: %w", uerr))
			}
		}
		for i, h := range fresh {
			if h == 0 || ms[i].Mapped() {
				continue
			}
			if ferr := a.drv.FreePhysical(h); ferr == nil {
				freed++
				fresh[i] = 0
			}
		}
		return errors.Join(append([]error{err}, rerrs...)...)
	})
	a.mappingBytes -= total
	for i, t := range a.growths {
		if t == ticket {
			a.growths = append(a.growths[:i], a.growths[i+1:]...)
			break
		}
	}
	a.grown.Broadcast()
	for i, m := range ms {
		_ = sl.runs[i].sg.s.EndMapKept(m)
		if err != nil && fresh[i] != 0 && !m.Mapped() {
			sl.runs[i].held = fresh[i] // its free failed: Wake maps it next time
		}
	}
	a.counters.HandlesCreated += created
	a.counters.HandlesFreed += freed
	if err != nil {
		return oom, err
	}
	return false, nil
}

// wakeFill is the byte Wake fills a pool slept with o with before it
// restores the backups: 0 for Memset, PoisonByte for Poison; ok is false
// when nothing is filled.
func wakeFill(o SleepOptions) (fill byte, ok bool) {
	switch {
	case o.Mode == Memset:
		return 0, true
	case o.Poison:
		return PoisonByte, true
	}
	return 0, false
}

// wakeRanges are the ranges Wake reports Mapped: pool p's memory as
// poolRanges finds it, with the handles of sl's runs. mu held.
func (a *Allocator) wakeRanges(p *Pool, sl *poolSleep) []SegmentRange {
	rs, _ := a.poolRanges(p)
	for i := range rs {
		r := &rs[i]
		r.Handles = r.Handles[:0]
		for _, run := range sl.runs {
			if va := run.sg.base + uintptr(run.off); va >= r.Addr && va < r.Addr+uintptr(r.Size) {
				r.Handles = append(r.Handles, HandleSpan{VA: va, Size: run.size})
			}
		}
	}
	return rs
}

func cmpAddr(x, y uintptr) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// remapKept maps back the handles a failed sleep unmapped, each tried up
// to rollbackTries times. mu held.
func (a *Allocator) remapKept(kept []sleptRun) error {
	var errs []error
	for _, k := range kept {
		var err error
		for try := 0; try < rollbackTries; try++ {
			if err = k.sg.s.MapKept(segment.KeptHandle{Off: k.off, Size: k.size, Handle: k.held}); err == nil || k.sg.s.IsMappedAt(k.off) {
				break // mapped, or mapped without access and not unmapped again: a retry cannot map it
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rollback incomplete: %w", err))
		}
	}
	return errors.Join(errs...)
}

// rollbackTries is how many times a rollback of Sleep or Wake tries each
// map or unmap that undoes what the failed call did: a second fault in a
// rollback (an unmap that fails once while undoing a failed map) then
// still leaves the pool as it was. Only a call that keeps failing leaves
// it part mapped, and the error and Check say so.
const rollbackTries = 3

// wakeOOM is the error of a Wake the device has no memory for. mu held.
func (a *Allocator) wakeOOM(p *Pool, total uint64, cause error) error {
	oom := a.newOOM(p, nil, nil, total, 0, total)
	oom.Pool, oom.PoolName, oom.Cause = p.id, p.name, cause
	a.adviseOOM(oom, p)
	return oom
}

// countSlept moves pool p's reserved bytes by sign × its asleep bytes:
// at sleep (-1) the asleep bytes are counted from the runs and leave the
// reserved bytes, at wake (+1) they come back and the asleep bytes are 0.
// mu held.
func (a *Allocator) countSlept(p *Pool, sl *poolSleep, sign int64) {
	if sign < 0 {
		sl.bytes = [2]uint64{}
		for _, r := range sl.runs {
			sl.bytes[r.sg.class.idx] += r.size
		}
	}
	for i := range sl.bytes {
		a.addReserved(p, a.classes[i].kind, sign*int64(sl.bytes[i]))
	}
	if sign > 0 {
		sl.bytes = [2]uint64{}
	}
}

// takeSpare takes a spare buffer of host of exactly the size a backup of
// n bytes is made in (newHostBuf's), or returns nil. Exactly: a larger
// buffer taken for a smaller backup would stay larger than what it holds
// across every later sleep, and the host memory kept would ratchet up to
// the largest backup ever made (TestSleepWakeEndurance); the same tensors
// slept again, the case KeepHostBuffers is for, find theirs. mu held.
func (sl *poolSleep) takeSpare(n uint64, host HostAllocator) *hostBuf {
	size := max(n, 1)
	for i, b := range sl.spare {
		if b.host == host && b.size == size {
			sl.spare = slices.Delete(sl.spare, i, i+1)
			return b
		}
	}
	return nil
}

// newHostBuf allocates a buffer of n bytes (at least 1) from host, or in
// Go memory when host is nil. Called without mu.
func newHostBuf(host HostAllocator, n uint64) (*hostBuf, error) {
	size := max(n, 1)
	if host == nil {
		return &hostBuf{size: size, mem: make([]byte, size)}, nil
	}
	ptr, err := host.Malloc(size)
	if err != nil {
		return nil, fmt.Errorf("pinned host buffer of %d bytes: %w", size, err)
	}
	return &hostBuf{host: host, ptr: ptr, size: size}, nil
}

// freeSpares gives back every spare buffer, with mu dropped. A buffer
// whose free fails stays a spare, for the next freeSpares (the end of
// the next Sleep or Wake, Close) to retry; the error is returned. mu
// held.
func (a *Allocator) freeSpares(sl *poolSleep) error {
	if len(sl.spare) == 0 {
		return nil
	}
	spare := sl.spare
	sl.spare = nil
	var failed []*hostBuf
	var errs []error
	_ = a.waitUnlocked(func() error {
		for _, b := range spare {
			if b.host != nil {
				if err := b.host.Free(b.ptr); err != nil {
					failed = append(failed, b)
					errs = append(errs, fmt.Errorf("vmmalloc: host buffer %#x kept for a retry: %w", b.ptr, err))
				}
			}
		}
		return nil
	})
	sl.spare = append(sl.spare, failed...)
	return errors.Join(errs...)
}

// dropBackup forgets the backup of the block at ptr of a sleeping pool,
// which Free has just freed; once no block of its run is left, the run's
// buffer goes to the spares and Wake restores nothing there. A run with
// blocks left is restored whole, the freed block's bytes with it (they
// are undefined anyway). It reports whether the pool is Asleep with
// spares to give back: Free then gives them back (freeSpares) before it
// returns; while Waking a copy may still read the buffer, and the end of
// the Wake gives it back. mu held.
func (a *Allocator) dropBackup(p *Pool, ptr uintptr) bool {
	sl := p.sleep
	i, ok := sl.backupOf[ptr]
	if !ok {
		return false
	}
	delete(sl.backupOf, ptr)
	r := &sl.backups[i]
	if r.live--; r.live == 0 {
		sl.spare = append(sl.spare, r.buf)
		r.buf = nil
	}
	return sl.state == Asleep && len(sl.spare) > 0
}

// runHolds reports whether run r of an asleep pool holds a block that is
// not free (allocated, or pending free): one Wake must map. mu held.
func (a *Allocator) runHolds(r sleptRun) bool {
	lo := r.sg.base + uintptr(r.off)
	hi := lo + uintptr(r.size)
	for id := a.heap.Find(lo); id != arena.NoBlock; id = a.heap.Next(id) {
		b, _ := a.heap.Block(id)
		if b.Addr >= hi {
			break
		}
		if b.State != arena.Free {
			return true
		}
	}
	return false
}

// freeRuns counts the runs of sl that hold only free blocks (the free
// cache Wake maps back when it can). mu held.
func (a *Allocator) freeRuns(sl *poolSleep) int {
	n := 0
	for _, r := range sl.runs {
		if !a.runHolds(r) {
			n++
		}
	}
	return n
}

// dropFreeRuns gives up the free cache of asleep pool p: every run that
// holds only free blocks is forgotten, its address space made unmapped in
// the heap as a release leaves it (its physical memory went at Sleep), a
// handle kept for it (its free failed) freed. A run whose kept handle
// cannot be freed stays, for Wake to map; the error says so. Wake then
// maps only the handles that hold allocations. mu held.
func (a *Allocator) dropFreeRuns(p *Pool, sl *poolSleep) error {
	var errs []error
	var touched []*seg
	keep := sl.runs[:0]
	for _, r := range sl.runs {
		if a.runHolds(r) {
			keep = append(keep, r)
			continue
		}
		if r.held != 0 {
			if err := a.drv.FreePhysical(r.held); err != nil {
				errs = append(errs, fmt.Errorf("vmmalloc: pool %q: %w: handle at %#x kept for Wake: %w", p.name, segment.ErrHandleNotFreed, r.sg.base+uintptr(r.off), err))
				keep = append(keep, r)
				continue
			}
			a.counters.HandlesFreed++
		}
		lo := r.sg.base + uintptr(r.off)
		hi := lo + uintptr(r.size)
		for at := lo; at < hi; {
			id := a.heap.Find(at)
			b, _ := a.heap.Block(id)
			if id == arena.NoBlock || b.State != arena.Free {
				return errors.Join(append(errs, fmt.Errorf("%w: pool %q asleep: %#x in its free run is not a free block", ErrCorrupt, p.name, at))...)
			}
			end := min(b.End(), hi)
			rel, err := a.heap.BeginRelease(id, uint64(at-b.Addr), uint64(end-at))
			if err == nil {
				_, err = a.heap.CommitRelease(rel, uint64(end-at))
			}
			if err != nil {
				return errors.Join(append(errs, fmt.Errorf("%w: %w", ErrCorrupt, err))...)
			}
			at = end
		}
		sl.bytes[r.sg.class.idx] -= r.size
		if !slices.Contains(touched, r.sg) {
			touched = append(touched, r.sg)
		}
	}
	clear(sl.runs[len(keep):])
	sl.runs = keep
	for _, sg := range touched {
		a.maybeDropEmpty(sg)
	}
	return errors.Join(errs...)
}

// closeAsleep readies asleep pool p, with nothing allocated, for Close:
// its free cache is given up (dropFreeRuns), and, nothing left to map, it
// is awake without a driver call but the frees of what it kept. mu held.
func (a *Allocator) closeAsleep(p *Pool) error {
	sl := p.sleep
	if sl.state != Asleep {
		return fmt.Errorf("%w: pool %q is %s", ErrSleepInProgress, p.name, sl.state)
	}
	if n, bytes := p.st.ActiveNow(stats.AllPools); n > 0 {
		return fmt.Errorf("%w: pool %q has %d allocations (%d bytes) not yet freed: free them, or wake it, before Close", p.notAwake(), p.name, n, bytes)
	}
	if err := a.dropFreeRuns(p, sl); err != nil {
		return err
	}
	if len(sl.runs) > 0 { // cannot be: dropFreeRuns failed otherwise
		return fmt.Errorf("%w: pool %q asleep with nothing allocated keeps %d runs", ErrCorrupt, p.name, len(sl.runs))
	}
	sl.state = Awake
	p.asleep = false
	a.setSleepOff()
	a.countSlept(p, sl, +1)
	return a.dropSleep(p)
}

// exportedIn reports whether a handle of pool p is exported. mu held.
func (a *Allocator) exportedIn(p *Pool) bool {
	if len(a.exported) == 0 {
		return false
	}
	rs, _ := a.poolRanges(p)
	for _, r := range rs {
		for _, hsp := range r.Handles {
			sg := a.segAt(hsp.VA)
			if h, _, _, ok := sg.s.HandleAt(uint64(hsp.VA - sg.base)); ok && a.exported[h] != nil {
				return true
			}
		}
	}
	return false
}

// poolStreams lists the streams whose queued work may use pool p's
// memory: its owners' streams, streams recorded on its blocks, and
// streams with events its pending frees wait for; ascending, each once.
// mu held.
func (a *Allocator) poolStreams(p *Pool) []backend.Stream {
	var out []backend.Stream
	for _, o := range a.ownersOf(p) {
		out = append(out, o.stream)
	}
	for b, uses := range a.uses {
		if a.ownerOf(b).pool == p {
			out = append(out, uses...)
		}
	}
	for _, ss := range a.busy {
		for _, pe := range ss.queue {
			if a.ownerOf(pe.b).pool == p {
				out = append(out, ss.stream)
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// poolRanges lists pool p's mapped memory as maximal runs of adjacent
// blocks of the pool per segment (each starts and ends on handle
// boundaries: a handle holds blocks of one owner), with their handles,
// and counts its pending-free blocks. mu held.
func (a *Allocator) poolRanges(p *Pool) (rs []SegmentRange, pending int) {
	h := a.heap
	for _, sg := range a.segs {
		if !sg.expandable {
			continue
		}
		info, _ := h.Region(sg.rid)
		var start uintptr
		var n uint64
		flush := func() {
			if n > 0 {
				rs = append(rs, a.segRange(sg, p, start, n))
			}
			n = 0
		}
		for id := info.Head; id != arena.NoBlock; id = h.Next(id) {
			b, _ := h.Block(id)
			if b.State == arena.Unmapped || b.StreamID == 0 || a.states[b.StreamID].pool != p {
				flush()
				continue
			}
			if b.State == arena.PendingFree {
				pending++
			}
			if n == 0 {
				start = b.Addr
			}
			n += b.Size
		}
		flush()
	}
	return rs, pending
}

// closeSleeps gives back what sleeping pools hold beside the segments:
// kept handles and host buffers (Allocator.Close). mu held.
func (a *Allocator) closeSleeps() error {
	var errs []error
	for _, p := range a.pools {
		if p == nil || p.sleep == nil {
			continue
		}
		if err := a.dropSleep(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// dropSleep frees pool p's kept handles and host buffers and forgets its
// sleep record (Close of the pool or the allocator). mu held.
func (a *Allocator) dropSleep(p *Pool) error {
	sl := p.sleep
	var errs []error
	keep := sl.runs[:0]
	for _, r := range sl.runs {
		if r.held != 0 {
			if err := a.drv.FreePhysical(r.held); err != nil {
				errs = append(errs, err)
				keep = append(keep, r)
				continue
			}
			a.counters.HandlesFreed++
		}
	}
	for _, b := range sl.backups {
		if b.buf != nil {
			sl.spare = append(sl.spare, b.buf)
		}
	}
	sl.backups, sl.backupOf = nil, nil
	if err := a.freeSpares(sl); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		sl.runs = keep
		return errors.Join(errs...)
	}
	p.sleep = nil
	p.asleep = false
	a.setSleepOff()
	return nil
}

// heldHandles counts the handles sleeping pools keep unmapped (their free
// failed): the Footprint's unmapped handles. mu held.
func (a *Allocator) heldHandles() int {
	n := 0
	for _, p := range a.pools {
		if p != nil && p.sleep != nil {
			for _, r := range p.sleep.runs {
				if r.held != 0 {
					n++
				}
			}
		}
	}
	return n
}

// sleepTotals are the device bytes asleep and the host bytes of backups
// and spare buffers of pool p, or of every pool when p is nil. mu held.
func (a *Allocator) sleepTotals(p *Pool) (asleep, host int64) {
	for _, q := range a.pools {
		if q == nil || q.sleep == nil || p != nil && q != p {
			continue
		}
		sl := q.sleep
		asleep += int64(sl.bytes[0] + sl.bytes[1])
		for _, b := range sl.backups {
			if b.buf != nil {
				host += int64(b.buf.size)
			}
		}
		for _, b := range sl.spare {
			host += int64(b.size)
		}
	}
	return asleep, host
}

// checkSleeps verifies the sleep records: a pool asleep has exactly its
// blocks' bytes in its runs (slept: the bytes Check found in its blocks),
// every run lies in unmapped granules of its segment, over blocks of the
// pool, and every backup is of an allocated block of the pool. mu held.
func (a *Allocator) checkSleeps(slept map[*Pool]uint64) error {
	for _, p := range a.pools {
		if p == nil {
			continue
		}
		sl := p.sleep
		if p.asleep != (sl != nil && sl.state != Awake) {
			return corrupt("pool %q: asleep flag %v, sleep record %v", p.name, p.asleep, sl)
		}
		if sl == nil || sl.state == Awake {
			if slept[p] != 0 || sl != nil && (len(sl.runs) != 0 || len(sl.backups) != 0 || len(sl.backupOf) != 0 || sl.bytes != [2]uint64{}) {
				return corrupt("pool %q is awake with %d bytes asleep", p.name, slept[p])
			}
			continue
		}
		if sl.state != Asleep {
			return corrupt("pool %q is %s with no wait in flight", p.name, sl.state)
		}
		var sum [2]uint64
		for _, r := range sl.runs {
			sum[r.sg.class.idx] += r.size
			for off := r.off; off < r.off+r.size; off += r.sg.s.Granule() {
				if r.sg.s.IsMappedAt(off) {
					return corrupt("pool %q asleep, but %#x is mapped", p.name, r.sg.base+uintptr(off))
				}
			}
			for id := a.heap.Find(r.sg.base + uintptr(r.off)); id != arena.NoBlock; id = a.heap.Next(id) {
				b, _ := a.heap.Block(id)
				if b.Addr >= r.sg.base+uintptr(r.off+r.size) {
					break
				}
				if b.State == arena.Unmapped || a.states[b.StreamID].pool != p {
					return corrupt("pool %q asleep: its handle at %#x holds a block %#x not of the pool", p.name, r.sg.base+uintptr(r.off), b.Addr)
				}
			}
		}
		if sum != sl.bytes || sum[0]+sum[1] != slept[p] {
			return corrupt("pool %q asleep: runs of %v bytes, counted %v, blocks %d", p.name, sum, sl.bytes, slept[p])
		}
		if err := a.checkBackups(p, sl); err != nil {
			return err
		}
	}
	return nil
}

// checkBackups verifies the backups of asleep pool p: every block in
// backupOf is an allocated block of the pool inside its run, every run
// counts its blocks in live, and holds a buffer while it has any. mu
// held.
func (a *Allocator) checkBackups(p *Pool, sl *poolSleep) error {
	counts := make([]int, len(sl.backups))
	for ad, i := range sl.backupOf {
		if i < 0 || i >= len(sl.backups) {
			return corrupt("pool %q asleep: block %#x's backup %d of %d", p.name, ad, i, len(sl.backups))
		}
		r := sl.backups[i]
		id := a.heap.Lookup(ad)
		if id == arena.NoBlock || a.ownerOf(id).pool != p || a.heap.State(id) != arena.Allocated {
			return corrupt("pool %q asleep: backup of %#x, not an allocation of the pool", p.name, ad)
		}
		info, _ := a.heap.Block(id)
		if r.buf == nil || ad < r.addr || uint64(ad-r.addr)+info.Requested > r.buf.n {
			return corrupt("pool %q asleep: block %#x+%d is not inside its backup at %#x", p.name, ad, info.Requested, r.addr)
		}
		counts[i]++
	}
	for i, r := range sl.backups {
		if counts[i] != r.live || (r.live == 0) != (r.buf == nil) {
			return corrupt("pool %q asleep: backup at %#x counts %d blocks, holds %d", p.name, r.addr, r.live, counts[i])
		}
		if r.buf != nil && r.buf.size < r.buf.n {
			return corrupt("pool %q asleep: backup at %#x holds %d bytes in a %d-byte buffer", p.name, r.addr, r.buf.n, r.buf.size)
		}
		if i > 0 && sl.backups[i-1].buf != nil && r.buf != nil && sl.backups[i-1].addr+uintptr(sl.backups[i-1].buf.n) > r.addr {
			return corrupt("pool %q asleep: backups at %#x and %#x overlap", p.name, sl.backups[i-1].addr, r.addr)
		}
	}
	return nil
}

// asleepAllocated is the bytes allocated in pools not awake (the
// OutOfMemoryError's AsleepAllocated). mu held.
func (a *Allocator) asleepAllocated() uint64 {
	var n int64
	for _, p := range a.pools {
		if p != nil && p.asleep {
			n += a.poolRec(p).AllocatedBytes[0].Current
		}
	}
	return uint64(n)
}
