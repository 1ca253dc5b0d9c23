"""A real ComfyUI server on a CUDA GPU, with and without Viking, on the example low-VRAM workflow
(workflows/viking_lowvram.json: Pin Model / CLIP / VAE, then KSampler and VAE decode), with VRAM
held down by a dummy allocation in another process so that the model streams as on a small card
(ComfyUI puts a model straight into VRAM when it fits in what is free).

Per server (a fresh one per mode): four prompts (plain, a LoRA through LoraLoader, a hook LoRA
through CreateHookLora + ConditioningSetProperties, plain again), then --cycles cycles of
POST /free (unload the models and drop ComfyUI's cache) + the plain prompt, with the process RSS
and Viking's registration counters after each. Checks: images bit-identical between the modes at
every prompt; no CUDA error, "Pin error", "Tried to unpin" or traceback in the log; with Viking,
after the last /free every registration made has been released; RSS flat over the cycles.

usage: python tests/gpu_server_check.py VERSION OUT.json [--free-gib G] [--cycles N] [--steps N] [--dynamic]
VERSION: 0.3.75 or 0.33; --dynamic: 0.33's default dynamic VRAM mode (else --disable-dynamic-vram).
"""

import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from comfy_server import (ComfyServer, cached_checkpoint, cached_lora, prepare_base_dir, txt2img_prompt,  # noqa: E402
                          wait_for)
from flux_model import arg  # noqa: E402
from server_tools import Results, bad_lines, hold_more, hold_vram, run_seconds, status_bytes  # noqa: E402

version, out_path = sys.argv[1], sys.argv[2]
free_gib, cycles, steps = arg("--free-gib", 2.0, float), arg("--cycles", 4, int), arg("--steps", 6, int)
dynamic = "--dynamic" in sys.argv
LORA = "synthetic_lora.safetensors"
results = Results(out_path, bench="gpu_server", version=version, date=time.strftime("%Y-%m-%d"), dynamic=dynamic,
                  free_gib=free_gib, cycles=cycles, steps=steps, modes={})
result, check, save = results.data, results.check, results.save


def image_hash(server, entry):
    files = server.output_files(entry)
    return hashlib.sha256(Path(files[0]).read_bytes()).hexdigest() if files else None


PIN_INPUTS = {"budget_gib": 0.0, "headroom_gib": 0.0, "backend": "auto", "priority": 0, "pinned_home": True}
MODEL_ONLY = ("vram_cap_gib", "prefetch")  # Pin Model's inputs that Pin CLIP / VAE do not have
LOAD_LINES = ("loaded completely", "loaded partially", "Requested to load", "tiled", "Ran out of memory", "lowvram")


def graph(server, viking, seed, lora=None, overrides=None):
    """The example low-VRAM workflow's graph (workflows/viking_lowvram.json: Pin Model with a
    4 GiB cap and priority 10, Pin CLIP, Pin VAE) at 512x512, or the same without the Viking
    nodes for ComfyUI alone; with a LoRA or a hook LoRA on top."""
    api = txt2img_prompt(seed=seed, steps=steps, size=512, prefix=f"s{seed}")
    sampler, model, clip, vae = "3", ["4", 0], ["4", 1], ["4", 2]
    if viking:
        settings = {**PIN_INPUTS, **(overrides or {})}
        model_settings = {**PIN_INPUTS, "priority": 10, "vram_cap_gib": 4.0, **(overrides or {})}
        shared = {k: v for k, v in settings.items() if k not in MODEL_ONLY and not k.startswith("_")}
        if settings.get("_pin_model", True):
            api["20"] = {"class_type": "VikingPinModel", "inputs": {
                "model": model, **{k: v for k, v in model_settings.items() if not k.startswith("_")}}}
            model = ["20", 0]
        if settings.get("_pin_clip", True):
            api["21"] = {"class_type": "VikingPinCLIP", "inputs": {"clip": clip, **shared}}
            clip = ["21", 0]
        if settings.get("_pin_vae", True):
            api["22"] = {"class_type": "VikingPinVAE", "inputs": {"vae": vae, **shared}}
            vae = ["22", 0]
        for encoder in ("6", "7"):
            api[encoder]["inputs"]["clip"] = clip
        api["8"]["inputs"]["vae"] = vae
    api[sampler]["inputs"]["model"] = model
    if lora == "lora":
        api["900"] = {"class_type": "LoraLoader", "inputs": {"model": model, "clip": clip, "lora_name": LORA,
                                                             "strength_model": 1.0, "strength_clip": 0.0}}
        api[sampler]["inputs"]["model"] = ["900", 0]
    elif lora == "hook":
        api["901"] = {"class_type": "CreateHookLora", "inputs": {"lora_name": LORA, "strength_model": 1.0, "strength_clip": 0.0}}
        api["902"] = {"class_type": "ConditioningSetProperties", "inputs": {
            "cond_NEW": ["6", 0], "strength": 1.0, "set_cond_area": "default", "hooks": ["901", 0]}}
        api[sampler]["inputs"]["positive"] = ["902", 0]
    return api


def run_sequence(name, overrides, prompts, free_cycles=0):
    """A fresh server for one mode (overrides None: ComfyUI alone; a dict: Viking with those
    Pin node settings), `prompts` as (seed, lora) run in turn (the first a warm-up, not kept),
    then `free_cycles` cycles of /free + the plain prompt."""
    viking = overrides is not None
    base = prepare_base_dir(Path(tempfile.mkdtemp(prefix=f"gpu_server_{name}_")), checkpoint=cached_checkpoint(),
                            custom_nodes={"viking_engine": REPO} if viking else {}, loras={LORA: cached_lora()})
    empty_frontend = base / "frontend"  # the API is all this needs: no UI package to carry
    empty_frontend.mkdir(exist_ok=True)
    extra = ["--disable-metadata", "--front-end-root", str(empty_frontend)]
    if version != "0.3.75" and not dynamic:
        extra.append("--disable-dynamic-vram")
    row = dict(prompts=[], cycles=[])
    seen = 0

    def load_lines():
        """What ComfyUI logged about loading models since the last call (how much of each model
        went to VRAM decides which of its own code paths run)."""
        nonlocal seen
        with open(server.log_path, "rb") as log_file:
            log_file.seek(seen)
            new = log_file.read()
        seen += len(new)
        lines = new.decode(errors="replace").splitlines()
        return [line.strip() for line in lines if any(key in line for key in LOAD_LINES)][:20]

    with ComfyServer(base, extra, cpu=False, version=version, start_timeout=300) as server:
        for index, (seed, lora) in enumerate(prompts):
            entry = server.run_prompt(graph(server, viking, seed, lora, overrides), timeout=600)
            prompt = dict(seed=seed, lora=lora, seconds=run_seconds(entry), image=image_hash(server, entry), loads=load_lines())
            if index == 0:
                row["warm_up"] = prompt  # not compared: the first run of a fresh process may pick other kernels
                continue
            if viking:
                status = server.get("/viking/status")
                model = next((o for o in status["owners"] if o["label"].startswith("MODEL")), {})
                prompt.update(pinned_bytes=status["pinned_bytes"], model_vram_bytes=model.get("vram_bytes"),
                              model_wanted_bytes=model.get("wanted_bytes"), comfy=status.get("comfy"),
                              notes=model.get("notes"), home_bytes=model.get("home_bytes"), prefetch=model.get("prefetch"))
            row["prompts"].append(prompt)
            print(name, json.dumps(prompt), flush=True)
        for cycle in range(free_cycles):
            server.free(unload_models=True, free_memory=True, settle=1.0)
            entry = server.run_prompt(graph(server, viking, 1, None, overrides), timeout=600)
            item = dict(cycle=cycle, seconds=run_seconds(entry), image=image_hash(server, entry), rss_bytes=status_bytes(server.pid, "VmRSS"),
                        loads=load_lines())
            if viking:
                counters = server.get("/viking/status")["counters"]
                item.update(registrations=counters["registrations"], releases=counters["releases"])
            row["cycles"].append(item)
            print(name, json.dumps(item), flush=True)
        server.free(unload_models=True, free_memory=True, settle=1.0)
        if viking:
            settled = wait_for(lambda: server.get("/viking/status")["pinned_bytes"] == 0, timeout=30)
            status = server.get("/viking/status")
            row["after_free"] = dict(pinned_bytes=status["pinned_bytes"], counters=status["counters"], settled=settled,
                                     release_failures=status["release_failures"], events=status["events"][-5:])
            row["applied_changes"] = status.get("applied_changes", [])
        log = server.log_path.read_text(errors="replace")
    row["bad_log_lines"] = bad_lines(log)
    return row


PROMPTS = [(0, None), (1, None), (2, "lora"), (3, "hook"), (4, None)]


def run_mode(name, overrides):
    row = run_sequence(name, overrides, PROMPTS, cycles)
    result["modes"][name] = row
    save()
    return row


def megabytes(lines, what: str) -> list[str]:
    """The 'N MB <what>' figures of ComfyUI's load lines, in order."""
    return [found.group(1) for line in lines for found in [re.search(rf"([\d.]+) MB {what}", line)] if found]


def vram_taken_mib(comfy_row, viking_row) -> float:
    """How much less VRAM ComfyUI found usable with Viking than alone, the most at any load of
    the warm-up and the timed prompts, load by load. Not the first load alone: the pins' page
    tables appear when the weights are pinned, which can be after ComfyUI's first load (it was
    before it on the H200, after it on an H100)."""
    def usable(row):
        return [megabytes(item["loads"], "usable") for item in [row["warm_up"]] + row["prompts"]]
    gaps = [float(alone) - float(viking) for alone_loads, viking_loads in zip(usable(comfy_row), usable(viking_row))
            for alone, viking in zip(alone_loads, viking_loads)]
    return max([0.0] + gaps)


def splits(item) -> list:
    """How ComfyUI split each model it loaded for one prompt: 'N MB loaded' per load line."""
    return megabytes(item["loads"], "loaded")


def main():
    holder, held = hold_vram(free_gib)
    result["held_vram_bytes"] = held
    try:
        comfy_row = run_mode("comfy", None)
        viking_row = run_mode("viking", {})
        # Pinned host memory takes a little VRAM for the GPU's page tables (measured: about 2 MiB
        # per GiB pinned, for torch's pin_memory() alike: gpu_probe_registration_vram.json), and
        # ComfyUI splits a model between VRAM and RAM by what is free. ComfyUI alone given the
        # same free VRAM as with Viking is the comparison on equal terms.
        page_tables_mib = vram_taken_mib(comfy_row, viking_row)
        result["viking_vram_page_tables_mib"] = page_tables_mib
        hold_more(holder, int(page_tables_mib * 2**20))
        same_row = run_mode("comfy_same_vram", None)
    finally:
        holder.kill()

    def compare(row):
        return list(zip(row["prompts"] + row["cycles"], viking_row["prompts"] + viking_row["cycles"]))

    pairs = compare(same_row)
    same = sum(1 for a, b in pairs if a["image"] and a["image"] == b["image"])
    check(same == len(pairs) > 0, f"images bit-identical with Viking and ComfyUI alone given the same free VRAM "
                                  f"({page_tables_mib:.2f} MiB less: the page tables of Viking's pins): {same} of {len(pairs)}")
    plain = compare(comfy_row)
    result["identical_to_comfy_alone_at_the_same_start"] = sum(1 for a, b in plain if a["image"] and a["image"] == b["image"])
    unexplained = [a.get("seed") for a, b in plain if a["image"] != b["image"] and splits(a) == splits(b)]
    check(not unexplained, f"where an image differs from ComfyUI alone at the same start "
                           f"({len(plain) - result['identical_to_comfy_alone_at_the_same_start']} of {len(plain)}), "
                           f"ComfyUI split a model differently: unexplained {unexplained}")
    check(page_tables_mib <= 2 * max(1, (viking_row["prompts"][0].get("pinned_bytes") or 0) / 2**30) + 2,
          f"the VRAM Viking's pins take is the page tables' (at most ~2 MiB per GiB pinned, +2): {page_tables_mib:.2f} MiB")
    check(len({p["image"] for p in comfy_row["prompts"]}) == 4 or comfy_row["prompts"][0]["image"] == comfy_row["prompts"][3]["image"],
          "the LoRA and the hook LoRA change the image (the comparison can fail)")
    for name, row in result["modes"].items():
        check(not row["bad_log_lines"], f"{name}: no CUDA error, Pin error, 'Tried to unpin' or traceback in the log: {row['bad_log_lines'][:3]}")
    after = viking_row.get("after_free", {})
    counters = after.get("counters", {})
    check(after.get("pinned_bytes") == 0 and counters.get("registrations") == counters.get("releases") and counters.get("failures") == 0,
          f"after /free every registration made was released: {counters}")
    if not dynamic:
        # A GPU model's first pins wait for the end of the prompt that loaded it (lifecycle._registrations_now).
        after_prompt = [c for c in viking_row.get("applied_changes", []) if c["applied"] == "after the prompt"
                        and c["change"].startswith("pinning")]
        check(after_prompt and (viking_row["prompts"][0].get("pinned_bytes") or 0) > 0,
              f"Viking: the weights' registrations ran once a prompt ended ({len(after_prompt)} time(s)) and the "
              f"next prompt found them pinned")
    streamed = [p for p in viking_row["prompts"] if p.get("model_vram_bytes") is not None and p["model_vram_bytes"] < (p.get("model_wanted_bytes") or 0)]
    result["viking_streamed_prompts"] = len(streamed)
    rss = [c["rss_bytes"] for c in viking_row["cycles"]]
    if len(rss) >= 3:
        spread = max(rss[1:]) - min(rss[1:])
        check(spread < 256 << 20, f"Viking: RSS flat over the /free cycles after the first (spread {spread >> 20} MiB)")
    for name in result["modes"]:
        seconds = [c["seconds"] for c in result["modes"][name]["cycles"] if c["seconds"]]
        result["modes"][name]["cycle_seconds"] = seconds
    save()
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
