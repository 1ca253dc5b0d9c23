"""Pinned home (comfy_node/home.py).

- The mechanics, in-process through ComfyUI's real ModelPatcher, with torch's meta device as the
  "GPU": loading takes the weights out of RAM for real, and nothing can be copied back from meta,
  so each weight that returns must come from its home (tests/home_check.py --cpu).
- The images, on a real server: load -> sample -> unload -> LoRA load -> sample -> unload ->
  reload -> sample, with Viking (pinned home on) and without, pixel for pixel. On this CPU
  machine ComfyUI never moves weights, so this shows the nodes change nothing; on a GPU the same
  sequence runs through the home (tests/home_check.py compares forward passes there).
"""

import json
import subprocess

import numpy as np
from PIL import Image

from comfy_server import REPO_ROOT, ComfyServer, cached_lora, pin_node, prepare_base_dir, txt2img_prompt

LORA = "synthetic_lora.safetensors"


def test_weights_come_home_without_copy_through_load_unload_and_lora(comfy_env, tmp_path):
    out = tmp_path / "home.json"
    run = subprocess.run([str(comfy_env.python), str(REPO_ROOT / "tests" / "home_check.py"), str(comfy_env.tree), str(out), "--cpu"],
                         capture_output=True, text=True, timeout=600)
    assert out.exists(), run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed and run.returncode == 0, failed or run.stderr[-3000:]
    part = result["parts"]["correctness"]
    assert part["cycles"] >= 10 and part["weights_in_new_storage"] == 0
    assert part["home_bytes_loaded"] >= part["model_bytes"]
    assert set(result["parts"]["fallback"]) == {"no_room", "switched_off"}


def stage_graph(seed, lora, viking: bool):
    """lora: False, True (LoraLoader: a patch ComfyUI restores from backup) or "hook" (a hook
    LoRA on the positive prompt: CreateHookLora + ConditioningSetProperties, which ComfyUI
    writes into the weights in place during sampling, per cond group)."""
    api = txt2img_prompt(seed=seed, prefix=f"s{seed}")
    model = ["4", 0]
    if viking:
        api["20"] = pin_node("Model", model)
        model = ["20", 0]
    if lora == "hook":
        api["11"] = {"class_type": "CreateHookLora", "inputs": {"lora_name": LORA, "strength_model": 1.0, "strength_clip": 0.0}}
        api["12"] = {"class_type": "ConditioningSetProperties", "inputs": {
            "cond_NEW": ["6", 0], "strength": 1.0, "set_cond_area": "default", "hooks": ["11", 0]}}
        api["3"]["inputs"]["positive"] = ["12", 0]
    elif lora:
        api["10"] = {"class_type": "LoraLoader", "inputs": {
            "model": model, "clip": ["4", 1], "lora_name": LORA, "strength_model": 1.0, "strength_clip": 0.0}}
        model = ["10", 0]
    api["3"]["inputs"]["model"] = model
    return api


STAGES = ((1, False), (2, True), (3, False), (4, "hook"), (5, False))


def run_stages(server, viking: bool):
    images = []
    for seed, lora in STAGES:
        entry = server.run_prompt(stage_graph(seed, lora, viking))
        files = server.output_files(entry)
        assert len(files) == 1, files
        images.append(np.asarray(Image.open(files[0]).convert("RGB")))
        server.free(unload_models=True, free_memory=False, settle=1.0)  # unload, keep the model
    return images


def test_load_lora_unload_reload_images_bit_identical(comfy_version, tmp_path):
    loras = {LORA: cached_lora()}
    base = prepare_base_dir(tmp_path / "viking", custom_nodes={"viking_engine": REPO_ROOT}, loras=loras)
    with ComfyServer(base, version=comfy_version) as server:
        pinned = run_stages(server, viking=True)
        state = server.get("/viking/status")
        assert any(o["label"].startswith("MODEL") and o["pinned_bytes"] > 0 for o in state["owners"]), state["owners"]
    with ComfyServer(prepare_base_dir(tmp_path / "plain", loras=loras), version=comfy_version) as plain:
        reference = run_stages(plain, viking=False)
        entry = plain.run_prompt(stage_graph(2, lora=False, viking=False))
        no_lora = np.asarray(Image.open(plain.output_files(entry)[0]).convert("RGB"))
        entry = plain.run_prompt(stage_graph(4, lora=False, viking=False))
        no_hook = np.asarray(Image.open(plain.output_files(entry)[0]).convert("RGB"))
    assert not np.array_equal(no_lora, reference[1]), "the LoRA changes the image (so the comparison can fail)"
    assert not np.array_equal(no_hook, reference[3]), "the hook LoRA changes the image (so the comparison can fail)"
    for index, (a, b) in enumerate(zip(pinned, reference)):
        assert np.array_equal(a, b), f"stage {index}: images differ"
