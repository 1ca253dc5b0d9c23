"""What a status read costs the thread that runs ComfyUI's prompts. With GIB GiB pinned by the
OS lock, one thread plays ComfyUI's execution thread: in a loop, what Viking's hand-over of the
budget does at each event (native.note_foreign_pins, native.budget_json) and a little Python
work, timing each round. Another thread reads the full status (native.status_json, what the
panel's route and the status node call; it reads the page tables of every pinned range) every
50 ms, twenty times more often than the panel polls. Recorded: the status call's duration, and
the execution thread's rounds with and without those reads (median, 99th percentile, worst):
the difference is what a status costs that thread.

With --baseline-site DIR the same is measured again, in a fresh process, with the native
module installed in DIR (`pip install --target DIR` of a wheel built from an older commit,
`--baseline-commit` names it), and both go into OUT.json side by side.

usage: python bench/status_stall.py OUT.json [--gib 8] [--seconds 10] [--baseline-site DIR --baseline-commit C]
"""
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import torch  # noqa: E402

import viking_native as native  # noqa: E402
from comfy_node.weights import cpu_storage_ranges  # noqa: E402
from flux_model import arg  # noqa: E402

out_path = sys.argv[1]
gib, seconds = arg("--gib", 8.0), arg("--seconds", 10.0)


def execution_rounds(stop: threading.Event) -> list[float]:
    rounds = []
    while not stop.is_set():
        started = time.perf_counter()
        native.note_foreign_pins(0)
        json.loads(native.budget_json())
        sum(range(200))  # a little Python work between events
        rounds.append(time.perf_counter() - started)
    return rounds


def run(poll: bool) -> dict:
    stop, status_calls, rounds = threading.Event(), [], []

    def poller():
        while not stop.is_set():
            started = time.perf_counter()
            native.status_json()
            status_calls.append(time.perf_counter() - started)
            stop.wait(0.05)

    worker = threading.Thread(target=lambda: rounds.extend(execution_rounds(stop)))
    threads = [worker] + ([threading.Thread(target=poller)] if poll else [])
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    ms = sorted(r * 1e3 for r in rounds)
    return {"rounds": len(ms), "round_median_ms": statistics.median(ms), "round_p99_ms": ms[int(0.99 * (len(ms) - 1))],
            "round_worst_ms": ms[-1], "status_calls": len(status_calls),
            "status_median_ms": statistics.median(status_calls) * 1e3 if status_calls else None}


def measure() -> dict:
    native.configure(headroom_gib=0.0)
    tensors = [torch.ones(256 << 20, dtype=torch.uint8) for _ in range(int(gib * 4))]  # 256 MiB storages, touched
    report = json.loads(native.reconcile(1, cpu_storage_ranges(tensors)[0], backend="os-lock"))
    assert report["pinned_bytes"] == int(gib * (1 << 30)), report
    quiet, polled = run(poll=False), run(poll=True)
    native.release_all()
    return {"native_module": native.__file__, "without_status_reads": quiet, "with_status_reads": polled,
            "status_ms_per_gib": polled["status_median_ms"] / gib,
            "worst_round_added_ms": polled["round_worst_ms"] - quiet["round_worst_ms"],
            "p99_round_added_ms": polled["round_p99_ms"] - quiet["round_p99_ms"]}


if "--measure-only" in sys.argv:  # the baseline's process
    print(json.dumps(measure()))
    sys.exit(0)
result = {"bench": "status_stall", "date": time.strftime("%Y-%m-%d"), "pinned_gib": gib, "seconds_each": seconds,
          "this_commit": measure()}
baseline_site = arg("--baseline-site", "", str)
if baseline_site:
    import subprocess

    run_baseline = subprocess.run([sys.executable, __file__, out_path, "--gib", str(gib), "--seconds", str(seconds), "--measure-only"],
                                  capture_output=True, text=True, check=True,
                                  env={**os.environ, "PYTHONPATH": baseline_site})
    result["baseline"] = {"commit": arg("--baseline-commit", "", str), **json.loads(run_baseline.stdout.strip().splitlines()[-1])}
    mine, theirs = result["this_commit"]["with_status_reads"], result["baseline"]["with_status_reads"]
    result["worst_round_with_reads_ms"] = {"this_commit": mine["round_worst_ms"], "baseline": theirs["round_worst_ms"]}
    result["rounds_with_reads"] = {"this_commit": mine["rounds"], "baseline": theirs["rounds"]}
with open(out_path, "w") as out:
    json.dump(result, out, indent=1)
print(json.dumps(result, indent=1))
