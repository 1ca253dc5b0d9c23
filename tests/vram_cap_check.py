"""A per-model VRAM cap through ComfyUI's real model management: a Flux-shaped model loaded
with caps from 0 up to all of it; at each cap the weights in VRAM must stay under the cap and
the forward pass must give the same bits as the uncapped one. On a GPU it also times the step
at each cap, with Viking's pins and with ComfyUI's own pinning (same cap, no Viking pins),
against the floor max(streamed bytes / link bandwidth, all-in-VRAM compute).

Modes (--modes, comma-separated): comfy (ComfyUI alone under the same cap on its weights, no
Viking: the bench trims partially_load's offer the way Viking's cap does, and ComfyUI pins what
it streams itself), comfy_same_peak (ComfyUI alone with the cap raised by the VRAM Viking's
prefetch window took beyond ComfyUI's buffer at that cap, so both use the same VRAM; runs after
the viking row of the cap), viking (Viking's pins and prefetch, the default), viking_noprefetch
(pins only), comfy_streams4 (ComfyUI alone with 4 offload streams, as its --async-offload 4
would give), viking@MIB (Viking with a prefetch window of MIB MiB).

The floor is max(streamed bytes / link speed, all-in-VRAM step), the link speed the best of 5
copies of 2 GiB from pinned memory measured in the same run. Step times are medians of --reps
steps after two warm-up steps.

usage: python tests/vram_cap_check.py COMFY_DIR OUT.json [--cpu] [--depth N] [--caps G,G,...] [--reps N]
       [--modes M,...] [--no-devicemap]
"""

import json
import statistics
import sys
import time

import flux_model
from flux_model import arg

comfy_dir, out_path = sys.argv[1], sys.argv[2]
cpu = "--cpu" in sys.argv
devicemap = "--no-devicemap" not in sys.argv
depth, reps = arg("--depth", 1 if cpu else 19, int), arg("--reps", 2 if cpu else 5, int)
caps = [float(c) for c in arg("--caps", "0.002,0.005" if cpu else "4,8,12,16", str).split(",")]
modes = arg("--modes", "viking" if cpu else "comfy,viking,viking_noprefetch", str).split(",")
flux_model.start_comfy(comfy_dir, cpu)

import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402

from comfy_node import lifecycle, prefetch, vram_cap  # noqa: E402
from comfy_node.native import require  # noqa: E402

native = require()
native.configure(cuda_devicemap=devicemap)
GIB = 1 << 30
model, cfg = flux_model.build(depth, tiny=cpu)
model_bytes = sum(p.nbytes for p in model.parameters())
patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())
device = mm.get_torch_device()
tokens, context = (16, 8) if cpu else (128, 512)
x, timestep, ctx, y, guidance = flux_model.step_inputs(cfg, device, tokens, context)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(n):
    """The output of one step, and the median time of `n` more (after a second warm-up step)."""
    times = []
    with torch.inference_mode():
        out = patcher.model.diffusion_model(x, timestep, ctx, y=y, guidance=guidance).float().cpu()
        patcher.model.diffusion_model(x, timestep, ctx, y=y, guidance=guidance)
        for _ in range(n):
            sync()
            started = time.perf_counter()
            patcher.model.diffusion_model(x, timestep, ctx, y=y, guidance=guidance)
            sync()
            times.append(time.perf_counter() - started)
    return out, statistics.median(times)


def link_gbps():
    if not torch.cuda.is_available():
        return None
    host = torch.empty(2 * GIB, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    best = []
    for _ in range(5):
        sync()
        started = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        sync()
        best.append(host.nbytes / (time.perf_counter() - started) / 1e9)
    return max(best)  # the link's speed: the best copy (a slow one is noise, not the link)


limit = link_gbps()
mm.load_models_gpu([patcher], force_full_load=True)
reference, all_in_vram = run(reps)
mm.unload_all_models()

result = dict(bench="comfy_vram_cap", date=time.strftime("%Y-%m-%d"),
              device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              model_bytes=model_bytes, cuda_devicemap=devicemap, link_gb_per_s=limit, all_in_vram_step_s=round(all_in_vram, 4),
              modes=modes, rows=[])
rows = result["rows"]


def save():
    result["ok"] = all(r["under_cap"] and r["identical"] and r.get("finite", True) for r in rows) and flux_model.finite(reference)
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)


def comfy_alone_cap(cap_bytes):
    """ComfyUI alone with a cap on its weights: the same trim of partially_load's offer as
    Viking's cap, on this patcher instance, with no Viking record (nothing pinned by Viking)."""
    method = type(patcher).partially_load

    def partially_load(device_to, extra_memory=0, force_patch_weights=False):
        allowed, _ = vram_cap.held_back(extra_memory, patcher.model.model_loaded_weight_memory, model_bytes, cap_bytes)
        return method(patcher, device_to, allowed, force_patch_weights=force_patch_weights)

    patcher.partially_load = partially_load


def set_offload_streams(count):
    """ComfyUI's --async-offload N, in-process: its stream pool is made on first use."""
    mm.NUM_STREAMS = count
    mm.STREAMS.clear()
    mm.stream_counters.clear()


default_streams = mm.NUM_STREAMS
if torch.cuda.is_available():
    torch.cuda.reset_peak_memory_stats()  # the reference run above loaded everything
for index, cap in enumerate(caps):
    # Every mode at each cap, the order rotating per cap, so none always runs on a warmer GPU.
    shift = index % len(modes)
    order = modes[shift:] + modes[:shift]
    if "comfy_same_peak" in order:  # needs the viking row of this cap first
        order = [m for m in order if m != "comfy_same_peak"] + ["comfy_same_peak"]
    for mode in order:
        vars(patcher).pop("partially_load", None)  # no cap wrapper from the mode before
        cap_bytes = int(cap * GIB)
        if mode.startswith("viking"):
            window_mib = int(mode.split("@")[1]) if "@" in mode else 0
            lifecycle.attach(patcher, lifecycle.PinSettings(label="flux", backend="os-lock" if cpu else "cuda", headroom_gib=4.0,
                                                            prefetch=mode != "viking_noprefetch", prefetch_window_mib=window_mib,
                                                            vram_cap_gib=cap))
        else:
            lifecycle.unpin(patcher)
            viking_row = next((r for r in rows if r["mode"] == "viking" and r["cap_gib"] == cap and "error" not in r), None)
            if mode == "comfy_same_peak":
                if viking_row is None or not viking_row.get("prefetch"):
                    continue
                cap_bytes += viking_row["prefetch"]["extra_bytes"]
            comfy_alone_cap(cap_bytes)
        mm.load_models_gpu([patcher])
        loaded = int(patcher.loaded_size())
        try:
            output, step = run(reps)
        except Exception as error:  # noqa: BLE001 - recorded, the other modes still run
            rows.append(dict(mode=mode, cap_gib=cap, error=repr(error), under_cap=False, identical=False))
            print(json.dumps(rows[-1]), flush=True)
            save()
            mm.unload_all_models()
            continue
        streamed = model_bytes - loaded
        floor = max(streamed / (limit * 1e9), all_in_vram) if limit else None
        record = lifecycle.record_of(patcher)
        row = dict(mode=mode, cap_gib=cap, weights_cap_bytes=cap_bytes, loaded_bytes=loaded, streamed_bytes=streamed,
                   under_cap=loaded <= cap_bytes,
                   identical=bool(torch.equal(output, reference)), finite=flux_model.finite(output), step_s=round(step, 4),
                   floor_s=round(floor, 4) if floor else None, over_floor=round(step / floor, 3) if floor else None,
                   viking_pinned_bytes=json.loads(native.status_json())["pinned_bytes"], comfy_pinned_bytes=int(mm.TOTAL_PINNED_MEMORY),
                   prefetch=prefetch.summary(record) if record is not None else None,
                   peak_vram_bytes=int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None)
        rows.append(row)
        print(json.dumps(row), flush=True)
        save()
        mm.unload_all_models()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
set_offload_streams(default_streams)
lifecycle.unpin(patcher)
vars(patcher).pop("partially_load", None)
# After an unpin the cap is gone with the model's record: ComfyUI loads what it wants again.
mm.load_models_gpu([patcher])
result["after_unpin_loaded_bytes"] = int(patcher.loaded_size())
result["after_unpin_cap_gone"] = bool(lifecycle.record_of(patcher) is None and (cpu or patcher.loaded_size() > min(caps) * GIB))
mm.unload_all_models()
save()
print("ok" if result["ok"] else "FAIL")
sys.exit(0 if result["ok"] else 1)
