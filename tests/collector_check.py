"""Viking's own work inside ComfyUI's calls starts no garbage collection (the CPU, ComfyUI's real
ModelPatcher and model management in this process): its node's attach, its reconcile on each
of ComfyUI's events, and the pinned home's watch set up around a load. The collector runs far
more often than usual here (a young collection every 10 allocations), so ComfyUI's own code
starts many meanwhile; each one is placed by the frames on the stack when it starts.
Prints one JSON object of named checks; exits 1 if one fails. Run by tests/test_collector.py
under each ComfyUI version's Python.

usage: python tests/collector_check.py COMFY_DIR
"""

import gc
import json
import os
import sys

from in_process import start_comfy

start_comfy(sys.argv[1], "--cpu")

import torch  # noqa: E402

import comfy.model_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.ops  # noqa: E402

from comfy_node import lifecycle, timing  # noqa: E402
from comfy_node.native import require  # noqa: E402

# Viking's functions whose own code must start no collection: the node's attach, the events,
# the reconcile they make, and the pinned home's watch set up and taken down around a load.
VIKING = {("lifecycle.py", "attach"), ("lifecycle.py", "reconcile"), ("lifecycle.py", "_on_event"),
          ("lifecycle.py", "_on_pre_run"), ("lifecycle.py", "_on_clone"), ("home.py", "_watch"),
          ("home.py", "_unwatch")}
started = {"in_viking": [], "elsewhere": 0}
checks = {}


def place(phase, _info):
    if phase != "start":
        return
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if (os.path.basename(code.co_filename), code.co_name) in VIKING and "comfy_node" in code.co_filename:
            started["in_viking"].append(code.co_name)
            return
        frame = frame.f_back
    started["elsewhere"] += 1


def model(layers: int):
    """`layers` 1 MiB fp32 linear layers that ComfyUI casts, in a ModelPatcher on the CPU."""
    net = torch.nn.Sequential(*[comfy.ops.disable_weight_init.Linear(512, 512, bias=False) for _ in range(layers)])
    for index, layer in enumerate(net):
        torch.nn.init.normal_(layer.weight, generator=torch.Generator().manual_seed(index))
    return comfy.model_patcher.ModelPatcher(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))


native = require()
native.configure(budget_gib=64 / 1024, headroom_gib=0.0)
patchers = [model(8) for _ in range(2)]
thresholds = gc.get_threshold()
gc.collect()
gc.callbacks.append(place)
gc.set_threshold(10, 10**6, 10**6)  # young collections only: each one is cheap
try:
    reports = [lifecycle.attach(patcher, lifecycle.PinSettings(label=f"model {index}", backend="os-lock",
                                                               headroom_gib=0.0))
               for index, patcher in enumerate(patchers)]
    for _ in range(3):  # ComfyUI's own loads and unloads, which fire Viking's events and wrappers
        comfy.model_management.load_models_gpu(patchers)
        for patcher in patchers:
            if hasattr(patcher, "pre_run"):
                patcher.pre_run()
        comfy.model_management.unload_all_models()
    lifecycle.attach(patchers[0], lifecycle.PinSettings(label="model 0 again", backend="os-lock", headroom_gib=0.0))
finally:
    gc.set_threshold(*thresholds)
    gc.callbacks.remove(place)

events = timing.totals().get("event", {}).get("calls", 0)
checks["both models pinned"] = all(report["pinned_bytes"] == 8 << 20 for report in reports)
checks["ComfyUI's loads and unloads fired Viking's events (at least one a load)"] = events >= 6
checks["collections started in ComfyUI's own code meanwhile (the check can fail)"] = started["elsewhere"] > 0
checks["none started in Viking's attach, reconcile, events or home watch"] = started["in_viking"] == []
checks["collection is on again afterwards"] = gc.isenabled()
print(f"events {events}, collections elsewhere {started['elsewhere']}, in Viking {started['in_viking'][:10]}",
      file=sys.stderr)
print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
