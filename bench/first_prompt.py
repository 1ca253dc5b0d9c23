"""The first prompt after a model is loaded, and prompts that hold the Viking Memory Status node,
against ComfyUI alone (issue 62): SD1.5-shaped models (tests/synthetic_checkpoint.py) in three
formats, on real servers of ComfyUI 0.33 (dynamic VRAM, its default on NVIDIA, and
--disable-dynamic-vram) and 0.3.75.

Per case (format x ComfyUI), fresh servers taking turns:
  alone, alone#2   ComfyUI alone, twice: the spread between two servers is the noise floor
  pin              Viking Pin Model (and Pin CLIP + Pin VAE where the checkpoint loader gives them)
  pin_status       the same and a Viking Memory Status node after the image
Each server: the first prompt after its start (the model files' pages dropped from the page
cache first), WARM warm prompts with new seeds, then POST /free (the loaders run again) and one
more prompt. Recorded: ComfyUI's seconds per prompt (execution_start to execution_success), the
image's hash (bit-identical to alone's), Viking's pinned bytes and time inside ComfyUI's calls.
The table: each Viking setup's seconds over the median of the two alone servers, per stage,
beside alone#2 over alone (the spread).

Formats: fp16 (a plain checkpoint), fp8_scaled (its UNet's linears float8 with a per-tensor
scale: ComfyUI 0.33 loads them as comfy-kitchen QuantizedTensor weights), gguf (the UNet in Q8_0
through the real ComfyUI-GGUF pack, tests/hosts.py; CLIP and VAE from the plain checkpoint).

usage: python bench/first_prompt.py [OUT.json] [--cpu] [--formats fp16,fp8_scaled,gguf]
       [--comfy 0.33-dynamic,0.33-static,0.3.75] [--warm 3] [--steps 6] [--size 512] [--free-gib 4]
OUT defaults to bench/results/first_prompt_gpu.json (first_prompt_cpu.json with --cpu); a case
already in OUT is kept, so two calls with different --comfy fill one file. --cpu: ComfyUI's
--cpu on any machine (a check of the bench; 0.33 runs static there), small images, fewer cases.
"""
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "tests"), str(BENCH)]

from comfy_server import (CACHE_DIR, ComfyServer, cached_checkpoint, comfy_unavailable,  # noqa: E402
                          pin_node, prepare_base_dir, txt2img_prompt)
from flux_model import arg  # noqa: E402
from hosts import GGUF_PACK  # noqa: E402
from server_tools import Results, bad_lines, drop_file_cache, hold_vram, run_seconds  # noqa: E402

cpu = "--cpu" in sys.argv
out_path = Path(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--")
                else BENCH / "results" / f"first_prompt_{'cpu' if cpu else 'gpu'}.json")
formats = arg("--formats", "fp16,gguf" if cpu else "fp16,fp8_scaled,gguf", str).split(",")
comfys = arg("--comfy", "0.33-static" if cpu else "0.33-dynamic,0.33-static,0.3.75", str).split(",")
warm, steps = arg("--warm", 3, int), arg("--steps", 1 if cpu else 6, int)
size, free_gib = arg("--size", 64 if cpu else 512, int), arg("--free-gib", 4.0)
SETUPS = ("alone", "pin", "alone#2", "pin_status")  # taking turns: no setup always follows the same one
GGUF_NAME = "sd15_unet_q8.gguf"

previous = json.loads(out_path.read_text()) if out_path.exists() else {}
results = Results(out_path, bench="first_prompt", date=time.strftime("%Y-%m-%d"), cpu=cpu, steps=steps, size=size,
                  warm_prompts=warm, free_gib=None if cpu else free_gib, cases=previous.get("cases", {}))
result, check, save = results.data, results.check, results.save


def synthetic(name: str, make) -> Path:
    import synthetic_checkpoint

    source = hashlib.sha256(Path(synthetic_checkpoint.__file__).read_bytes()).hexdigest()[:10]
    path = CACHE_DIR / f"{name}_{source}{'.gguf' if name.endswith('q8') else '.safetensors'}"
    if not path.exists():
        make(synthetic_checkpoint, str(path))
    return path


def model_files(weight_format: str) -> dict:
    """{"checkpoint": path, "unet": path or None} of a format."""
    if weight_format == "fp8_scaled":
        return {"checkpoint": synthetic("first_prompt_sd15_scaled_fp8",
                                        lambda sc, p: sc.make_checkpoint(p, seed=5, quant="scaled_fp8")), "unet": None}
    unet = synthetic("first_prompt_sd15_unet_q8", lambda sc, p: sc.make_gguf(p, seed=4)) if weight_format == "gguf" else None
    return {"checkpoint": cached_checkpoint(), "unet": unet}


def graph(setup: str, weight_format: str, seed: int) -> dict:
    api = txt2img_prompt(seed=seed, steps=steps, size=size, prefix=f"fp{seed}")
    model = ["4", 0]
    if weight_format == "gguf":
        api["20"] = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": GGUF_NAME}}
        model = ["20", 0]
    api["3"]["inputs"]["model"] = model
    if setup.startswith("pin"):
        api["10"] = pin_node("Model", model)
        api["3"]["inputs"]["model"] = ["10", 0]
        if weight_format != "gguf":  # issue 62's GGUF case: Pin Model only
            api["11"], api["12"] = pin_node("CLIP", ["4", 1]), pin_node("VAE", ["4", 2])
            api["6"]["inputs"]["clip"] = api["7"]["inputs"]["clip"] = ["11", 0]
            api["8"]["inputs"]["vae"] = ["12", 0]
    if setup == "pin_status":
        api["13"] = {"class_type": "VikingMemoryStatus", "inputs": {"after": ["8", 0]}}
    return api


def image_hash(server, entry) -> str | None:
    files = server.output_files(entry)
    return hashlib.sha256(Path(files[0]).read_bytes()).hexdigest() if files else None


def run_server(case: str, setup: str, weight_format: str, files: dict) -> dict:
    version, _, vram_mode = case.split("/")[1].partition("-")
    base = Path(tempfile.mkdtemp(prefix=f"first_prompt_{setup.replace('#', '_')}_"))
    nodes = {"viking_engine": REPO} if setup.startswith("pin") else {}
    if weight_format == "gguf":
        nodes["ComfyUI-GGUF"] = GGUF_PACK
    prepare_base_dir(base, custom_nodes=nodes, checkpoint=files["checkpoint"])
    if files["unet"]:
        (base / "models" / "diffusion_models").mkdir(parents=True, exist_ok=True)
        (base / "models" / "diffusion_models" / GGUF_NAME).symlink_to(files["unet"])
    extra = ["--disable-metadata"] + (["--disable-dynamic-vram"] if vram_mode == "static" else [])
    for path in filter(None, files.values()):
        drop_file_cache(path)
    row = {"prompts": []}
    with ComfyServer(base, extra, cpu=cpu, version=version, start_timeout=300) as server:
        stages = ["first"] + ["warm"] * warm + ["after free"]
        for index, stage in enumerate(stages):
            if stage == "after free":
                server.free(unload_models=True, idle=1.0)
            entry = server.run_prompt(graph(setup, weight_format, seed=index), timeout=900)
            prompt = {"stage": stage, "seconds": run_seconds(entry), "image": image_hash(server, entry)}
            if nodes.get("viking_engine"):
                status = server.get("/viking/status")
                prompt.update(pinned_bytes=status["pinned_bytes"], time_in_viking=status.get("time_in_viking"),
                              residency_age_seconds=(status.get("residency") or {}).get("age_seconds"))
            row["prompts"].append(prompt)
            print(case, setup, json.dumps({k: v for k, v in prompt.items() if k != "time_in_viking"}), flush=True)
        row["bad_log_lines"] = bad_lines(server.log_text())
        row["dynamic_vram_on"] = "DynamicVRAM support detected and enabled" in server.log_text()
    return row


def stage_seconds(row: dict) -> dict:
    """{stage: seconds} of one server (warm: the median of its warm prompts)."""
    by_stage = {}
    for prompt in row["prompts"]:
        by_stage.setdefault(prompt["stage"], []).append(prompt["seconds"])
    return {stage: statistics.median(values) for stage, values in by_stage.items() if None not in values}


def summarize(case: str, rows: dict) -> dict:
    alone = [stage_seconds(rows[s]) for s in ("alone", "alone#2") if s in rows and "error" not in rows[s]]
    if not alone:
        return {}
    summary = {}
    for setup in ("pin", "pin_status", "alone#2"):
        if setup not in rows or "error" in rows[setup]:
            continue
        mine = stage_seconds(rows[setup])
        against = alone[:1] if setup == "alone#2" else alone
        summary[setup] = {stage: round(seconds / statistics.median(a[stage] for a in against), 3)
                          for stage, seconds in mine.items() if all(a.get(stage) for a in against)}
    return summary


holder = None
if not cpu:
    holder, held = hold_vram(free_gib)
    result["held_vram_bytes"] = held
try:
    for comfy in comfys:
        version = comfy.partition("-")[0]
        reason = comfy_unavailable(version)
        for weight_format in formats:
            case = f"{weight_format}/{comfy}"
            if reason or (weight_format == "gguf" and not (GGUF_PACK / "loader.py").exists()):
                result["cases"][case] = {"skipped": reason or "no ComfyUI-GGUF host"}
                print(case, "skipped:", result["cases"][case]["skipped"], flush=True)
                continue
            files, rows = model_files(weight_format), {}
            for setup in SETUPS:
                try:
                    rows[setup] = run_server(case, setup, weight_format, files)
                except Exception as error:  # noqa: BLE001 - recorded; the other setups still run
                    rows[setup] = {"error": f"{type(error).__name__}: {error}"[:4000], "prompts": []}
                    print(case, setup, "failed:", rows[setup]["error"][:2000], flush=True)
                result["cases"][case] = {"servers": rows}
                save()
            result["cases"][case]["over_alone"] = summarize(case, rows)
            save()
finally:
    if holder is not None:
        holder.kill()

for case, entry in result["cases"].items():
    rows = entry.get("servers", {})
    for setup, row in rows.items():
        check("error" not in row, f"{case} {setup}: every prompt ran {row.get('error', '')[:200]}")
        check(not row.get("bad_log_lines"), f"{case} {setup}: no traceback or CUDA error in the log {row.get('bad_log_lines', [])[:2]}")
    reference = [p["image"] for p in rows.get("alone", {}).get("prompts", [])]
    for setup, row in rows.items():
        if "error" not in row and setup != "alone" and reference:
            check([p["image"] for p in row["prompts"]] == reference, f"{case} {setup}: images bit-identical to alone's")
    if case.endswith("0.33-dynamic") and not cpu:
        check(all(row.get("dynamic_vram_on") for row in rows.values() if "error" not in row), f"{case}: dynamic VRAM on")
save()

print(f"\n{'case':28} {'setup':11} {'first':>7} {'warm':>7} {'after free':>10}   (seconds over ComfyUI alone's median)")
for case, entry in result["cases"].items():
    for setup, ratios in entry.get("over_alone", {}).items():
        print(f"{case:28} {setup:11} " + " ".join(f"{ratios.get(stage, float('nan')):{w}.3f}"
                                                   for stage, w in (("first", 7), ("warm", 7), ("after free", 10))))
sys.exit(0 if result["ok"] else 1)
