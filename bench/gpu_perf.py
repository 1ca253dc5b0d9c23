"""What Viking Engine is for, measured on a CUDA GPU, side by side in one run (issue: performance).
A Flux-shaped model (random bf16 weights, built through ComfyUI's own model classes) and
ComfyUI 0.3.75's real model management. Each case runs in its own process, so no pinning state
leaks from one into the next.

  pin          pin throughput: Viking's plan vs one cudaHostRegister per tensor (ComfyUI's way)
               vs tensor.pin_memory() copies; peak RAM of each. Host->device bandwidth of the
               weights pinned vs pageable, against a cudaHostAlloc buffer (the PCIe limit).
  full_none    full load RAM->VRAM from pageable RAM, then the step time with all in VRAM
  full_viking  the same with the weights pinned by Viking first
  low_none     lowvram: VRAM left to ComfyUI limited (dummy allocation), pinning disabled
  low_builtin  the same with ComfyUI's built-in pinning
  low_viking   the same with Viking (ComfyUI's built-in pinning still on)
  low_engine   the same with Viking's engine mode (no node: pinned after load_models_gpu)

usage: python bench/gpu_perf.py COMFY_DIR OUT.json [--depth 19] [--vram-gib 12] [--reps 5] [--modes a,b]
       [--no-devicemap]   (Viking registers PORTABLE only, as ComfyUI does)
"""

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
from flux_model import arg  # noqa: E402
GIB = 1 << 30
DEVICEMAP = "--no-devicemap" not in sys.argv  # read before run_case resets sys.argv for ComfyUI


def median(values):
    return round(statistics.median(values), 4)


# --- one case, in its own process ------------------------------------------------------------

def run_case(mode, comfy_dir, depth, vram_gib, reps):
    sys.path[:0] = [comfy_dir, REPO, HERE]
    sys.argv = [sys.argv[0]]
    import torch
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.model_management as mm
    import comfy.model_patcher
    from comfy_node import lifecycle
    from comfy_node.native import require
    from comfy_node.weights import cpu_storage_ranges

    native = require()
    native.configure(headroom_gib=8.0, cuda_devicemap=DEVICEMAP)
    import flux_model
    model, cfg = flux_model.build(depth, tiny=False)
    torch.manual_seed(0)  # the same step inputs in every case, so outputs compare bit for bit
    params = [p.data for p in model.parameters()]
    model_bytes = sum(p.nbytes for p in params)
    result = dict(mode=mode, model_bytes=model_bytes, tensors=len(params))
    torch.cuda.init()

    if mode == "pin":
        result.update(pin_figures(torch, native, params, reps, cpu_storage_ranges))
        print(json.dumps(result), flush=True)
        return

    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())
    dummy = None
    if mode.startswith("low"):
        free, _ = torch.cuda.mem_get_info()
        dummy = torch.empty(max(0, free - int(vram_gib * GIB)), dtype=torch.uint8, device="cuda")
    if mode.endswith("none"):
        mm.MAX_PINNED_MEMORY = -1  # what --disable-pinned-memory does
    if mode.endswith("viking"):
        started = time.perf_counter()
        lifecycle.attach(patcher, lifecycle.PinSettings(label="flux", backend="cuda", headroom_gib=8.0))
        result["pin_s"] = round(time.perf_counter() - started, 3)
    if mode == "low_engine":  # no node: engine mode pins what load_models_gpu loaded
        from comfy_node import engine_mode
        engine_mode.set_enabled(True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    mm.load_models_gpu([patcher], force_full_load=mode.startswith("full"))
    torch.cuda.synchronize()
    result["load_s"] = round(time.perf_counter() - started, 3)  # one load: a single sample
    result["loaded_vram_bytes"] = int(patcher.loaded_size())
    result["streamed_bytes_per_step"] = model_bytes - result["loaded_vram_bytes"]
    result["comfy_pinned_bytes"] = int(mm.TOTAL_PINNED_MEMORY)
    status = json.loads(native.status_json())
    result["viking_pinned_bytes"] = status["pinned_bytes"]
    result["viking_owners"] = [dict(label=o["label"], by_backend=o["by_backend"], pinned_bytes=o["pinned_bytes"]) for o in status["owners"]]

    device = mm.get_torch_device()
    x = torch.randn(1, 16, 128, 128, device=device, dtype=torch.bfloat16)  # 1024x1024 image
    ctx = torch.randn(1, 512, 4096, device=device, dtype=torch.bfloat16)
    y = torch.randn(1, 768, device=device, dtype=torch.bfloat16)
    timestep, guidance = torch.tensor([0.5], device=device), torch.tensor([3.5], device=device)
    steps = []
    with torch.inference_mode():
        for i in range(2 + reps):
            torch.cuda.synchronize()
            started = time.perf_counter()
            out = patcher.model.diffusion_model(x, timestep, ctx, y=y, guidance=guidance)
            torch.cuda.synchronize()
            if i >= 2:
                steps.append(time.perf_counter() - started)
        result["output_checksum"] = float(out.float().sum())
    result["step_s"] = steps
    result["step_s_median"] = median(steps)
    result["peak_vram_bytes"] = int(torch.cuda.max_memory_allocated())  # this process's own, the dummy included
    result["dummy_bytes"] = int(dummy.numel()) if dummy is not None else 0
    del dummy
    print(json.dumps(result), flush=True)


def pin_figures(torch, native, params, reps, cpu_storage_ranges):
    cudart_path = next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart.so" in line)
    cudart = ctypes.CDLL(cudart_path)
    cudart.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    cudart.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    total = sum(p.nbytes for p in params)

    def rss_kib(field):
        return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(field + ":")))

    def peak_extra(action):
        """Seconds of `action` and the RAM peak above the start (VmHWM reset through clear_refs)."""
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        before = rss_kib("VmRSS")
        started = time.perf_counter()
        kept = action()
        seconds = time.perf_counter() - started
        return seconds, (rss_kib("VmHWM") - before) * 1024, kept

    def viking():
        native.reconcile(1, cpu_storage_ranges(params)[0], backend="cuda")

    def per_tensor():
        failures = sum(cudart.cudaHostRegister(p.data_ptr(), p.nbytes, 1) != 0 for p in params)
        assert failures == 0, failures

    def copies():
        return [p.pin_memory() for p in params]

    def drop_cached_host_blocks():
        # PyTorch caches freed pinned blocks: without this, later repetitions only memcpy.
        torch.cuda.synchronize()
        torch._C._host_emptyCache()

    # pin_memory cold: PyTorch's pinned-block cache emptied first (cudaHostAlloc for every
    # tensor); warm: right after, the cache holds blocks of these sizes (a memcpy each).
    rows = {"viking": [], "per_tensor": [], "pin_memory": [], "pin_memory_warm": []}
    for _ in range(reps):
        seconds, peak, _ = peak_extra(viking)
        pinned = json.loads(native.status_json())["pinned_bytes"]
        started = time.perf_counter()
        native.release_all()
        rows["viking"].append(dict(seconds=seconds, peak_extra_bytes=peak, pinned_bytes=pinned, release_s=time.perf_counter() - started))
        seconds, peak, _ = peak_extra(per_tensor)
        started = time.perf_counter()
        for p in params:
            cudart.cudaHostUnregister(p.data_ptr())
        rows["per_tensor"].append(dict(seconds=seconds, peak_extra_bytes=peak, pinned_bytes=total, release_s=time.perf_counter() - started))
        drop_cached_host_blocks()
        seconds, peak, kept = peak_extra(copies)
        del kept
        rows["pin_memory"].append(dict(seconds=seconds, peak_extra_bytes=peak, pinned_bytes=total))
        seconds, peak, kept = peak_extra(copies)
        del kept
        rows["pin_memory_warm"].append(dict(seconds=seconds, peak_extra_bytes=peak, pinned_bytes=total))
        drop_cached_host_blocks()
    pin = {}
    for method, reps_rows in rows.items():
        s = median([r["seconds"] for r in reps_rows])
        pin[method] = dict(seconds_median=s, gb_per_s=round(reps_rows[0]["pinned_bytes"] / s / 1e9, 2),
                           peak_extra_ram_bytes=max(r["peak_extra_bytes"] for r in reps_rows), repetitions=reps_rows)

    # Host->device bandwidth: the weights pinned by Viking, the same weights pageable, and a
    # cudaHostAlloc buffer (what the link can do).
    targets = [torch.empty_like(p, device="cuda") for p in params]

    def copy_all(sources, dests):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for source, dest in zip(sources, dests):
            dest.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        return sum(s.nbytes for s in sources) / (time.perf_counter() - started) / 1e9

    native.reconcile(1, cpu_storage_ranges(params)[0], backend="cuda")
    pinned_bw = [copy_all(params, targets) for _ in range(reps)]
    native.release_all()
    pageable_bw = [copy_all(params, targets) for _ in range(reps)]
    del targets
    host = torch.empty(4 * GIB, dtype=torch.uint8, pin_memory=True)
    device_buffer = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
    limit_bw = [copy_all([host], [device_buffer]) for _ in range(reps)]
    # The link's speed is the best copy of the buffer (a slower one is noise, not the link).
    bandwidth = dict(pinned_weights_gb_per_s=median(pinned_bw), pageable_weights_gb_per_s=median(pageable_bw),
                     cuda_host_alloc_gb_per_s=round(max(limit_bw), 2), cuda_host_alloc_all_gb_per_s=[round(b, 2) for b in limit_bw])
    bandwidth["pinned_share_of_limit"] = round(bandwidth["pinned_weights_gb_per_s"] / bandwidth["cuda_host_alloc_gb_per_s"], 3)
    bandwidth["pinned_over_pageable"] = round(bandwidth["pinned_weights_gb_per_s"] / bandwidth["pageable_weights_gb_per_s"], 2)
    return dict(pin=pin, bandwidth=bandwidth,
                viking_over_per_tensor=round(pin["per_tensor"]["seconds_median"] / pin["viking"]["seconds_median"], 2),
                viking_over_pin_memory=round(pin["pin_memory"]["seconds_median"] / pin["viking"]["seconds_median"], 2),
                viking_over_pin_memory_warm=round(pin["pin_memory_warm"]["seconds_median"] / pin["viking"]["seconds_median"], 2))


# --- the driver --------------------------------------------------------------------------------

def main():
    comfy_dir, out = sys.argv[1], sys.argv[2]
    depth, vram_gib, reps = arg("--depth", 19, int), arg("--vram-gib", 12.0), arg("--reps", 5, int)
    if "--mode" in sys.argv:
        return run_case(sys.argv[sys.argv.index("--mode") + 1], comfy_dir, depth, vram_gib, reps)
    import torch
    cases = {}
    modes = arg("--modes", "pin,full_none,full_viking,low_none,low_builtin,low_viking", str).split(",")
    for mode in modes:
        started = time.perf_counter()
        try:
            flags = [] if DEVICEMAP else ["--no-devicemap"]
            done = subprocess.run([sys.executable, __file__, comfy_dir, out, "--mode", mode, "--depth", str(depth),
                                   "--vram-gib", str(vram_gib), "--reps", str(reps)] + flags, capture_output=True, text=True, timeout=200)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            cases[mode] = json.loads(lines[-1]) if done.returncode == 0 and lines else dict(error=done.stderr[-3000:])
        except subprocess.TimeoutExpired:
            cases[mode] = dict(error="timed out after 200 s")
        print(f"{mode}: {time.perf_counter() - started:.0f} s", flush=True)
        with open(out, "w") as partial:  # what is done survives a later timeout
            json.dump(dict(partial=True, cases=cases), partial, indent=1)
    limit = cases.get("pin", {}).get("bandwidth", {}).get("cuda_host_alloc_gb_per_s")
    compute = cases.get("full_viking", {}).get("step_s_median")
    for mode in ("low_none", "low_builtin", "low_viking"):
        case = cases.get(mode, {})
        if "step_s_median" in case and limit and compute:
            transfer = case["streamed_bytes_per_step"] / (limit * 1e9)
            case["floor_s"] = round(max(transfer, compute), 4)
            case["transfer_floor_s"] = round(transfer, 4)
            case["over_floor"] = round(case["step_s_median"] / case["floor_s"], 3)
    summary = {}
    if all("step_s_median" in cases.get(m, {}) for m in ("low_none", "low_builtin", "low_viking")):
        summary["lowvram_viking_over_builtin"] = round(cases["low_viking"]["step_s_median"] / cases["low_builtin"]["step_s_median"], 3)
        summary["lowvram_none_over_viking"] = round(cases["low_none"]["step_s_median"] / cases["low_viking"]["step_s_median"], 2)
        summary["lowvram_none_over_builtin"] = round(cases["low_none"]["step_s_median"] / cases["low_builtin"]["step_s_median"], 2)
    engine, builtin = cases.get("low_engine", {}), cases.get("low_builtin", {})
    if "step_s_median" in engine and "step_s_median" in builtin:
        summary["lowvram_engine_over_builtin"] = round(engine["step_s_median"] / builtin["step_s_median"], 3)
        summary["lowvram_engine_same_output_checksum"] = engine["output_checksum"] == builtin["output_checksum"]
    if "load_s" in cases.get("full_none", {}) and "load_s" in cases.get("full_viking", {}):
        summary["full_load_unpinned_over_viking"] = round(cases["full_none"]["load_s"] / cases["full_viking"]["load_s"], 2)
    checksums = {m: cases[m].get("output_checksum") for m in cases if m != "pin"}
    summary["outputs_identical"] = len(set(checksums.values())) == 1
    result = dict(bench="gpu_perf", date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(),
                  driver=os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip(),
                  torch=torch.__version__, cuda_devicemap=DEVICEMAP, depth=depth, vram_left_gib=vram_gib, reps=reps, summary=summary, cases=cases)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))
    print(json.dumps({m: {k: v for k, v in c.items() if k not in ("pin", "step_s", "error")} for m, c in cases.items()}, indent=1))
    for mode, case in cases.items():
        if "error" in case:
            print(f"--- {mode} failed:\n{case['error']}")


if __name__ == "__main__":
    main()
