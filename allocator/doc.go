// Package allocator is vmmalloc's caching allocator: it serves Malloc/Free
// of device memory per tensor, on streams, from many goroutines, out of
// segments whose physical memory is mapped on demand (expandable segments)
// or allocated whole (classic segments, PyTorch's default algorithm, kept as
// the baseline for studies).
//
// # Data model
//
// One Allocator serves one device. Its memory is split two ways:
//
//   - by size class (PyTorch's small and large "pools"; sizeClass here):
//     small (rounded requests ≤ 1 MiB) and large, each with its own page
//     size (2 MiB and 20 MiB by default: the handle size kept in its handle
//     cache) and its own reservations;
//   - by memory pool (Pool, PyTorch's MemPool; pool.go): the default pool
//     (the allocator's own cache, which Malloc uses) and up to 64 private
//     pools (NewPool). A block of one pool never serves another pool's
//     Malloc.
//
// What the device shares and what each pool owns:
//
//	Allocator (the device)                 Pool (each)
//	  streams, their events (primary         an owner per stream: its free
//	    stream states, streams.go)             lists in the heap, its active
//	  reservations per size class            count; its idle owner (memory of
//	    (segments; VA bound independent        released streams)
//	    of pools)                            the handles its blocks lie in
//	  handle caches, OOM ladder, hooks       limit, segment kind, statistics
//	  the aggregate statistics
//
// A segment is one virtual address reservation (package segment) whose
// range is tiled by blocks (package arena). The heap labels every block
// with an owner (arena.StreamID): one per stream and pool, so a block's
// pool is its owner's, and a free list is one owner's in one size class,
// a TLSF index giving the exact best fit (smallest, then lowest address).
// A block's life:
//
//	Unmapped ──map handles──▶ Free ──Malloc──▶ Allocated ──Free──▶ Free
//	    ▲                      │                   │
//	    └──unmap handles───────┘                   └─Free after RecordStream──▶ PendingFree
//	                                                   (events complete) ──▶ Free
//
// Malloc rounds the request (512 bytes, or roundup_power2_divisions), takes
// the best fit from its stream's free list and splits off the rest. On a
// miss it grows: it takes the lowest-addressed unmapped run that, merged
// with the stream's free block just before it (and just after it), fits,
// and maps only the granules needed (the driver's granularity, 2 MiB), so
// the heap grows at the lowest address and freed pieces merge back. The
// mapped range is cut every page size from its start: full-size handles
// (reused from a handle cache), then one handle of exactly the size of the
// rest. A growth of the large pool of at least expandable_handle_mb (64
// MiB) is cut into handles of that size instead, fresh from the driver:
// a third of the driver calls to map and later unmap it. Memory is
// unmapped a whole handle at a time, so handles that fit what was asked
// for, starting where the growth's allocation starts, leave less memory
// stranded in partly used handles than a fixed page grid. Under pressure
// (the growth would take reserved memory past half of what the process
// may use, or a pool past half its limit: pressure.go) every growth maps
// granule handles instead, so that near the limit every free granule can
// be unmapped and remapped where the heap grows; there a wholly free
// growth handle is unmapped rather than cut by a Malloc (whose cache hit
// then takes only blocks that leave less than a granule) and before a
// growth, to be remapped as granules. The handle cache's budget
// (handle_cache_mb, bytes) holds handles of every size a growth maps.
// Free coalesces with free neighbours of the same stream. A free block on another stream's list is never handed out:
// stream-ordered reuse needs no synchronisation.
//
// # Handles belong to one stream at a time
//
// Handles are mapped for one owner (a stream in a pool), and every block
// inside a mapped handle belongs to that owner, so no handle is shared by
// two pools or two streams; once the stream's blocks in a handle are
// all free they coalesce, and the handle can be unmapped after
// synchronising only that stream. Unmapped address space belongs to no
// stream, so every stream of a pool shares one reservation. Before a pool
// grows, free handles of other streams whose queued work has completed (a
// non-blocking event query says so) change hands where they are mapped, or
// are unmapped and remapped where the heap grows (reclaim.go), so many
// streams reserve about the peak of their sum, not the sum of their peaks.
// Under pressure a pool's growth also adopts other pools' idle free
// handles where they are mapped (whole handles, their reserved bytes
// moving with them; pool.go says which pools lend), so tenants whose
// peaks do not fit together hand memory over with no driver call.
// Unmapping for that, or for the stream's own holes (defragmentation),
// happens only when the growth would take the pool's mapped bytes past
// (1 + defrag_threshold) × its high water mark of allocated bytes plus a
// page: memory mapped for an earlier peak stays mapped, so a workload
// that returns to that peak does not unmap and remap it every step.
//
// # Address-space budget
//
// PyTorch reserves 9/8 of device memory per stream and pool, and many
// streams × devices exhaust the 128 TiB user address space (pytorch#192269).
// Here every stream and every memory pool share the reservations of a size
// class: each expandable segment reserves 9/8 of device memory (the 1/8
// lets memory be remapped past holes; at most segment.MaxGranules
// granules, 32 TiB at 2 MiB) and a size class has at most
// max_segments_per_pool (default 2) of them, so the address space reserved
// per device is at most 2 size classes × 2 × 9/8 = 4.5× the device memory,
// however many streams and pools (up to 64 private ones) are used
// (TestPoolSharesReservations). A second reservation is made only when no
// unmapped run of the first fits. Classic segments are reserved per growth,
// mapped whole, for the pool that grew.
//
// # Out-of-memory ladder
//
// When growth fails for lack of memory (driver OOM, the
// per_process_memory_fraction cap, or the address-space budget), Malloc
//  1. frees the cached physical handles (unmapped but not yet freed) and
//     retries;
//     Then, if owned Buffers (NewBuffer) hold memory and owned_buffer_gc
//     is on, runs a garbage collection, waits with mu dropped for the
//     cleanups of the Buffers it found unreachable (they Free), and
//     retries; Mallocs that would grow meanwhile wait for it (owned.go);
//  2. waits for every pending stream event (freeing the blocks waiting on
//     them), unmaps every free handle of every stream in every pool
//     (synchronising each such stream; interior handles of free blocks
//     too), so no pool starves for memory another pool only caches,
//     releases empty segments and cached handles, and retries
//     (num_alloc_retries);
//  3. takes a last look (oom.go): waits for the growths, releases and
//     collections of other goroutines in flight, searches the free lists
//     again, and climbs rung 2 again while memory to release appeared
//     with the lock dropped (or grows again where room came back), so
//     that a retry with nothing changed never succeeds where the Malloc
//     failed;
//  4. returns an *OutOfMemoryError stating the request, device total and
//     free memory, allocated bytes, reserved-but-unallocated bytes, and
//     where the free memory is (the largest free block the request could
//     use, free bytes unusable for its size, other streams' and pools'
//     caches), with advice that tells fragmentation from exhaustion.
//
// A growth that would take a pool past its own memory limit
// (PoolOptions.MemoryLimit) releases only that pool's free memory, retries
// (with the last look, within the pool), and returns an *OutOfMemoryError whose PoolLimit says the pool's
// limit, not the device, was hit: other pools' caches are theirs.
//
// Completed events are processed at the start of every Malloc that has
// some pending.
//
// # Sleep and wake
//
// Pool.Sleep gives a pool's physical memory back to the driver and keeps
// its addresses; Pool.Wake maps fresh handles at exactly the old places
// (vLLM's sleep(level)/wake_up(tags), torch_memory_saver's pause/resume;
// sleep.go). Every pool is an expandable pool, so sleeping is unmapping
// the handles the pool already owns: a handle holds blocks of one owner,
// hence of one pool.
//
//	          Sleep: sync the pool's streams (mu dropped), back up
//	          allocated bytes (Offload; mu dropped), report Unmapped,
//	          unmap and free every handle of the pool
//	awake ──▶ sleeping ──────────────────────────────────▶ asleep
//	  ▲          │ any failure: handles mapped back,         │
//	  └──────────┘ contents untouched                        │ Wake
//	  ▲                                                      ▼
//	  └──────────── waking ◀─────────────────────────────────┘
//	   restore       │ create handles (OOM ladder first), map
//	   backups,      │ at the old offsets, set access; any
//	   report Mapped │ failure: back to asleep, backups intact
//
// While a pool is not awake its blocks stay in the heap, allocated and
// free, so no other pool's growth takes their address space; its Malloc
// and RecordStream return ErrPoolAsleep, Free works (the last block a
// backup holds freed, the backup's host memory goes at once), Close works
// once nothing is allocated, and every release (the ladder, Synchronize,
// ReleaseStream, reclaim) skips it; its own EmptyCache gives up its free
// cache, which Wake then does not map back. Its reserved bytes leave
// ReservedBytes for AsleepBytes, so the memory fraction cap and the other
// pools see the memory free at once. Wake's out-of-memory ladder takes
// back other pools' free cache; the pool's own free cache is optional,
// given up if the device still has no room for it, so that what holds
// allocations wakes; only if that does not fit either does Wake return
// *OutOfMemoryError. The modes are
// Discard, Offload (host backups of the allocated bytes) and Memset (zero
// at Wake); SleepOptions.Poison fills what was discarded with PoisonByte
// at Wake. Check verifies the sleep records (checkSleeps).
//
// Pool.Close returns the pool's memory to the driver: the handles its
// release unmaps into the device-wide handle cache are trimmed back out
// (to the cache's level when the pool was made), so a tenant that leaves
// leaves the device's free memory as it found it.
//
// # Release policy and reserved-memory bound
//
// EmptyCache runs rung 2 of the ladder on demand. Synchronize(stream) waits
// for the stream and unmaps the stream's free handles in excess of
// release_threshold_mb, as CUDA's pool release threshold does. In classic
// mode, max_split_size_mb keeps big blocks whole (PyTorch's rules). In
// expandable mode it is ignored: splitting an expandable block strands no
// memory, since its free handles can always be unmapped; honouring it there is
// what made reserved memory grow without bound in pytorch#193400.
//
// # Stream lifecycle
//
// A stream is learnt on first use and its state (free lists, queued events)
// kept until ReleaseStream(s), which waits for s, returns its free memory
// and forgets it; call it before destroying a stream. Memory still
// allocated on a released stream is relabelled to an internal idle owner
// and returned as it is freed. A stream destroyed without ReleaseStream is
// noticed when a driver call on it fails, or when RecordStream asks the
// driver about it again (backend.StreamValidator, shared with the host
// allocator; Malloc trusts a stream it knows, so that its cache hit asks
// the driver nothing); its memory, and a block
// recorded on it and freed since, is counted as stranded
// (DeviceStats.StrandedBytes, OutOfMemoryError.Stranded) and reused or
// unmapped only after a device-wide synchronize
// (backend.DeviceSynchronizer) shows its work complete: the one that
// EmptyCache, rung 2 of the out-of-memory ladder, Synchronize or
// ReleaseStream of the destroyed stream, or Close makes; Free never makes
// one. Where the driver cannot synchronize a device it stays stranded until
// Close. Events are
// polled only on streams that have some queued, so the work per call does
// not grow with the streams ever used. streams.go has the details.
//
// # Errors
//
// Every error wraps a sentinel (errors.Is). Bad input changes nothing and
// makes no driver call. After Close every method returns ErrClosed before
// looking at its arguments. A pointer that is not a live allocation is
// ErrInteriorPointer inside an allocated block, ErrDoubleFree at a
// pending-free block or a 512-aligned address in mapped free memory (where
// a block may have been freed), and ErrUnknownPointer anywhere else: 0, an
// unaligned address, outside every reservation, or in the unmapped part of
// one. A config string that sets a key twice is refused.
//
// # Planned steps
//
// A framework calls MarkStep once per step (Pool.MarkStep for a pool's
// own). A pool whose steps repeat the same Mallocs and Frees learns the
// step, packs the blocks born and freed within it into one region offline
// (package arena/plan), and serves later steps from the plan: the k-th
// Malloc checks its rounded size and stream against the k-th call learned
// and returns base+offset[k], with no search, split, merge or driver call.
// The first call that differs sends the rest of the step to the heap. The
// state machine (unmarked, learning, planned, diverged, off) is described
// in planned.go; StepStats reports it. planned_steps:False turns it off;
// without MarkStep nothing changes.
//
// # Memory history
//
// RecordHistory (off by default) keeps a ring of alloc, free_requested,
// free_completed, segment map/unmap/alloc/free, empty_cache and oom
// entries, optionally with the Go call stack of each Malloc and Free
// caller (history.go). MemorySnapshot pairs it with the segments for
// PyTorch's memory viewer (package stats/memviz), and MemProfile feeds the
// pprof profile of package allocator/devprof. When off, it costs the
// cache-hit path nothing: its bit in the fast paths' guard byte is clear.
//
// # The cache hit
//
// Malloc and Free first try a fast path under one lock acquisition,
// unlocked explicitly on return (nothing between Lock and Unlock can
// panic): Malloc on the stream it used last with no pending event and no
// history takes arena.Heap.AllocFit (best fit, the max_split_size rules
// as bounds from fitLimits, split); Free with no RecordStream'd block, no
// history and no pool asleep takes arena.Heap.FreeAt (lookup, free, merge)
// unless the block has events. Those conditions, and Close, are bits of
// one byte (hitOff), so that each path tests one field. AllocFit keeps, per free index, the last block it
// split in place (arena's fitMemo): while nothing but that block's own
// split and merge back has changed the index, the next request of the
// same size takes it again without a search, so the cycle of a cache hit
// searches once; the heap's results are those of the search, always
// (arena.Heap.Check verifies a memo that claims to be valid). The five
// hot statistics store only what cannot be derived later
// (stats.HotCounters): a malloc stores Current and Allocated of
// Allocation, AllocatedBytes and RequestedBytes for the size class and
// their aggregate's Current, and compares each Peak; Active and
// ActiveBytes are Allocation and AllocatedBytes plus the blocks pending
// free, which only the general path moves, so the cache hit stores only
// their peaks, and only when Allocation's peak moves; a free stores the
// three Currents. Stats derives the rest when it copies the record, and
// Check compares Current and Peak, which are always exact. FreeAt's
// result has four fields, so that it stays in registers. Anything else,
// including every error, goes to the general path (mallocSlow, freeSlow),
// which handles every case.
//
// What a cache-hit pair costs: 469 instructions of vmmalloc code per
// Malloc+Free at 100 live blocks (docs/results.md, "Cache hit", gives the
// cachegrind command), 0 allocations. What remains per pair: the lock's
// two atomic round trips, the split and the merge back, the address
// table, four record lookups (a bounds-checked slab index each), the
// statistics, and three calls below Malloc and Free (AllocFit, FreeAt,
// CountMalloc; Go keeps no register across a call, so each spills and
// reloads what is live). A training step's calls rarely free and
// reallocate one size with nothing in between, so the memo seldom serves
// them; the search does.
//
// Pools (pool.go) cost the default pool's cache hit one flag test per
// Malloc and per Free (Allocator.pooled). A cache hit inside a private
// pool (Pool.Malloc) counts two records, the pool's and the aggregate's,
// in one call (stats.CountMallocBoth).
//
// A front cache that does not coalesce, per stream and exact size (a
// freed block parked, handed to the next request of its size, and
// coalesced into the heap before any other call), was measured and not
// taken: it changes which block a request gets. On cs336_ctx128_fullstep
// the parked block is the heap's pick in 45% of the requests it would
// serve, and a prototype moved the shared traces' driver calls and
// minimum capacity by up to 8%, where results must stay within 0.1%.
//
// # Mechanism and policy
//
// The blocks live in an arena.Heap, which owns their storage (pointer-free
// records, so the garbage collector scans nothing per block), splitting,
// coalescing (free neighbours of one stream, unmapped neighbours), best
// fit per stream and pool, the unmapped index, the address table of
// allocated blocks, and the Unmapped ↔ Free transitions (BeginMap/CommitMap,
// BeginRelease/CommitRelease) with their Releasing and Mapping states; it
// has its own Check, which Check runs. The allocator decides when: pools
// and rounding, streams and their events, growth and release policy, the
// out-of-memory ladder, driver calls and statistics. It keeps, beside the
// heap, its segments by arena.RegionID, its stream states by
// arena.StreamID, and the streams recorded on allocated blocks
// (RecordStream) by arena.BlockID. Classic inactive_split accounting is the
// heap's split hook.
//
// # Concurrency and lock order
//
// One mutex (Allocator.mu) guards all state of an Allocator, the heap
// included; the cache-hit path holds it for one best fit and split, or one
// merge, and makes no driver call and no Go heap allocation. Lock order:
// Allocator.mu, then the driver's own locks (the allocator calls the
// driver with mu held or dropped, never the other way round); no other
// lock is taken under mu.
//
// No wait on queued device work runs with mu held. Every such wait goes
// through waitUnlocked, which counts it in Allocator.inflight, drops mu,
// waits, and retakes mu; what the caller must protect while mu is dropped
// it marks first. The functions that drop and retake mu, and what each
// marks:
//
//   - releaseStreamPool with needSync (StreamSynchronize of the stream
//     whose handles it releases, then the driver Unmap of each handle):
//     marks the whole handles it will unmap Releasing in the heap (best
//     fit and coalescing skip them, so no other goroutine can allocate
//     memory whose old work is still being waited for) and begins their
//     unmap in the segment (Segment.BeginUnmap: an overlapping unmap is
//     refused, Release and Destroy return ErrBusy); after the wait,
//     still without mu, it makes the unmap calls (segment.UnmapOp.Run),
//     then retakes mu, ends the unmaps (handles to the cache or freed,
//     counters) and commits the marks for what was unmapped (reserved
//     bytes drop only then), or, if the wait failed, ends them unrun and
//     aborts the marks. A classic segment's release (Destroy) stays
//     under mu. Reached from growth
//     (defragBeforeGrow), releaseUntil (the garbage-collection threshold),
//     Synchronize's release, EmptyCache and rung 2 of the out-of-memory
//     ladder.
//   - synchronizeAndFreeEvents (EventSynchronize of each pending event;
//     EmptyCache, the ladder): marks nothing; the block waiting on the
//     event is PendingFree, which nothing else takes. It retires the
//     queue's head after the wait only if nothing was retired from that
//     queue meanwhile (streamState.retired): another goroutine may have
//     retired the event and recycled it and the block, recorded again
//     after the wait, and only the events queued when it reached the
//     stream are waited for.
//   - Synchronize (StreamSynchronize): marks nothing; blocks freed to the
//     stream meanwhile (streamState.frees) make its release wait again
//     with its blocks marked.
//   - ReleaseStream (StreamSynchronize): marks the stream releasing:
//     stream() refuses it (ErrInvalidStream), so no Malloc, RecordStream,
//     Synchronize or second ReleaseStream starts on it; it completes only
//     the events queued on the stream before its wait (streamState.retired
//     counts them), and waits again while a Free during the wait queued
//     another or freed a block of the stream (streamState.frees), so the
//     state is forgotten with none queued and no work queued during the
//     wait left. A failed wait clears the mark and changes nothing else.
//     Blocks of the stream that another call's release holds Releasing
//     go to the idle owner with the rest; that call's wait failing
//     afterwards (the caller destroyed the stream) is then moot. A
//     retired state is kept for reuse, but reused for a new stream only
//     while no wait runs without mu, so a caller that held it across a
//     wait finds it no longer owning its stream (owns).
//   - insertEvents, Free's fallback when an event cannot be recorded
//     (StreamSynchronize of each such stream): marks the block in
//     Allocator.freeing, so another Free or RecordStream of it fails with
//     ErrDoubleFree; the events already recorded are held in a private
//     slice and given back if a wait fails (nothing changed).
//   - Close (StreamSynchronize of every stream): sets closed first, so
//     every later call returns ErrClosed before it touches state, after
//     quiesceWaits found no other wait in flight; between its waits it
//     holds mu, so a second Close waits in quiesceWaits until the first
//     returns, and then finds nothing left (ErrClosed).
//   - mapGrowth (growth of an expandable pool: handle creation, Map and
//     SetAccess, the driver calls of segment.MapOp.Run): marks the range
//     Mapping in the heap (arena.Heap.BeginMap: best fit, coalescing,
//     growth searches and releases skip it, and a segment with a Mapping
//     block is not dropped) and in the segment (Segment.BeginMap: a map
//     overlapping it is refused, Release and Destroy return ErrBusy); the
//     segment's state, its handle cache and the driver-call counters
//     change only with mu held, in BeginMap and EndMap. It gives the
//     growth a ticket in Allocator.growths and counts its bytes in
//     mappingBytes, which the memory-fraction cap adds to reserved bytes. After retaking mu,
//     EndMap records the handles (reserved bytes and the history's
//     segment_map entry count only then, at CommitMap) or rolls the map
//     back and AbortMap unmarks the range, exactly as a failed map under
//     the lock did. A Malloc whose stream was released meanwhile fails
//     with ErrInvalidStream and the mapped memory goes to the idle owner
//     (the next release returns it); one whose free neighbour, counted
//     into the growth, was allocated meanwhile keeps the memory on its
//     stream and grows again (errGrowAgain). A Malloc that needs memory
//     while growths are in flight waits for those (awaitGrowths, on
//     Allocator.grown; not for growths started later, so a goroutine that
//     grows again and again starves nobody), takes its stream's best fit
//     if one appeared, and before declaring out-of-memory waits again for
//     the growths then in flight and retries (the last look, oom.go), so
//     that two Mallocs do not both grow for what one growth serves and the
//     memory a failing growth held is not refused to the other. The last
//     look waits the same way for the releases in flight (releaseRels and
//     flushUnmaps take a ticket in Allocator.releasesLive for their
//     window; awaitReleases) and for owned-Buffer collections. holdForGrowth
//     raises and lowers the handle cache's limit by its own amount, so
//     overlapping growths each undo only their raise.
//   - Pool.Sleep and Pool.Wake (sleep.go): mark the pool Sleeping or
//     Waking (its Malloc, RecordStream, releases and a second Sleep or
//     Wake are refused or skip it) and its ranges in flight in their
//     segments (Segment.BeginUnmap, Segment.BeginMapKept); Sleep drops mu
//     for its stream synchronizes and for one window of pinned
//     allocations, backup copies, Unmapped reports, unmaps and handle
//     frees; Wake for one window of creates, maps, SetAccess, restore
//     copies and Mapped reports, with a ticket in growths and its bytes in
//     mappingBytes, as a growth's.
//
// So Malloc, Free, Synchronize, ReleaseStream, EmptyCache and Close may
// drop and retake mu, and each re-validates after: a Malloc whose stream
// was released meanwhile fails with ErrInvalidStream (owns). Close, Check,
// Snapshot and MemorySnapshot wait until no wait is in flight
// (quiesceWaits), so they never see a Releasing or Mapping block, a
// releasing stream or a block being freed (Check reports any left); a
// growth in flight and a Malloc waiting for one count as waits there.
//
// Pools add no lock: every pool's state is guarded by Allocator.mu.
//
// Segment hooks (hooks.go) are called without mu, each serialised by the
// hook's own mutex: lock order hook.mu, then Allocator.mu (a callback may
// call Stats or Spans, which take mu), and mu is never held when a hook's
// mutex is taken. A growth's Mapped reports run in mapGrowth's window,
// after MapOp.Run and before EndMap, with the range still Mapping (a
// classic growth reports its new segment before adding it to the heap);
// an unmap's reports run where its range is Releasing: in
// releaseStreamPool's window after the stream synchronize and before
// UnmapOp.Run, or in flushUnmaps for the releases that run under mu when
// no hook is attached (releaseBlock queues them while one is; every call
// that may queue one flushes before it unlocks, in Allocator.unlock, and
// growth flushes before it maps). AddSegmentHook takes its view after
// quiesceWaits and an empty queue, and holds the new hook's mutex across
// its catch-up, so later reports to it come after. A hook that refuses or
// panics in Mapped fails the growth with a full rollback; a panic in
// Unmapped is recovered. Callbacks must not call methods that wait for
// the work running them (Malloc, Free, EmptyCache, Check, snapshots,
// Close, RemoveSegmentHook).
//
// Lock order: Allocator.mu, then the driver's locks. An exporter's lock
// (ShareHolder, exported.go: allocator/ipc's Exporter) comes after mu: the
// allocator tells it of exported handles it unmaps with mu held, and it
// never calls the allocator holding its own. segment.Segment and
// segment.HandleCache have no lock of their own: mu guards them, and the
// only driver calls made on their behalf without mu are those of
// MapOp.Run and UnmapOp.Run, which touch no state of theirs.
//
// Still made with mu held: the unmap calls of releases that need no
// synchronize (releaseBlock: Synchronize's release after its own wait,
// ReleaseStream's, reclaim of idle streams' handles), the release of
// physical handles (FreePhysical, handle-cache trims), the
// reservation and release of address ranges (a new expandable segment,
// an empty one dropped), classic growth (a classic segment is reserved,
// created and mapped in one call), the rollback of a failed growth map
// (its unmaps and frees), the device synchronize of quiesce (only after a
// stream was destroyed without ReleaseStream), and the non-blocking event
// queries.
// BenchmarkMallocFreeDuringWait shows what is left: while another
// goroutine waits for its stream, or maps with driver Maps of 2 ms each
// (other=slow-map), a cache-hit pair's own duration stays within
// microseconds at p99 (docs/results.md, "Waits and the lock").
//
// Cache-hit throughput does not grow with goroutines: Malloc and Free each
// hold mu for all their work, so two goroutines on two streams take turns
// (BenchmarkMallocFreeTwoStreams). A per-stream lock for the cache hit
// would still take the heap's lock for the split and the merge that every
// pair makes.
package allocator
