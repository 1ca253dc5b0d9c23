"""One Viking registration (PORTABLE|DEVICEMAP) serving copies to two GPUs: 4 GiB of pinned
host memory copied to each GPU alone, then to both at once; per-GPU bandwidth against the
single-GPU figure. Pageable copies of the same bytes for reference. Medians of 5.

usage: python bench/gpu_two.py OUT.json      (a machine with 2+ CUDA GPUs)"""

import json
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from comfy_node.native import require  # noqa: E402
from comfy_node.weights import cpu_storage_ranges  # noqa: E402

GIB = 1 << 30
native = require()
native.configure(headroom_gib=8.0)
host = torch.ones(4 * GIB, dtype=torch.uint8)
targets = [torch.empty(4 * GIB, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]


def copy_to(device_index, results):
    with torch.cuda.device(device_index):
        torch.cuda.synchronize()
        started = time.perf_counter()
        targets[device_index].copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        results[device_index] = host.nbytes / (time.perf_counter() - started) / 1e9


def measure(reps=5):
    alone = {0: [], 1: []}
    together = {0: [], 1: []}
    for _ in range(reps):
        for index in (0, 1):
            result = {}
            copy_to(index, result)
            alone[index].append(result[index])
        result = {}
        threads = [threading.Thread(target=copy_to, args=(i, result)) for i in (0, 1)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for index in (0, 1):
            together[index].append(result[index])
    med = lambda values: round(statistics.median(values), 1)  # noqa: E731
    return {f"gpu{i}_alone_gb_per_s": med(alone[i]) for i in (0, 1)} | {f"gpu{i}_together_gb_per_s": med(together[i]) for i in (0, 1)}


pageable = measure()
report = json.loads(native.reconcile(1, cpu_storage_ranges([host])[0], backend="cuda", label="4 GiB"))
assert report["pinned_bytes"] == 4 * GIB, report
pinned = measure()
native.release_all()
single = statistics.mean([pinned["gpu0_alone_gb_per_s"], pinned["gpu1_alone_gb_per_s"]])
result = dict(bench="gpu_two", date=time.strftime("%Y-%m-%d"), devices=[torch.cuda.get_device_name(i) for i in range(2)],
              driver=os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().split()[0],
              registrations=1, pinned=pinned, pageable=pageable,
              together_share_of_single=round(min(pinned["gpu0_together_gb_per_s"], pinned["gpu1_together_gb_per_s"]) / single, 3))
with open(sys.argv[1], "w") as out:
    json.dump(result, out, indent=1)
print(json.dumps(result, indent=1))
