"""What the gate's watcher does to ComfyUI's garbage collection while ComfyUI's thread holds the
gate's lock, as it does through a whole model load (the pinned home's watch wraps `load`).

The watcher switches the process's collection off for each of its looks, so that no collection
starts on its own thread (comfy_node/gate.py, `_watch_once`). Until 17ca39f it switched it off
before waiting for the lock: a look that began during a load kept collection off for the rest
of the load. Here a "load" holds the lock for LOAD_SECONDS while it allocates objects that live
on (as a model's modules and tensors do), in a process holding HEAP_OBJECTS objects (ComfyUI's
heap), with the watcher looking every WATCH_SECONDS as in a server during a prompt. Measured
on the load's thread: the share of its allocations made with collection off, the collections
that ran during the load, and the longest pause any collection caused, during the load or in
the second after it. Each tree in its own process, alternating, three rounds each.

usage: python bench/probes/watcher_gc.py OUT.json --baseline DIR --baseline-commit C
       (any Python with torch: this project's .venv)
"""

import gc
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
LOAD_SECONDS = 2.0
HEAP_OBJECTS = 2_000_000
ROUNDS = 3


def measure(code_root: str) -> dict:
    sys.path.insert(0, code_root)
    from comfy_node import comfy, gate

    assert Path(gate.__file__).resolve().parent.parent == Path(code_root).resolve()
    heap = [{"i": i} for i in range(HEAP_OBJECTS)]  # long-lived objects a full collection walks
    gc.collect()
    comfy.prompt_running = lambda: True  # a prompt runs: the looks apply nothing
    stop = threading.Event()

    def watcher():
        while not stop.is_set():
            time.sleep(gate.WATCH_SECONDS)
            gate._watch_once()

    load_thread, pauses, started = threading.get_ident(), [], {}

    def note(phase, info):
        if threading.get_ident() != load_thread:
            return
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            pauses.append((started.pop("t"), time.perf_counter(), info["generation"]))

    looks = threading.Thread(target=watcher, daemon=True)
    looks.start()
    time.sleep(0.1)
    gc.callbacks.append(note)
    kept, with_gc_off, batches = [], 0, 0
    with gate.lock:  # as ComfyUI's thread holds it through a load
        begin = time.perf_counter()
        while time.perf_counter() - begin < LOAD_SECONDS:
            kept.append([{"weight": j} for j in range(200)])  # a module's worth of objects that live on
            batches += 1
            with_gc_off += not gc.isenabled()
            time.sleep(0.001)  # the load's copies, during which the watcher may run
        end = time.perf_counter()
    after = []
    while time.perf_counter() - end < 1.0:
        after.append([{"next": j} for j in range(50)])
        time.sleep(0.001)
    gc.callbacks.remove(note)
    stop.set()
    looks.join()
    during = [p for p in pauses if p[0] < end]
    return {"load_batches": batches, "share_with_collection_off": round(with_gc_off / batches, 3),
            "collections_during_load": len(during),
            "longest_pause_ms": round(max([(e - s) * 1000 for s, e, _g in pauses], default=0.0), 1),
            "collections_in_the_second_after": len(pauses) - len(during), "heap_objects": len(heap)}


def main():
    out_path = sys.argv[1]
    baseline = sys.argv[sys.argv.index("--baseline") + 1]
    trees = {"this": str(ROOT), "baseline": baseline}
    runs = {name: [] for name in trees}
    for _round in range(ROUNDS):
        for name, code_root in trees.items():
            child = subprocess.run([sys.executable, __file__, "--measure", code_root], capture_output=True, text=True,
                                   timeout=300)
            line = next((l for l in reversed(child.stdout.splitlines()) if l.startswith("{")), None)
            if line is None:
                sys.exit(f"{name}: the measuring process printed no result:\n{child.stderr[-3000:]}")
            runs[name].append(json.loads(line))
            print(name, runs[name][-1], flush=True)
    keys = ("share_with_collection_off", "collections_during_load", "longest_pause_ms")
    result = {"probe": "watcher_gc", "date": time.strftime("%Y-%m-%d"), "load_seconds": LOAD_SECONDS,
              "heap_objects": HEAP_OBJECTS, "baseline_commit": sys.argv[sys.argv.index("--baseline-commit") + 1],
              "runs": runs, "median": {name: {k: statistics.median(r[k] for r in rs) for k in keys}
                                       for name, rs in runs.items()}}
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)
    print(json.dumps(result["median"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()
