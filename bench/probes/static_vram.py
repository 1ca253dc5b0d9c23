"""Where the VRAM goes in the static cross-check (bench/gpu_dynamic.py's modes `static` and
`static_nodes`: ComfyUI 0.33 with --disable-dynamic-vram, alone and with the Pin Model, VRAM
held to 6 GiB free). At 8878ce0 ComfyUI alone ran every prompt and with Viking the fourth ran
out of VRAM, after ComfyUI had streamed 100, 99, then 167 layers: something took VRAM between
prompts. This runs the same bench (unchanged, in-process) three ways and records, before and
after every prompt, what splits the device's memory:

  default         the cross-check as gpu_check's part `dynamic` runs it
  no_prefetch     the Pin Model with prefetch off (Viking's copy stream never runs)
  no_cuda_malloc  --disable-cuda-malloc: PyTorch's own caching allocator instead of the
                  cudaMallocAsync pool that ComfyUI 0.33 turns on with CUDA 13 (its cast
                  buffers exist only then, and so does the release of 9edbde9)

Per prompt: ComfyUI's /system_stats (its free VRAM, and PyTorch's reserved and unused
memory), the device's used memory (nvidia-smi; the holding process is constant), and
ComfyUI's log lines that say how it split the model ("loaded partially", "Unloaded partially",
Viking's "prefetching ..."). The server's memory outside PyTorch's pool, prompt to prompt, is
`device_used - reserved` (plus the holder's constant share).

usage: python bench/probes/static_vram.py OUT.json [--variants default,no_prefetch,no_cuda_malloc]
       [--modes static,static_nodes] [gpu_dynamic.py's --depth/--free-gib/--steps/--size/--cpu]
       (run by ComfyUI 0.33's Python; --modes takes any of gpu_dynamic.py's modes, in the order
       they run: part `dynamic` runs four dynamic-mode servers before the two static ones)
"""
import json
import os
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BENCH.parent / "tests"), str(BENCH)]

from flux_model import arg  # noqa: E402

DEFAULT_MODES = "static,static_nodes"
VARIANTS = {"default": [], "no_prefetch": [], "no_cuda_malloc": ["--disable-cuda-malloc"]}
SPLIT_LINES = re.compile(r"loaded partially|loaded completely|Unloaded partially|models unloaded|Requested to load"
                         r"|Viking Engine: prefetching")


def device_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None  # no GPU (a dry run)


def wait_for_device_idle(below_mib=4096, seconds=60):
    """The last run's holder and servers give their VRAM back before the next run holds it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (device_used_mib() or 0) > below_mib:
        time.sleep(0.5)


def run_variant(variant: str, modes: str, bench_out: str, trace_out: str, bench_args: list[str]):
    """In this process: gpu_dynamic.py with ComfyServer.run_prompt traced (and the variant's change)."""
    import comfy_server

    modes = modes.split(",")

    trace, log_offsets = [], {}
    start, run_prompt = comfy_server.ComfyServer.start, comfy_server.ComfyServer.run_prompt

    def snapshot(server, when: str, mode: str):
        device = server.get("/system_stats")["devices"][0]
        text = server.log_text()
        new = text[log_offsets.get(server.port, 0):]
        log_offsets[server.port] = len(text)
        trace.append(dict(mode=mode, when=when, comfy_free_bytes=device.get("vram_free"),
                          torch_reserved_bytes=device.get("torch_vram_total"), torch_unused_bytes=device.get("torch_vram_free"),
                          device_used_mib=device_used_mib(),
                          split_lines=[line.strip() for line in new.splitlines() if SPLIT_LINES.search(line)]))
        json.dump(trace, open(trace_out, "w"), indent=1)

    def traced_start(server):
        server.cmd += VARIANTS[variant]
        start(server)
        snapshot(server, "started", mode_of(server, modes))

    def traced_run_prompt(server, api_graph, timeout=300):
        if variant == "no_prefetch":
            for node in api_graph.values():
                if node["class_type"] == "VikingPinModel":
                    node["inputs"]["prefetch"] = False
        mode = mode_of(server, modes)
        try:
            return run_prompt(server, api_graph, timeout)
        finally:
            snapshot(server, "after prompt", mode)

    comfy_server.ComfyServer.start, comfy_server.ComfyServer.run_prompt = traced_start, traced_run_prompt
    sys.argv = [str(BENCH / "gpu_dynamic.py"), bench_out, "--modes", ",".join(modes), *bench_args]
    try:
        runpy.run_path(str(BENCH / "gpu_dynamic.py"), run_name="__main__")
    except SystemExit:
        pass  # gpu_dynamic exits 1 when a check fails: the trace is what this probe is for


def mode_of(server, modes: list[str]) -> str:
    """gpu_dynamic names each server's base folder gpu_dynamic_<mode>_<random>."""
    name = server.base_dir.name.removeprefix("gpu_dynamic_")
    return next(mode for mode in sorted(modes, key=len, reverse=True) if name.startswith(mode + "_"))


def main():
    out = sys.argv[1]
    if "--run" in sys.argv:  # the child: one variant
        at = sys.argv.index("--run")
        run_variant(*sys.argv[at + 1:at + 5], sys.argv[2:at])
        return
    variants = arg("--variants", ",".join(VARIANTS), str).split(",")
    modes = arg("--modes", DEFAULT_MODES, str)
    passed = sys.argv[2:]  # gpu_dynamic.py's own options
    for own in ("--variants", "--modes"):
        if own in passed:
            at = passed.index(own)
            del passed[at:at + 2]
    result = dict(probe="static_vram", date=time.strftime("%Y-%m-%d"), args=passed, modes=modes, variants={})
    for variant in variants:
        wait_for_device_idle()
        bench_out, trace_out = f"{out}.{variant}.bench.json", f"{out}.{variant}.trace.json"
        # A fresh process per variant: the bench holds VRAM and its globals for one run.
        subprocess.run([sys.executable, __file__, out, *passed, "--run", variant, modes, bench_out, trace_out], check=False)
        bench = json.load(open(bench_out)) if os.path.exists(bench_out) else {}
        rows = {mode: dict(error=row.get("error"), prompts=[dict(seconds=p["seconds"], latent=p["latent"], prefetch=p.get("prefetch"))
                                                              for p in row.get("prompts", [])])
                 for mode, row in bench.get("modes", {}).items()}
        result["variants"][variant] = dict(held_vram_bytes=bench.get("held_vram_bytes"), modes=rows, checks=bench.get("checks"),
                                           trace=json.load(open(trace_out)) if os.path.exists(trace_out) else [])
        json.dump(result, open(out, "w"), indent=1)
        print(variant, {mode: row["error"].splitlines()[1] if row["error"] else "ran" for mode, row in rows.items()}, flush=True)


if __name__ == "__main__":
    main()
