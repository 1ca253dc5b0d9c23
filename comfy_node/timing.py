"""Viking's own time inside ComfyUI's calls, for the status: what a prompt pays for Viking is
then measured (the GPU bench reads it per prompt) rather than guessed from step times that
differ as much between two fresh servers of ComfyUI alone."""

from __future__ import annotations

import contextlib
import threading
import time

_lock = threading.Lock()
_totals: dict[str, list] = {}  # kind -> [calls, seconds]


@contextlib.contextmanager
def timed(kind: str):
    """Counts one call of `kind` and the seconds it took ("event": a ComfyUI callback Viking
    reconciles in; "watch": the pinned home's watch set up and taken down around a ComfyUI call
    that moves weights; "eviction_check": a staging eviction call Viking decides on). A kind
    "outer/part" is a part of the time of "outer" (where an event's time goes), not added to it."""
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        with _lock:
            slot = _totals.setdefault(kind, [0, 0.0])
            slot[0] += 1
            slot[1] += elapsed


def totals() -> dict:
    """{kind: {"calls": n, "seconds": s}} since the server started (`total_seconds` adds them up)."""
    with _lock:
        return {kind: {"calls": calls, "seconds": round(seconds, 6)} for kind, (calls, seconds) in _totals.items()}


def total_seconds(kinds: dict) -> float:
    """Viking's time in `kinds` (a `totals()`): the parts ("outer/part") are within their outer kind."""
    return sum(entry["seconds"] for kind, entry in kinds.items() if "/" not in kind)
