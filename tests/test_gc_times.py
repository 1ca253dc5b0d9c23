"""The garbage-collection probe (bench/probes/gc_times.py) against a real CPU server of each
version: its node pack logs ComfyUI's own collection of the whole heap after the first prompt
(main.py's prompt worker calls gc.collect() once a prompt has run), with the frames that made
it, and the probe places a collection inside the prompt whose start and end surround it."""
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "bench" / "probes")]

import gc_times  # noqa: E402
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
