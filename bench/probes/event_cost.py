"""What one ComfyUI event costs Viking in 0.33's dynamic VRAM mode, on the CPU: the whole
`lifecycle.reconcile` of a pinned model (the dynamic branch: the guard wrappers, the walk over
the model's modules for its file slices, the residency signature, the current-prompt mark and
the hand-over of the budget to ComfyUI's ceiling), for a model of 780 weights in comfy-aimdo's
mapping of a safetensors file (the count of the Flux-shaped model's tensors), once with
ComfyUI's staging holding every module (Viking holds nothing) and once with none staged
(residency for all: the locks are made at the first event, later events find them unchanged).
The patcher is tests/dynamic_cpu.py's (a real dynamic one needs a GPU), ComfyUI's own
parts are real. Also Viking's native calls alone. Medians of 200 events after 5 untimed.
Then a 2 GiB model of 780 weights: the first lock of its residency, 40 events each with one
more module staged (the residency ranges change at each: what is released and locked), and
the native call alone with one range fewer each time.

usage: python bench/probes/event_cost.py COMFY_0_33_DIR OUT.json   (ComfyUI 0.33's Python)
"""

import json
import os
import statistics
import sys
import tempfile
import time

comfy_dir, out_path = sys.argv[1], sys.argv[2]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [comfy_dir, ROOT, os.path.join(ROOT, "tests")]
sys.argv = [sys.argv[0], "--cpu"]
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import safetensors.torch  # noqa: E402
import torch  # noqa: E402

import comfy_aimdo.control  # noqa: E402

comfy_aimdo.control.init()
from comfy_node import dynamic, lifecycle  # noqa: E402
from comfy_node.native import require  # noqa: E402
from dynamic_cpu import StagingPatcher, enter_dynamic_mode, mapped_model, stage, unstage  # noqa: E402

WEIGHTS, EVENTS, GROWN = 780, 200, 40
native = require()
native.configure(headroom_gib=0.0)
enter_dynamic_mode()

path = os.path.join(tempfile.mkdtemp(prefix="event_cost_"), "model.safetensors")
g = torch.Generator().manual_seed(0)
safetensors.torch.save_file({f"{i}.weight": torch.randn(64, 64, generator=g) for i in range(WEIGHTS)}, path)
patcher = mapped_model(path, StagingPatcher)
net = patcher.model
lifecycle.attach(patcher, lifecycle.PinSettings(label="event cost", backend="os-lock", headroom_gib=0.0))
lifecycle._on_pre_run(patcher)  # sampled once: residency is decided from here on


def median_ms(call) -> float:
    for _ in range(5):
        call()
    times = []
    for _ in range(EVENTS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)


result = {"bench": "event_cost", "date": time.strftime("%Y-%m-%d"), "weights": WEIGHTS, "events": EVENTS}
for module in net:
    stage(module)
result["reconcile_ms_all_staged"] = median_ms(lambda: lifecycle.reconcile(patcher))
result["pinned_bytes_all_staged"] = lifecycle.reconcile(patcher)["pinned_bytes"]
for module in net:
    unstage(module)
result["reconcile_ms_none_staged"] = median_ms(lambda: lifecycle.reconcile(patcher))
result["pinned_bytes_none_staged"] = lifecycle.reconcile(patcher)["pinned_bytes"]
result["native_budget_json_ms"] = median_ms(native.budget_json)
result["native_reconcile_empty_ms"] = median_ms(lambda: native.reconcile(10**9, [], backend="os-lock", label="empty"))
result["status_ms"] = median_ms(lifecycle.status)
lifecycle.forget(lifecycle.owner_of(patcher))

# Staging that grows by one module per event, over a model of 2 GiB in 780 weights: on the H200
# (two models taking turns under --fast-disk) ComfyUI staged ~94 MB more at each prompt, so each
# such event changes the residency ranges and Viking releases and locks what moved. First the
# lock of the whole model after its first sampling (pages in the page cache, as then).
big_path = os.path.join(os.path.dirname(path), "big.safetensors")
safetensors.torch.save_file({f"{i}.weight": torch.randn(1024, 640, generator=g) for i in range(WEIGHTS)}, big_path)
big = mapped_model(big_path, StagingPatcher)
for tensor in big.model.parameters():
    tensor.sum()  # the first sampling read them: in the page cache
lifecycle.attach(big, lifecycle.PinSettings(label="event cost, 2 GiB", backend="os-lock", headroom_gib=0.0))
lifecycle._on_pre_run(big)
started = time.perf_counter()
result["big_model_bytes"] = lifecycle.reconcile(big)["pinned_bytes"]
result["residency_first_lock_ms"] = round((time.perf_counter() - started) * 1e3, 3)
grown = []
for step, module in enumerate(list(big.model)[:GROWN]):
    stage(module)
    started = time.perf_counter()
    report = lifecycle.reconcile(big)
    grown.append(time.perf_counter() - started)
result["reconcile_ms_one_more_staged"] = round(statistics.median(grown) * 1e3, 3)
result["grown_events"] = GROWN
result["big_pinned_bytes_after"] = report["pinned_bytes"]
# Viking's native part of such an event alone: one range fewer (a module in the middle of the
# file staged), the ledger releasing what held it and locking the rest again.
record = lifecycle.record_of(big)
ranges = dynamic.file_ranges(big, record)
native_times = []
for _ in range(GROWN):
    del ranges[len(ranges) // 2]
    started = time.perf_counter()
    native.reconcile(record.owner, ranges, backend="os-lock", label="event cost, 2 GiB")
    native_times.append(time.perf_counter() - started)
result["native_reconcile_ms_one_range_fewer"] = round(statistics.median(native_times) * 1e3, 3)
del ranges
lifecycle.forget(lifecycle.owner_of(big))
os.remove(big_path)
result["ok"] = (result["pinned_bytes_all_staged"] == 0 and result["pinned_bytes_none_staged"] >= WEIGHTS * 64 * 64 * 4
                and result["big_pinned_bytes_after"] == result["big_model_bytes"] * (WEIGHTS - GROWN) // WEIGHTS)
with open(out_path, "w") as out:
    json.dump(result, out, indent=1)
    out.write("\n")
print(json.dumps(result, indent=1))
sys.exit(0 if result["ok"] else 1)
