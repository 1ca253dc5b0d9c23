"""What Viking's work counts towards the process's garbage collections, on the CPU (ComfyUI 0.33
in this process, the fp8-scaled Flux-shaped model of bench/probes/static_event_cost.py loaded by
ComfyUI's own loader, static mode): for the node's first attach and for a ComfyUI event that
moves nothing (once the model's pins are settled) and for one after a weight was pointed at
other memory (`lifecycle._on_event`,
as ComfyUI calls it; the second walks and plans the weights), what the work adds to the
collector's young-generation count, read with collection off: the objects it keeps, and those
it freed into one of Python's free lists (tuples, lists, dicts), which the count does not take
back; what it frees to the allocator nets out. That count is the collector's clock: each 700
start a young collection, and Python starts a full collection of the heap (0.25 s in a 0.33
server with this model) once enough young collections have run since the last.
Side by side: this tree and, with --baseline DIR, the comfy_node/ of another checkout (each in
its own process, alternating, two rounds each).

usage: python bench/probes/kept_objects.py COMFY_0_33_DIR OUT.json [--depth 8] [--baseline DIR --baseline-commit C]
       (ComfyUI 0.33's Python)
"""

import gc
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from static_event_cost import arg, side_by_side, start_with_code  # noqa: E402

EVENTS = 8


def measure(comfy_dir: str, code_root: str, model_path: str):
    sd, lifecycle, native = start_with_code(comfy_dir, code_root)
    import torch

    def kept(work) -> int:
        """What `work` adds to the collector's young count (collection off)."""
        gc.collect()
        gc.disable()
        try:
            before = gc.get_count()[0]
            work()
            return gc.get_count()[0] - before
        finally:
            gc.enable()

    settings = lifecycle.PinSettings(label="kept objects", backend="os-lock", headroom_gib=0.0)
    patcher = sd.load_diffusion_model(model_path)
    first_kept = kept(lambda: lifecycle.attach(patcher, settings))
    for _ in range(3):
        lifecycle._on_event(patcher)
    if hasattr(native, "settle"):  # file pages are locked off this thread: measured once that is done
        native.settle(120.0)
        lifecycle._on_event(patcher)
    still = [kept(lambda: lifecycle._on_event(patcher)) for _ in range(EVENTS)]
    # An event after a weight was pointed at other memory: the weights are walked and planned.
    weight = next(w for w in patcher.model.diffusion_model.parameters() if type(w.data) is torch.Tensor)
    other = [weight.data, weight.data.clone()]
    moved = []
    for index in range(EVENTS):
        weight.data = other[index % 2]
        moved.append(kept(lambda: lifecycle._on_event(patcher)))
    print(json.dumps({"first_attach_kept": first_kept, "event_moved_nothing_kept": statistics.median(still),
                      "event_weight_moved_kept": statistics.median(moved),
                      "weights": sum(1 for _ in patcher.model.parameters()),
                      "pinned_bytes": lifecycle.record_of(patcher).last_report["pinned_bytes"]}))


def main():
    out_path, depth, _path, runs = side_by_side(__file__, default_depth=8)
    keys = [k for k in runs["this"][0] if k not in ("weights", "pinned_bytes")]
    result = {"probe": "kept_objects", "date": time.strftime("%Y-%m-%d"), "depth": depth, "format": "fp8_scaled",
              "events": EVENTS, "runs": runs,
              "median": {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}}
    if "baseline" in runs:
        result["baseline_commit"] = arg("--baseline-commit", "")
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)
    print(json.dumps(result["median"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        measure(*sys.argv[2:5])
    else:
        main()
