"""Pin CLIP's zero-copy embeddings in-process on a real ComfyUI's classes, on any machine: the
cases that keep ComfyUI's own path, each with its reason (tests/test_zero_copy.py runs it under
each ComfyUI version's Python). A text encoder of ComfyUI's own (comfy.text_encoders.llama,
small), its ModelPatcher, Viking's real pins (the OS lock here):
- the decision for a model that computes on the CPU (--cpu): nothing mapped, the reason;
- past that decision (as on a GPU): a table a LoRA patches is left to ComfyUI; a table with no
  CUDA pin (the OS lock holds it) is left to ComfyUI with the native module's reason; the table
  stays a parameter, and the model still computes what it computed before.

usage: python tests/zero_copy_check.py COMFY_DIR   (prints named checks as JSON; exit 1 if one fails)
"""
import json
import sys

from in_process import start_comfy

start_comfy(sys.argv[1], "--cpu")

import torch  # noqa: E402
import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.ops  # noqa: E402
from comfy.text_encoders.llama import Llama2  # noqa: E402

from comfy_node import comfy as seam, lifecycle, zero_copy  # noqa: E402

checks = {}
config = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=500000.0)
encoder = Llama2(config, dtype=torch.float32, device="cpu", operations=comfy.ops.manual_cast)
generator = torch.Generator().manual_seed(0)
with torch.no_grad():
    for parameter in encoder.parameters():
        parameter.copy_(torch.randn(parameter.shape, generator=generator) * parameter.shape[-1] ** -0.5)
patcher = comfy.model_patcher.ModelPatcher(encoder, load_device=mm.get_torch_device(), offload_device=torch.device("cpu"))
tokens = torch.randint(0, 4096, (1, 32), generator=generator)
with torch.inference_mode():  # ComfyUI 0.33's attention writes with out=, refused under autograd
    before = encoder(tokens, dtype=torch.float32)[0]
key = "model.embed_tokens.weight"
table = encoder.model.embed_tokens

report = lifecycle.attach(patcher, lifecycle.PinSettings(label="zero-copy check", backend="os-lock"))
checks["the encoder is pinned by the OS lock"] = report["pinned_bytes"] >= table.weight.nbytes

notes = zero_copy.apply(patcher, True)
cpu_reason = "zero-copy embeddings: off, this model runs on the CPU (--cpu): nothing is mapped"
checks["--cpu: nothing mapped, with the reason"] = notes == [cpu_reason]
status = lifecycle.status()
entry = next(o for o in status["owners"] if o["owner"] == seam.owner_of(patcher))
checks["--cpu: the status says why"] = entry["zero_copy"] == {"mapped_bytes": 0, "tables": 0, "notes": [cpu_reason]}
checks["--cpu: no mapped view holds a pin"] = entry["mapped_view_bytes"] == 0

# Past the device decision, as on a GPU: a patched table stays with ComfyUI.
patcher.add_patches({key: (torch.zeros_like(table.weight),)}, 0.5)
notes = []
mapped = zero_copy._map_tables(patcher, notes)
checks["a patched table is left to ComfyUI, said so"] = mapped == 0 and notes == [
    f"zero-copy embeddings: {key} is patched (LoRA or hook): ComfyUI's own path reads it"]
patcher.patches.clear()
# Unpatched, but its pin is the OS lock's: no device address, the native reason.
notes = []
mapped = zero_copy._map_tables(patcher, notes)
checks["an OS-lock pin is not mapped, with the native reason"] = (
    mapped == 0 and len(notes) == 1 and notes[0].startswith(f"zero-copy embeddings: {key} not mapped: ")
    and "os-lock" in notes[0])
checks["the table is still a parameter"] = isinstance(table._parameters.get("weight"), torch.nn.Parameter)
with torch.inference_mode():
    checks["the encoder computes what it did"] = torch.equal(encoder(tokens, dtype=torch.float32)[0], before)
zero_copy.apply(patcher, False)
checks["the option off forgets the decision"] = lifecycle.status()["owners"] and all(
    o.get("zero_copy") is None for o in lifecycle.status()["owners"])
lifecycle.unpin(None)

print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
