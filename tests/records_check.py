"""One record per model, checked through ComfyUI's real ModelPatcher in this process (CPU):
every path that ends a model (the Unpin node's unpin, the HTTP route's unpin_owner, ComfyUI
dropping the model, engine mode switched off) leaves nothing of it in any table, and its VRAM
cap no longer trims what ComfyUI loads. Prints one JSON object of named checks; exits 1 if one
fails. Run by tests/test_records.py under each ComfyUI version's Python.

usage: python tests/records_check.py COMFY_DIR
"""

import gc
import json
import sys

from in_process import start_comfy

comfy_dir = sys.argv[1]
start_comfy(comfy_dir, "--cpu")

import torch  # noqa: E402

import comfy.model_patcher  # noqa: E402

from comfy_node import contract, engine_mode, gate, lifecycle, models, prefetch  # noqa: E402
from comfy_node.native import require  # noqa: E402

native = require()
checks = {}
MIB = 1 << 20


def model():
    """Eight 1 MiB fp32 linear layers that ComfyUI casts (so partially_load decides per layer)."""
    import comfy.ops

    layers = [comfy.ops.disable_weight_init.Linear(512, 512, bias=False) for _ in range(8)]
    net = torch.nn.Sequential(*layers)
    for index, layer in enumerate(layers):
        torch.nn.init.normal_(layer.weight, generator=torch.Generator().manual_seed(index))
    return net


def patcher_of(net):
    return comfy.model_patcher.ModelPatcher(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))


def nothing_left(owner) -> bool:
    status = json.loads(native.status_json())
    return (models.get(owner) is None and owner not in lifecycle.labels() and not gate.deferred()
            and not any(o["owner"] == owner for o in status["owners"]))


def loads_when_offered(patcher, offered) -> int:
    patcher.detach()
    patcher.partially_load(torch.device("cpu"), offered)
    return int(patcher.model.model_loaded_weight_memory)


def settings(label, **kw):
    return lifecycle.PinSettings(label=label, backend="os-lock", headroom_gib=0.0, vram_cap_gib=2 / 1024, **kw)


# 1. The Unpin node's path (on the execution thread): lifecycle.unpin(patcher).
# 2. The HTTP route's path: lifecycle.unpin_owner(owner) through the gate (no prompt runs here).
for path in ("unpin node", "unpin route"):
    net = model()
    patcher = patcher_of(net)
    lifecycle.attach(patcher, settings(path))
    owner = lifecycle.owner_of(patcher)
    checks[f"{path}: capped at 2 MiB while pinned"] = loads_when_offered(patcher, 8 * MIB) <= 2 * MIB
    if path == "unpin node":
        mismatches = contract.key_mismatches(lifecycle.status(), contract.Status)
        checks["status: lifecycle.status() matches contract.Status"] = not mismatches
        if mismatches:
            print(mismatches, file=sys.stderr)
    pinned = json.loads(native.status_json())["pinned_bytes"]
    if path == "unpin node":
        released = lifecycle.unpin(patcher)
    else:
        outcome = gate.submit("unpin", lambda: lifecycle.unpin_owner(owner))
        released = outcome["result"] if outcome["applied"] else -1
    checks[f"{path}: released what was pinned"] = released == pinned > 0
    checks[f"{path}: nothing of the model left"] = nothing_left(owner)
    checks[f"{path}: the cap no longer applies"] = loads_when_offered(patcher, 64 * MIB) == 8 * MIB
    patcher.detach()
    del patcher, net
    gc.collect()

# 3. ComfyUI drops the model: the weakref finalizer forgets it.
net = model()
patcher = patcher_of(net)
lifecycle.attach(patcher, settings("dropped"))
owner = lifecycle.owner_of(patcher)
del patcher, net
gc.collect()
checks["dropped: nothing of the model left"] = nothing_left(owner)

# 4. Engine mode off forgets what engine mode pinned, and only that.
net_engine, net_node = model(), model()
engine_patcher, node_patcher = patcher_of(net_engine), patcher_of(net_node)
lifecycle.attach(engine_patcher, lifecycle.PinSettings(label="engine", backend="os-lock", node_id=engine_mode.ENGINE_NODE_ID, headroom_gib=None))
lifecycle.attach(node_patcher, settings("node", node_id="7"))
engine_mode.set_enabled(False)
checks["engine mode off: its model forgotten"] = nothing_left(lifecycle.owner_of(engine_patcher))
checks["engine mode off: the node's model kept"] = lifecycle.is_pinned(node_patcher)
lifecycle.unpin(None)
# 5. Which models get a prefetcher: a diffusion model that ComfyUI loaded in part, and nothing
# else. A prefetcher elsewhere held VRAM and changed how ComfyUI split the next model (seen on an
# H200, bench/results/gpu_probe_lora_variants_*.json). Each case is loaded on the CPU, then told
# its load device is CUDA: prefetch.update must decide "none" before it touches CUDA (making
# one would need a GPU: tests/test_gpu_streaming.py).

class Sampled(torch.nn.Module):
    """A BaseModel's shape: the module that sampling steps through is `diffusion_model`."""

    def __init__(self):
        super().__init__()
        self.diffusion_model = model()


def prefetcher_for(patcher, offered) -> bool:
    loads_when_offered(patcher, offered)
    patcher.load_device = torch.device("cuda", 0)
    record = models.ModelRecord(owner=-1, settings=settings("prefetch case"))
    try:
        return prefetch.update(patcher, record, True) is not None or record.prefetcher is not None
    except Exception as error:  # noqa: BLE001 - reaching CUDA here means it tried to make one
        print(f"prefetch.update reached CUDA: {error}", file=sys.stderr)
        return True


encoder = patcher_of(model())
checks["prefetch: none for a text encoder / VAE loaded in part"] = not prefetcher_for(encoder, 2 * MIB) and encoder.model.model_lowvram
sampled = patcher_of(Sampled())
checks["prefetch: none for a diffusion model loaded whole"] = not prefetcher_for(sampled, 64 * MIB) and not sampled.model.model_lowvram

checks["unpin everything: no record, no pin"] = not models.owners() and json.loads(native.status_json())["pinned_bytes"] == 0

print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
