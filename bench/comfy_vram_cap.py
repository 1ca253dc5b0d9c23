"""A per-model VRAM cap through ComfyUI's real model management: a Flux-shaped model loaded
with caps from 0 up to all of it; at each cap the weights in VRAM must stay under the cap and
the forward pass must give the same bits as the uncapped one. On a GPU it also times the step
at each cap, with Viking's pins and with ComfyUI's own pinning (same cap, no Viking pins),
against the floor max(streamed bytes / link bandwidth, all-in-VRAM compute).

Modes (--modes, comma-separated): comfy (the cap alone, no Viking pins: ComfyUI pins what it
streams itself), viking (Viking's pins and prefetch, the default), viking_noprefetch (pins only),
comfy_streams4 (ComfyUI alone with 4 offload streams, as its --async-offload 4 would give),
viking@MIB (Viking with a prefetch window of MIB MiB instead of ComfyUI's streaming reserve).

usage: python bench/comfy_vram_cap.py COMFY_DIR OUT.json [--cpu] [--depth N] [--caps G,G,...] [--reps N]
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

from comfy_node import lifecycle  # noqa: E402
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
    return statistics.median(best)


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
    result["ok"] = all(r["under_cap"] and r["identical"] for r in rows)
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)


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
    for mode in modes[shift:] + modes[:shift]:
        if mode.startswith("viking"):
            window_mib = int(mode.split("@")[1]) if "@" in mode else 0
            lifecycle.attach(patcher, lifecycle.PinSettings(label="flux", backend="os-lock" if cpu else "cuda", headroom_gib=4.0,
                                                            prefetch=mode != "viking_noprefetch", prefetch_window_mib=window_mib))
        else:
            lifecycle.unpin(patcher)
        set_offload_streams(4 if mode == "comfy_streams4" else default_streams)
        lifecycle.set_vram_cap(patcher, cap)
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
        from comfy_node import prefetch  # noqa: E402
        row = dict(mode=mode, cap_gib=cap, loaded_bytes=loaded, streamed_bytes=streamed, under_cap=loaded <= cap * GIB,
                   identical=bool(torch.equal(output, reference)), step_s=round(step, 4),
                   floor_s=round(floor, 4) if floor else None, over_floor=round(step / floor, 3) if floor else None,
                   viking_pinned_bytes=json.loads(native.status_json())["pinned_bytes"], comfy_pinned_bytes=int(mm.TOTAL_PINNED_MEMORY),
                   prefetch=prefetch.summary(lifecycle.owner_of(patcher)),
                   peak_vram_bytes=int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None)
        rows.append(row)
        print(json.dumps(row), flush=True)
        save()
        mm.unload_all_models()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
set_offload_streams(default_streams)
lifecycle.unpin(patcher)
save()
print("ok" if result["ok"] else "FAIL")
sys.exit(0 if result["ok"] else 1)
