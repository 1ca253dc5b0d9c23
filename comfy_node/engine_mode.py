"""Engine mode: pin every model ComfyUI loads, with no Viking node in the graph.

On with the ComfyUI setting "Viking.EngineMode" (settings dialog, stored in the user's
comfy.settings.json) or with VIKING_ENGINE_MODE=1 for headless servers. Models get the shared
budget and priority ENGINE_PRIORITY; a Viking Pin node in a graph overrides that for its model.

Why one narrow wrapper: ComfyUI (0.3.75 and 0.33) has no global "a model was loaded" callback
(ModelPatcher callbacks are per instance, and attaching them needs the instance first), but every
model it manages (diffusion models, text encoders, VAEs, ControlNets, CLIP vision, upscalers,
audio and video models) goes through `load_models_gpu`; comfy.call_after_models_load attaches
Viking after it, on the execution thread. From then on the ModelPatcher callbacks follow each
model as for the nodes. Switching off forgets what engine mode pinned.
"""

from __future__ import annotations

import logging
import os

from . import comfy, lifecycle, shared_settings

ENV = "VIKING_ENGINE_MODE"
SETTING_ID = "Viking.EngineMode"
ENGINE_PRIORITY = -10  # below the nodes' default 0: models pinned by a node keep their pins first
ENGINE_NODE_ID = "engine"

log = logging.getLogger("viking_engine")
_enabled = False


def enabled() -> bool:
    return _enabled


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def saved_setting() -> bool | None:
    """The setting as the UI saved it for the default user, if ComfyUI and the file exist."""
    value = shared_settings.saved(SETTING_ID)
    return None if value is None else bool(value)


def start():
    """At ComfyUI start: the environment variable wins, else the saved UI setting."""
    wanted = _truthy(os.environ.get(ENV)) if ENV in os.environ else bool(saved_setting())
    if wanted:
        set_enabled(True)


def set_enabled(on: bool) -> dict:
    """Switches engine mode (call on the execution thread, or through gate.submit). Off forgets
    the models engine mode pinned (node pins stay)."""
    global _enabled
    _enabled = bool(on)
    if _enabled:
        comfy.call_after_models_load(_after_load)
        pin_loaded_models()
    else:
        for record_owner in _engine_owners():
            lifecycle.forget(record_owner)
    log.info("Viking Engine: engine mode %s", "on" if _enabled else "off")
    return {"engine_mode": _enabled}


def _after_load():
    if _enabled:
        pin_loaded_models()


def _engine_owners() -> list[int]:
    return [owner for owner, settings in lifecycle.settings_by_owner().items() if settings.node_id == ENGINE_NODE_ID]


def pin_loaded_models():
    """Attaches Viking to every loaded model that no Viking node pinned. Never raises: it runs
    inside ComfyUI's load path."""
    for patcher in comfy.loaded_patchers():
        if lifecycle.is_pinned(patcher):
            continue
        try:
            settings = lifecycle.PinSettings(label=f"{type(patcher.model).__name__} (engine mode)",
                                             priority=ENGINE_PRIORITY, node_id=ENGINE_NODE_ID, headroom_gib=None)
            lifecycle.attach(patcher, settings)
        except Exception as error:  # noqa: BLE001 - logged; ComfyUI's load must go on
            log.warning("Viking Engine: engine mode could not pin %s: %s", type(patcher.model).__name__, error)
