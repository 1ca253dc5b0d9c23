"""What one ComfyUI event costs Viking in static mode (0.3.x, or 0.33 with
--disable-dynamic-vram), on the CPU: `lifecycle.reconcile` of a pinned Flux-shaped model whose
linear weights are in the legacy fp8-scaled layout (ComfyUI 0.33 loads them as comfy-kitchen
QuantizedTensor weights), loaded by ComfyUI's own loader, after the first reconcile pinned it:
the events of a prompt that move nothing. Medians of 200 events after 5 untimed and after the
model's pins are settled (file pages are locked off the caller's thread), and the native
reconciles those events made. Side by side in one run: this tree and, with --baseline DIR, the
comfy_node/ of another checkout (each in its own process, alternating, two rounds each).
This tree also: events that saw weights move, for a model Viking holds nothing of, with and
without a prompt running (`moved`: the work such an event leaves to the prompt's end).

usage: python bench/probes/static_event_cost.py COMFY_0_33_DIR OUT.json [--depth 2] [--baseline DIR --baseline-commit C]
       (ComfyUI 0.33's Python)
"""

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EVENTS = 200


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def start_with_code(comfy_dir: str, code_root: str):
    """In this process: ComfyUI (on the CPU) and `code_root`'s comfy_node, with no headroom.
    Returns ComfyUI's `comfy.sd`, Viking's `lifecycle` and the native module."""
    sys.path[:0] = [code_root, os.path.join(ROOT, "tests")]
    import flux_model

    flux_model.start_comfy(comfy_dir, cpu=True)
    sys.path.insert(0, code_root)  # start_comfy put this repository first: the code measured goes before it
    import comfy.sd

    from comfy_node import lifecycle
    from comfy_node.native import require

    assert os.path.dirname(os.path.dirname(os.path.abspath(lifecycle.__file__))) == os.path.abspath(code_root)
    native = require()
    native.configure(headroom_gib=0.0)
    return comfy.sd, lifecycle, native


def side_by_side(script: str, default_depth: int):
    """A probe's main part, from its command line (COMFY_DIR OUT.json [--depth N] [--baseline
    DIR]): runs `script --measure COMFY CODE_ROOT MODEL` for this tree and the baseline's,
    alternating, two rounds; each child prints its result as a JSON line. Returns the out path,
    the depth, the model file and {tree name: [results]}."""
    comfy_dir, out_path = sys.argv[1], sys.argv[2]
    depth = arg("--depth", default_depth)
    baseline = arg("--baseline", "")
    model_path = model_file(comfy_dir, depth)
    trees = {"this": ROOT} | ({"baseline": baseline} if baseline else {})
    runs = {name: [] for name in trees}
    for _round in range(2):
        for name, code_root in trees.items():
            child = subprocess.run([sys.executable, script, "--measure", comfy_dir, code_root, model_path],
                                   capture_output=True, text=True, timeout=900)
            line = next((l for l in reversed(child.stdout.splitlines()) if l.startswith("{")), None)
            if line is None:
                sys.exit(f"{name}: the measuring process printed no result:\n{child.stderr[-3000:]}")
            runs[name].append(json.loads(line))
            print(name, runs[name][-1], flush=True)
    return out_path, depth, model_path, runs


def measure(comfy_dir: str, code_root: str, model_path: str):
    """In this process: the model loaded by ComfyUI, pinned with `code_root`'s comfy_node."""
    sd, lifecycle, native = start_with_code(comfy_dir, code_root)
    patcher = sd.load_diffusion_model(model_path)
    calls = {"reconcile": 0}
    inner = native.reconcile

    def counted(*args, **kwargs):
        calls["reconcile"] += 1
        return inner(*args, **kwargs)

    native.reconcile = counted  # the probe's own count; lifecycle calls the module's attribute
    first = lifecycle.attach(patcher, lifecycle.PinSettings(label="static event cost", backend="os-lock", headroom_gib=0.0))
    for _ in range(5):
        lifecycle.reconcile(patcher)
    # The file pages of a checkpoint torch maps copy-on-write are locked off this thread: until
    # that lock is done every event asks the native side after it. Measured: the events after.
    if hasattr(native, "settle"):
        native.settle(120.0)
        lifecycle.reconcile(patcher)
    calls["reconcile"] = 0
    times = []
    for _ in range(EVENTS):
        start = time.perf_counter()
        report = lifecycle.reconcile(patcher)
        times.append((time.perf_counter() - start) * 1000)
    weights = sum(1 for _ in patcher.model.parameters())
    kinds = getattr(lifecycle.record_of(patcher), "weight_kinds", {}).get("bytes_by_kind", {})
    result = {"median_ms": round(statistics.median(times), 3), "p90_ms": round(sorted(times)[int(0.9 * EVENTS)], 3),
              "native_reconciles": calls["reconcile"], "events": EVENTS, "weights": weights,
              "pinned_bytes": report["pinned_bytes"], "first_pinned_bytes": first["pinned_bytes"],
              "bytes_by_kind": kinds}
    if hasattr(lifecycle, "_holds_nothing_during_prompt"):  # code that leaves such events to the prompt's end
        result["moved"] = moved_events(sd.load_diffusion_model(model_path), lifecycle, calls)
    print(json.dumps(result))


def moved_events(patcher, lifecycle, calls) -> dict:
    """Events that saw weights move (one weight pointed at other memory, ComfyUI's VRAM share
    changed: what a partial load does on a GPU) for a model Viking holds nothing of (its own
    limit pins nothing here; on a GPU, a quantized model whose offloaded weights ComfyUI 0.33
    pins itself): while no prompt runs (the whole reconcile, as the gate's watcher makes it
    once a prompt has ended) and during a prompt (left to its end). ComfyUI's queue is a
    stand-in here: its server module cannot be imported outside main.py's set-up."""
    import types

    import torch

    from comfy_node import gate

    queue = types.SimpleNamespace(currently_running={})
    sys.modules["server"] = types.ModuleType("server")
    sys.modules["server"].PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(prompt_queue=queue))
    gate.start(watch=True)
    # No home, no prefetcher: as on a GPU for a model of quantized layers (ComfyUI streams those
    # itself), which the CPU cannot show.
    first = lifecycle.attach(patcher, lifecycle.PinSettings(label="holds nothing", backend="os-lock", headroom_gib=0.0,
                                                            model_limit_gib=1e-9, pinned_home=False, prefetch=False))
    weight = next(w for w in patcher.model.diffusion_model.parameters() if type(w.data) is torch.Tensor)
    other = [weight.data, weight.data.clone()]
    result = {"first_pinned_bytes": first["pinned_bytes"]}
    for name, running in (("no_prompt", {}), ("during_prompt", {1: "a prompt"})):
        queue.currently_running = running
        calls["reconcile"], times = 0, []
        for index in range(EVENTS + 5):
            weight.data = other[index % 2]
            patcher.model.model_loaded_weight_memory = index % 2 << 20
            start = time.perf_counter()
            with gate.lock:  # as ComfyUI's events take it (lifecycle._on_event)
                lifecycle.reconcile(patcher)
            if index >= 5:
                times.append((time.perf_counter() - start) * 1000)
        result[name] = {"median_ms": round(statistics.median(times), 3), "native_reconciles": calls["reconcile"]}
    queue.currently_running = {}
    return result


def model_file(comfy_dir: str, depth: int) -> str:
    """The fp8-scaled Flux-shaped model of `depth`, written once (in a child: it loads ComfyUI)."""
    cache = os.path.join(os.path.expanduser("~/.cache/viking-engine/bench"), f"flux_{depth}_fp8_scaled_cpu.safetensors")
    if not os.path.exists(cache):
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        subprocess.run([sys.executable, __file__, "--write-model", comfy_dir, cache, str(depth)], check=True)
    return cache


def write_model(comfy_dir: str, path: str, depth: int):
    sys.path[:0] = [os.path.join(ROOT, "tests")]
    import flux_model

    flux_model.start_comfy(comfy_dir, cpu=True)
    import safetensors.torch
    import torch

    model, _ = flux_model.build(depth, tiny=False, seed=0)
    out = {}
    for key, tensor in model.diffusion_model.state_dict().items():
        tensor = tensor.contiguous()
        if key.endswith(".weight") and tensor.dim() == 2:  # the layout of bench/gpu_dynamic.py's fp8_scaled
            layer, wide = key[:-len(".weight")], tensor.float()
            scale = wide.abs().max() / 448.0
            out[key] = (wide / scale).to(torch.float8_e4m3fn)
            out[layer + ".scale_weight"] = scale.reshape(())
            out[layer + ".scale_input"] = torch.ones((), dtype=torch.float32)
        else:
            out[key] = tensor
    out["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    safetensors.torch.save_file(out, path + ".part")
    os.replace(path + ".part", path)


def main():
    out_path, depth, path, runs = side_by_side(__file__, default_depth=2)
    result = {"probe": "static_event_cost", "date": time.strftime("%Y-%m-%d"), "depth": depth, "format": "fp8_scaled",
              "model_file_bytes": os.path.getsize(path), "runs": runs,
              "median_ms": {name: statistics.median(r["median_ms"] for r in rs) for name, rs in runs.items()}}
    moved = [r["moved"] for r in runs["this"] if "moved" in r]
    if moved:
        result["moved_median_ms"] = {name: statistics.median(m[name]["median_ms"] for m in moved)
                                     for name in ("no_prompt", "during_prompt")}
        result["moved_no_prompt_over_during"] = round(result["moved_median_ms"]["no_prompt"]
                                                      / result["moved_median_ms"]["during_prompt"], 1)
    if "baseline" in runs:
        result["baseline_commit"] = arg("--baseline-commit", "")
        result["baseline_over_this"] = round(result["median_ms"]["baseline"] / result["median_ms"]["this"], 2)
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)
    print(json.dumps(result["median_ms"]), result.get("baseline_over_this", ""), json.dumps(result.get("moved_median_ms")))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        measure(*sys.argv[2:5])
    elif sys.argv[1:2] == ["--write-model"]:
        write_model(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
