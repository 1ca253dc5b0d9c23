"""Which Viking feature changes the bits of a LoRA prompt on a GPU server (seen in
bench/results/gpu_server_*.json: the LoraLoader prompt differed from ComfyUI alone while plain
and hook-LoRA prompts matched). One server per variant: warm-up, LoRA (seed 2), plain (seed 1),
LoRA again (seed 2); the images' hashes per variant, and what ComfyUI logged about each load.

usage: python bench/probes/lora_variants.py VERSION OUT.json [--free-gib 2] [--variants comfy,viking,...]
"""
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent.parent / "tests")]
sys.argv = [sys.argv[0], sys.argv[1], sys.argv[2], "--cycles", "0"] + sys.argv[3:]
import gpu_server_check as bench  # noqa: E402  (its main runs only as a script)

VARIANTS = {
    "comfy": None,
    "viking": {},
    "viking_no_prefetch": {"prefetch": False},
    "viking_model_not_pinned": {"_pin_model": False},  # Pin CLIP and Pin VAE only
    "viking_clip_only": {"_pin_model": False, "_pin_vae": False},
    "viking_vae_only": {"_pin_model": False, "_pin_clip": False},
    "viking_model_only": {"_pin_clip": False, "_pin_vae": False},
    "viking_no_nodes": {"_pin_model": False, "_pin_clip": False, "_pin_vae": False},  # installed, unused
}
wanted = bench.arg("--variants", ",".join(VARIANTS), str).split(",")
rows = {}
holder, held = bench.hold_vram(bench.free_gib)
try:
    for name, overrides in ((n, VARIANTS[n]) for n in wanted):
        rows[name] = bench.run_sequence(name, overrides, [(0, None), (2, "lora"), (1, None), (2, "lora")])
finally:
    holder.kill()
Path(sys.argv[2]).write_text(json.dumps(dict(held_vram_bytes=held, rows=rows), indent=1))
for name, row in rows.items():
    print(name, row["warm_up"]["image"][:10], [p["image"][:10] for p in row["prompts"]], row["bad_log_lines"][:1])
    for p in [row["warm_up"]] + row["prompts"][:1]:
        print("   ", p["seed"], p["lora"], p["loads"])
