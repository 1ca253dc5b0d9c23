"""Who may change pins, and when: no copy to the GPU may read pages while they are unregistered.

ComfyUI's execution thread queues copies from pinned weights (loads, lowvram streaming, the
prefetch) at any time during a prompt. CUDA registrations are therefore released only
- on the execution thread itself (Viking's ModelPatcher callbacks and wrappers run there), or
- while no prompt runs, holding `lock`, which every Viking entry point on the execution thread
  takes too: a prompt that starts meanwhile waits at its first load or sampling start.
A change asked for from elsewhere (an HTTP route, the engine-mode switch) while a prompt runs is
deferred: the execution thread applies it at its next Viking callback, or the watcher applies
it as soon as the prompt is over. Memory pressure is relieved the same way (the native monitor
thread is told not to release on its own: `set_monitor_releases(False)`).

ComfyUI embedded in another program, without its HTTP server: nobody can tell whether a prompt
runs, so there is no watcher and every change, pressure relief included, waits for the execution
thread's next Viking callback (`start(watch=False)`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from . import comfy, dynamic, timing
from .native import native

log = logging.getLogger("viking_engine")
lock = threading.RLock()
_take_lock, _give_lock = lock.acquire, lock.release  # for the watcher (_watch_once says why)
_deferred: list[tuple[str, Callable[[], object]]] = []
# Work that costs a running prompt time and can wait for the queue to be idle (the watcher runs
# it): key -> (what, change, shown); a later request for the same key replaces the earlier one.
_after_prompt: dict[object, tuple[str, Callable[[], object], bool]] = {}
_idle_mark: tuple | None = None  # the queue's mark at the watcher's last look, if it was idle then
_flags_seen = False  # ComfyUI's worker had flags waiting (a /free) at the watcher's last look
_next_look_seconds = 0.5  # the watcher's pause before its next look (`_watch_once` sets it)
_applied: list[dict] = []  # the last changes applied, where and when (for the status)
_watcher: threading.Thread | None = None
_relief = "native monitor"  # who releases pins under memory pressure (for the status)
pressure_releases = 0  # bumped whenever pressure relief gave pins back: reconciles must not skip
WATCH_SECONDS = 0.5
AFTER_PROMPT_WATCH_SECONDS = 0.02


def _remember(what: str, where: str):
    _applied.append({"change": what, "applied": where, "at": round(time.time(), 3)})
    del _applied[:-16]


def submit(what: str, change: Callable[[], object]) -> dict:
    """Runs `change()` now when that is safe (no prompt runs), else defers it to the execution
    thread. Returns {"applied": True, "result": ...} or {"applied": False, "deferred": what}."""
    with lock:
        if not _prompt_may_run():
            result = change()
            _remember(what, "at once (no prompt running)")
            return {"applied": True, "result": result}
        _deferred.append((what, change))
    log.info("Viking Engine: %s waits for the running prompt", what)
    return {"applied": False, "deferred": what}


def deferred() -> list[str]:
    """What waits, for the status: the changes asked for and the work a user would miss (not the
    routine checks made after each prompt)."""
    return [what for what, _ in list(_deferred)] + [what for what, _, shown in list(_after_prompt.values()) if shown]


def watching() -> bool:
    """Whether a watcher runs work left for the end of a prompt (inside a ComfyUI server)."""
    return _relief == "gate watcher"


def prompt_running() -> bool:
    return comfy.prompt_running()


def after_prompt(key, what: str, change: Callable[[], object], shown: bool = True):
    """Runs `change()` once no prompt runs, in place of any change waiting under `key`.
    `shown`: work a user waits for (pins held back from a prompt), listed among the status's
    deferred changes and run at the watcher's first look with no prompt running. Otherwise a
    routine check after a prompt: it runs only once the queue has stayed idle between two of
    the watcher's looks, so that it never holds up a prompt a client sends right after the last."""
    with lock:
        _after_prompt[key] = (what, change, shown)


def _run_after_prompt(quiet: bool = True):
    # A change may leave more for later (a step of a long registration): the loop goes on until
    # nothing it may run waits, or ComfyUI's worker has work (a prompt, or a /free whose unload
    # would wait for this lock): each step is short, and the rest waits for the next idle look.
    while not comfy.worker_wanted():
        key = next((key for key, (_what, _change, shown) in _after_prompt.items() if shown or quiet), None)
        if key is None:
            break
        what, change, _shown = _after_prompt.pop(key)
        try:
            change()
            _remember(what, "after the prompt")
        except Exception as error:  # noqa: BLE001 - one failed change must not stop the rest
            log.warning("Viking Engine: %s failed: %s", what, error)


def applied() -> list[dict]:
    return list(_applied)


def drain(where: str):
    """Applies the deferred changes. Call with nothing in flight that could read them: on the
    execution thread (where == "on the execution thread"), or while no prompt runs."""
    global pressure_releases
    with lock:
        while _deferred:
            what, change = _deferred.pop(0)
            try:
                change()
                _remember(what, where)
            except Exception as error:  # noqa: BLE001 - one failed change must not stop the rest
                log.warning("Viking Engine: %s failed: %s", what, error)
        if native is not None and native.relieve_pressure() > 0:
            pressure_releases += 1
        dynamic.govern()


_execution_thread: int | None = None  # ComfyUI's execution thread, once a Viking node or sampling ran on it


def note_execution_thread():
    """Called where only ComfyUI's execution thread runs Viking (a node's run, the start of sampling)."""
    global _execution_thread
    _execution_thread = threading.get_ident()


def on_another_thread() -> bool:
    """A ComfyUI callback arriving off the execution thread: ModelPatcher.__del__ detaches a
    model on whichever thread drops its last reference or runs the cyclic collector, possibly
    while another prompt samples. Such a callback must go through `submit`."""
    return _execution_thread is not None and threading.get_ident() != _execution_thread


def on_execution_thread():
    """Every Viking entry point on ComfyUI's execution thread calls this first (holding `lock`)."""
    if _deferred or _relief != "native monitor":
        drain("on the execution thread")


def _prompt_may_run() -> bool:
    """Whether a prompt may be running: ComfyUI's queue says so inside a server; without one
    (embedded) any time after the execution thread was first seen."""
    if _relief == "execution thread":
        return _execution_thread is not None
    return comfy.prompt_running()


def relief() -> str:
    """Who releases pins under memory pressure: "native monitor" (outside ComfyUI), "gate
    watcher" (a ComfyUI server) or "execution thread" (ComfyUI without its server)."""
    return _relief


def _watch():
    while True:
        time.sleep(_next_look_seconds)  # set by the last look, where no collection can start
        _watch_once()


def _watch_once():
    """One look of the watcher. No cyclic garbage collection may start on this thread: a
    collection runs the finalizers of whatever garbage the process holds, and an object may
    only be safe to finalize on the thread that made it (an in-memory SQLite connection of
    ComfyUI 0.3.75's database logged SQLAlchemy tracebacks when any other thread collected it).
    The switch is process-wide, so it is off only while this thread holds the lock: switched off
    before the wait for the lock, it stayed off for as long as ComfyUI's thread held the lock,
    through a whole model load, whose collections then piled up and fell due later. Waiting for
    the lock allocates nothing. A collection that falls due meanwhile runs at another thread's
    next allocation (ComfyUI's execution thread also collects after its prompts)."""
    global _idle_mark, _next_look_seconds, _flags_seen
    _take_lock()  # bound once: a `with lock` would allocate its bound methods, which can set off a collection
    try:
        timing.hold_collector()  # before any allocation of this look
        try:
            mark = comfy.queue_mark()
            quiet, _idle_mark = mark is not None and mark == _idle_mark, mark
            # A /free still waiting a look later was sent while ComfyUI's worker was not waiting
            # (comfy.wake_worker says why): wake it, so the models go now, not at the next prompt.
            flags = comfy.flags_waiting()
            if flags and _flags_seen:
                comfy.wake_worker()
            _flags_seen = flags
            if not comfy.worker_wanted():
                drain("after the prompt")
                _run_after_prompt(quiet)
            # Pins held back from a prompt are looked after often: the gap between two prompts
            # of a queue is short. Every look costs a running prompt a switch of the GIL, so
            # routine checks, which wait for an idle queue anyway, leave the watcher at its
            # slow pace.
            _next_look_seconds = (AFTER_PROMPT_WATCH_SECONDS if any(shown for _w, _c, shown in _after_prompt.values())
                                  else WATCH_SECONDS)
        except Exception as error:  # noqa: BLE001 - the watcher must keep going
            log.warning("Viking Engine: gate watcher: %s", error)
        finally:
            timing.release_collector()
    finally:
        _give_lock()


def start(watch: bool = True):
    """Inside ComfyUI: the gate takes over pressure relief from the native monitor (whose thread
    would release CUDA pins while copies from them may be queued). `watch`: ComfyUI's server
    runs, so a watcher can apply changes as soon as a prompt is over."""
    global _watcher, _relief
    if _relief != "native monitor" or native is None:
        return
    native.set_monitor_releases(False)
    _relief = "gate watcher" if watch else "execution thread"
    if watch:
        _watcher = threading.Thread(target=_watch, name="viking-gate", daemon=True)
        _watcher.start()
