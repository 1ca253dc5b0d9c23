"""VRAM cap: at most `vram_cap_gib` GiB of a model's weights in VRAM; the rest stays in pinned
RAM and streams to the GPU at each use (ComfyUI's own lowvram machinery, with prefetch.py ahead
of it).

Why a wrapper: ComfyUI has no per-model VRAM limit. `ModelPatcher.partially_load(device_to,
extra_memory, ...)` is where it decides how much of a model goes to VRAM on every load path
(load_models_gpu -> LoadedModel.model_load / model_use_more_vram), so the cap trims the
`extra_memory` offered there, on the patcher instance only (comfy.wrap_instance_method; clones
get it again through ON_CLONE). Whatever else ComfyUI passes rides along unchanged.

What the cap held back (`cap_surplus_bytes`: VRAM ComfyUI would have given these weights and
the cap did not) is the only VRAM the prefetch window may add to ComfyUI's streaming buffer.
When the model fits ComfyUI offers an unbounded 1e32: what it would have loaded is then the
rest of the model, not the offer.
"""

from __future__ import annotations

import logging

from . import comfy, models

log = logging.getLogger("viking_engine")
GIB = 1 << 30


def held_back(offered: float, loaded: int, model_bytes: int, cap_bytes: int) -> tuple[int, int]:
    """(extra_memory to pass on, VRAM held back from the weights) for an offer of `offered`
    bytes to a model with `loaded` of its `model_bytes` in VRAM under a cap of `cap_bytes`."""
    would_load = int(max(0, min(float(offered), float(max(0, model_bytes - loaded)))))
    allowed = int(min(float(offered), float(cap_bytes - loaded)))
    if loaded == 0 and allowed <= 0:
        allowed = 1  # load nothing: every weight streams (0 would mean "no limit" to ComfyUI)
    return allowed, max(0, would_load - max(0, allowed))


def install(patcher):
    """The cap's wrapper on this patcher (once); it does nothing for a model without a cap."""
    owner = comfy.owner_of(patcher)

    def make_body(inner):
        def partially_load(this, *args, **kwargs):
            record = models.get(owner)
            if record is None or not record.vram_cap_bytes:
                if record is not None:
                    record.cap_surplus_bytes = 0
                return inner(this, *args, **kwargs)

            def adjust(offered):
                allowed, surplus = held_back(offered, comfy.loaded_weight_bytes(this), comfy.model_bytes(this), record.vram_cap_bytes)
                record.cap_surplus_bytes = surplus
                return allowed

            adjusted = comfy.with_extra_memory(args, kwargs, adjust)
            if adjusted is None:
                return inner(this, *args, **kwargs)  # host() reports why the cap stands aside
            return inner(this, *adjusted[0], **adjusted[1])

        return partially_load

    comfy.wrap_instance_method(patcher, "partially_load", make_body)


def usage(record) -> tuple[int, int | None] | None:
    """(VRAM cap in bytes or 0, bytes of the model's weights in VRAM now), while it lives."""
    patcher = record.live_patcher()
    if patcher is None:
        return None
    return record.vram_cap_bytes, comfy.weights_in_vram_bytes(patcher)
