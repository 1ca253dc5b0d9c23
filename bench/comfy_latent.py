"""The largest latent that samples on a consumer-sized GPU, with and without Viking's VRAM cap.

The free VRAM is cut to --free-gib (the rest held by a dummy allocation). For each resolution,
the model is loaded the way ComfyUI's sampler loads it (comfy.sampler_helpers.prepare_sampling:
ComfyUI estimates the activation memory of that latent and makes room), then one step runs; a
CUDA out-of-memory error ends that mode. Modes: comfy (ComfyUI alone decides what stays in
VRAM), viking (Viking's pins and prefetch, VRAM cap --cap-gib).

usage: python bench/comfy_latent.py COMFY_DIR OUT.json [--depth N] [--free-gib G] [--cap-gib G] [--sizes 1024,2048,...]
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import flux_model  # noqa: E402
from flux_model import arg  # noqa: E402

comfy_dir, out_path = sys.argv[1], sys.argv[2]
depth, free_gib, cap_gib = arg("--depth", 19, int), arg("--free-gib", 24.0, float), arg("--cap-gib", 8.0, float)
sizes = [int(s) for s in arg("--sizes", "1024,2048,3072,4096").split(",")]
flux_model.start_comfy(comfy_dir, cpu=False)

import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sampler_helpers  # noqa: E402

from comfy_node import lifecycle  # noqa: E402

GIB = 1 << 30
model, cfg = flux_model.build(depth, tiny=False)
model_bytes = sum(p.nbytes for p in model.parameters())
patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())
device = mm.get_torch_device()
free, total = torch.cuda.mem_get_info()
dummy = torch.empty(max(0, free - int(free_gib * GIB)), dtype=torch.uint8, device=device)
result = dict(bench="comfy_latent", date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(), model_bytes=model_bytes,
              free_vram_bytes=int(torch.cuda.mem_get_info()[0]), cap_gib=cap_gib, rows=[], largest={})


def save():
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)


def step(size):
    x, t, ctx, y, guide = flux_model.step_inputs(cfg, device, size // 8, 512)
    with torch.inference_mode():
        patcher.model.diffusion_model(x, t, ctx, y=y, guidance=guide)  # warm-up (and the prefetch plan)
        torch.cuda.synchronize()
        started = time.perf_counter()
        patcher.model.diffusion_model(x, t, ctx, y=y, guidance=guide)
        torch.cuda.synchronize()
    return time.perf_counter() - started


for mode in ("comfy", "viking"):
    if mode == "viking":
        lifecycle.attach(patcher, lifecycle.PinSettings(label="flux", backend="cuda", headroom_gib=4.0, vram_cap_gib=cap_gib))
    for size in sizes:
        row = dict(mode=mode, size=size)
        try:
            comfy.sampler_helpers.prepare_sampling(patcher, (1, 16, size // 8, size // 8), {}, model_options=patcher.model_options)
            row["loaded_bytes"] = int(patcher.loaded_size())
            torch.cuda.reset_peak_memory_stats()
            row["step_s"] = round(step(size), 3)
            row["peak_vram_bytes"] = int(torch.cuda.max_memory_allocated()) - dummy.nbytes  # the model's run, not the dummy
        except torch.OutOfMemoryError as error:
            row["oom"] = str(error).split("\n")[0][:200]
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        mm.unload_all_models()
        torch.cuda.empty_cache()
        save()
        if "oom" in row:
            break
    fitted = [r["size"] for r in result["rows"] if r["mode"] == mode and "step_s" in r]
    result["largest"][mode] = max(fitted) if fitted else None
    save()
lifecycle.unpin(patcher)
del dummy
save()
