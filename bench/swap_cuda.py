"""Does a CUDA registration (Viking's CUDA backend, no mlock) keep pages out of swap? A temporary
swap file, then for each case a 1 GiB tensor paged out with madvise(MADV_PAGEOUT): plain
pageable, and registered by Viking (cuMemHostRegister, PORTABLE|DEVICEMAP). Reports what the
kernel did (VmSwap, pswpout), what Viking's status says, and the host->device copy afterwards.

usage: python bench/swap_cuda.py OUT.json      (root, Linux, a CUDA GPU)"""

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests")]
from comfy_node.native import require  # noqa: E402
from comfy_node.weights import cpu_storage_ranges  # noqa: E402
from memory_probe import status_kib  # noqa: E402
from swap_pressure import MADV_PAGEOUT, SwapUnavailable, swap_counters, temporary_swap  # noqa: E402

native = require()
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
GIB = 1 << 30


def h2d_gbps(tensor):
    target = torch.empty_like(tensor, device="cuda")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    target.copy_(tensor, non_blocking=True)
    stop.record()
    stop.synchronize()
    return tensor.nbytes / (start.elapsed_time(stop) / 1e3) / 1e9


def case(name, register):
    tensor = torch.ones(GIB, dtype=torch.uint8)
    report = None
    if register:
        report = json.loads(native.reconcile(1, cpu_storage_ranges([tensor])[0], backend="cuda", label=name))
    ptr = tensor.data_ptr()
    swapped_before, pswpout_before = status_kib("VmSwap") * 1024, swap_counters()[1]
    rss_before = status_kib("VmRSS") * 1024
    result = libc.madvise(ctypes.c_void_p(ptr & ~4095), GIB, MADV_PAGEOUT)
    errno = ctypes.get_errno()
    time.sleep(1)
    status = json.loads(native.status_json())
    owner = next((o for o in status["owners"] if o["owner"] == 1), None)
    row = dict(
        case=name, registered_bytes=report["pinned_bytes"] if report else 0, madvise_rc=result, madvise_errno=errno,
        rss_drop_bytes=rss_before - status_kib("VmRSS") * 1024,
        swapped_bytes=status_kib("VmSwap") * 1024 - swapped_before,
        pswpout_pages=swap_counters()[1] - pswpout_before,
        viking_pinned_swapped_bytes=owner["pinned_swapped_bytes"] if owner else None,
        h2d_gbps_after=round(h2d_gbps(tensor), 1),
    )
    native.release_all()
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    torch.cuda.init()
    native.configure(headroom_gib=1.0)
    try:
        with temporary_swap(REPO / ".comfy" / "swapfile", 4096):
            rows = [case("pageable", register=False), case("viking cuda", register=True)]
    except SwapUnavailable as reason:
        rows = [dict(skipped=str(reason))]
        print(f"skipped: {reason}")
    result = dict(bench="swap_cuda", date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(),
                  driver=os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip(),
                  kernel=os.uname().release, cases=rows)
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1) + "\n")
