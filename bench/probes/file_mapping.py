"""How a checkpoint's file pages behave under CUDA registration (issue 18: residency and in-place
staging for ComfyUI 0.33's dynamic VRAM mode, whose weights live in read-only file mappings).

For a file of --gib GiB (random bytes, written then read into the page cache):
- H2D copy speed from a MAP_PRIVATE PROT_READ mapping (pageable: what dynamic mode reads from);
- MAP_SHARED PROT_READ mapping registered with PORTABLE|READ_ONLY (1|8): time to register,
  H2D speed, whether the bytes match, and whether the pages stay resident after
  posix_fadvise(DONTNEED) + MADV_PAGEOUT (a registration holding the page cache);
- the same pages seen through a second MAP_PRIVATE PROT_READ mapping (the one ComfyUI holds):
  resident too? (page-cache pages are shared between mappings of one file)
Never registers a private read-only mapping (that hung for more than 90 s on an H200).

usage: python bench/probes/file_mapping.py OUT.json [--gib N] [--dir D]
"""
import ctypes
import json
from _lasterr import cuda_last_error
import mmap
import os
import sys
import time

import torch

gib = float(sys.argv[sys.argv.index("--gib") + 1]) if "--gib" in sys.argv else 2.0
folder = sys.argv[sys.argv.index("--dir") + 1] if "--dir" in sys.argv else "/var/tmp"
out_path = sys.argv[1]
size = int(gib * (1 << 30)) // 4096 * 4096
path = os.path.join(folder, "viking_probe.bin")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_READ, MAP_SHARED, MAP_PRIVATE, MADV_PAGEOUT, POSIX_FADV_DONTNEED = 1, 1, 2, 21, 4
rows = {}


def resident(addr, n):
    pages = (n + 4095) // 4096
    vec = ctypes.create_string_buffer(pages)
    if libc.mincore(ctypes.c_void_p(addr), n, vec) != 0:
        return None
    return sum(b & 1 for b in vec.raw) * 4096


def as_tensor(addr, n):
    buf = (ctypes.c_uint8 * n).from_address(addr)
    return torch.frombuffer(buf, dtype=torch.uint8)


def h2d(addr, n, reps=3):
    t = as_tensor(addr, n)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    best = None
    for _ in range(reps):
        torch.cuda.synchronize()
        s = time.perf_counter()
        dst.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        e = time.perf_counter() - s
        best = e if best is None else min(best, e)
    same = torch.equal(dst[:1 << 20].cpu(), t[:1 << 20]) and torch.equal(dst[-(1 << 20):].cpu(), t[-(1 << 20):])
    return round(n / best / 1e9, 2), same


with open(path, "wb") as f:
    chunk = os.urandom(64 << 20)
    for _ in range(size // len(chunk)):
        f.write(chunk)
    f.truncate(size)
fd = os.open(path, os.O_RDONLY)
torch.cuda.init()
rt = torch.cuda.cudart()

priv = libc.mmap(None, size, PROT_READ, MAP_PRIVATE, fd, 0)
as_tensor(priv, size).sum()  # fault in (page cache)
rows["private_ro_resident_after_read"] = resident(priv, size)
rows["private_ro_h2d_gbps"], rows["private_ro_bytes_ok"] = h2d(priv, size)

shared = libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
as_tensor(shared, size).sum()
s = time.perf_counter()
code = int(rt.cudaHostRegister(ctypes.c_void_p(shared).value, size, 1 | 8))
rows["shared_ro_register_code"] = code
rows["shared_ro_register_s"] = round(time.perf_counter() - s, 3)
rows["last_error_after_register"] = cuda_last_error()
if code == 0:
    rows["shared_ro_registered_h2d_gbps"], rows["shared_ro_bytes_ok"] = h2d(shared, size)
    # Pressure on the page cache: drop it and page out both mappings.
    os.posix_fadvise(fd, 0, size, POSIX_FADV_DONTNEED)
    libc.madvise(ctypes.c_void_p(shared), size, MADV_PAGEOUT)
    libc.madvise(ctypes.c_void_p(priv), size, MADV_PAGEOUT)
    rows["shared_resident_after_pressure"] = resident(shared, size)
    rows["private_resident_after_pressure"] = resident(priv, size)
    rows["private_ro_h2d_gbps_while_registered"], _ = h2d(priv, size)
    s = time.perf_counter()
    rows["unregister_code"] = int(rt.cudaHostUnregister(ctypes.c_void_p(shared).value))
    rows["unregister_s"] = round(time.perf_counter() - s, 3)
# Without a registration the same pressure evicts the pages.
os.posix_fadvise(fd, 0, size, POSIX_FADV_DONTNEED)
libc.madvise(ctypes.c_void_p(shared), size, MADV_PAGEOUT)
libc.madvise(ctypes.c_void_p(priv), size, MADV_PAGEOUT)
rows["private_resident_after_pressure_unregistered"] = resident(priv, size)
s = time.perf_counter()
rows["private_ro_h2d_gbps_cold"], _ = h2d(priv, size, reps=1)
rows["cold_read_s"] = round(time.perf_counter() - s, 3)
rows["last_error_end"] = cuda_last_error()
rows["size_bytes"] = size
libc.munmap(ctypes.c_void_p(priv), size)
libc.munmap(ctypes.c_void_p(shared), size)
os.close(fd)
os.unlink(path)
print(json.dumps(rows, indent=1))
with open(out_path, "w") as f:
    json.dump({"probe": "file_mapping", "rows": rows}, f, indent=1)
