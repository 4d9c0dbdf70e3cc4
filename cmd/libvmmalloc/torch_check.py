"""A short PyTorch training loop with vmmalloc as the current CUDA allocator
or with PyTorch's own, printing peak reserved and allocated memory; run by
backend/cuda/gpucheck.sh on a GPU machine with PyTorch installed:

    python3 torch_check.py vmmalloc LIBVMMALLOC_SO
    python3 torch_check.py pytorch

Each mode runs in a process of its own: the allocator must be chosen before
CUDA allocates anything. The loop is a 6-layer transformer encoder trained
with Adam on batches of random sequence lengths (fragmentation comes from
the changing shapes), the same seed in both modes. With vmmalloc,
torch.cuda.memory_stats is not available (PyTorch's pluggable allocator does
not forward it); the figures come from vmmalloc_stats_json.
"""
import ctypes
import json
import sys
import time

import torch

mode = sys.argv[1]
if mode not in ("vmmalloc", "pytorch"):
    sys.exit("usage: torch_check.py vmmalloc LIB | pytorch")
if not torch.cuda.is_available():
    print("GPUCHECK pytorch: SKIP: torch.cuda.is_available() is False")
    sys.exit(0)

lib = None
if mode == "vmmalloc":
    path = sys.argv[2]
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, "vmmalloc_alloc", "vmmalloc_free")
    lib = ctypes.CDLL(path)
    hooks = pluggable.allocator()
    for setter, fn in (("set_init_fn", "vmmalloc_init"), ("set_reset_fn", "vmmalloc_reset"),
                       ("set_memory_fraction_fn", "vmmalloc_memory_fraction"),
                       ("set_record_stream_fn", "vmmalloc_record_stream")):
        if hasattr(hooks, setter):
            getattr(hooks, setter)(ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(pluggable)


def peaks():
    """Peak reserved and allocated bytes of device 0."""
    if lib is None:
        return torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    lib.vmmalloc_stats_json.restype = ctypes.c_size_t
    lib.vmmalloc_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    n = lib.vmmalloc_stats_json(0, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.vmmalloc_stats_json(0, buf, n + 1)
    st = json.loads(buf.value)
    return st["reserved_bytes.all.peak"], st["allocated_bytes.all.peak"]


torch.manual_seed(0)
dev = torch.device("cuda", 0)
layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
steps = 30
start = time.perf_counter()
for step in range(steps):
    seq = int(torch.randint(64, 513, (1,)))
    x = torch.randn(16, seq, 1024, device=dev)
    loss = model(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
elapsed = time.perf_counter() - start
reserved, allocated = peaks()
print(f"GPUCHECK pytorch {mode}: {steps} steps in {elapsed:.2f} s, peak reserved {reserved / 2**20:.1f} MiB, "
      f"peak allocated {allocated / 2**20:.1f} MiB ({reserved / max(allocated, 1):.3f}x allocated), loss {loss.item():.4f}")
