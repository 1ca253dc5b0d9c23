"""Where Viking's time goes at ComfyUI's events in static mode when ComfyUI moves weights between
VRAM and RAM (ComfyUI 0.33 with --disable-dynamic-vram, on a GPU). The formats bench
(`gpu_check.sh` part fp8) found 60-86 ms of Viking's work a warm prompt for a Flux-shaped
fp8-scaled model there, while an event that moves nothing costs ~1 ms on the CPU; in that bench
ComfyUI put a slightly different share of the model in VRAM at each prompt. This probe repeats
that in one process: the fp8-scaled model (bench/probes/static_event_cost.py writes it) loaded by
ComfyUI's own loader, pinned by Viking, then "prompts": ComfyUI's load_models_gpu with an extra
memory requirement that changes from prompt to prompt (so ComfyUI moves layers in and out, as
it does between real prompts), and a few forward steps. Viking's event time is timed part by
part, with the probe's own wrappers (the product code is not changed): the identity key, the
walk over the weights' storages, the native reconcile (registration; release, which first waits
for the device), the pinned home, the prefetcher, the read of ComfyUI's own pins. Each prompt
runs twice: as is, and with the GPU's queued work finished before each native reconcile, timed
apart ("queued GPU work"): what is left in the native call is then the registration and release
themselves.

usage: python bench/probes/static_event_breakdown.py COMFY_0_33_DIR OUT.json [--depth 8] [--prompts 6]
           [--free-gib 4] [--steps 2] [--cpu]      (ComfyUI 0.33's Python; --cpu: a smoke run, no moves)
"""

import collections
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIB = 1 << 20
# The extra VRAM asked for at each prompt, in turn: ComfyUI makes room for it by moving layers
# back to RAM, and loads them again when it is asked for less.
EXTRA_MIB = [0, 384, 128, 512, 0, 256]


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


class PartTimes:
    """Seconds and calls per part, per prompt; wraps module attributes the code looks up at call time."""

    def __init__(self):
        self.seconds, self.calls = collections.Counter(), collections.Counter()

    def wrap(self, owner, name: str, part: str, before=None, after=None):
        inner = getattr(owner, name)

        def call(*args, **kwargs):
            if before is not None:
                before()
            started = time.perf_counter()
            try:
                result = inner(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += 1
            if after is not None:
                after(result)
            return result

        setattr(owner, name, call)

    def take(self) -> dict:
        out = {part: {"ms": round(self.seconds[part] * 1000, 3), "calls": self.calls[part]} for part in sorted(self.seconds)}
        self.seconds.clear()
        self.calls.clear()
        return out


def main():
    comfy_dir, out_path = sys.argv[1], sys.argv[2]
    depth, prompts, free_gib, steps = arg("--depth", 8), arg("--prompts", 6), arg("--free-gib", 4.0), arg("--steps", 2)
    cpu = "--cpu" in sys.argv
    sys.path[:0] = [HERE, os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench")]
    import static_event_cost

    path = static_event_cost.model_file(comfy_dir, depth)
    import in_process

    in_process.start_comfy(comfy_dir, *(["--cpu"] if cpu else ["--disable-dynamic-vram"]))
    import torch

    import comfy.model_management as mm
    import comfy.sd
    import flux_model
    from comfy_node import comfy as seam
    from comfy_node import home, lifecycle, prefetch, timing
    from comfy_node.native import require

    native = require()
    device = mm.get_torch_device()
    holder = None
    if not cpu:
        free = torch.cuda.mem_get_info(device)[0]
        holder = torch.empty(max(0, free - int(free_gib * 2**30)), dtype=torch.uint8, device=device)
    patcher = comfy.sd.load_diffusion_model(str(path))
    times, native_reports, presync = PartTimes(), [], {"on": False}

    def finish_queued_work():
        if presync["on"] and not cpu:
            started = time.perf_counter()
            torch.cuda.synchronize(device)
            times.seconds["queued GPU work, finished before the native call"] += time.perf_counter() - started
            times.calls["queued GPU work, finished before the native call"] += 1

    def note_native(report_json):
        report = json.loads(report_json)
        native_reports.append({k: report.get(k) for k in ("newly_pinned_bytes", "released_bytes", "regions_registered",
                                                          "pinned_bytes")})

    # What makes an event reconcile: the weights' identity key or ComfyUI's own pins changed.
    seen = {"keys": [], "comfy_pins": []}
    times.wrap(lifecycle, "reconcile", "event, in all")
    times.wrap(lifecycle, "identity_key", "identity key", after=lambda key: seen["keys"].append(hash(key)))
    times.wrap(lifecycle, "host_ranges", "walk over the weights' storages")
    times.wrap(seam, "foreign_pins", "ComfyUI's own pins read",
               after=lambda pins: seen["comfy_pins"].append([len(pins[0]), pins[1]]))
    times.wrap(home, "update", "pinned home")
    times.wrap(prefetch, "update", "prefetcher")
    times.wrap(native, "reconcile", "native reconcile (registration, release and its device wait)",
               before=finish_queued_work, after=note_native)
    attached = lifecycle.attach(patcher, lifecycle.PinSettings(label="static event breakdown"))
    x, t, ctx, y, guidance = flux_model.step_inputs({"context_in_dim": 4096, "vec_in_dim": 768}, device, 64, 256)
    rows = []
    for index in range(prompts * 2):
        presync["on"] = index % 2 == 1  # alternate: as is, then with the queued work finished first
        extra = EXTRA_MIB[(index // 2) % len(EXTRA_MIB)] * MIB
        times.take()
        native_reports.clear()
        seen["keys"].clear()
        seen["comfy_pins"].clear()
        before = json.loads(native.status_json())["counters"]
        started = time.perf_counter()
        mm.load_models_gpu([patcher], memory_required=extra)
        with torch.no_grad():
            for _ in range(steps):
                out = patcher.model.diffusion_model(x, t, ctx, y=y, guidance=guidance)
        if not cpu:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        after = json.loads(native.status_json())["counters"]
        loaded = patcher.loaded_size()
        rows.append({"prompt": index // 2, "queued_work_finished_first": presync["on"], "extra_mib": extra // MIB,
                     "seconds": round(seconds, 4), "loaded_in_vram_bytes": loaded,
                     "registrations": after["registrations"] - before["registrations"],
                     "releases": after["releases"] - before["releases"], "native_reports": list(native_reports),
                     "identity_keys": len(seen["keys"]), "distinct_identity_keys": len(set(seen["keys"])),
                     "comfy_pins_at_each_event": [list(p) for p in seen["comfy_pins"]],
                     "parts": times.take(), "finite": flux_model.finite(out)})
        print(json.dumps({k: rows[-1][k] for k in ("prompt", "queued_work_finished_first", "extra_mib", "seconds",
                                                   "loaded_in_vram_bytes", "registrations", "releases",
                                                   "identity_keys", "distinct_identity_keys")}),
              json.dumps({k: v["ms"] for k, v in rows[-1]["parts"].items()}), flush=True)
    status = json.loads(native.status_json())
    result = {"probe": "static_event_breakdown", "date": time.strftime("%Y-%m-%d"), "depth": depth, "format": "fp8_scaled",
              "cpu": cpu, "free_gib": free_gib, "steps": steps, "extra_mib_in_turn": EXTRA_MIB,
              "first_pinned_bytes": attached["pinned_bytes"] if attached else None, "rows": rows,
              "time_in_viking": timing.totals(), "counters": status["counters"], "pinned_bytes": status["pinned_bytes"],
              "cuda_error_left": None if cpu else flux_model.cuda_error_left()}
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)
    del holder


if __name__ == "__main__":
    main()
