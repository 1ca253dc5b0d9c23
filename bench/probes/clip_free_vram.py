"""Where the VRAM goes when a Pin CLIP node runs (seen in gpu_probe_lora_variants_*.json: with
Pin CLIP, ComfyUI found ~72 MB less usable VRAM when it loaded the text encoder, loaded it in
part instead of whole, and a prompt's images changed). In one process on the GPU, through
ComfyUI's own model management: the free VRAM as ComfyUI counts it (get_free_memory) before
and after each step of pinning the synthetic checkpoint's CLIP, then loading and encoding.

usage: python bench/probes/clip_free_vram.py COMFY_DIR OUT.json [backend] [prefetch 0|1] [home 0|1]
"""
import json
import os
import sys

comfy_dir, out = sys.argv[1], sys.argv[2]
backend = sys.argv[3] if len(sys.argv) > 3 else "cuda"
prefetch = (sys.argv[4] if len(sys.argv) > 4 else "1") == "1"
pinned_home = (sys.argv[5] if len(sys.argv) > 5 else "1") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [comfy_dir, ROOT, os.path.join(ROOT, "tests")]
sys.argv = [sys.argv[0], "--disable-dynamic-vram"] if "0.33" in comfy_dir else [sys.argv[0]]
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.sd  # noqa: E402
from comfy_server import cached_checkpoint  # noqa: E402

device = mm.get_torch_device()
steps = []


def note(what):
    free_cuda, _ = torch.cuda.mem_get_info(device)
    steps.append(dict(step=what, comfy_free_mb=round(mm.get_free_memory(device) / 2**20, 2),
                      cuda_free_mb=round(free_cuda / 2**20, 2), torch_reserved_mb=round(torch.cuda.memory_reserved(device) / 2**20, 2),
                      torch_allocated_mb=round(torch.cuda.memory_allocated(device) / 2**20, 2)))
    print(json.dumps(steps[-1]), flush=True)


note("start")
_, clip, _, _ = comfy.sd.load_checkpoint_guess_config(str(cached_checkpoint()), output_vae=True, output_clip=True)[:4]
note("checkpoint loaded (CPU)")
from comfy_node import lifecycle  # noqa: E402
from comfy_node.native import require  # noqa: E402

native = require()
note("native module loaded")
pinned = clip.clone()
note("CLIP cloned")
report = lifecycle.attach(pinned.patcher, lifecycle.PinSettings(label="CLIP", backend=backend, prefetch=prefetch,
                                                                 pinned_home=pinned_home))
note(f"Pin CLIP ({backend}, prefetch {prefetch}, home {pinned_home}): {report['pinned_bytes']} bytes pinned, "
     f"prefetch {report.get('prefetch')}")
tokens = pinned.tokenize("a photo of a cat")
pinned.encode_from_tokens(tokens)
note("first encode")
pinned.encode_from_tokens(pinned.tokenize("blurry"))
note("second encode")
lifecycle.unpin(None)
note("unpinned")
with open(out, "w") as f:
    json.dump(dict(backend=backend, prefetch=prefetch, pinned_home=pinned_home, steps=steps), f, indent=1)
