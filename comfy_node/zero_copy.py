"""Zero-copy token embeddings: the tables ComfyUI reads only by index (a text encoder's token
embeddings: 128k x 4096 in Llama 3.1 8B, about 1 GB in bf16) stay in Viking's pinned RAM, and
the GPU reads the few rows a prompt needs in place, through the registration's device address
(viking_native.mapped_view). ComfyUI's loads then neither count those bytes in VRAM, nor copy
them there, nor copy the whole table at each call in low-VRAM mode.

Only where it is safe: a CUDA device, ComfyUI's static mode (its dynamic VRAM mode stages weights
itself), a table Viking pinned with CUDA, unpatched (a LoRA or hook patch on it leaves it to
ComfyUI's own path). Each case left out says why (`notes`, the status's `zero_copy`).

Lifetime: the module holds a CUDA tensor that holds the native view, which holds its pin: the pin
cannot end while the module reads it. `restore` puts the parameter back (Unpin, the option off);
a model dropped by ComfyUI drops its views with it, and Viking's next release lets the pin go.
"""

from __future__ import annotations

import threading
import weakref

from . import comfy
from .native import require

_lock = threading.Lock()
# torch model -> {module name: (module, parameter, view tensor)}: what to put back.
_swaps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# torch model -> {"mapped_bytes": int, "tables": int, "notes": [str]}: the last decision, for the status.
_decisions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _decide(patcher) -> str | None:
    """Why no table of this model may be read in place, or None."""
    if not comfy.runs_on_gpu(patcher) or comfy.load_device_type(patcher) != "cuda":
        return "zero-copy embeddings: off, this model runs on the CPU (--cpu): nothing is mapped"
    if comfy.is_dynamic(patcher):
        return "zero-copy embeddings: off, ComfyUI's dynamic VRAM mode stages these weights itself"
    return None


def apply(patcher, wanted: bool) -> list[str]:
    """Reads this model's index-only tables in place when `wanted` (else puts them back).
    Returns notes for the node's text: what was mapped, and why anything was not."""
    model = comfy.torch_model(patcher)
    if not wanted:
        restore(patcher)
        return []
    notes, mapped_bytes = [], 0
    reason = _decide(patcher)
    if reason:
        notes.append(reason)
    else:
        mapped_bytes = _map_tables(patcher, notes)
    with _lock:
        tables = len(_swaps.get(model, {}))
        _decisions[model] = {"mapped_bytes": mapped_bytes, "tables": tables, "notes": list(notes)}
    return notes


def _map_tables(patcher, notes: list[str]) -> int:
    import torch

    native = require()
    model = comfy.torch_model(patcher)
    device = comfy.load_device(patcher)
    total = 0
    with _lock:
        swaps = _swaps.setdefault(model, {})
    for name, module in comfy.index_read_modules(patcher):
        weight = comfy.module_weight(module)
        key = f"{name}.weight"
        if weight.device.type != "cpu":
            notes.append(f"zero-copy embeddings: {key} is in VRAM already (loaded before this node ran); "
                         "it is read in place from its next load")
            continue
        if comfy.weight_patched(patcher, key):
            notes.append(f"zero-copy embeddings: {key} is patched (LoRA or hook): ComfyUI's own path reads it")
            continue
        if type(weight.data) is not torch.Tensor or not weight.is_contiguous():
            notes.append(f"zero-copy embeddings: {key} is not a plain contiguous tensor: ComfyUI's own path reads it")
            continue
        nbytes = weight.numel() * weight.element_size()
        try:
            view = native.mapped_view(weight.data_ptr(), nbytes)
        except (ValueError, native.BackendUnavailableError) as error:
            notes.append(f"zero-copy embeddings: {key} not mapped: {error}")
            continue
        tensor = torch.as_tensor(view, device=device).view(weight.dtype).view(weight.shape)
        parameter = comfy.read_weight_in_place(module, tensor)
        with _lock:
            swaps[name] = (module, parameter, tensor)
        total += nbytes
    if total:
        comfy.forget_model_size(patcher)
        notes.insert(0, f"zero-copy embeddings: {len(swaps)} table(s), {total / 2**20:.0f} MiB read in place from pinned RAM "
                        "(not in VRAM)")
    elif not notes:
        notes.append("zero-copy embeddings: this model has no token-embedding table")
    return total


def restore(patcher) -> int:
    """Puts this model's tables back as parameters (in RAM, as ComfyUI left them). Returns how many."""
    model = comfy.torch_model(patcher)
    with _lock:
        swaps = _swaps.pop(model, {})
        _decisions.pop(model, None)
    restored = sum(comfy.read_weight_from_parameter(module, parameter, tensor) for module, parameter, tensor in swaps.values())
    if swaps:
        comfy.forget_model_size(patcher)
    return restored


def restore_all() -> int:
    with _lock:
        models = list(_swaps.keys())
        _decisions.clear()
    restored = 0
    for model in models:
        with _lock:
            swaps = _swaps.pop(model, {})
        restored += sum(comfy.read_weight_from_parameter(m, p, t) for m, p, t in swaps.values())
    return restored


def summary() -> dict:
    """owner (as comfy.owner_of) -> the last decision: bytes and tables mapped, and the notes (why not)."""
    with _lock:
        return {str(id(model)): dict(decision) for model, decision in _decisions.items()}
