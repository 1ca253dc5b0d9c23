"""Engine mode: pin every model ComfyUI loads, with no Viking node in the graph.

On with the ComfyUI setting "Viking.EngineMode" (settings dialog, stored in the user's
comfy.settings.json) or with VIKING_ENGINE_MODE=1 for headless servers. Models get the shared
budget and priority ENGINE_PRIORITY; a Viking Pin node in a graph overrides that for its model.

Why one narrow wrapper: ComfyUI 0.3.75 has no global "a model was loaded" callback (ModelPatcher
callbacks are per instance, and attaching them needs the instance first), but every model it
manages (diffusion models, text encoders, VAEs, ControlNets, CLIP vision, upscalers, audio and
video models) goes through `comfy.model_management.load_models_gpu`. Viking wraps that one
function: it calls ComfyUI's own and then attaches its callbacks to the models now loaded; from
then on the ModelPatcher callbacks follow each model as for the nodes.
"""

from __future__ import annotations

import functools
import json
import logging
import os

from . import lifecycle

ENV = "VIKING_ENGINE_MODE"
SETTING_ID = "Viking.EngineMode"
ENGINE_PRIORITY = -10  # below the nodes' default 0: models pinned by a node keep their pins first
ENGINE_NODE_ID = "engine"

log = logging.getLogger("viking_engine")
_enabled = False
_original_load_models_gpu = None


def enabled() -> bool:
    return _enabled


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def saved_setting() -> bool | None:
    """The setting as the UI saved it for the default user, if ComfyUI and the file exist."""
    try:
        import folder_paths
        path = os.path.join(folder_paths.get_user_directory(), "default", "comfy.settings.json")
        with open(path) as settings:
            value = json.load(settings).get(SETTING_ID)
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    return None if value is None else bool(value)


def start():
    """At ComfyUI start: the environment variable wins, else the saved UI setting."""
    wanted = _truthy(os.environ.get(ENV)) if ENV in os.environ else bool(saved_setting())
    if wanted:
        set_enabled(True)


def set_enabled(on: bool) -> dict:
    """Switches engine mode. Off releases the pins engine mode made (node pins stay)."""
    global _enabled
    _enabled = bool(on)
    if _enabled:
        _install()
        pin_loaded_models()
    else:
        for patcher in _engine_patchers():
            lifecycle.unpin(patcher)
    log.info("Viking Engine: engine mode %s", "on" if _enabled else "off")
    return {"engine_mode": _enabled}


def _install():
    global _original_load_models_gpu
    import comfy.model_management as mm

    if _original_load_models_gpu is not None:
        return
    _original_load_models_gpu = mm.load_models_gpu

    @functools.wraps(_original_load_models_gpu)
    def load_models_gpu(*args, **kwargs):
        result = _original_load_models_gpu(*args, **kwargs)
        if _enabled:
            pin_loaded_models()
        return result

    mm.load_models_gpu = load_models_gpu


def _loaded_patchers():
    import comfy.model_management as mm

    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model
        if patcher is not None and hasattr(patcher, "add_callback_with_key"):
            yield patcher


def _engine_patchers():
    return [p for p in _loaded_patchers() if (lifecycle.settings_of(p) or lifecycle.PinSettings("")).node_id == ENGINE_NODE_ID]


def pin_loaded_models():
    """Attaches Viking to every loaded model that no Viking node pinned. Never raises: it runs
    inside ComfyUI's load path."""
    for patcher in _loaded_patchers():
        if lifecycle.is_pinned(patcher):
            continue
        try:
            settings = lifecycle.PinSettings(label=f"{type(patcher.model).__name__} (engine mode)",
                                             priority=ENGINE_PRIORITY, node_id=ENGINE_NODE_ID, headroom_gib=None)
            lifecycle.attach(patcher, settings)
        except Exception as error:  # noqa: BLE001 - logged; ComfyUI's load must go on
            log.warning("Viking Engine: engine mode could not pin %s: %s", type(patcher.model).__name__, error)
