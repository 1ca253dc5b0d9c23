"""Residency under a container's memory limit, ComfyUI 0.33's dynamic VRAM mode, on the CPU.

ComfyUI runs in a memory cgroup with a limit (Docker, Kubernetes, systemd `MemoryMax=`); its
model's weights sit in comfy-aimdo's read-only mapping of the checkpoint, so they are page
cache charged to the container. Then the container reads another large file twice or more
(what loading and running a second model does to the page cache): at the limit, the kernel reclaims
the container's own page cache, the first model's pages with it, and the model's next run
reads them from disk again. With Viking's Pin Model (node defaults: auto headroom, so the
budget follows the container limit) the model's file pages are locked through Viking's shared
view (dynamic.file_ranges, the OS lock) and stay.

Each run is a fresh process in a fresh cgroup: the model loaded through aimdo's mapping
(tests/dynamic_cpu.py; ComfyUI's own loader), run once, marked as sampling (ComfyUI's
ON_PRE_RUN), run again, reconciled (the event after sampling), five warm runs timed (the median); the other
file read --other-reads times; then the next run: its seconds, the bytes read from storage (/proc/self/io),
the share of the checkpoint in RAM before it (mincore), and its output, which must equal the
warm run's bit for bit and every other run's. The model has no staged modules (every weight is
read from the file, as under --fast-disk or for weights in VRAM slots). Alone and with Viking
alternate; medians of --reps.

usage: python tests/container_check.py COMFY_0_33_DIR OUT.json [--limit-gib 4] [--model-mib 640]
       [--other-gib 4] [--other-reads 2] [--reps 3] [--work DIR]     (ComfyUI 0.33's Python, as root)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB, GIB = 1 << 20, 1 << 30
SIDE = 2048  # square fp32 weights: 16 MiB each, chained into one forward


def child(comfy_dir: str, model: str, other: str, reads: int, viking: bool):
    """One run inside the cgroup; prints its figures as JSON."""
    sys.path[:0] = [comfy_dir, str(ROOT), str(ROOT / "tests")]
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy_aimdo.control
    comfy_aimdo.control.init()
    import torch

    from comfy_node import comfy as seam, lifecycle
    from comfy_node.native import require
    from dynamic_cpu import StagingPatcher, enter_dynamic_mode, mapped_model

    native = require()
    enter_dynamic_mode()
    patcher = mapped_model(model, StagingPatcher)
    x = torch.ones(1, SIDE)

    def run():
        with torch.no_grad():
            return patcher.model(x)

    def read_bytes():
        return next(int(line.split()[1]) for line in open("/proc/self/io") if line.startswith("read_bytes"))

    spans = seam.mapped_storage_spans(patcher)
    if viking:
        lifecycle.attach(patcher, lifecycle.PinSettings(label="model"))  # the node's defaults
    run()  # first prompt: the weights come from the file
    if viking:
        lifecycle._on_pre_run(patcher)  # ComfyUI's ON_PRE_RUN: the model samples
    run()
    if viking:
        lifecycle._on_event(patcher)  # the event after sampling: residency is decided
    warm_times = []
    for _ in range(5):
        started = time.perf_counter()
        warm = run()
        warm_times.append(time.perf_counter() - started)
    warm_seconds = statistics.median(warm_times)
    for _ in range(reads):  # the container reads another large file again and again
        with open(other, "rb") as stream:
            while stream.read(64 * MIB):
                pass
    resident = sum(native.resident_bytes(addr, length) or 0 for addr, length in spans)
    before, started = read_bytes(), time.perf_counter()
    after = run()
    figures = dict(warm_seconds=warm_seconds, next_seconds=time.perf_counter() - started, next_read_bytes=read_bytes() - before,
                   resident_share=resident / sum(length for _, length in spans), model_bytes=sum(n for _, n in spans),
                   same_as_warm=bool(torch.equal(warm, after)), output=hashlib.sha256(after.numpy().tobytes()).hexdigest())
    status = json.loads(native.status_json())
    figures.update(memory=status["memory"], budget={k: status["budget"][k] for k in ("limit_bytes", "headroom_bytes", "reason")},
                   pinned_bytes=status["pinned_bytes"], pressure_events=[e for e in status["events"] if "pressure" in e])
    if viking:
        lifecycle.forget(lifecycle.owner_of(patcher))
    print(json.dumps(figures), flush=True)


def write_file(path: Path, size: int, make_block):
    with open(path, "wb") as out:
        for index in range(size // (64 * MIB)):
            out.write(make_block(index))
        out.flush()
        os.fsync(out.fileno())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("comfy_dir")
    parser.add_argument("out")
    parser.add_argument("--limit-gib", type=float, default=4.0)
    parser.add_argument("--model-mib", type=int, default=640)
    parser.add_argument("--other-gib", type=float, default=4.0)
    parser.add_argument("--other-reads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", default=str(ROOT / ".comfy" / "container_residency"))
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests")]
    import memory_cgroup
    from server_tools import drop_file_cache
    import safetensors.torch
    import torch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)  # on disk, not a tmpfs: page cache the kernel can drop
    model, other = work / "model.safetensors", work / "other.bin"
    weights = args.model_mib * MIB // (SIDE * SIDE * 4)
    generator = torch.Generator().manual_seed(0)
    safetensors.torch.save_file({f"{i}.weight": torch.randn(SIDE, SIDE, generator=generator) / SIDE ** 0.5
                                 for i in range(weights)}, str(model))
    with open(model, "rb+") as written:  # written back, so the cache drop below can drop it all
        os.fsync(written.fileno())
    block = os.urandom(MIB)
    write_file(other, int(args.other_gib * GIB), lambda index: block * 64)
    limit = int(args.limit_gib * GIB)
    result = dict(bench="container_residency", date=time.strftime("%Y-%m-%d"), limit_bytes=limit,
                  other_file_bytes=other.stat().st_size, other_file_reads=args.other_reads, model_weights=weights, runs={"alone": [], "viking": []}, checks=[])
    try:
        with memory_cgroup.limited_cgroup(limit, "viking_bench") as cgroup:
            for _ in range(args.reps):
                for mode in ("alone", "viking"):
                    drop_file_cache(model)
                    drop_file_cache(other)
                    run = subprocess.run([sys.executable, __file__, "--child", args.comfy_dir, str(model), str(other), str(args.other_reads), mode],
                                         preexec_fn=cgroup.join, capture_output=True, text=True, timeout=600)
                    if run.returncode != 0:
                        raise SystemExit(f"{mode} run failed:\n{run.stderr[-3000:]}")
                    result["runs"][mode].append(json.loads(run.stdout.strip().splitlines()[-1]))
                    print(mode, {k: v for k, v in result["runs"][mode][-1].items() if k.endswith(("seconds", "bytes", "share"))},
                          flush=True)
    except memory_cgroup.Unavailable as reason:
        raise SystemExit(f"no container limit here: {reason}")
    finally:
        model.unlink(missing_ok=True)
        other.unlink(missing_ok=True)

    runs = result["runs"]
    median = {mode: {key: statistics.median(r[key] for r in rs) for key in ("warm_seconds", "next_seconds", "next_read_bytes",
                                                                         "resident_share")} for mode, rs in runs.items()}
    result["median"] = median
    result["next_run_alone_over_viking"] = round(median["alone"]["next_seconds"] / median["viking"]["next_seconds"], 2)
    result["warm_viking_over_alone"] = round(median["viking"]["warm_seconds"] / median["alone"]["warm_seconds"], 2)

    def check(ok, what):
        result["checks"].append({"ok": bool(ok), "what": what})

    every = runs["alone"] + runs["viking"]
    check(all(r["same_as_warm"] for r in every) and len({r["output"] for r in every}) == 1,
          "every run's output bit-identical, alone and with Viking, before and after the pressure")
    check(all(r["memory"]["container_limit"] == limit for r in runs["viking"]), "Viking's budget reads the container limit")
    check(all(r["pinned_bytes"] == r["model_bytes"] and r["budget"]["limit_bytes"] <= limit for r in runs["viking"]),
          "Viking pins the model's file pages, within a budget below the limit")
    check(all(not r["pressure_events"] for r in runs["viking"]),
          "no pressure release: the other file's page cache counts as available")
    check(all(r["resident_share"] == 1.0 and r["next_read_bytes"] < r["model_bytes"] // 100 for r in runs["viking"]),
          "with Viking the model's pages stay in RAM and the next run reads (almost) nothing from storage")
    check(all(r["resident_share"] < 0.5 and r["next_read_bytes"] > r["model_bytes"] // 2 for r in runs["alone"]),
          "control: alone, the container's limit evicts the pages and the next run reads them again")
    result["ok"] = all(c["ok"] for c in result["checks"])
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median", "next_run_alone_over_viking", "warm_viking_over_alone", "checks")}, indent=1))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "viking")
    else:
        main()
