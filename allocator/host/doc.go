// Package host is vmmalloc's caching allocator of pinned host memory: the
// staging buffers of host↔device copies (PyTorch's pin_memory, served by its
// CachingHostAllocator), and the registration of host memory the program
// already owns. It allocates through the driver's optional
// backend.HostMemory capability (ACL aclrtMallocHost / aclrtFreeHost /
// aclrtFreeHostWithDevSync / aclrtHostRegister / aclrtHostGetDevicePointer /
// aclrtHostUnregister; CUDA cuMemHostAlloc / cuMemFreeHost /
// cuMemHostRegister / cuMemHostGetDevicePointer / cuMemHostUnregister).
//
// Pinning is slow (the emulator's cost model charges 50 µs plus 250 µs per
// GiB for MallocHost, and real drivers take a global lock and touch every
// page), so freed blocks are cached and reused.
//
// # Two policies
//
// Expandable segments (expandable_segments:True, the default on Linux) are
// the device allocator's design over host memory: blocks are split from and
// coalesced into chunks of pinned memory, so what is pinned follows what is
// asked for. The size-class policy (expandable_segments:False, the default
// elsewhere, and the baseline) pins one driver allocation per block, rounded
// to a size class and never split. Both share the life of a block, stream
// ordering, the quarantine, registration, the pin budget and the
// statistics described below.
//
// # Expandable segments
//
// The allocator reserves host address space (4 GiB first, each further
// reservation twice the last, mmap(PROT_NONE, MAP_NORESERVE): no memory, no
// commit charge) and maps
// chunks of it on demand: a chunk is a whole number of 2 MiB granules
// (ChunkGranule), made readable and writable (mprotect) and pinned and
// mapped for the device with one HostRegister(MAPPED); its device address
// (HostGetDevicePointer) is learnt once and stays valid for the chunk's
// life, so DevicePointer of any byte of a block is the chunk's plus the
// offset, without a driver call. Each reservation is a region of an
// arena.Heap, the block heap the device allocator uses, Unmapped where no
// chunk is mapped: a request, rounded up to a 4 KiB page, takes the
// best-fitting free block (split, the rest stays free), and a freed block
// merges with its free neighbours, across chunks too. A request no free
// block fits maps a chunk where it pins least: next to the free block at
// the end of a chunk (or the start of the next), the chunk being the
// request less that free block, rounded up to the granule, or else a chunk
// of the whole request rounded up to the granule, so a 20.4 GiB request
// pins 20.4 GiB (TestLargeRequestPinsWhatItAsks; the size classes pin 22
// GiB, PyTorch's power-of-two classes 32 GiB). The range is Mapping in the
// heap while the driver works with the lock dropped, and joins its
// neighbours only once registered and only if its device addresses
// continue theirs: with CUDA's unified addressing the device address of
// registered memory is its host address, so adjacent chunks always are;
// where a driver places a chunk elsewhere (ACL, the emulator after an
// unregister), the chunk is unmapped and mapped again a granule away from
// every other, so no block spans device addresses that are not
// contiguous. A fault while mapping leaves the range Unmapped, joined to
// nothing. Chunks are unmapped whole under pressure (the out-of-memory
// ladder, EmptyCache, Close; with pinned_release_on_grow also before a new
// chunk is mapped), any chunk that lies wholly in free memory, between
// others too: HostUnregister, then madvise(MADV_DONTNEED) and
// mprotect(PROT_NONE) give the pages back and leave the address space
// reserved (Unmapped) for the next chunk. A chunk whose registration the
// driver refuses to undo after a failed mapping stays counted as pinned
// until a later release undoes it. MallocHost memory is never used: CUDA
// refuses to register memory cuMemHostAlloc pinned (CUDA_ERROR_INVALID_VALUE,
// measured on an H200), and the register path is the one both drivers
// support.
//
//	address space:  reserved ──map (mprotect RW, HostRegister)──▶ chunk
//	                   ▲                                            │
//	                   └── unmap (HostUnregister, MADV_DONTNEED) ◀──┘
//	                        a wholly free chunk, under pressure
//	block in a chunk: free ──Malloc (split)──▶ allocated ──Free──▶ free-pending
//	                   ▲                                              │
//	                   └──────── events complete: merged ─────────────┘
//
// A small per-size fast cache (at most max(4 MiB, 1/64 of what is
// pinned)) keeps freed blocks out of the heap, so the cache hit is a slice
// pop, as in the size-class policy; it is flushed into the heap whenever a
// request is not in it, before the heap is searched, and before chunks are
// unmapped.
//
// Where the driver offers host virtual memory management (CUDA 13:
// cuMemCreate with a CU_MEM_LOCATION_TYPE_HOST location, cuMemMap and
// cuMemSetAccess into a range from cuMemAddressReserve) a chunk would be a
// physical host handle mapped into a device-visible reservation instead of
// registered OS memory: mapChunk and releaseChunk are the two places that
// change, and the device-contiguity check would always pass, since the
// mapping fixes the device address.
//
// Measured (BenchmarkPoliciesOnTraces, the shared PyTorch snapshots
// replayed as pinned staging three steps in a row; hit% counts all three):
//
//	trace                          held/live classes  expandable  +release_on_grow   hit% classes → expandable   steady pins
//	cs336_ctx128_forward                    1.003       1.008        1.051           85.2 → 89.6                 0
//	cs336_ctx128_fullstep                   1.188       1.020        1.027           91.1 → 95.1                 0
//	cs336_gpt2small_compiled_train          1.113       1.006        1.007           93.4 → 98.7                 0
//	cs336_medium_ctx1024_train              1.255       1.034        1.034           94.0 → 99.5                 0
//	cs336_small_forward_bf16                1.091       1.122        1.130           95.9 → 97.1                 0 (8 with rog)
//	llama7b_offload_4streams                1.844       1.200        1.299           99.5 → 99.8                 0
//	opt125m_zeroth_order_finetune           1.189       1.082        1.008           97.9 → 99.4                 0
//	tts_inference_server                    3.118       1.378        1.378           95.2 → 99.5                 0
//
// Expandable segments hold less than the size classes on seven of the
// eight traces (geometric mean 1.10 against 1.37), pin 2 to 10 times less
// often, and pin nothing in a steady step. Four traces stay above 1.05:
// what is left is fragmentation between live blocks (free holes too small
// for the request at hand, a few large block sizes in few steps), which
// no placement inside pinned memory undoes. The fast cache's exact-size
// reuse costs opt125m_zeroth_order_finetune 6 points (1.024 without it)
// and the others under 2; the granule under 2 points.
//
// The fast cache keeps blocks of up to 1 MiB by size, and up to 8 larger
// sizes by exact size, within the same byte cap, so a cache hit of any
// size is a slice pop (BenchmarkCacheHit: 31 ns for 256 KiB and 4 MiB
// blocks, against 39–40 ns for the size classes). Its blocks go back to
// the heap before any heap search, so best fit always sees every free
// byte: a cached block left between free ranges would split the free
// memory a larger request needs.
//
// # The pin budget
//
// Pinned memory cannot be swapped. Every pin (a chunk, or a size-class
// block) first asks a PinBudget, shared by every allocator of the process
// (ProcessPinBudget) unless Config.Budget names another; the driver is
// asked only if the budget allows it, and the budget gets the bytes back
// when they are unpinned. Its limit is pinned_budget_mb (default half of
// physical memory, 0 = unlimited), set by New. A refusal climbs the
// out-of-memory ladder (below) like a driver's, since unmapping this
// allocator's free chunks frees budget; at its end Malloc returns a
// *BudgetError (errors.Is ErrBudget and ErrOutOfMemory) naming the budget,
// or MallocWith with AllowPageable serves the request with pageable memory
// and says so (Allocation.Pinned false, Stats.PageableBytes).
// A sleeping pool's offload backups made in this allocator pin 1.012× the
// bytes backed up (the size classes 1.091×;
// TestSleepBackupsPinWhatTheyBackUp).
//
// # The size-class policy
//
// A block is one pinned allocation from the driver and is never split: a
// request is rounded up to a size class and served by a cached block of
// exactly that class, or by a new block. Classes are whole 4 KiB pages;
// above one page they are the powers of two and d steps between
// consecutive powers (2^k + j·2^k/d, j = 1..d, no step below a page). d = 1
// is PyTorch's power-of-two rounding, which wastes up to half of a block;
// d = 8 wastes at most an eighth.
//
// The default, d = 8, is measured (BenchmarkSizeClassesOnTraces): the
// allocations of eight real PyTorch snapshots replayed as if every tensor
// were staged through pinned memory. Peak pinned bytes held over peak
// bytes asked for (held/live), and the share of Malloc calls served from
// the cache:
//
//	trace                          held/live d=1   d=2    d=4    d=8    hit% d=1 → d=8
//	cs336_ctx128_forward               1.535  1.181  1.003  1.003   55.8 → 55.7
//	cs336_ctx128_fullstep              1.373  1.455  1.268  1.188   75.7 → 73.2
//	cs336_gpt2small_compiled_train     1.821  1.393  1.167  1.113   80.3 → 80.2
//	cs336_medium_ctx1024_train         1.239  1.267  1.255  1.255   82.0 → 81.9
//	cs336_small_forward_bf16           1.842  1.398  1.194  1.091   88.1 → 87.7
//	llama7b_offload_4streams           1.712  1.881  1.881  1.844   98.6 → 98.6
//	opt125m_zeroth_order_finetune      1.889  1.425  1.235  1.189   94.2 → 93.7
//	tts_inference_server               2.488  2.450  3.089  3.118   89.1 → 85.5
//	geometric mean                     1.70   1.52   1.41   1.37
//
// Eight classes per power of two hold less pinned memory than PyTorch's
// power-of-two classes on five of the eight traces (up to 1.7× less), 1.3%
// more on a sixth, and cost at most 2.5 points of hit rate (3.6 on the tiny
// tts trace). The two traces that reuse a few sizes heavily (llama offload,
// tts) hold less with coarse classes, which let one block serve more
// sizes: choose pinned_roundup_power2_divisions:1 for such workloads.
//
// # Life of a block
//
//	         Malloc (cache miss: MallocHost, or mmap + HostRegister)
//	              │
//	              ▼
//	┌──────▶ allocated ──Free, no stream recorded──────────────┐
//	│             │                                            │
//	│             │ Free after RecordStream: an event is       │
//	│             │ recorded on each stream (never waits)      │
//	│             ▼                                            ▼
//	│       free-pending ──every event complete (EventQuery)──▶ cached
//	│             ▲                                            ▲
//	│             │ Free after RecordStream on a stream        │ EmptyCache, OOM, Close:
//	│             │ destroyed since (never waits)              │ a device synchronize
//	│             │                                            │
//	│        quarantined ──────────────────────────────────────┤
//	│        (free-pending, no events)                         │
//	│                                                          │
//	└──────────────────── Malloc (cache hit) ─────────────────┤
//	                                                           │ EmptyCache, OOM, Close
//	                                                           ▼
//	                                     released (HostUnregister if registered, then
//	                                     FreeHost / FreeHostWithDevSync, or munmap)
//
// Completed events are collected, without waiting, at the start of every
// Malloc while some block is free-pending, and by EmptyCache. Events come
// from a per-device pool, so after warm-up Free creates none. A stream's
// events complete in order, so each stream's queue is polled oldest first
// and polling stops at the first incomplete event.
//
// When the driver is out of pinned memory, Malloc releases the cached blocks
// and retries, then waits for the pending events and ends the quarantine
// (below), releases those blocks too and retries, and only then returns an
// error wrapping ErrOutOfMemory. A cache miss pins its new block (MallocHost,
// or mmap and HostRegister, which take milliseconds per megabyte) with
// the allocator's mutex released too. Those waits (the newest pending event of
// each stream; a device-wide synchronize for the quarantine) and
// EmptyCache's run with the allocator's mutex released, so other
// goroutines' calls, cache hits included, go on meanwhile; what the waiter
// then releases it decides from the state it finds after the wait, and a
// Close meanwhile lets the wait end first and makes the waiting call
// return ErrClosed. Free waits only if the driver fails to give or record
// an event on a live stream: it then synchronizes that stream (with the
// mutex held: a driver fault, not a steady state) and, if that fails too,
// returns the error with nothing changed. Close waits with the mutex held:
// every call after it returns ErrClosed anyway.
//
// # Streams that disappear
//
// RecordStream asks the driver about its stream on every call
// (backend.StreamValidator, the check the device allocator makes too): a
// stream destroyed after the allocator had seen it is refused like one it
// never saw, with an error wrapping ErrInvalidStream and a
// *backend.StreamError, and the block is left as it was.
//
// A stream recorded on a block may still be destroyed before the block is
// freed; its queued work still runs, but no event can be recorded on it and
// no stream wait can name it. Free then quarantines the block (free-pending
// without events) instead of failing or waiting: waiting for the whole
// device would wait for the unrelated work of every other stream, and the
// block must not be reused while the destroyed stream's work may still
// touch it. It forgets the stream. A quarantined block is counted
// (Stats.Quarantined, Stats.QuarantinedBytes, and Check recounts them) and
// stays quarantined until something shows the device's work complete:
//
//   - EmptyCache, rung 2 of the out-of-memory ladder, and Close end the
//     quarantine where there is one. Where the driver can wait for a whole
//     device (backend.DeviceSynchronizer), they synchronize every device
//     once (Stats.NumDeviceSyncs) and cache the blocks quarantined
//     before that wait began (one quarantined during it may have work the
//     wait did not cover, and stays for the next); otherwise they
//     give MallocHost blocks back with FreeHostWithDevSync, which waits for
//     the device work that uses them. Besides Close, which gives every
//     block back with FreeHostWithDevSync, these are the only device-wide
//     waits the allocator makes, and EmptyCache and Malloc make none while
//     nothing is quarantined.
//   - Blocks of OS memory (pinned_use_host_register) have no such call
//     without a DeviceSynchronizer: they stay quarantined until Close,
//     which releases them without waiting.
//
// So quarantined memory never makes Malloc fail: before it reports out of
// memory, the ladder takes it back. The device allocator treats a block
// recorded on a destroyed stream the same way (its "stranded" blocks,
// DeviceStats.StrandedBytes).
//
// # Device addresses
//
// DevicePointer returns the device address of a host address inside an
// allocated block or a mapped registration. The device address of a
// MallocHost block is asked of the driver directly (CUDA maps
// cuMemHostAlloc memory for the device, and refuses to register it); only
// a driver that has none for it unregistered (ACL, and the emulator)
// gets it registered (HostRegister, MAPPED), the first time its device
// address is asked for, and the registration is undone before the block
// goes back to the driver, since FreeHost refuses a block with registered
// ranges (R19). With pinned_use_host_register, and with expandable
// segments, memory is registered when it is pinned.
//
// # Registration
//
// Register and Unregister pin memory the program owns. The seed's rules are
// checked before the driver is called, each with its own error: a nonzero
// 4 KiB-aligned address (ErrMisaligned), a nonzero size that does not wrap
// (ErrInvalidSize), flags MAPPED or PINNED only (ErrInvalidFlags: IOMEMORY
// and READONLY are reserved); a range may not overlap another registration
// or a block of this allocator (ErrOverlap); pin-only ranges have no device
// address (ErrNotMapped). Whatever the driver refuses besides is returned
// as its *backend.Error.
//
// # Configuration
//
// VMMALLOC_HOST_CONF (ConfigFromEnv) or ParseConfig take key:value pairs
// separated by commas, as VMMALLOC_CONF does:
//
//	expandable_segments              True    False: the size-class policy (True only on Linux)
//	pinned_budget_mb                 ½ RAM   the process's pin budget in MiB; 0 = unlimited
//	pinned_release_on_grow           False   True: unmap wholly free chunks before mapping a new one
//	pinned_use_host_register         False   size classes: blocks are OS memory pinned with HostRegister
//	pinned_roundup_power2_divisions  8       size classes: 1, 2, 4 or 8 classes per power of two
//
// PyTorch's pinned_num_register_threads is refused with an explanation: its
// threads pre-fault the pages of a malloc'd buffer before one
// cudaHostRegister, while here a block is pinned by a single HostRegister
// of fresh zero-filled OS memory, and splitting the registration would give
// a block several device addresses.
//
// # Concurrency and errors
//
// One mutex guards all state (the budget has its own, taken only to pin
// and unpin); the cache-hit path makes no driver call and no Go heap
// allocation: measured (BenchmarkCacheHit, Malloc+Free with 1,000 blocks
// live, -count=5, medians), 31 ns for a 256 KiB and a 4 MiB block from
// the fast cache against 40 ns for the size classes. Bad input returns a typed error (see errors.go) and
// changes nothing; a failed driver call leaves the allocator and the driver
// as they were, or, where the driver cannot undo a step, leaves the
// allocator recording exactly what the driver still holds so that a later
// release or Close undoes it. Check verifies the invariants against a
// recount and the driver. After Close, every method that returns an error
// returns ErrClosed, whatever its arguments, Check included; a Close that
// failed can be retried.
package host
