"""The garbage-collection log (tests/gc_log.py, which bench/probes/gc_times.py uses) against a real CPU server of each
version: its node pack logs ComfyUI's own collection of the whole heap after the first prompt
(main.py's prompt worker calls gc.collect() once a prompt has run), with the frames that made
it, and the probe places a collection inside the prompt whose start and end surround it."""
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests")]

import gc_log as gc_times  # noqa: E402
from comfy_server import ComfyServer, prepare_base_dir, txt2img_prompt  # noqa: E402


def test_gc_probe_logs_comfyuis_full_collection_and_places_it(comfy_version, tmp_path):
    base = prepare_base_dir(tmp_path / "gc")
    log = gc_times.add_gc_pack(base)
    with ComfyServer(base, version=comfy_version) as server:
        start = time.time()
        server.run_prompt(txt2img_prompt(seed=7, steps=1, prefix="gc"))
        deadline = time.time() + 20
        while not any(c["generation"] == 2 for c in gc_times.read_log(log)) and time.time() < deadline:
            time.sleep(0.2)
        end = time.time()
        assert "Traceback" not in server.log_text()
    found = gc_times.read_log(log)
    full = [c for c in found if c["generation"] == 2]
    assert full, found
    worker = [c for c in full if any(frame.endswith("main.py:prompt_worker") for frame in c["frames"])]
    assert worker, full  # ComfyUI's own gc.collect() after the prompt, named by its frames
    assert all(c["ms"] >= 0 and start <= c["at"] <= end for c in worker)
    [inside] = gc_times.in_prompts(found, [dict(mode="alone", server="s", index=0, start=start, end=end)])
    [before] = gc_times.in_prompts(found, [dict(mode="alone", server="s", index=0, start=start - 60, end=start)])
    assert inside["full_collection_ms"] == round(sum(c["ms"] for c in full if c["at"] >= start), 1)
    assert all(c["at"] < start for c in before["collections"]) and not any(c in before["collections"] for c in worker)
    summary = gc_times.summary([inside])
    assert summary == {"alone": {"servers": 1, "cold_full_collection_ms": [inside["full_collection_ms"]],
                                 "later_full_collection_ms_per_prompt": None}}


def test_watcher_looks_are_timed_and_placed(comfy_version, tmp_path, monkeypatch):
    """In a server with Viking the probe's pack finds the gate's watcher, sets how often it looks
    while work waits (VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS) and logs every look."""
    monkeypatch.setenv("VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS", "0.05")
    base = prepare_base_dir(tmp_path / "watch", custom_nodes={"viking_engine": REPO})
    log = gc_times.add_gc_pack(base)
    with ComfyServer(base, version=comfy_version) as server:
        server.run_prompt(txt2img_prompt(seed=3, steps=1, prefix="watch"))
        time.sleep(1.5)  # the watcher looks every 0.5 s at least
        assert "Traceback" not in server.log_text()
    entries = gc_times.read_log(log.with_name(gc_times.WATCH_LOG_NAME))
    assert entries and entries[0]["after_prompt_watch_seconds"] == 0.05, entries[:2]
    looks = [e for e in entries if "ms" in e]
    assert len(looks) >= 2 and all(look["ms"] >= 0 for look in looks), entries


def test_watcher_looks_are_placed_in_and_between_prompts():
    prompts = [dict(mode="static_nodes", index=0, start=10.0, end=12.0),
               dict(mode="static_nodes", index=1, start=12.5, end=13.0)]
    looks = [dict(at=11.0, ms=0.1), dict(at=12.2, ms=400.0), dict(at=12.7, ms=0.2), dict(at=13.5, ms=8.0)]
    first, second = gc_times.watcher_in_prompts(looks, prompts)
    assert (first["looks_inside"], first["looks_after"], first["looks_after_ms"]) == (1, 1, 400.0)
    assert abs(first["into_next_prompt_ms"] - 100.0) < 1e-6  # 12.2 s + 0.4 s runs 0.1 s into the prompt at 12.5 s
    assert (second["looks_inside"], second["looks_after_ms"], second["into_next_prompt_ms"]) == (1, 8.0, 0.0)
    assert gc_times.watcher_summary([first, second]) == {
        "static_nodes": {"looks_inside": 1, "looks_inside_ms": 0.2, "looks_after_ms": 8.0, "into_next_prompt_ms": 0.0}}
