"""Viking's own time inside ComfyUI's calls, for the status: what a prompt pays for Viking is
then measured (the GPU bench reads it per prompt) rather than guessed from step times that
differ as much between two fresh servers of ComfyUI alone.

And Viking's own work starts no garbage collection. A collection of the oldest generation walks
the whole heap (0.25 s in a ComfyUI 0.33 server with a Flux-shaped model); Python starts one once
enough younger collections have run since the last, and every allocation counts towards those,
including the lists and tuples a walk of the weights makes and drops again. So, while Viking's
code runs inside ComfyUI's calls, the collector is held: what Viking frees again leaves the
collector's counts where they were, and only what it keeps counts, as if ComfyUI had made it."""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time

_lock = threading.Lock()
_totals: dict[str, list] = {}  # kind -> [calls, seconds]
_collector_lock = threading.Lock()
_take_collector, _give_collector = _collector_lock.acquire, _collector_lock.release  # bound once: no allocation
_collector_holders = 0  # how many of Viking's spans, on any thread, hold the collector now
_collector_was_on = False  # whether collection was on when the first of them began


def hold_collector():
    """Switches cyclic garbage collection off until the matching `release_collector()`; spans of
    several threads nest, and the last to end switches it back on if it was on at the first.
    Allocates nothing that the collector tracks, so it may run where no collection may start."""
    global _collector_holders, _collector_was_on
    _take_collector()
    try:
        if _collector_holders == 0:
            _collector_was_on = gc.isenabled()
            gc.disable()
        _collector_holders += 1
    finally:
        _give_collector()


def release_collector():
    global _collector_holders
    _take_collector()
    try:
        _collector_holders -= 1
        if _collector_holders == 0 and _collector_was_on:
            gc.enable()
    finally:
        _give_collector()


def holds_collector(function):
    """`function`, run with the collector held (the module's note says why). The hold comes
    before `function`'s first allocation; the call's own argument packing falls in the caller."""
    @functools.wraps(function)
    def held(*args, **kwargs):
        hold_collector()
        try:
            return function(*args, **kwargs)
        finally:
            release_collector()
    return held


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
