"""Loads libvmmalloc.so through ctypes the way torch's loader does and uses
its control functions; run by the Go tests (cabi_test.go) as

    python3 ctypes_check.py LIBDIR SNAPSHOT_PATH

over the CUDA test double (libcuda.so.1 on LD_LIBRARY_PATH). No torch is
needed: torch.cuda.memory.CUDAPluggableAllocator does ctypes.CDLL(path) and
takes the addresses of the two functions it names, which is what this does,
then calls them with the C types of CUDAPluggableAllocator.h. The double's
device memory is host memory, so contents are checked through the pointers.
Prints "ok: ..." per check and "PASS" at the end; any failure raises.
"""
import ctypes
import json
import os
import pickle
import sys

libdir, snapshot = sys.argv[1], sys.argv[2]
lib = ctypes.CDLL(os.path.join(libdir, "libvmmalloc.so"))

# torch.cuda.memory.CUDAPluggableAllocator(path, "vmmalloc_alloc", "vmmalloc_free")
alloc_addr = ctypes.cast(lib.vmmalloc_alloc, ctypes.c_void_p).value
free_addr = ctypes.cast(lib.vmmalloc_free, ctypes.c_void_p).value
assert alloc_addr and free_addr
ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
alloc, free = ALLOC(alloc_addr), FREE(free_addr)
# The optional hooks' addresses, as set_reset_fn & co. take them.
for hook in ("vmmalloc_init", "vmmalloc_reset", "vmmalloc_memory_fraction", "vmmalloc_record_stream"):
    assert ctypes.cast(getattr(lib, hook), ctypes.c_void_p).value

u64 = ctypes.c_uint64
lib.vmmalloc_stats_json.restype = ctypes.c_size_t
lib.vmmalloc_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.vmmalloc_last_error.restype = ctypes.c_size_t
lib.vmmalloc_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.vmmalloc_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
lib.vmmalloc_mark_step.argtypes = [ctypes.c_int]
lib.vmmalloc_begin_allocate_to_pool.argtypes = [ctypes.c_int, u64, u64]
lib.vmmalloc_end_allocate_to_pool.argtypes = [ctypes.c_int, u64, u64]
lib.vmmalloc_release_pool.argtypes = [ctypes.c_int, u64, u64]
lib.vmmalloc_sleep.argtypes = [ctypes.c_int, u64, u64, ctypes.c_int, ctypes.c_int]
lib.vmmalloc_wake.argtypes = [ctypes.c_int, u64, u64]
lib.vmmalloc_snapshot.argtypes = [ctypes.c_char_p]
lib.vmmalloc_record_history.argtypes = [ctypes.c_int, ctypes.c_size_t]
lib.vmmalloc_record_stream_checked.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


def text(fn, *args):
    """Calls an snprintf-style function twice: to size, then to fill."""
    n = fn(*args, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    assert fn(*args, buf, n + 1) == n
    return buf.value.decode()


def last_error():
    return text(lib.vmmalloc_last_error)


def stats(device=0):
    return json.loads(text(lib.vmmalloc_stats_json, device))


MIB = 1 << 20
assert lib.vmmalloc_record_history(-1, 10000) == 0

# Allocations as PyTorch makes them, contents through the pointers.
sizes = [1, 512, 4096, 1000003, 5 * MIB, 30 * MIB]
ptrs = [alloc(n, 0, None) for n in sizes]
assert all(ptrs), last_error()
for i, (p, n) in enumerate(zip(ptrs, sizes)):
    ctypes.memset(p, i + 1, n)
st = stats()
assert st["requested_bytes.all.current"] == sum(sizes), st["requested_bytes.all.current"]
assert st["allocation.all.current"] == len(sizes)
assert st["reserved_bytes.all.current"] >= st["allocated_bytes.all.current"] >= sum(sizes)
assert lib.vmmalloc_record_stream_checked(ctypes.c_void_p(ptrs[3]), None) == 0
for i, (p, n) in enumerate(zip(ptrs, sizes)):
    assert ctypes.string_at(p + n - 1, 1) == bytes([i + 1])
    free(p, n, 0, None)
assert stats()["allocation.all.current"] == 0
print("ok: alloc/free through the function addresses; stats JSON matches")

# Errors: NULL and a readable message.
assert alloc(4096, 5, None) is None
assert "invalid device" in last_error(), last_error()
assert lib.vmmalloc_set_memory_fraction(0.25, 0) == 0
assert alloc(300 * MIB, 0, None) is None
oom = last_error()
assert "out of memory" in oom and "allowed" in oom, oom
# The whole message, one line, as long as the error's: no fixed buffer
# cuts it (the figures and the advice come last).
assert "largest free block" in oom and "Advice:" in oom and oom.endswith("."), oom
assert "\n" not in oom and len(oom) > 300, oom
short = ctypes.create_string_buffer(16)
assert lib.vmmalloc_last_error(short, 16) == len(oom.encode()) and short.value == oom.encode()[:15]
assert lib.vmmalloc_set_memory_fraction(0.0, 0) == -1 and "outside (0,1]" in last_error()
assert lib.vmmalloc_set_memory_fraction(1.0, 0) == 0
assert lib.vmmalloc_mark_step(0) == 0
assert lib.vmmalloc_mark_step(-1) == 0
assert lib.vmmalloc_empty_cache(-1) == 0
print("ok: OOM under a memory fraction returns NULL:", oom)

# A pool (torch.cuda.MemPool ids are (0, n)), sleep with offload, wake.
pool = (0, 5)
assert lib.vmmalloc_begin_allocate_to_pool(0, *pool) == 0
w = alloc(6 * MIB, 0, None)
assert lib.vmmalloc_end_allocate_to_pool(0, *pool) == 0
pattern = bytes(range(256)) * (6 * MIB // 256)
ctypes.memmove(w, pattern, len(pattern))
before = stats()["reserved_bytes.all.current"]
assert lib.vmmalloc_sleep(0, *pool, 1, 0) == 0, last_error()
assert stats()["reserved_bytes.all.current"] <= before - 6 * MIB
assert lib.vmmalloc_wake(0, *pool) == 0, last_error()
assert ctypes.string_at(w, len(pattern)) == pattern
assert lib.vmmalloc_wake(0, *pool) == -1 and "awake" in last_error()
free(w, 6 * MIB, 0, None)
assert lib.vmmalloc_release_pool(0, *pool) == 0, last_error()
print("ok: pool scope, sleep (offload) and wake keep the contents")

assert lib.vmmalloc_snapshot(snapshot.encode()) == 0, last_error()
with open(snapshot, "rb") as f:
    snap = pickle.load(f)
actions = [e["action"] for e in snap["device_traces"][0]]
# The sizes, the pool's block, and that block again: history records a
# sleep as the pool's blocks freed and its memory unmapped, a wake as the
# memory mapped and the blocks allocated again.
assert actions.count("alloc") == len(sizes) + 2, actions
oom_at = len(actions) - 1 - actions[::-1].index("oom")
assert actions[oom_at + 1:] == [
    "segment_map", "alloc",                                     # the pool's block
    "free_requested", "free_completed", "segment_unmap",        # sleep
    "segment_map", "alloc",                                     # wake
    "free_requested", "free_completed", "segment_unmap",        # free, release_pool
], actions
assert "segment_map" in actions or "segment_alloc" in actions, set(actions)
print("ok: snapshot loads with pickle:", len(actions), "trace entries")
print("PASS")
