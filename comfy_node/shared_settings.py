"""Settings every model shares, set once for the server, not per node: the RAM headroom (here)
and engine mode (engine_mode.py). They come from ComfyUI's settings dialog (saved in the user's
comfy.settings.json, read at start, changed through /viking/headroom) or from a VIKING_*
environment variable for headless servers, which then fixes the value."""

from __future__ import annotations

import json
import logging
import os

from . import comfy
from .native import native

log = logging.getLogger("viking_engine")
HEADROOM_ENV = "VIKING_HEADROOM_GIB"
HEADROOM_SETTING = "Viking.HeadroomGiB"
_headroom_source = "auto"  # where the shared headroom came from (for the status)


def saved(setting_id: str):
    """A setting as the UI saved it for the default user; None when ComfyUI, the file or the
    setting is not there."""
    try:
        with open(comfy.user_settings_path()) as settings:
            return json.load(settings).get(setting_id)
    except (TypeError, OSError, ValueError, AttributeError):
        return None


def headroom_fixed() -> bool:
    """The environment variable fixes the headroom: the dialog and the nodes leave it."""
    return HEADROOM_ENV in os.environ


def set_headroom(gib: float, source: str) -> dict:
    """Sets the shared headroom (0 = auto: 20% of RAM, 4-16 GiB). Raises ValueError with what
    to change for a value that is not a size."""
    global _headroom_source
    native.set_headroom(float(gib) if gib > 0 else -1.0)
    _headroom_source = source if gib > 0 else "auto"
    return {"headroom_gib": float(gib), "source": _headroom_source}


def headroom_source() -> str:
    return _headroom_source


def start():
    """At ComfyUI start: the environment variable wins, else the saved dialog setting."""
    if native is None:
        return
    if headroom_fixed():
        text, source = os.environ[HEADROOM_ENV], HEADROOM_ENV
    else:
        text, source = saved(HEADROOM_SETTING), "settings dialog"
    try:
        gib = float(text or 0)
        if gib:
            set_headroom(gib, source)
    except ValueError as error:
        log.warning("Viking Engine: the RAM headroom from the %s is not used: %s", source, error)
