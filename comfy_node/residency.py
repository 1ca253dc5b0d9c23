"""How much of each pinned model is in RAM or swapped out, sampled off ComfyUI's execution thread.

Those figures mean reading the page tables of every pinned page (~24 ms per GiB) and, in
dynamic VRAM mode, the page cache's residency of each model's checkpoint spans. The status node
runs inside a prompt, and the panel polls: neither may make a prompt wait for that. So the
status they show is built from what is already at hand (the ledger's totals, the budget), and
the residency figures come from the last sample with its age. Asking for a status wakes the
sampler thread, which takes a new sample at most every MIN_INTERVAL_SECONDS, and while a prompt
runs waits for it to end (at most MAX_WAIT_SECONDS, then samples anyway: the reads let go of
the GIL, so the prompt loses at most a share of a CPU core for them).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from . import comfy, dynamic, models, timing
from .native import native

log = logging.getLogger("viking_engine")
MIN_INTERVAL_SECONDS = 5.0
MAX_WAIT_SECONDS = 30.0
PROMPT_POLL_SECONDS = 0.25
OWNER_FIELDS = ("resident_bytes", "swapped_bytes", "pinned_swapped_bytes")

_lock = threading.Lock()
_wanted = threading.Event()
_thread: threading.Thread | None = None
_sample: dict | None = None  # {"at": epoch seconds, "owners": {owner: {...}}, "dynamic": {owner: {...}}}
_sampler_tid: int | None = None  # the OS thread id of the sampler (the tests check who reads page tables)


def request():
    """A status was asked for: the sampler takes a new sample when it may (starts it once)."""
    global _thread
    _wanted.set()
    if _thread is None:
        with _lock:
            if _thread is None:
                _thread = threading.Thread(target=_run, name="viking-residency", daemon=True)
                _thread.start()


def last() -> dict | None:
    return _sample


def overlay(status: dict, now: float | None = None) -> dict:
    """Puts the last sample's figures into a status built without page-table reads, and says
    how old they are under status["residency"]. A model pinned after the sample shows None."""
    sample = _sample
    owners = sample["owners"] if sample else {}
    for entry in status["owners"]:
        figures = owners.get(entry["owner"], {})
        for field in OWNER_FIELDS:
            entry[field] = figures.get(field)
        dynamic_entry = entry.get("dynamic")
        if dynamic_entry is not None:
            dynamic_entry.update(sample["dynamic"].get(entry["owner"], {}) if sample else {})
    now = time.time() if now is None else now
    status["residency"] = {
        "sampled_at": sample["at"] if sample else None,
        "age_seconds": round(now - sample["at"], 3) if sample else None,
        "sample_seconds": sample["seconds"] if sample else None,
        "min_interval_seconds": MIN_INTERVAL_SECONDS,
        "sampler_thread": _sampler_tid,
    }
    return status


def read_now_note() -> dict:
    """status["residency"] for a status that read the figures itself."""
    return {"sampled_at": time.time(), "age_seconds": 0.0, "sample_seconds": None,
            "min_interval_seconds": MIN_INTERVAL_SECONDS, "sampler_thread": _sampler_tid}


def sample_now() -> dict:
    """Reads the residency of every pinned model now, on the calling thread (the sampler, or a
    route asked for a fresh figure). Never on ComfyUI's execution thread."""
    global _sample
    started = time.perf_counter()
    # The long part (page-table reads) runs in native code without the GIL; it returns a str,
    # which the collector does not track, so no collection can start before the hold below.
    text = native.status_json(residency=True)
    timing.hold_collector()  # a collection here could finalize objects of other threads (gate.py says why)
    try:
        owners = {entry["owner"]: {field: entry.get(field) for field in OWNER_FIELDS}
                  for entry in json.loads(text)["owners"]}
        dynamic_figures = {}
        for record in models.all_records():
            patcher = record.live_patcher()
            if patcher is None or not comfy.is_dynamic(patcher):
                continue
            try:
                dynamic_figures[record.owner] = dynamic.residency(patcher, record)
            except (RuntimeError, AttributeError, KeyError) as error:
                # ComfyUI changed the model while it was walked: the next sample reads it again.
                log.debug("Viking Engine: residency of %s skipped: %s", record.settings.label, error)
        sample = {"at": time.time(), "seconds": round(time.perf_counter() - started, 4), "owners": owners,
                  "dynamic": dynamic_figures}
        _sample = sample
        return sample
    finally:
        timing.release_collector()


def _run():
    global _sampler_tid
    _sampler_tid = threading.get_native_id()
    while True:
        _wanted.wait()
        sample = _sample
        if sample is not None:
            time.sleep(max(0.0, sample["at"] + MIN_INTERVAL_SECONDS - time.time()))
        _wanted.clear()
        waited = 0.0
        while comfy.prompt_running() and waited < MAX_WAIT_SECONDS:
            time.sleep(PROMPT_POLL_SECONDS)
            waited += PROMPT_POLL_SECONDS
        try:
            sample_now()
        except Exception as error:  # noqa: BLE001 - the sampler must keep going
            log.warning("Viking Engine: residency sample failed: %s", error)
