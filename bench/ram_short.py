"""The machine this pack is for, made for real (issue 61): a memory cgroup whose limit stands for a
16 or 32 GB machine (scaled to the models used), a swap file, the model files' disk throttled to a
hard disk's or an SSD's speed, and a neighbour in the same cgroup that behaves like a browser and
the desktop (tests/ram_short_machine.py, tests/neighbour.py). In it, one real ComfyUI server per
mode, each in turn: ComfyUI alone, the Viking Pin Model (+ Pin CLIP + Pin VAE) in the graph, and
engine mode (VIKING_ENGINE_MODE=1, no node). Two models take turns (a base and a refiner, each an
SD1.5-shaped fp16 checkpoint with its text encoder and VAE), prompts with new seeds and texts,
bursts of the neighbour and a /free between some of them (ram_short_machine.schedule).

Recorded per run: seconds per prompt and its kind, the image's hash, Viking's pinned bytes; the
swap traffic, the server's file reads (/proc/PID/io), OOM kills, the neighbour's touch latency and
major faults, the PSI stall totals. Each mode is judged against ComfyUI alone of the same run with
issue 61's bar (ram_short_machine.verdict), printed as a table, and the images are compared
across modes (bit-identical).

The sizes are small so that the whole run on a 2-core machine without a GPU takes about 25
minutes: 64x64 images, 1 sampling step (the memory behaviour, not the sampling, is measured).

usage (root, Linux):
  python bench/ram_short.py --profile 16gb --out bench/results/ram_short_cpu.json
      [--disk hdd|ssd|none] [--prompts 10] [--modes alone,pin_model,engine] [--comfy 0.33,0.3.75]
      [--size 64] [--steps 1] [--server-base-gib G]
  on the GPU machine: --gpu (no --cpu; ComfyUI 0.33 dynamic, 0.33-static and 0.3.75 by default)
      [--vram-free-gib G: hold the GPU's memory down to G GiB free, as a consumer card has]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "bench")]

import ram_short_machine as rsm  # noqa: E402
from comfy_server import (ComfyError, ComfyServer, cached_checkpoint, comfy_unavailable, pin_node,  # noqa: E402
                          prepare_base_dir)
from memory_cgroup import Unavailable  # noqa: E402
from server_tools import bad_lines, run_seconds  # noqa: E402

MODES = ("alone", "pin_model", "engine")
# name: (version, extra flags, VRAM mode on a GPU)
COMFY_CONFIGS = {"0.33": ("0.33", [], "dynamic"), "0.33-static": ("0.33", ["--disable-dynamic-vram"], "static"),
                 "0.3.75": ("0.3.75", [], "static")}
MODEL_FILES = {"base": "ram_short_base.safetensors", "refiner": "ram_short_refiner.safetensors"}
PRIORITY = {"base": 1, "refiner": 0}  # the README's recipe: the model sampled first gets the higher priority


def graph(model: str, index: int, mode: str, size: int, steps: int) -> dict:
    """One prompt: both checkpoints loaded (a workflow with two models taking turns keeps both),
    `model` samples with its own text encoder and VAE; in pin_model mode each loader's model,
    text encoder and VAE pass through Viking's Pin nodes."""
    nodes, outputs = {}, {}
    for number, name in (("1", "base"), ("2", "refiner")):
        nodes[number] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": MODEL_FILES[name]}}
        outputs[name] = [[number, 0], [number, 1], [number, 2]]
        if mode == "pin_model":
            for slot, kind in enumerate(("Model", "CLIP", "VAE")):
                pin = f"{number}{kind.lower()}"
                nodes[pin] = pin_node(kind, [number, slot], priority=PRIORITY[name])
                outputs[name][slot] = [pin, 0]
    unet, clip, vae = outputs[model]
    nodes.update({
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": f"a viking longship in a fjord at dawn, take {index}", "clip": clip}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, low quality", "clip": clip}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": unet, "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0], "seed": 1000 + index,
            "steps": steps, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": vae}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": f"ram_short_{index}"}},
    })
    return nodes


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def vram_mode(config: str, gpu: bool) -> str:
    return COMFY_CONFIGS[config][2] if gpu else "cpu"


def server_for(machine, base: Path, config: str, gpu: bool, env: dict) -> ComfyServer:
    version, flags, _ = COMFY_CONFIGS[config]
    # --disable-metadata: the PNG holds the pixels only, so images of different graphs compare by bytes
    server = ComfyServer(base, ["--disable-metadata", *flags], version=version, cpu=not gpu, env=env, start_timeout=600)
    server.cmd = machine.command(server.cmd)  # joins the machine's cgroups, then execs ComfyUI (same pid)
    return server


def idle_server_rss(machine, bases: dict, config: str, gpu: bool) -> int:
    """The resident bytes of a started ComfyUI with no model loaded: the scale rule's unscaled part."""
    with server_for(machine, bases["alone"], config, gpu, {"VIKING_ENGINE_MODE": "0"}) as server:
        time.sleep(2)
        return rsm.status_bytes(server.pid, "VmRSS")


def run_mode(machine, sizes: rsm.Machine, bases: dict, config: str, mode: str, args, work: Path) -> dict:
    version, flags, _ = COMFY_CONFIGS[config]
    comfy = dict(version=version, vram_mode=vram_mode(config, args.gpu), flags=["--cpu"] * (not args.gpu) + flags)
    run = dict(mode=mode, comfy=comfy, prompts=[])
    print(f"\n== ComfyUI {rsm.comfy_label(comfy)}, {mode}", flush=True)
    machine.set_limit(sizes.memory_limit_bytes)
    machine.drop_model_cache()
    machine.reset_peaks()
    before = machine.counters()
    started = time.monotonic()
    neighbour = rsm.Neighbour(machine, sizes.hot_bytes, sizes.burst_bytes, work / f"neighbour_{config}_{mode}.json")
    env = {"VIKING_ENGINE_MODE": "1" if mode == "engine" else "0"}
    server = server_for(machine, bases["alone" if mode == "alone" else "viking"], config, args.gpu, env)
    swap_peak = 0
    try:
        server.start()
        run["server_start_seconds"] = round(server.start_seconds, 2)
        reads_at_start = rsm.process_read_bytes(server.pid)
        for index, (model, kind) in enumerate(rsm.schedule(args.prompts)):
            if kind == "after_burst":
                burst = neighbour.burst()
                print(f"   neighbour burst: {burst} s", flush=True)
            elif kind == "after_free":
                server.free()
            began = time.monotonic()
            entry = server.run_prompt(graph(model, index, mode, args.size, args.steps), timeout=900)
            wall = time.monotonic() - began
            images = server.output_files(entry)
            pinned = server.get("/viking/status").get("pinned_bytes") if mode != "alone" else None
            sample = machine.sample()
            swap_peak = max(swap_peak, sample["swap_bytes"])
            prompt = dict(index=index, kind=kind, model=model, seconds=run_seconds(entry), wall_seconds=round(wall, 3),
                          hash=file_hash(images[0]) if images else None, pinned_bytes=pinned,
                          cgroup_usage_bytes=sample["usage_bytes"], cgroup_swap_bytes=sample["swap_bytes"],
                          server_rss_bytes=rsm.status_bytes(server.pid, "VmRSS"), server_swap_bytes=rsm.status_bytes(server.pid, "VmSwap"))
            run["prompts"].append(prompt)
            print(f"   {index:2d} {kind:12s} {model:8s} {prompt['seconds']} s  pinned {pinned}  "
                  f"cgroup {sample['usage_bytes'] / rsm.MIB:.0f} MiB, swap {sample['swap_bytes'] / rsm.MIB:.0f} MiB", flush=True)
        reads_now = rsm.process_read_bytes(server.pid)
        run["file_read_bytes"] = reads_now - reads_at_start if reads_now is not None and reads_at_start is not None else None
        run["server_peak_rss_bytes"] = rsm.status_bytes(server.pid, "VmHWM")
        run["viking_status"] = _status_summary(server.get("/viking/status")) if mode != "alone" else None
    except (ComfyError, OSError) as error:  # the server killed (an OOM kill) or a prompt failed: recorded, the bench goes on
        run["error"] = str(error)[:2000]
        print(f"   FAILED: {str(error)[:500]}", flush=True)
    finally:
        after = machine.counters()
        run["seconds"] = round(time.monotonic() - started, 1)
        run["neighbour"] = neighbour.stop()
        log = server.log_text() if server.log_path.exists() else ""
        server.stop()
    run.update(rsm.differences(before, after))
    run["cgroup_peak_usage_bytes"] = machine.peak_usage_bytes()
    run["cgroup_swap_peak_bytes"] = swap_peak
    run["log_problems"] = bad_lines(log)
    return run


def _status_summary(status: dict) -> dict:
    """The parts of Viking's status that say why it pinned what it pinned."""
    summary = {k: status[k] for k in ("pinned_bytes", "budget", "memory", "policy", "paging") if k in status}
    summary["events"] = status.get("events", [])[-10:]
    summary["owners"] = [{k: v for k, v in owner.items() if v is None or isinstance(v, (int, float, str, bool))}
                         for owner in status.get("owners", [])]
    return summary


def print_table(result: dict):
    kinds = rsm.KINDS
    head = f"{'comfy':14s} {'mode':10s} " + " ".join(f"{k:>12s}" for k in kinds) + \
        f" {'swapin MB':>9s} {'swapout MB':>10s} {'read MB':>8s} {'oom':>3s} {'nb p95':>7s} {'nb max':>7s} {'psi full s':>10s} {'pinned MB':>9s}"
    print("\n" + head)
    mb = lambda v: f"{v / 1e6:.0f}" if v is not None else "-"  # noqa: E731
    for run in result["runs"]:
        by_kind = rsm.seconds_by_kind(run)
        pinned = max((p.get("pinned_bytes") or 0 for p in run["prompts"]), default=0) if run["mode"] != "alone" else None
        nb = run.get("neighbour", {})
        print(f"{rsm.comfy_label(run['comfy']):14s} {run['mode']:10s} "
              + " ".join(f"{by_kind[k]:12.2f}" if by_kind.get(k) is not None else f"{'-':>12s}" for k in kinds)
              + f" {mb(run.get('swap_in_bytes')):>9s} {mb(run.get('swap_out_bytes')):>10s} {mb(run.get('file_read_bytes')):>8s}"
              + f" {run.get('oom_kills', '-')!s:>3s} {nb.get('p95_ms', '-')!s:>7s} {nb.get('max_ms', '-')!s:>7s}"
              + f" {(run['psi_full_us'] or 0) / 1e6 if run.get('psi_full_us') is not None else '-':>10} {mb(pinned):>9s}")
    print()
    for v in result["verdicts"]:
        print(f"{rsm.comfy_label(v['comfy'])} {v['mode']} against alone: {'PASS' if v['ok'] else 'FAIL'}"
              f" (alone swaps or re-reads: {v['alone_swaps_or_rereads']})")
        for check in v["checks"]:
            print(f"   {'ok ' if check['ok'] else 'NO '} {check['what']}: {check['value']} (bar {check['bar']})")
    for label, agreement in result["hashes"].items():
        said = {True: "bit-identical across modes", False: "DIFFER", None: "one mode only, nothing to compare"}
        print(f"images {label}: {said[agreement['identical']]} "
              f"({agreement['compared']} compared{', differ: ' + str(agreement['differing']) if agreement['differing'] else ''})")


def checkout_state():
    """(commit, dirty) of the checkout, or None where there is no git (the GPU machine)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit, dirty


def stamp(out: Path, command: str, state):
    """The commit this measured (bench/stamp.py): the one at the start, whose pack the servers
    ran; where there is no git, the lead stamps it."""
    if state is None:
        print("no git here: stamp the result with bench/stamp.py where the checkout is", flush=True)
        return
    commit, dirty = state
    device = f"{os.cpu_count()}-core {os.uname().machine} Linux {os.uname().release}, no GPU" if "--gpu" not in command else None
    subprocess.run([sys.executable, str(REPO / "bench" / "stamp.py"), str(out), str(out), commit, command,
                    *(["--dirty"] if dirty else []), *(["--device", device] if device else [])], check=True)


def main():
    # A timeout's SIGTERM ends the bench through its `finally`s: servers, cgroups and the swap file go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(rsm.PROFILES), default="16gb")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--disk", choices=("hdd", "ssd", "none"), default="ssd")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--comfy", default=None, help="comma-separated: " + ", ".join(COMFY_CONFIGS))
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--gpu", action="store_true", help="run ComfyUI on the GPU (no --cpu)")
    parser.add_argument("--vram-free-gib", type=float, default=None, help="with --gpu: hold the GPU's memory down to this much free")
    parser.add_argument("--server-base-gib", type=float, default=None, help="skip measuring the idle server's RSS; use this")
    args = parser.parse_args()
    state = checkout_state()
    modes = args.modes.split(",")
    configs = (args.comfy or ("0.33,0.33-static,0.3.75" if args.gpu else "0.33,0.3.75")).split(",")
    for name in modes + configs:
        if name not in MODES and name not in COMFY_CONFIGS:
            parser.error(f"unknown mode or ComfyUI {name!r}")
    skipped = {c: comfy_unavailable(COMFY_CONFIGS[c][0]) for c in configs if comfy_unavailable(COMFY_CONFIGS[c][0])}
    for config, why in skipped.items():
        print(f"skipping ComfyUI {config}: {why}", flush=True)
    configs = [c for c in configs if c not in skipped]
    if not configs:
        sys.exit("no ComfyUI to run: " + "; ".join(skipped.values()))

    checkpoints = {"base": cached_checkpoint(seed=0), "refiner": cached_checkpoint(seed=1)}
    checkpoint_bytes = [path.stat().st_size for path in checkpoints.values()]
    profile = rsm.PROFILES[args.profile]
    model_set = rsm.model_set_bytes(checkpoint_bytes, cpu=not args.gpu)
    unlimited = rsm.scaled_machine(profile, model_set, 0)  # the swap size does not depend on the server's RSS
    holder = None
    if args.gpu and args.vram_free_gib is not None:
        from server_tools import hold_vram
        holder, held = hold_vram(args.vram_free_gib)
        print(f"holding {held / rsm.GIB:.1f} GiB of VRAM", flush=True)

    with tempfile.TemporaryDirectory(prefix="ram_short_") as scratch:
        work = Path(scratch)
        bases = {}
        for kind, nodes in (("alone", None), ("viking", {"viking_engine": REPO})):
            base = prepare_base_dir(work / kind, custom_nodes=nodes, checkpoint=checkpoints["base"], ckpt_name=MODEL_FILES["base"])
            (base / "models" / "checkpoints" / MODEL_FILES["refiner"]).symlink_to(checkpoints["refiner"].resolve())
            bases[kind] = base
        try:
            rsm.remove_stale_swap_files(REPO / ".comfy")
            with rsm.RamShortMachine("viking_ram_short", REPO / ".comfy" / f"ram_short_{os.getpid()}.swap", unlimited.swap_bytes,
                                     None if args.disk == "none" else args.disk, list(checkpoints.values())) as machine:
                if args.server_base_gib is not None:
                    server_base = int(args.server_base_gib * rsm.GIB)
                else:
                    machine.set_limit(None)
                    idle = {c: idle_server_rss(machine, bases, c, args.gpu) for c in configs}
                    print(f"idle server RSS: { {c: round(v / rsm.MIB) for c, v in idle.items()} } MiB", flush=True)
                    server_base = max(idle.values())
                sizes = rsm.scaled_machine(profile, model_set, server_base)
                print(f"profile {profile.name}: scale {sizes.scale}, limit {sizes.memory_limit_bytes / rsm.MIB:.0f} MiB, "
                      f"neighbour {sizes.hot_bytes / rsm.MIB:.0f} MiB hot + {sizes.burst_bytes / rsm.MIB:.0f} MiB bursts, "
                      f"swap {machine.swap_bytes / rsm.MIB:.0f} MiB{' (' + machine.swap_reason + ')' if machine.swap_reason else ''}, disk {machine.disk_read_limit or machine.disk_read_limit_reason}",
                      flush=True)
                result = dict(
                    bench="ram_short", date=time.strftime("%Y-%m-%d"), kernel=os.uname().release,
                    runs_on="gpu" if args.gpu else "cpu (--cpu)", profile=profile.name,
                    memory_limit_bytes=sizes.memory_limit_bytes, swap_bytes=machine.swap_bytes, swap_reason=machine.swap_reason,
                    disk_read_limit_bytes_per_s=machine.disk_read_limit,
                    disk_read_limit_reason=machine.disk_read_limit_reason, disk_device=machine.disk_device,
                    model_cache="the model files' pages are dropped from the page cache before each run (posix_fadvise DONTNEED)",
                    scale_rule=rsm.SCALE_RULE, scale=dict(
                        sizes.__dict__, profile_ram_bytes=profile.ram_bytes, profile_models_bytes=profile.models_bytes,
                        profile_models=profile.models, model_set_fits=sizes.model_set_fits(),
                        model_set_and_neighbour_do_not_fit=sizes.neighbour_does_not_fit()),
                    psi_source=machine.psi_source, swap_counter_source=machine.swap_source,
                    neighbour_config=dict(hot_bytes=sizes.hot_bytes, burst_bytes=sizes.burst_bytes, period_s=0.1,
                                          burst_every_s=[20, 30], burst_hold_s=1.0,
                                          asked_bursts="one before each after_burst prompt, besides the timed ones"),
                    workload=dict(models={k: dict(file=MODEL_FILES[k], bytes=p.stat().st_size) for k, p in checkpoints.items()},
                                  shape="synthetic SD1.5-shaped fp16 checkpoints (tests/synthetic_checkpoint.py), seeds 0 and 1",
                                  size=args.size, steps=args.steps, prompts=args.prompts,
                                  schedule=[dict(model=m, kind=k) for m, k in rsm.schedule(args.prompts)],
                                  note=f"small on purpose: {args.size}x{args.size}, {args.steps} steps, so that the whole CPU run "
                                       "takes about 25 minutes on 2 cores; what is measured is the memory, not the sampling"),
                    skipped={c: why for c, why in skipped.items()}, runs=[])
                for config in configs:
                    for mode in modes:
                        result["runs"].append(run_mode(machine, sizes, bases, config, mode, args, work))
                        save(args.out, result, sum(checkpoint_bytes))
        except Unavailable as why:
            sys.exit(f"cannot make the RAM-short machine here: {why}")
        finally:
            if holder is not None:
                holder.kill()
    save(args.out, result, sum(checkpoint_bytes))
    print_table(result)
    stamp(args.out, "python bench/ram_short.py " + " ".join(sys.argv[1:]), state)
    print(f"\nwrote {args.out}")


def save(out: Path, result: dict, model_files_bytes: int):
    """The result with its verdicts and the image comparison, written after every run (a later
    failure keeps what was measured)."""
    verdicts = []
    for run in result["runs"]:
        alone = next((r for r in result["runs"] if r["mode"] == "alone" and r["comfy"] == run["comfy"]), None)
        if run["mode"] != "alone" and alone is not None:
            verdicts.append(rsm.verdict(alone, run, model_files_bytes))
    result["verdicts"] = verdicts
    result["hashes"] = rsm.hash_agreement(result["runs"])
    compared = [a["identical"] for a in result["hashes"].values() if a["identical"] is not None]
    result["images_identical"] = all(compared) if compared else None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
