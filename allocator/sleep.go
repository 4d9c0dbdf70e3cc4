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
)

// Sleep and wake of a pool (vLLM's sleep mode, torch_memory_saver's
// pause/resume): the pool's physical memory is given back to the driver
// and its addresses kept, so every pointer into it, and every graph
// captured on them, is valid again after Wake.
//
//	           Sleep                         (asleep: Malloc → ErrPoolAsleep,
//	awake ───────────────▶ sleeping ───────▶ asleep  RecordStream refused,
//	  ▲   wait for the pool's   back up, unmap,  │     Free works and drops
//	  │   streams               free handles     │     the block's backup)
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
// other pool see the memory free at once. Releases (EmptyCache, the
// out-of-memory ladder, Synchronize, ReleaseStream, reclaim) skip a pool
// that is not awake (releasable, releaseBlock).
//
// Locking: Sleep and Wake hold Allocator.mu except in waitUnlocked
// windows: the stream synchronizes, the backup copies (with the pinned
// allocations and the Unmapped reports), the restore copies (with the
// Mapped reports) and the frees of pinned buffers. The unmaps and
// FreePhysical calls of Sleep and the creates, maps and SetAccess of Wake
// are made with mu held, as a classic growth's are. Both start with
// quiesceWaits, so no growth or release of the pool is in flight, and set
// the state first, so no Malloc or RecordStream of the pool starts and no
// release touches it while mu is dropped.

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
)

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
	// Buffers kept and not used by a Sleep are given back at its end.
	KeepHostBuffers bool
	// Stream is the stream the copies are made on (0: the default
	// stream). The pool's own streams are synchronized first either way.
	Stream backend.Stream
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
	// backups are the host copies of the allocated blocks, by block
	// address.
	backups map[uintptr]*hostBuf
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
// Until Wake: the pool's Malloc and RecordStream on its memory return
// ErrPoolAsleep; Free of its pointers works (and drops the backup); the
// pointers must not be used by device work.
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
	a.quiesceWaits()
	if err := p.live(); err != nil {
		return err
	}
	if sl := p.sleep; sl != nil && sl.state != Awake {
		if sl.state == Sleeping || sl.state == Waking {
			return fmt.Errorf("%w: pool %q is %s", ErrSleepInProgress, p.name, sl.state)
		}
		return p.notAwake()
	}
	if !p.expandable {
		return fmt.Errorf("%w: pool %q: sleep needs expandable segments", ErrInvalidPool, p.name)
	}
	if o.Mode != Discard && o.Mode != Offload {
		return fmt.Errorf("%w: SleepOptions.Mode: %d", ErrInvalidConfig, o.Mode)
	}
	if o.Host != nil && !reflect.TypeOf(o.Host).Comparable() {
		// Buffers are matched to their allocator by ==.
		return fmt.Errorf("%w: SleepOptions.Host: %T is not comparable (use a pointer)", ErrInvalidConfig, o.Host)
	}
	var c backend.Copier
	if o.Mode == Offload {
		var ok bool
		if c, ok = a.drv.(backend.Copier); !ok {
			return fmt.Errorf("%w: the %s driver cannot copy (backend.Copier), so it cannot offload: %w", ErrInvalidConfig, a.drv.Name(), backend.ErrNotSupported)
		}
	}
	s := o.Stream
	if s == 0 {
		s = a.defaultS
	}
	if o.Mode == Offload {
		if _, err := a.stream(s); err != nil {
			return err
		}
	}
	if p.sleep == nil {
		p.sleep = &poolSleep{}
	}
	sl := p.sleep
	sl.state, sl.opts = Sleeping, o
	p.asleep = true
	err := a.sleep(p, sl, c, s)
	if sl.state == Sleeping { // rolled back
		sl.state = Awake
		p.asleep = false
	}
	return err
}

// sleep is Sleep's work once the state is Sleeping; on failure before the
// first handle is freed it restores everything and leaves the state
// Sleeping (Sleep makes it Awake). mu held (dropped in windows).
func (a *Allocator) sleep(p *Pool, sl *poolSleep, c backend.Copier, s backend.Stream) error {
	if a.exportedIn(p) {
		return fmt.Errorf("%w: pool %q", ErrPoolExported, p.name)
	}
	for _, st := range a.poolStreams(p) {
		a.counters.StreamSyncs++
		if err := a.waitUnlocked(func() error { return a.drv.StreamSynchronize(st) }); err != nil {
			return fmt.Errorf("vmmalloc: sleep of pool %q: synchronize stream %d: %w", p.name, st, err)
		}
	}
	if a.pending > 0 {
		a.processEvents()
	}
	ranges, pending := a.poolRanges(p)
	if pending > 0 {
		return fmt.Errorf("%w: pool %q has %d frees pending on work the sleep cannot wait for", ErrPoolBusy, p.name, pending)
	}
	// The backups: every allocated block's requested bytes, in buffers
	// kept from an earlier sleep where one fits.
	var bufs []*hostBuf
	var addrs []uintptr
	var sizes []uint64
	if sl.opts.Mode == Offload {
		for _, r := range ranges {
			for id := a.heap.Find(r.Addr); id != arena.NoBlock; id = a.heap.Next(id) {
				b, _ := a.heap.Block(id)
				if b.Addr >= r.Addr+uintptr(r.Size) {
					break
				}
				if b.State == arena.Allocated {
					addrs = append(addrs, b.Addr)
					sizes = append(sizes, b.Requested)
					bufs = append(bufs, sl.takeSpare(b.Requested, sl.opts.Host))
				}
			}
		}
	}
	hs := a.hookList()
	var rs []SegmentRange
	if hs != nil {
		rs = ranges
	}
	host := sl.opts.Host
	err := a.waitUnlocked(func() error {
		for i, ad := range addrs {
			if bufs[i] == nil {
				b, err := newHostBuf(host, sizes[i])
				if err != nil {
					return err
				}
				bufs[i] = b
			}
			bufs[i].n = sizes[i]
			if err := c.CopyDtoH(bufs[i].bytes(sizes[i]), ad, s); err != nil {
				return fmt.Errorf("back up [%#x, +%#x): %w", ad, sizes[i], err)
			}
		}
		reportUnmapped(hs, rs) // idle now, still mapped
		return nil
	})
	if err != nil {
		for _, b := range bufs {
			if b != nil {
				sl.spare = append(sl.spare, b)
			}
		}
		if !sl.opts.KeepHostBuffers {
			_ = a.freeSpares(sl) // a failure keeps them for a retry
		}
		return fmt.Errorf("vmmalloc: sleep of pool %q: %w", p.name, err)
	}
	// Unmap every handle, keeping it: on a failure they are mapped back
	// with their bytes.
	var kept []sleptRun
	for _, r := range ranges {
		sg := a.segAt(r.Addr)
		ks, uerr := sg.s.UnmapKeep(uint64(r.Addr-sg.base), r.Size)
		for _, k := range ks {
			kept = append(kept, sleptRun{sg: sg, off: k.Off, size: k.Size, held: k.Handle})
		}
		if uerr != nil {
			err = uerr
			break
		}
	}
	if err != nil {
		rerr := a.remapKept(kept)
		if hs != nil {
			_ = a.waitUnlocked(func() error {
				for _, r := range rs {
					_ = reportMapped(hs, r) // best effort: mapped again either way
				}
				return nil
			})
		}
		for _, b := range bufs {
			sl.spare = append(sl.spare, b)
		}
		if !sl.opts.KeepHostBuffers {
			_ = a.freeSpares(sl) // a failure keeps them for a retry
		}
		return errors.Join(fmt.Errorf("vmmalloc: sleep of pool %q: %w", p.name, err), rerr)
	}
	// Past the point of return: the pool is asleep.
	sl.state = Asleep
	sl.runs = kept
	a.countSlept(p, sl, -1)
	var ferrs []error
	for i := range sl.runs {
		r := &sl.runs[i]
		if ferr := a.drv.FreePhysical(r.held); ferr != nil {
			ferrs = append(ferrs, fmt.Errorf("%w: handle at %#x kept for Wake: %w", segment.ErrHandleNotFreed, r.sg.base+uintptr(r.off), ferr))
			continue
		}
		a.counters.HandlesFreed++
		r.held = 0
	}
	sl.backups = make(map[uintptr]*hostBuf, len(addrs))
	for i, ad := range addrs {
		if id := a.heap.Lookup(ad); id != arena.NoBlock && a.ownerOf(id).pool == p {
			sl.backups[ad] = bufs[i]
		} else { // freed while the copies ran
			sl.spare = append(sl.spare, bufs[i])
		}
	}
	// Buffers neither kept for a backup nor needed: no growth across
	// cycles. A failure keeps them for a retry; the sleep is done.
	_ = a.freeSpares(sl)
	if len(ferrs) > 0 {
		return fmt.Errorf("vmmalloc: sleep of pool %q: %w", p.name, errors.Join(ferrs...))
	}
	return nil
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
// If the memory cannot be had, Wake returns an *OutOfMemoryError; on any
// error the pool stays asleep with every backup intact and nothing
// leaked, and Wake can be called again. Wake of an awake pool returns
// ErrPoolAwake, during another Sleep or Wake ErrSleepInProgress.
func (p *Pool) Wake() error {
	a := p.a
	a.mu.Lock()
	defer a.unlock()
	a.quiesceWaits()
	if err := p.live(); err != nil {
		return err
	}
	sl := p.sleep
	if sl == nil || sl.state == Awake {
		return fmt.Errorf("%w: pool %q", ErrPoolAwake, p.name)
	}
	if sl.state != Asleep {
		return fmt.Errorf("%w: pool %q is %s", ErrSleepInProgress, p.name, sl.state)
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
	if a.overCap(total) {
		_ = errors.Join(a.trimCaches(), a.releaseAll())
		if a.overCap(total) {
			return a.wakeOOM(p, total, nil)
		}
	}
	fresh, err := a.createRuns(sl)
	if err != nil && isOOM(err) {
		// The ladder: cached handles, then every awake pool's free
		// memory (releaseAll skips pools that are not awake).
		for _, st := range a.statsOf(p) {
			st.NumAllocRetries++
		}
		_ = errors.Join(a.trimCaches(), a.releaseAll())
		fresh, err = a.createRuns(sl)
		if err != nil && isOOM(err) {
			return a.wakeOOM(p, total, err)
		}
	}
	if err != nil {
		return fmt.Errorf("vmmalloc: wake of pool %q: %w", p.name, err)
	}
	for i := range sl.runs {
		r := &sl.runs[i]
		h := fresh[i]
		if h == 0 {
			h = r.held
		}
		if err = r.sg.s.MapKept(segment.KeptHandle{Off: r.off, Size: r.size, Handle: h}); err != nil {
			rerr := a.unmapRuns(sl.runs[:i])
			a.freeFresh(sl, fresh)
			return errors.Join(fmt.Errorf("vmmalloc: wake of pool %q: %w", p.name, err), rerr)
		}
	}
	a.countSlept(p, sl, +1)
	// Restore and report with mu dropped: the pool is Waking, so nothing
	// allocates or releases its memory meanwhile; a Free moves the
	// block's backup to the spares, where the copy may still read it.
	c, _ := a.drv.(backend.Copier)
	s := sl.opts.Stream
	if s == 0 {
		s = a.defaultS
	}
	type restore struct {
		addr uintptr
		buf  *hostBuf
	}
	var todo []restore
	for ad, b := range sl.backups {
		todo = append(todo, restore{ad, b})
	}
	slices.SortFunc(todo, func(x, y restore) int { return cmpAddr(x.addr, y.addr) })
	hs := a.hookList()
	var rs []SegmentRange
	if hs != nil {
		rs, _ = a.poolRanges(p)
	}
	var accepted []SegmentRange
	err = a.waitUnlocked(func() error {
		for _, t := range todo {
			if err := c.CopyHtoD(t.addr, t.buf.bytes(t.buf.n), s); err != nil {
				return fmt.Errorf("restore [%#x, +%#x): %w", t.addr, t.buf.n, err)
			}
		}
		for _, r := range rs {
			if err := reportMapped(hs, r); err != nil {
				reportUnmapped(hs, accepted)
				return err
			}
			accepted = append(accepted, r)
		}
		return nil
	})
	if err != nil {
		a.countSlept(p, sl, -1)
		rerr := a.unmapRuns(sl.runs)
		a.freeFresh(sl, fresh)
		var hk *SegmentHookError
		if errors.As(err, &hk) {
			return errors.Join(err, rerr)
		}
		return errors.Join(fmt.Errorf("vmmalloc: wake of pool %q: %w", p.name, err), rerr)
	}
	sl.state = Awake
	p.asleep = false
	sl.runs = nil
	for _, b := range sl.backups {
		sl.spare = append(sl.spare, b)
	}
	sl.backups = nil
	if !sl.opts.KeepHostBuffers {
		// The pool is awake; a buffer whose free failed stays a spare
		// for a retry.
		_ = a.freeSpares(sl)
	}
	return nil
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

// createRuns makes a fresh handle for every run not held, all or
// nothing. mu held.
func (a *Allocator) createRuns(sl *poolSleep) ([]backend.Handle, error) {
	fresh := make([]backend.Handle, len(sl.runs))
	for i, r := range sl.runs {
		if r.held != 0 {
			continue
		}
		h, err := a.drv.CreatePhysical(r.size, r.sg.s.Prop())
		if err != nil {
			a.freeFresh(sl, fresh)
			return nil, fmt.Errorf("create %d-byte handle for %#x: %w", r.size, r.sg.base+uintptr(r.off), err)
		}
		a.counters.HandlesCreated++
		fresh[i] = h
	}
	return fresh, nil
}

// freeFresh frees the handles createRuns made (unmapped). A failed free
// keeps the handle as the run's held one, so Wake maps it next time and
// nothing leaks. mu held.
func (a *Allocator) freeFresh(sl *poolSleep, fresh []backend.Handle) {
	for i, h := range fresh {
		if h == 0 {
			continue
		}
		if err := a.drv.FreePhysical(h); err != nil {
			sl.runs[i].held = h // fresh only where none was held
			fresh[i] = 0
			continue
		}
		a.counters.HandlesFreed++
		fresh[i] = 0
	}
}

// unmapRuns unmaps the runs mapped by a wake being rolled back; a held
// handle stays held. mu held.
func (a *Allocator) unmapRuns(runs []sleptRun) error {
	var errs []error
	for i := len(runs) - 1; i >= 0; i-- {
		r := &runs[i]
		ks, err := r.sg.s.UnmapKeep(r.off, r.size)
		if err != nil {
			errs = append(errs, fmt.Errorf("rollback incomplete: %w", err))
			continue
		}
		_ = ks // the handle is held or fresh: the caller frees fresh ones
	}
	return errors.Join(errs...)
}

// remapKept maps back the handles a failed sleep unmapped. mu held.
func (a *Allocator) remapKept(kept []sleptRun) error {
	var errs []error
	for _, k := range kept {
		if err := k.sg.s.MapKept(segment.KeptHandle{Off: k.off, Size: k.size, Handle: k.held}); err != nil {
			errs = append(errs, fmt.Errorf("rollback incomplete: %w", err))
		}
	}
	return errors.Join(errs...)
}

// wakeOOM is the error of a Wake the device has no memory for. mu held.
func (a *Allocator) wakeOOM(p *Pool, total uint64, cause error) error {
	for _, st := range a.statsOf(p) {
		st.NumOOMs++
	}
	free, _, _ := a.drv.MemGetInfo(a.dev)
	oom := &OutOfMemoryError{
		Device:    a.dev,
		Requested: total,
		Tried:     total,
		Total:     a.total,
		Free:      free,
		Allocated: uint64(a.st.AllocatedBytes[0].Current),
		Reserved:  uint64(a.st.ReservedBytes[0].Current),
		Stranded:  a.strandedBytes(),
		Pool:      p.id,
		PoolName:  p.name,
		Cause:     cause,
	}
	if a.allowed < a.total {
		oom.Allowed = a.allowed
	}
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

// takeSpare takes the smallest spare buffer of host of at least n bytes,
// or returns nil. mu held.
func (sl *poolSleep) takeSpare(n uint64, host HostAllocator) *hostBuf {
	best := -1
	for i, b := range sl.spare {
		if b.host == host && b.size >= n && (best < 0 || b.size < sl.spare[best].size) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := sl.spare[best]
	sl.spare = slices.Delete(sl.spare, best, best+1)
	return b
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
// which Free has just freed: its buffer goes to the spares (a copy may
// still be reading it). mu held.
func (a *Allocator) dropBackup(p *Pool, ptr uintptr) {
	sl := p.sleep
	if b := sl.backups[ptr]; b != nil {
		delete(sl.backups, ptr)
		sl.spare = append(sl.spare, b)
	}
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
		sl.spare = append(sl.spare, b)
	}
	sl.backups = nil
	if err := a.freeSpares(sl); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		sl.runs = keep
		return errors.Join(errs...)
	}
	p.sleep = nil
	p.asleep = false
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
			host += int64(b.size)
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
			if slept[p] != 0 || sl != nil && (len(sl.runs) != 0 || len(sl.backups) != 0 || sl.bytes != [2]uint64{}) {
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
		for ad, b := range sl.backups {
			id := a.heap.Lookup(ad)
			if id == arena.NoBlock || a.ownerOf(id).pool != p {
				return corrupt("pool %q asleep: backup of %#x, not an allocation of the pool", p.name, ad)
			}
			if info, _ := a.heap.Block(id); info.Requested != b.n || b.size < b.n {
				return corrupt("pool %q asleep: backup of %#x holds %d bytes, the block %d", p.name, ad, b.n, info.Requested)
			}
		}
	}
	return nil
}
