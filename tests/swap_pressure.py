"""Swap guard, measured: a real ComfyUI server with the synthetic checkpoint loaded and parked
in RAM, its memory paged out from outside (process_madvise MADV_PAGEOUT on every private
writable mapping, as the kernel would under pressure, without starving the machine), then the
next sampling run. Side by side in one run: without Viking, and with the example workflow's
Viking pins (OS lock on this machine).

usage: python tests/swap_pressure.py [OUT.json]   (root, Linux; default bench/results/swap_cpu.json)
The swap file is temporary (.comfy/swapfile) and always removed, also on failure."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from comfy_server import ComfyServer, api_prompt_from_ui_workflow, cached_checkpoint, prepare_base_dir, without_viking  # noqa: E402
from memory_probe import status_kib  # noqa: E402

SYS_PIDFD_OPEN, SYS_PROCESS_MADVISE, MADV_PAGEOUT = 434, 440, 21  # x86_64
libc = ctypes.CDLL(None, use_errno=True)


class SwapUnavailable(RuntimeError):
    pass


def is_active_swap(path: Path) -> bool:
    """Whether the kernel swaps to this very file now (by its absolute path, so another
    checkout's swap file on the same kernel is not taken for this one)."""
    listed = Path("/proc/swaps").read_text().splitlines()[1:]
    return any(line.split()[0] == str(path.resolve()) for line in listed if line.split())


@contextlib.contextmanager
def temporary_swap(path: Path, size_mib: int):
    """A swap file for the block; raises SwapUnavailable (with the reason) where swapon is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A run killed mid-way (a timeout, a closed session) leaves its swap file on: take it off
    # first, or the kernel keeps swapping to a file that is no longer there.
    if is_active_swap(path):
        subprocess.run(["swapoff", str(path)], capture_output=True)
    path.unlink(missing_ok=True)
    try:
        subprocess.run(["fallocate", "-l", f"{size_mib}M", str(path)], check=True, capture_output=True)
        path.chmod(0o600)
        subprocess.run(["mkswap", str(path)], check=True, capture_output=True)
        done = subprocess.run(["swapon", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SwapUnavailable(f"swapon refused: {done.stderr.strip() or done.returncode}")
    except (OSError, subprocess.CalledProcessError) as error:
        path.unlink(missing_ok=True)
        raise SwapUnavailable(f"cannot make a swap file: {error}") from error
    try:
        yield path
    finally:
        subprocess.run(["swapoff", str(path)], capture_output=True)
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def temporary_zram(size_mib: int):
    """A compressed-RAM swap device for the block. Unlike a swap file, its writes complete at
    once, so MADV_PAGEOUT really evicts the pages (with a file, an idle kernel keeps them in
    the swap cache and the next access is only a minor fault)."""
    control = Path("/sys/class/zram-control/hot_add")
    if not control.exists():
        raise SwapUnavailable("no zram in this kernel (/sys/class/zram-control)")
    index = int(control.read_text())
    device = Path(f"/dev/zram{index}")
    try:
        Path(f"/sys/block/zram{index}/disksize").write_text(f"{size_mib}M")
        subprocess.run(["mkswap", str(device)], check=True, capture_output=True)
        done = subprocess.run(["swapon", "-p", "100", str(device)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SwapUnavailable(f"swapon refused: {done.stderr.strip()}")
        yield device
    except (OSError, subprocess.CalledProcessError) as error:
        raise SwapUnavailable(f"cannot set up zram: {error}") from error
    finally:
        subprocess.run(["swapoff", str(device)], capture_output=True)
        with contextlib.suppress(OSError):
            Path(f"/sys/block/zram{index}/reset").write_text("1")
            Path("/sys/class/zram-control/hot_remove").write_text(str(index))


def swap_counters() -> tuple[int, int]:
    fields = dict(line.split() for line in open("/proc/vmstat"))
    return int(fields["pswpin"]), int(fields["pswpout"])


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def page_out(pid: int) -> dict:
    """MADV_PAGEOUT on each private writable mapping of `pid`. Locked mappings answer EINVAL:
    the kernel will not page them out, which is the point."""
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    advised = refused = 0
    try:
        for line in open(f"/proc/{pid}/maps"):
            fields = line.split()
            if fields[1][1] != "w" or fields[1][3] != "p":
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            vec = Iovec(start, end - start)
            done = libc.syscall(SYS_PROCESS_MADVISE, pidfd, ctypes.byref(vec), 1, MADV_PAGEOUT, 0)
            if done < 0:
                refused += end - start
            else:
                advised += done
    finally:
        os.close(pidfd)
    return {"advised_bytes": advised, "refused_bytes": refused}


def faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of `pid` so far (/proc/PID/stat fields 10 and 12)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[9])


def with_seed(api: dict, seed: int) -> dict:
    api = json.loads(json.dumps(api))
    next(v for v in api.values() if v["class_type"] == "KSampler")["inputs"]["seed"] = seed
    return api


REPEATS = 3


def scenario(name: str, base: Path, pin: bool, version: str = "0.3.75") -> dict:
    ui = json.loads((REPO / "workflows" / "viking_pin_checkpoint.json").read_text())
    with ComfyServer(base, version=version) as server:
        api = api_prompt_from_ui_workflow(ui, server.object_info())
        api = api if pin else without_viking(api)
        server.run_prompt(with_seed(api, 1))  # load the model; it stays parked in RAM
        reps = []
        for seed in range(2, 2 + REPEATS):
            rss_before = status_kib("VmRSS", server.pid) * 1024
            paged = page_out(server.pid)
            time.sleep(0.5)
            swapped_process = status_kib("VmSwap", server.pid) * 1024
            owners = server.get("/viking/status")["owners"]
            swap_in_before, faults_before = swap_counters()[0], faults(server.pid)
            started = time.perf_counter()
            server.run_prompt(with_seed(api, seed))  # the next sampling run reads every UNet/VAE weight
            run_seconds = time.perf_counter() - started
            minor, major = (now - then for now, then in zip(faults(server.pid), faults_before))
            reps.append(dict(
                rss_before_pageout=rss_before, pageout=paged, process_swapped_bytes=swapped_process,
                weights_swapped_bytes=sum(o["swapped_bytes"] or 0 for o in owners) if owners else None,
                pinned_weights_swapped_bytes=sum(o["pinned_swapped_bytes"] or 0 for o in owners) if owners else None,
                swapped_in_during_next_run_bytes=(swap_counters()[0] - swap_in_before) * os.sysconf("SC_PAGE_SIZE"),
                page_faults_during_next_run=minor + major, major_faults_during_next_run=major,
                next_run_seconds=round(run_seconds, 3),
            ))
        pinned = server.get("/viking/status")["pinned_bytes"]
    median = {key: statistics.median(r[key] for r in reps) for key in reps[0]
              if isinstance(reps[0][key], (int, float)) and not isinstance(reps[0][key], bool)}
    refused = min(r["pageout"]["refused_bytes"] for r in reps)
    worst_pinned_swapped = max(r["pinned_weights_swapped_bytes"] or 0 for r in reps) if pin else None
    return dict(scenario=name, pinned_bytes=pinned, pageout_refused_bytes_min=refused,
                pinned_weights_swapped_bytes_max=worst_pinned_swapped, median=median, repetitions=reps)


def measure(workdir: Path, version: str = "0.3.75") -> dict:
    checkpoint = cached_checkpoint()
    base = prepare_base_dir(workdir / "swap", checkpoint=checkpoint, custom_nodes={"viking_engine": REPO})
    rows = []
    for device, make in (("swap file", lambda: temporary_swap(REPO / ".comfy" / "swapfile", 4096)),
                         ("zram", lambda: temporary_zram(4096))):
        with make():
            for name, pin in (("unpinned", False), ("viking", True)):
                rows.append(dict(scenario(name, base, pin=pin, version=version), swap_device=device))
    ratios = {}
    for device in ("swap file", "zram"):
        plain, viking = (next(r for r in rows if r["swap_device"] == device and r["scenario"] == s) for s in ("unpinned", "viking"))
        ratios[device] = dict(
            process_swapped_unpinned_over_viking=round(plain["median"]["process_swapped_bytes"] / max(1, viking["median"]["process_swapped_bytes"]), 2),
            next_run_seconds_unpinned_over_viking=round(plain["median"]["next_run_seconds"] / viking["median"]["next_run_seconds"], 2),
            page_faults_unpinned_over_viking=round(plain["median"]["page_faults_during_next_run"] / max(1, viking["median"]["page_faults_during_next_run"]), 2),
        )
    return dict(bench="swap_pressure", date=time.strftime("%Y-%m-%d"), kernel=os.uname().release, backend="os-lock", comfyui=version,
                checkpoint_bytes=checkpoint.stat().st_size, scenarios=rows, ratios=ratios)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results" / "swap_cpu.json"
    import tempfile
    with tempfile.TemporaryDirectory() as scratch:
        result = measure(Path(scratch))
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
