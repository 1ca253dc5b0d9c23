"""Pins through a model's whole life in ComfyUI's real model management, in-process: pin ->
full load -> unload -> partial load (small VRAM) -> unload -> reload -> drop. At each stage it
compares the bytes Viking holds pinned with the bytes of the model that sit in RAM, and checks
that nothing leaks, that ComfyUI never warns, that no CUDA error is left, and that a forward
pass gives the same bits with every weight in VRAM and with half of them streamed from RAM.

usage: python tests/lifecycle_check.py COMFY_DIR OUT.json [--cpu] [--depth N] [--vram-gib G]
  --cpu: ComfyUI's --cpu mode and the OS-lock backend (what CI runs, on a tiny model)
  --depth: Flux double blocks (single blocks = 2x); the default 6 gives ~8 GB of bf16 weights
  --vram-gib: VRAM left free for the partial-load stage (the rest held by a dummy allocation)
"""

import gc
import json
import logging
import sys
import time

import flux_model
from flux_model import arg

comfy_dir, out_path = sys.argv[1], sys.argv[2]
cpu = "--cpu" in sys.argv
depth, vram_gib = arg("--depth", 1 if cpu else 6), arg("--vram-gib", 3.0)
flux_model.start_comfy(comfy_dir, cpu)

import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402

from comfy_node import lifecycle  # noqa: E402
from comfy_node.native import require  # noqa: E402
from comfy_node.weights import cpu_storage_ranges  # noqa: E402

native = require()
warnings = []


class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())


logging.getLogger().addHandler(Collect())

started = time.perf_counter()
model, cfg = flux_model.build(depth, tiny=cpu)
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())
build_s = time.perf_counter() - started

device = mm.get_torch_device()
tokens = 16 if cpu else 64
x = torch.randn(1, 16, tokens, tokens, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
ctx = torch.randn(1, 8 if cpu else 256, cfg["context_in_dim"], generator=torch.Generator().manual_seed(2)).to(device, torch.bfloat16)
y = torch.randn(1, cfg["vec_in_dim"], generator=torch.Generator().manual_seed(3)).to(device, torch.bfloat16)
timestep, guidance = torch.tensor([0.5], device=device), torch.tensor([3.5], device=device)

stages, checks = [], []


def check(stage, ok, what):
    checks.append({"stage": stage, "ok": bool(ok), "what": what})


def model_ranges():
    """(ptr, nbytes) of the model's distinct storages in host RAM now."""
    ranges, _ = cpu_storage_ranges(lifecycle.host_weights(patcher))
    return [(ptr, nbytes) for ptr, nbytes, _ in ranges]


def record(stage, seconds, **extra):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    status = json.loads(native.status_json())
    owner = next((o for o in status["owners"] if o["owner"] == lifecycle.owner_of(patcher)), None)
    ranges = model_ranges()
    in_ram = sum(n for _, n in ranges)
    pinned = owner["pinned_bytes"] if owner else 0
    too_small = sum(s["bytes"] for s in (owner or {}).get("skipped", []) if s["reason"] == "too_small")
    # ComfyUI pins offloaded weights itself, but skips those that are already pinned (ours):
    # what it holds of this model must be bytes Viking left, never a byte twice.
    comfy_pins = dict(mm.PINNED_MEMORY)
    comfy_in_model = sum(n for ptr, n in ranges if ptr in comfy_pins)
    row = dict(stage=stage, seconds=round(seconds, 3), ram_bytes=in_ram, pinned_bytes=pinned,
               registrations=status["registrations"], comfy_pinned_bytes=int(mm.TOTAL_PINNED_MEMORY),
               comfy_pinned_of_model=comfy_in_model, loaded_vram_bytes=int(patcher.loaded_size()), **extra)
    stages.append(row)
    print(json.dumps(row), flush=True)
    check(stage, pinned + comfy_in_model <= in_ram, f"no byte pinned twice: Viking {pinned} + ComfyUI {comfy_in_model} <= in RAM {in_ram}")
    # Every byte in RAM is pinned, but for slivers below Viking's registration threshold.
    check(stage, pinned + comfy_in_model >= in_ram - too_small, f"everything in RAM pinned but {too_small} B of slivers")
    return row


def timed(action):
    started = time.perf_counter()
    action()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def forward():
    with torch.inference_mode():
        return patcher.model.diffusion_model(x, timestep, ctx, y=y, guidance=guidance).float().cpu()


backend = "os-lock" if cpu else "cuda"
settings = lifecycle.PinSettings(label="flux-shaped test model", backend=backend, headroom_gib=1.0)
record("pinned at rest", timed(lambda: lifecycle.attach(patcher, settings)))

record("full load", timed(lambda: mm.load_models_gpu([patcher], force_full_load=True)))
full_output = forward()

record("unloaded", timed(mm.unload_all_models))

dummy = None
if not cpu:
    free, _ = torch.cuda.mem_get_info()
    dummy = torch.empty(max(0, free - int(vram_gib * (1 << 30))), dtype=torch.uint8, device="cuda")
    partial_s = timed(lambda: mm.load_models_gpu([patcher]))
else:
    # --cpu loads fully; drive the partial-load path directly (what lowvram does on a GPU).
    partial_s = timed(lambda: patcher.load(device, lowvram_model_memory=1, full_load=False))
row = record("partial load", partial_s)
check("partial load", cpu or 0 < row["loaded_vram_bytes"] < model_bytes, "part of the model in VRAM, the rest in RAM")
check("partial load", row["comfy_pinned_of_model"] <= stages[0]["ram_bytes"] - stages[0]["pinned_bytes"],
      "ComfyUI's own pinning took only the slivers Viking left")
step_s = timed(forward)
partial_output = forward()
check("partial load", torch.equal(full_output, partial_output), "forward pass bit-identical to the full-VRAM one")

record("unloaded again", timed(mm.unload_all_models))
del dummy
record("reloaded", timed(lambda: mm.load_models_gpu([patcher], force_full_load=True)))
check("reloaded", torch.equal(full_output, forward()), "forward pass bit-identical after the round trip")
mm.unload_all_models()

owner = lifecycle.owner_of(patcher)
del patcher, model
mm.cleanup_models()
gc.collect()
status = json.loads(native.status_json())
check("dropped", status["registrations"] == 0 and not any(o["owner"] == owner for o in status["owners"]),
      "the model is gone: no registration left")
check("all", not [w for w in warnings if "pin" in w.lower()], f"no pin warnings from ComfyUI or Viking: {warnings}")
check("all", status["counters"]["failures"] == 0 and status["release_failures"] == 0, "no failed pin or release")
if torch.cuda.is_available():
    check("all", flux_model.cuda_error_left() == 0, "no CUDA error left behind")

result = dict(
    bench="comfy_lifecycle", date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    backend=backend, model_bytes=model_bytes, build_s=round(build_s, 1), partial_step_s=round(step_s, 3),
    vram_left_gib=None if cpu else vram_gib, stages=stages, checks=checks, warnings=warnings,
    ok=all(c["ok"] for c in checks),
)
with open(out_path, "w") as out:
    json.dump(result, out, indent=1)
for c in checks:
    print(("ok   " if c["ok"] else "FAIL ") + f"{c['stage']}: {c['what']}")
sys.exit(0 if result["ok"] else 1)
