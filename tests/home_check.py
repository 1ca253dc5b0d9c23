"""Pinned home through ComfyUI's real ModelPatcher, in-process.

Parts (--parts, comma-separated; default: all that can run here):
- correctness: load -> partial unload -> unload -> LoRA-patched load -> unload -> reload -> unload,
  for several cycles, driven through the calls ComfyUI's model management makes
  (partially_load, partially_unload, detach). After every unload each weight must hold its
  original bits, in its original storage (no copy, no new allocation); the process RSS and the
  ledger must stay flat over the cycles. On a GPU the forward pass after each load is compared
  bit for bit with the same sequence run by ComfyUI alone (no Viking).
  --cpu: the "GPU" is torch's meta device: loading really takes the weights out of RAM and
  nothing can ever be copied back from it, so every weight that comes back must come from
  its home. Nothing computes there, so no forward pass.
- fallback: a model whose home does not fit the budget, and one with pinned_home off, get no
  home (the report says why) and unload the ordinary way.
- timing (GPU): unload and reload of a --depth model through load_models_gpu / unload_all_models,
  ComfyUI alone vs Viking with pinned home, medians of --reps.
- alternate (GPU): two such models take turns on a GPU whose free VRAM (the rest held by a
  dummy allocation) holds only one; each turn loads the model and runs one step. Total time.

usage: python tests/home_check.py COMFY_DIR OUT.json [--cpu] [--parts P,...] [--depth N] [--reps N]
       [--cycles N] [--switches N]
"""

import gc
import json
import os
import statistics
import sys
import time

import flux_model
from flux_model import arg

comfy_dir, out_path = sys.argv[1], sys.argv[2]
cpu = "--cpu" in sys.argv

parts = arg("--parts", "correctness,fallback" if cpu else "correctness,fallback,timing,alternate").split(",")
depth, reps = arg("--depth", 19, int), arg("--reps", 5, int)
cycles, switches = arg("--cycles", 20 if cpu else 3, int), arg("--switches", 6, int)
flux_model.start_comfy(comfy_dir, cpu)

import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402

from comfy_node import home, lifecycle  # noqa: E402
from comfy_node.native import require  # noqa: E402

native = require()
GIB = 1 << 30
device = torch.device("meta") if cpu else mm.get_torch_device()
CPU = torch.device("cpu")
result = dict(bench="comfy_home", date=time.strftime("%Y-%m-%d"),
              device="meta (CPU run)" if cpu else torch.cuda.get_device_name(),
              driver=None, parts={}, checks=[])
checks = result["checks"]


def save():
    result["ok"] = all(c["ok"] for c in checks)
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)


def check(part, ok, what):
    checks.append({"part": part, "ok": bool(ok), "what": what})
    print(("ok   " if ok else "FAIL ") + f"{part}: {what}", flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settings(label):
    return lifecycle.PinSettings(label=label, backend="os-lock" if cpu else "cuda", headroom_gib=4.0)


def owner_status(patcher):
    status = json.loads(native.status_json())
    entry = next((o for o in status["owners"] if o["owner"] == lifecycle.owner_of(patcher)), None)
    return status, entry


# --- correctness -------------------------------------------------------------------------------

def random_model(seed):
    return flux_model.build(1, tiny=cpu, seed=seed)


def lora_patches(model, seed):
    """A LoRA-like patch ("diff") on every second linear weight."""
    g = torch.Generator().manual_seed(seed)
    keys = [n for n, p in model.named_parameters() if n.endswith(".weight") and p.dim() == 2][::2]
    params = dict(model.named_parameters())
    return {k: (torch.randn(params[k].shape, generator=g) * 0.01,) for k in keys}


def run_sequence(viking: bool, inference: bool = False):
    """One model through `cycles` cycles. Returns forward outputs per stage (GPU) and checks.
    inference: build and run everything under torch.inference_mode(), as ComfyUI's executor
    does (its weights are then inference tensors, which have no version counter)."""
    with torch.inference_mode(inference):
        return _run_sequence(viking)


def _run_sequence(viking: bool):
    model, cfg = random_model(7)
    originals = {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=CPU)
    if viking:
        lifecycle.attach(patcher, settings("home correctness"))
    lora = patcher.clone()  # as a LoRA loader after the Viking node makes it
    lora.add_patches(lora_patches(model, 9), 1.0)
    storages = {n: t.data_ptr() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    x, t, ctx, y, guide = flux_model.step_inputs(cfg, device, 8 if cpu else 64, 16 if cpu else 256)
    model_bytes = sum(p.nbytes for p in model.parameters())
    outputs, flat, problems = [], [], []

    def forward(p):
        if cpu:
            return None
        with torch.inference_mode():
            return p.model.diffusion_model(x, t, ctx, y=y, guidance=guide).float().cpu()

    def came_home(stage, p):
        weights = list(p.model.named_parameters()) + list(p.model.named_buffers())
        wrong = [n for n, w in weights if w.device.type != "cpu" or not torch.equal(w, originals[n])]
        if wrong:
            problems.append(f"{stage}: {len(wrong)} weights differ from the original, e.g. {wrong[:3]}")
        moved = sum(1 for n, w in weights if w.data_ptr() != storages[n])
        return moved

    moved_total, home_loaded = 0, None
    for cycle in range(cycles):
        patcher.partially_load(device, 1e32)
        if home_loaded is None:
            home_loaded = home.held_bytes(lifecycle.record_of(patcher))
        outputs.append(("full load", forward(patcher)))
        patcher.partially_unload(CPU, model_bytes // 2)
        outputs.append(("half unloaded", forward(patcher)))
        patcher.detach()
        moved_total += came_home(f"cycle {cycle} unload", patcher)
        lora.partially_load(device, 1e32)
        outputs.append(("LoRA load", forward(lora)))
        lora.detach()
        moved_total += came_home(f"cycle {cycle} LoRA unload", lora)
        patcher.partially_load(device, 1e32)
        outputs.append(("reload", forward(patcher)))
        patcher.detach()
        moved_total += came_home(f"cycle {cycle} reload+unload", patcher)
        gc.collect()
        status, entry = owner_status(patcher)
        flat.append(dict(cycle=cycle, rss_bytes=rss_bytes(), pinned_bytes=entry["pinned_bytes"] if entry else 0,
                         registrations=status["registrations"]))
    report = lifecycle.record_of(patcher).last_report if viking else None
    del lora, patcher, model
    gc.collect()
    return dict(outputs=outputs, flat=flat, problems=problems, moved=moved_total, model_bytes=model_bytes, report=report,
                home_loaded=home_loaded)


if "correctness" in parts:
    viking_run = run_sequence(viking=True)
    part = dict(cycles=cycles, model_bytes=viking_run["model_bytes"], flat=viking_run["flat"],
                problems=viking_run["problems"], weights_in_new_storage=viking_run["moved"],
                home_bytes_loaded=viking_run["home_loaded"])
    check("correctness", viking_run["home_loaded"] >= viking_run["model_bytes"],
          f"while loaded, the home holds every weight ({viking_run['home_loaded']} of {viking_run['model_bytes']} B)")
    check("correctness", not viking_run["problems"], "after every unload each weight holds its original bits, in RAM")
    check("correctness", viking_run["moved"] == 0, f"no weight came back in a new allocation ({viking_run['moved']} did)")
    rss = [f["rss_bytes"] for f in viking_run["flat"]]
    warm = rss[min(2, len(rss) - 1):]
    part["rss_growth_bytes"] = max(warm) - min(warm)
    check("correctness", max(warm) - min(warm) < 64 << 20, f"RSS flat over cycles after warm-up (spread {(max(warm) - min(warm)) >> 20} MiB)")
    pinned = {(f["pinned_bytes"], f["registrations"]) for f in viking_run["flat"]}
    check("correctness", len(pinned) == 1 and next(iter(pinned))[0] > 0, f"ledger flat over cycles: {sorted(pinned)}")
    inference_run = run_sequence(viking=True, inference=True)
    part["inference_mode"] = dict(problems=inference_run["problems"], weights_in_new_storage=inference_run["moved"])
    check("correctness", not inference_run["problems"] and inference_run["moved"] == 0,
          "the same under inference_mode (as in ComfyUI's executor): originals back, no new allocation")
    if not cpu:
        plain_run = run_sequence(viking=False)
        same = [a[0] for a, b in zip(viking_run["outputs"], plain_run["outputs"]) if torch.equal(a[1], b[1])]
        part["stages_compared"] = len(viking_run["outputs"])
        part["stages_identical"] = len(same)
        check("correctness", len(same) == len(viking_run["outputs"]) == len(plain_run["outputs"]),
              f"forward outputs bit-identical to ComfyUI alone at {len(same)} of {len(viking_run['outputs'])} stages")
        lora_differs = not torch.equal(viking_run["outputs"][0][1], viking_run["outputs"][2][1])
        check("correctness", lora_differs, "the LoRA patch changes the output (the comparison can fail)")
        check("correctness", plain_run["moved"] > 0, "ComfyUI alone does copy the weights into new storages (the check can fail)")
        check("correctness", all(flux_model.finite(o[1]) for o in viking_run["outputs"] + plain_run["outputs"]),
              "every forward output is finite (random weights keep activations in range)")
    result["parts"]["correctness"] = part
    save()


def fallback_case(budget_gib, pinned_home):
    """Loads a model whose home cannot or must not exist; returns what the report and the
    unload show."""
    model, _ = random_model(11)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=CPU)
    model_bytes = sum(p.nbytes for p in model.parameters())
    options = settings("home fallback")
    options.model_limit_gib, options.pinned_home = budget_gib(model_bytes), pinned_home
    lifecycle.attach(patcher, options)
    patcher.partially_load(device, 1e32)
    owner = lifecycle.owner_of(patcher)
    record = lifecycle.record_of(patcher)
    report = record.last_report
    status = lifecycle.status()
    entry = next(o for o in status["owners"] if o["owner"] == owner)
    try:
        patcher.detach()
        unload = "ordinary copy back" if all(w.device.type == "cpu" for w in model.parameters()) else "weights left behind"
    except NotImplementedError as error:  # the meta "GPU": ComfyUI's own copy back cannot read it
        unload = "ordinary copy back (attempted: " + str(error).split(";")[0] + ")"
    lifecycle.unpin(patcher)
    return dict(held_bytes_loaded=home.held_bytes(record), report_note=report.get("home_note"),
                status_home_bytes=entry["home_bytes"], unload=unload, model_bytes=model_bytes)


if "fallback" in parts:
    no_room = fallback_case(lambda n: n * 0.25 / GIB, True)  # room for a quarter of the model
    switched_off = fallback_case(lambda n: 0.0, False)
    result["parts"]["fallback"] = dict(no_room=no_room, switched_off=switched_off)
    check("fallback", no_room["held_bytes_loaded"] == 0 and no_room["status_home_bytes"] == 0 and "no pinned home" in (no_room["report_note"] or ""),
          f"no room in the budget: no home, and the report says so ({no_room['report_note']})")
    check("fallback", no_room["unload"].startswith("ordinary"), f"... and it unloads the ordinary way: {no_room['unload']}")
    check("fallback", switched_off["held_bytes_loaded"] == 0 and switched_off["unload"].startswith("ordinary"),
          f"pinned_home off: no home, ordinary unload: {switched_off['unload']}")
    save()


# --- timing and alternating (GPU) --------------------------------------------------------------

def big_model(seed=0):
    model, cfg = flux_model.build(depth, tiny=False, seed=seed)
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=CPU), cfg


def timed(action):
    sync()
    started = time.perf_counter()
    action()
    sync()
    return time.perf_counter() - started


if "timing" in parts and not cpu:
    patcher, cfg = big_model()
    model_bytes = patcher.model_size()
    rows = []
    for mode in ("comfy", "viking"):
        if mode == "viking":
            lifecycle.attach(patcher, settings("home timing"))
        mm.load_models_gpu([patcher], force_full_load=True)  # first load, not timed
        unloads, reloads = [], []
        for _ in range(reps):
            unloads.append(timed(mm.unload_all_models))
            reloads.append(timed(lambda: mm.load_models_gpu([patcher], force_full_load=True)))
        status, entry = owner_status(patcher)
        row = dict(mode=mode, unload_s=round(statistics.median(unloads), 4), reload_s=round(statistics.median(reloads), 4),
                   unload_all_s=[round(s, 4) for s in unloads], reload_all_s=[round(s, 4) for s in reloads],
                   reload_gbps=round(model_bytes / statistics.median(reloads) / 1e9, 1), rss_bytes=rss_bytes(),
                   home_bytes=home.held_bytes(lifecycle.record_of(patcher)), pinned_bytes=entry["pinned_bytes"] if entry else 0)
        rows.append(row)
        print(json.dumps(row), flush=True)
        mm.unload_all_models()
        result["parts"]["timing"] = dict(model_bytes=model_bytes, depth=depth, reps=reps, rows=rows)
        save()
    comfy_row, viking_row = rows
    result["parts"]["timing"].update(unload_speedup=round(comfy_row["unload_s"] / viking_row["unload_s"], 1),
                                     reload_speedup=round(comfy_row["reload_s"] / viking_row["reload_s"], 1))
    # (Each row was taken with the model loaded: its home held. Now unloaded: nothing held twice.)
    mm.unload_all_models()
    status, entry = owner_status(patcher)
    check("timing", home.held_bytes(lifecycle.record_of(patcher)) == 0 and entry["pinned_bytes"] >= model_bytes * 0.99,
          "unloaded, the weights are at home: all pinned, no RAM held twice")
    save()
    lifecycle.unpin(patcher)
    del patcher
    gc.collect()

if "alternate" in parts and not cpu:
    models = [big_model(seed) for seed in range(2)]
    model_bytes = models[0][0].model_size()
    x, t, ctx, y, guide = flux_model.step_inputs(models[0][1], device, 128, 512)
    mm.unload_all_models()
    free, _ = torch.cuda.mem_get_info()
    keep_free = int(model_bytes * 1.45)  # one model and its working memory, never two
    dummy = torch.empty(max(0, free - keep_free), dtype=torch.uint8, device=device)
    rows = []

    vram_seen = []

    def turn(patcher):
        mm.load_models_gpu([patcher])
        with torch.inference_mode():
            patcher.model.diffusion_model(x, t, ctx, y=y, guidance=guide)
        vram_seen.append(sum(int(p.loaded_size()) for p, _ in models))

    for mode in ("comfy", "viking"):
        if mode == "viking":
            for index, (patcher, _) in enumerate(models):
                lifecycle.attach(patcher, settings(f"home alternate {index}"))
        turn(models[0][0])  # warm-up, not timed
        turn(models[1][0])
        turn_s = [timed(lambda: turn(models[i % 2][0])) for i in range(switches)]
        row = dict(mode=mode, total_s=round(sum(turn_s), 3), turn_s=[round(s, 3) for s in turn_s],
                   median_turn_s=round(statistics.median(turn_s), 3), rss_bytes=rss_bytes(),
                   loaded_vram_bytes=[int(p.loaded_size()) for p, _ in models])
        rows.append(row)
        print(json.dumps(row), flush=True)
        mm.unload_all_models()
        result["parts"]["alternate"] = dict(model_bytes=model_bytes, free_vram_bytes=keep_free, switches=switches, rows=rows)
        save()
    result["parts"]["alternate"]["speedup"] = round(rows[0]["total_s"] / rows[1]["total_s"], 2)
    result["parts"]["alternate"]["max_weights_in_vram_bytes"] = max(vram_seen)
    check("alternate", max(vram_seen) < 2 * model_bytes * 0.75, f"the two models never both fit in VRAM (at most {max(vram_seen)} B of weights loaded)")
    del dummy

status = json.loads(native.status_json())
check("all", status["counters"]["failures"] == 0 and status["release_failures"] == 0, "no failed pin or release")
if torch.cuda.is_available():
    check("all", flux_model.cuda_error_left() == 0, "no CUDA error left behind")
    import subprocess

    result["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                      capture_output=True, text=True).stdout.split("\n")[0].strip()
save()
sys.exit(0 if result["ok"] else 1)
