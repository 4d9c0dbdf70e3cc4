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
// # Blocks and size classes
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
// allocated block or a mapped registration. A MallocHost block is
// registered (HostRegister, MAPPED) the first time its device address is
// asked for, and the registration is undone before the block goes back to
// the driver, since FreeHost refuses a block with registered ranges (R19).
// With pinned_use_host_register every block is registered when it is made.
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
//	pinned_use_host_register         False   True: blocks are OS memory pinned with HostRegister
//	pinned_roundup_power2_divisions  8       1, 2, 4 or 8 size classes per power of two
//
// PyTorch's pinned_num_register_threads is refused with an explanation: its
// threads pre-fault the pages of a malloc'd buffer before one
// cudaHostRegister, while here a block is pinned by a single HostRegister
// of fresh zero-filled OS memory, and splitting the registration would give
// a block several device addresses.
//
// # Concurrency and errors
//
// One mutex guards all state; the cache-hit path makes no driver call and no
// Go heap allocation. Bad input returns a typed error (see errors.go) and
// changes nothing; a failed driver call leaves the allocator and the driver
// as they were, or, where the driver cannot undo a step, leaves the
// allocator recording exactly what the driver still holds so that a later
// release or Close undoes it. Check verifies the invariants against a
// recount and the driver. After Close, every method that returns an error
// returns ErrClosed, whatever its arguments, Check included; a Close that
// failed can be retried.
package host
