/* vmmalloc.h: vmmalloc as PyTorch's and torch_npu's pluggable allocator.
 *
 * libvmmalloc.so is built from cmd/libvmmalloc (a Go package built with
 * -buildmode=c-shared) by cmd/libvmmalloc/build.sh, which copies this
 * header next to it. Every function has C linkage, is safe to call from
 * any thread, never unwinds a Go panic into the caller (a panic becomes an
 * error return and a last error), and validates its arguments: a call it
 * refuses changes nothing, is logged on standard error ("vmmalloc: ..."),
 * and leaves its message for vmmalloc_last_error.
 *
 * Configuration: VMMALLOC_CONF, read at the first call, takes PyTorch's
 * PYTORCH_CUDA_ALLOC_CONF keys plus backend:cuda (the default) or
 * backend:acl (Ascend, for torch_npu). One allocator per device is made on
 * the device's first use. The CUDA backend loads libcuda.so.1 (or
 * $VMMALLOC_LIBCUDA) and allocates in each device's primary context, the
 * one the CUDA runtime and PyTorch use; the ACL backend loads
 * libascendcl.so (or $VMMALLOC_LIBASCENDCL).
 *
 * Streams: a stream argument is the framework's handle (cudaStream_t,
 * which is a CUstream; aclrtStream). NULL is the default stream: on CUDA
 * the legacy default stream (PyTorch's default stream), on ACL the
 * allocator's own stream (ACL has no handle that names a device's default
 * stream; torch_npu's default stream is a created stream and is adopted
 * like any other). A stream is checked on first sight to belong to the
 * device (CUDA: cuStreamGetCtx against the device's primary context; ACL:
 * taken on trust) and remembered; a stream destroyed and its handle reused
 * for a stream of the same device is indistinguishable.
 *
 * The Go runtime in a foreign process (see cmd/libvmmalloc/doc.go):
 *  - Signals: at load the Go runtime installs handlers for SIGSEGV, SIGBUS,
 *    SIGFPE (forwarded to the handler that was installed before when the
 *    fault is not in Go code), SIGPIPE and SIGURG (goroutine preemption),
 *    and adds SA_ONSTACK to existing handlers it finds; it leaves SIGINT,
 *    SIGTERM, SIGUSR1/2 and the rest to the program. Python's handlers
 *    and faulthandler keep working. A program that installs its own
 *    SIGSEGV/SIGBUS/SIGURG handler after loading must chain to the previous
 *    one and use SA_ONSTACK.
 *  - Threads: the runtime starts a few threads of its own (GOMAXPROCS
 *    bounds the ones running Go code at once). A thread that calls in
 *    stays bound to a Go M, so repeated calls from it are cheap.
 *  - GODEBUG and GOMAXPROCS in the environment at load apply to the
 *    library; GODEBUG=asyncpreemptoff=1 stops the SIGURG preemption
 *    signals if a program cannot tolerate EINTR on slow system calls.
 *  - One Go runtime per process: do not load a second Go c-shared library.
 *  - fork() without exec after the first call: a child must not call into
 *    the library (the Go runtime's threads are not forked); use the spawn
 *    start method for multiprocessing.
 *  - Never dlclose it: a Go library cannot be unloaded.
 */
#ifndef VMMALLOC_H
#define VMMALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A framework's stream handle: cudaStream_t (CUstream) or aclrtStream.
 * Every one of them is a pointer, so the entry points below have exactly
 * the types PyTorch and torch_npu cast them to. */
typedef void *vmmalloc_stream_t;

/* ---- The pluggable allocator's two entry points ----
 * torch.cuda.memory.CUDAPluggableAllocator(path, "vmmalloc_alloc",
 * "vmmalloc_free") and torch_npu.npu.memory.NPUPluggableAllocator(...).
 *
 * vmmalloc_alloc: size bytes on device for work on stream, from the pool
 * this thread allocates to on that device (vmmalloc_begin_allocate_to_pool)
 * or the default pool. NULL when it fails (out of memory, a bad device or
 * stream); PyTorch then raises its out-of-memory error, and
 * vmmalloc_last_error says why. Size 0 returns NULL and is no error.
 *
 * vmmalloc_free: frees ptr, which vmmalloc_alloc returned for device. The
 * size and stream PyTorch passes back are those of the allocation; the
 * allocator knows them. NULL does nothing. A pointer the device did not
 * allocate (another device's, interior, unknown, already freed) is
 * refused and logged. */
void *vmmalloc_alloc(size_t size, int device, vmmalloc_stream_t stream);
void vmmalloc_free(void *ptr, size_t size, int device, vmmalloc_stream_t stream);

/* ---- PyTorch's optional hooks, with its types ----
 * Set from Python with the addresses of these symbols, e.g.
 *   a.allocator().set_reset_fn(ctypes.cast(lib.vmmalloc_reset, ctypes.c_void_p).value)
 * init: void(int device_count); opens the driver.
 * reset: void(void) (torch.cuda.empty_cache); torch_npu's takes a bool.
 * memory_fraction: void(double fraction, int device).
 * record_stream: void(void *ptr, cudaStream_t stream).
 * Not given C linkage, because their PyTorch types are C++:
 *   begin_allocate_to_pool (int, MempoolId_t, std::function<bool(cudaStream_t)>),
 *   end_allocate_to_pool and release_pool (int, MempoolId_t = std::pair):
 *   use the C functions of the same names below, which take the pool id as
 *   two integers, from Python with ctypes or from a C++ lambda wrapper.
 * base_alloc (getBaseAllocation, for CUDA IPC of expandable memory) is not
 *   provided. */
void vmmalloc_init(int device_count);
void vmmalloc_reset(void);
void vmmalloc_npu_reset(bool check_error);
void vmmalloc_memory_fraction(double fraction, int device);
void vmmalloc_record_stream(void *ptr, vmmalloc_stream_t stream);

/* ---- Control functions ----
 * All return 0 on success and -1 on failure (read vmmalloc_last_error),
 * unless said otherwise. device -1 means every device used so far where
 * stated. */

/* Releases cached memory (torch.cuda.empty_cache); device -1: all. */
int vmmalloc_empty_cache(int device);
/* Caps device's mapped memory at fraction (0,1] of its total
 * (torch.cuda.set_per_process_memory_fraction). */
int vmmalloc_set_memory_fraction(double fraction, int device);
/* Marks the end of a step (a training iteration, a served batch) on
 * device's default pool; device -1: all. A step that repeats is served
 * from one region packed offline; a call that differs sends the rest of
 * the step to the heap (planned_steps:False in VMMALLOC_CONF: off). */
int vmmalloc_mark_step(int device);
/* Marks ptr as used by work on stream (Tensor.record_stream). */
int vmmalloc_record_stream_checked(void *ptr, vmmalloc_stream_t stream);

/* Pools by PyTorch's MempoolId_t (id0, id1) (torch.cuda.MemPool().id);
 * (0, 0) is the default pool. begin makes the pool if new and makes this
 * thread's next allocations on device come from it, until the matching
 * end (scopes nest, up to 16 deep per thread). release closes a pool
 * without live allocations and frees its cache. */
int vmmalloc_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
int vmmalloc_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
int vmmalloc_release_pool(int device, uint64_t id0, uint64_t id1);

/* Sleep and wake a pool (vLLM's sleep mode, torch_memory_saver's pause):
 * sleep gives its physical memory back and keeps its addresses; with
 * VMMALLOC_OFFLOAD its allocated bytes are copied to pinned host memory
 * and restored by wake, with VMMALLOC_DISCARD they are undefined after
 * wake, with VMMALLOC_MEMSET they read zero after wake (TensorRT-LLM's
 * MEMSET restore mode). keep_host_buffers keeps the pinned buffers after
 * wake for the next sleep. Expandable pools only (the default). */
enum { VMMALLOC_DISCARD = 0, VMMALLOC_OFFLOAD = 1, VMMALLOC_MEMSET = 2 };
int vmmalloc_sleep(int device, uint64_t id0, uint64_t id1, int mode, int keep_host_buffers);
int vmmalloc_wake(int device, uint64_t id0, uint64_t id1);

/* Statistics as JSON (torch.cuda.memory_stats keys, flat:
 * "allocated_bytes.all.current", ...), of device, or with -1 an object
 * keyed by device ordinal. Writes at most len bytes including a NUL into
 * buf (which may be NULL when len is 0) and returns the JSON's length, so
 * a return >= len means buf was too small; 0 on failure. */
size_t vmmalloc_stats_json(int device, char *buf, size_t len);

/* Records the allocation history snapshots carry (max_entries newest
 * events; 0 stops), on device or on every device (-1, later ones too). */
int vmmalloc_record_history(int device, size_t max_entries);
/* Writes a memory snapshot pickle of every device used
 * (torch.cuda.memory._dump_snapshot) that https://pytorch.org/memory_viz
 * opens. */
int vmmalloc_snapshot(const char *path);

/* The message of the most recent failure of any thread ("" if none), as
 * vmmalloc_stats_json writes and counts. */
size_t vmmalloc_last_error(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* VMMALLOC_H */
