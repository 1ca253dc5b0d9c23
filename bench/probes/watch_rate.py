"""What the gate's watcher costs a sampler whose steps are bound by Python, by how often it looks.

While pins held back from a prompt wait for its end (`gate.after_prompt(..., shown=True)`), the
watcher looks every AFTER_PROMPT_WATCH_SECONDS (0.02 s) in place of WATCH_SECONDS (0.5 s); until
43bdef6 any waiting work did, routine checks included. Each look takes the
GIL from ComfyUI's execution thread. Here that thread is a loop of "layers", each a few Python
calls and small torch ops on the CPU (as a launch-bound sampler step spends its time), timed
beside the real watcher (`gate._watch`, this checkout's code, a prompt running so that the looks
apply nothing) looking every 0.02 s, every 0.5 s, or not at all. Each case in its own process,
alternating, ROUNDS rounds; per case the median over its processes of the mean step time (the
looks land in some steps and not others).

usage: python bench/probes/watch_rate.py OUT.json   (any Python with torch: this project's .venv)
"""

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CASES = ("no watcher", "every 0.5 s", "every 0.02 s")
ROUNDS = 5
STEPS, LAYERS = 100, 4000  # ~2 s of steps: ~100 looks at 0.02 s


def measure(case: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from comfy_node import comfy, gate

    torch.set_num_threads(1)
    comfy.prompt_running = lambda: True  # a prompt runs: the looks apply nothing
    if case != "no watcher":
        if case == "every 0.02 s":
            gate._after_prompt["probe"] = ("pins waiting for the prompt's end", lambda: None, True)
        threading.Thread(target=gate._watch, daemon=True).start()
    weights = [torch.randn(64, 64) for _ in range(200)] * (LAYERS // 200)
    x = torch.randn(1, 64)

    def layer(x, w):
        w = w.to(torch.float32, copy=False)  # the cast ComfyUI makes per streamed weight
        return torch.nn.functional.linear(x, w).tanh_()

    time.sleep(1.0)  # the watcher settles into its rate
    steps = []
    for _ in range(STEPS):
        begin = time.perf_counter()
        for w in weights:
            x = layer(x, w)
        steps.append(time.perf_counter() - begin)
    return {"step_ms_mean": round(1000 * statistics.mean(steps), 3), "looks_every_s":
            None if case == "no watcher" else gate._next_look_seconds}


def main():
    if sys.argv[1] == "--case":
        print(json.dumps(measure(sys.argv[2])))
        return
    out = Path(sys.argv[1])
    runs = {case: [] for case in CASES}
    for round_index in range(ROUNDS):
        for case in (CASES if round_index % 2 == 0 else CASES[::-1]):
            done = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, check=True)
            runs[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {case: statistics.median(r["step_ms_mean"] for r in found) for case, found in runs.items()}
    result = dict(probe="watch_rate", date=time.strftime("%Y-%m-%d"), steps=STEPS, layers=LAYERS, rounds=ROUNDS,
                  runs=runs, step_ms=medians,
                  over_no_watcher={case: round(medians[case] / medians["no watcher"], 4) for case in CASES})
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"step_ms": medians, "over_no_watcher": result["over_no_watcher"]}))


if __name__ == "__main__":
    main()
