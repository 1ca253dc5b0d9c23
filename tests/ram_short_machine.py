"""The machine Viking is for, made for real on a bigger one: short of RAM, swapping, a desktop
beside ComfyUI, the models on a slow disk. bench/ram_short.py runs ComfyUI in it;
tests/test_ram_short.py checks that it works.

- A memory cgroup (a child of this process's own, v1 or v2) whose limit stands for the RAM of a
  named machine (`PROFILES`, `scaled_machine`): the model set fits, the model set and the
  neighbour (tests/neighbour.py) do not.
- A swap file, made here and removed after (where swapon is refused: none, and the reason).
- The model files' disk throttled to a hard disk's or a SATA SSD's read speed with the blkio
  (v1) or io (v2) controller, where the kernel allows it; else None and the reason.
- Pressure stall information (PSI) of exactly the processes inside: on a v2 machine the memory
  cgroup's own memory.pressure; on a v1 machine a child of this process's cgroup in the unified
  (v2) tree, where the kernel tracks PSI per cgroup whatever the controllers; else the
  machine-wide /proc/pressure/memory, said in `psi_source`.

Every process the machine starts joins all of its cgroups before it execs (`command()` wraps a
command line, `join` is a preexec_fn). Needs root on Linux; `Unavailable` says why not."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from memory_cgroup import Unavailable, own_memory_cgroup
from swap_pressure import SwapUnavailable, temporary_swap

GIB = 1 << 30
MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
DISK_SPEEDS = {"hdd": 150_000_000, "ssd": 500_000_000}  # read bytes/s of a hard disk and a SATA SSD


# ---- the profiles and the scale rule (pure) ---------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """A machine people run ComfyUI on: its RAM, the model set such a machine runs, the desktop
    beside it (a browser and the desktop: a working set kept hot, bursts now and then), and its
    swap."""
    name: str
    ram_bytes: int
    models_bytes: int
    models: str
    hot_bytes: int
    burst_bytes: int
    swap_bytes: int


# The desktop: an OS with its desktop session (2-3 GB) and a browser with a few tabs (2-4 GB).
# With it the 16gb machine is 19% short (12.1 + 5 + 2 against 16 GiB), the 32gb one 14%.
PROFILES = {
    "16gb": Profile("16gb", 16 * GIB, int(12.1 * GIB), "SDXL base + refiner, fp16 checkpoints (6.9 + 6.1 GB)",
                    hot_bytes=5 * GIB, burst_bytes=2 * GIB, swap_bytes=8 * GIB),
    "32gb": Profile("32gb", 32 * GIB, int(26.6 * GIB), "Wan 2.2 A14B's two experts, fp8 (14.3 GB each)",
                    hot_bytes=7 * GIB, burst_bytes=3 * GIB, swap_bytes=16 * GIB),
}

SCALE_RULE = (
    "scale = model set here / the profile's model set, where the model set here is the bytes the "
    "server holds of both checkpoints (their file bytes; x1.5 with --cpu, where ComfyUI holds "
    "most fp16 weights as fp32: ComfyUI 0.3.75 --cpu held 1.57x the files' bytes with both models "
    "loaded); memory limit = the idle server's RSS (measured, not "
    "scaled: the Python and torch runtime) + scale x the profile's RAM; the neighbour's working set, "
    "its bursts and the swap file = scale x the profile's. Then the model set fits (the profile's "
    "models are below its RAM) and the model set with the neighbour's working set and a burst does "
    "not (they are above it).")


@dataclass(frozen=True)
class Machine:
    """What a profile comes to for a model set: the sizes the bench uses."""
    profile: str
    scale: float
    memory_limit_bytes: int
    hot_bytes: int
    burst_bytes: int
    swap_bytes: int
    model_set_bytes: int
    server_base_bytes: int

    def model_set_fits(self) -> bool:
        return self.server_base_bytes + self.model_set_bytes <= self.memory_limit_bytes

    def neighbour_does_not_fit(self) -> bool:
        return self.server_base_bytes + self.model_set_bytes + self.hot_bytes + self.burst_bytes > self.memory_limit_bytes


CPU_HOLD_FACTOR = 1.5  # measured: 0.3.75 --cpu, both synthetic checkpoints loaded: RSS +1397 MiB for 887 MiB of files


def model_set_bytes(checkpoint_bytes: list[int], cpu: bool) -> int:
    """What the server holds of the checkpoints: their weights, most of them as fp32 with --cpu."""
    return int(sum(checkpoint_bytes) * (CPU_HOLD_FACTOR if cpu else 1))


def scaled_machine(profile: Profile, model_set: int, server_base: int) -> Machine:
    """The profile scaled to a model set of `model_set` bytes (SCALE_RULE)."""
    scale = model_set / profile.models_bytes
    pages = lambda nbytes: int(nbytes) // PAGE * PAGE  # noqa: E731
    return Machine(profile=profile.name, scale=round(scale, 5),
                   memory_limit_bytes=pages(server_base + scale * profile.ram_bytes),
                   hot_bytes=pages(scale * profile.hot_bytes), burst_bytes=pages(scale * profile.burst_bytes),
                   swap_bytes=pages(scale * profile.swap_bytes) // MIB * MIB,
                   model_set_bytes=model_set, server_base_bytes=server_base)


# ---- reading the kernel's counters --------------------------------------------------------------
def psi_totals(path: Path) -> dict:
    """{"some": us, "full": us} from a PSI file (memory.pressure, /proc/pressure/memory)."""
    totals = {}
    for line in path.read_text().splitlines():
        kind, *fields = line.split()
        totals[kind] = int(dict(f.split("=") for f in fields)["total"])
    return totals


def key_values(path: Path) -> dict:
    """A "key value" file (memory.stat, memory.oom_control, memory.events, /proc/vmstat)."""
    return {k: int(v) for k, v in (line.split()[:2] for line in path.read_text().splitlines() if len(line.split()) >= 2)}


def process_read_bytes(pid: int) -> int | None:
    """Bytes `pid` made the kernel fetch from storage (/proc/PID/io read_bytes), or None once it has gone."""
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split(":")[1]) for line in lines if line.startswith("read_bytes:")), None)


def status_bytes(pid: int, field: str) -> int | None:
    """A kB field of /proc/PID/status (VmRSS, VmSwap, VmLck) in bytes, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


def block_device_of(path: Path) -> tuple[str, str]:
    """("MAJ:MIN", name) of the whole disk a file lives on (the throttles take disks, not
    partitions)."""
    dev = os.stat(path).st_dev
    number = f"{os.major(dev)}:{os.minor(dev)}"
    sysfs = Path("/sys/dev/block") / number
    if not sysfs.exists():
        raise Unavailable(f"{path} is on device {number}, which is no block device (a network or virtual file system)")
    sysfs = sysfs.resolve()
    if (sysfs / "partition").exists():
        sysfs = sysfs.parent
    return (sysfs / "dev").read_text().strip(), sysfs.name


# ---- the machine --------------------------------------------------------------------------------
class RamShortMachine:
    """The cgroups, the swap file and the disk throttle, for a `with` block. `limit_bytes` may be
    set later (`set_limit`); until then the memory cgroup has no limit."""

    def __init__(self, name: str, swap_file: Path, swap_bytes: int, disk: str | None, model_files: list[Path]):
        self.name = f"{name}_{os.getpid()}"
        self.swap_file, self.swap_bytes = Path(swap_file), swap_bytes
        self.disk, self.model_files = disk, [Path(f) for f in model_files]
        self.memory = self.unified = self.blkio = None
        self.memory_version = None
        self.disk_read_limit = None          # bytes/s, or None with the reason:
        self.disk_read_limit_reason = None
        self.disk_device = None
        self.psi_source = None
        self.swap_source = None
        self.swap_reason = None              # why there is no swap file (swap_bytes is then 0)
        self._stack = contextlib.ExitStack()

    # -- set-up and tear-down
    def __enter__(self):
        if not sys.platform.startswith("linux"):
            raise Unavailable("Linux only (memory cgroups, swapon, /proc)")
        if os.geteuid() != 0:
            raise Unavailable("needs root (cgroups, swapon)")
        try:
            self._make_memory_cgroup()
            self._make_swap()
            self._make_psi_cgroup()
            self._make_disk_throttle()
            self._check_join()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def _make_directory(self, path: Path):
        path.mkdir()

        def remove():
            self.kill_all(path)
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)
            print(f"could not remove {path}", flush=True)
        self._stack.callback(remove)
        return path

    def _make_memory_cgroup(self):
        found = own_memory_cgroup()
        if found is None or not found[1].is_dir():
            raise Unavailable("no memory cgroup found for this process")
        self.memory_version, parent = found
        try:
            self.memory = self._make_directory(parent / self.name)
        except OSError as error:
            raise Unavailable(f"cannot make a memory cgroup under {parent} ({error})") from error
        if self.memory_version == "v2":
            self.unified = self.memory  # v2: PSI of the memory cgroup itself
            self.psi_source = "the memory cgroup's memory.pressure (v2)"
            stat = key_values(self.memory / "memory.stat")
            self.swap_source = ("the memory cgroup's memory.stat pswpin/pswpout" if "pswpin" in stat
                                else "system-wide /proc/vmstat pswpin/pswpout (this kernel's memory.stat has none)")
        else:
            self.swap_source = ("system-wide /proc/vmstat pswpin/pswpout (a v1 memory cgroup counts no swap traffic; "
                                "the cgroup's swap in use is memory.stat's swap)")

    def _make_psi_cgroup(self):
        if self.unified is not None:
            return
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and controllers == "":
                parent = Path("/sys/fs/cgroup/unified") / path.lstrip("/")
                if (parent / "cgroup.procs").exists():
                    try:
                        self.unified = self._make_directory(parent / self.name)
                    except OSError as error:
                        self.psi_source = f"system-wide /proc/pressure/memory (no cgroup in the unified tree: {error})"
                        return
                    if (self.unified / "memory.pressure").exists():
                        self.psi_source = "a cgroup of the unified (v2) tree holding the same processes: its memory.pressure"
                        return
                    self.psi_source = "system-wide /proc/pressure/memory (the unified tree has no memory.pressure)"
                    return
        self.psi_source = "system-wide /proc/pressure/memory (no unified cgroup tree)"

    def _make_swap(self):
        # tests/swap_pressure.py's swap file (a stale one from a killed run is taken off first).
        try:
            self._stack.enter_context(temporary_swap(self.swap_file.resolve(), self.swap_bytes >> 20))
        except SwapUnavailable as error:
            # A container may refuse swapon: the machine then runs without swap and says so.
            self.swap_reason = f"no swap file: cannot make one at {self.swap_file.resolve()} ({error})"
            self.swap_bytes = 0

    def _make_disk_throttle(self):
        if self.disk is None:
            self.disk_read_limit_reason = "not asked for (--disk none)"
            return
        speed = DISK_SPEEDS[self.disk]
        try:
            number, name = block_device_of(self.model_files[0])
        except Unavailable as why:
            self.disk_read_limit_reason = str(why)
            return
        self.disk_device = f"{name} ({number})"
        if self.memory_version == "v2":
            controllers = (self.memory.parent / "cgroup.subtree_control").read_text().split()
            if "io" not in controllers:
                self.disk_read_limit_reason = "the io controller is not enabled for this cgroup's children (v2)"
                return
            target, rule = self.memory / "io.max", f"{number} rbps={speed}"
        else:
            root = Path("/sys/fs/cgroup/blkio")
            own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                        if "blkio" in line.split(":", 2)[1].split(",")), None)
            if own is None or not (root / own.lstrip("/") / "blkio.throttle.read_bps_device").exists():
                self.disk_read_limit_reason = "no blkio controller with throttling (v1)"
                return
            try:
                self.blkio = self._make_directory(root / own.lstrip("/") / self.name)
            except OSError as error:
                self.disk_read_limit_reason = f"cannot make a blkio cgroup ({error})"
                return
            target, rule = self.blkio / "blkio.throttle.read_bps_device", f"{number} {speed}"
        try:
            target.write_text(rule)
        except OSError as error:
            self.disk_read_limit_reason = f"the kernel refused the read limit {rule!r} ({error})"
            return
        self.disk_read_limit = speed

    def _check_join(self):
        try:  # v2 refuses processes in some places (the "no internal processes" rule)
            subprocess.run(self.command(["true"]), check=True, capture_output=True)
        except (subprocess.SubprocessError, OSError) as error:
            raise Unavailable(f"cannot move a process into the bench's cgroups ({error})") from error

    # -- processes
    def cgroups(self) -> list[Path]:
        """Every cgroup a process of the machine joins."""
        return [p for p in dict.fromkeys((self.memory, self.unified, self.blkio)) if p is not None]

    def join(self):
        """A preexec_fn: the child joins every cgroup before it execs, so all it touches is
        charged, throttled and counted there."""
        for cgroup in self.cgroups():
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run through a shell that joins the cgroups and then execs it (same pid), for
        code that starts its own processes (tests/comfy_server.py's ComfyServer)."""
        joins = "; ".join(f"echo $$ > {shlex.quote(str(c / 'cgroup.procs'))}" for c in self.cgroups())
        return ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh", *map(str, argv)]

    def pids(self) -> list[int]:
        return [int(p) for p in (self.memory / "cgroup.procs").read_text().split()]

    @staticmethod
    def kill_all(cgroup: Path):
        """Ends what is still inside (a process of ours the bench could not stop)."""
        try:
            pids = (cgroup / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)

    # -- the limit and the counters
    def set_limit(self, limit_bytes: int | None):
        """The memory cgroup's limit (None: none). Swap stays unlimited (v1: memsw is not set)."""
        name = "memory.limit_in_bytes" if self.memory_version == "v1" else "memory.max"
        value = ("-1" if self.memory_version == "v1" else "max") if limit_bytes is None else str(int(limit_bytes))
        (self.memory / name).write_text(value)

    def reset_peaks(self):
        """Restarts the peak usage counter (v1; v2's memory.peak cannot be reset before 6.12)."""
        with contextlib.suppress(OSError):
            (self.memory / ("memory.max_usage_in_bytes" if self.memory_version == "v1" else "memory.peak")).write_text("0")

    def counters(self) -> dict:
        """The running totals a run's figures are differences of."""
        stat = key_values(self.memory / "memory.stat")
        if "pswpin" in stat:
            swap_in, swap_out = stat["pswpin"], stat["pswpout"]
        else:
            vmstat = key_values(Path("/proc/vmstat"))
            swap_in, swap_out = vmstat["pswpin"], vmstat["pswpout"]
        events = self.memory / ("memory.oom_control" if self.memory_version == "v1" else "memory.events")
        psi_file = self.unified / "memory.pressure" if self.unified is not None and (self.unified / "memory.pressure").exists() \
            else Path("/proc/pressure/memory")
        psi = psi_totals(psi_file) if psi_file.exists() else {}
        return dict(swap_in_bytes=swap_in * PAGE, swap_out_bytes=swap_out * PAGE, oom_kills=key_values(events).get("oom_kill", 0),
                    psi_some_us=psi.get("some"), psi_full_us=psi.get("full"))

    def sample(self) -> dict:
        """What the cgroup holds now: usage, swap in use (v1 memory.stat swap; v2 memory.swap.current)."""
        if self.memory_version == "v1":
            stat = key_values(self.memory / "memory.stat")
            return dict(usage_bytes=int((self.memory / "memory.usage_in_bytes").read_text()), swap_bytes=stat.get("swap", 0))
        swap_file = self.memory / "memory.swap.current"
        return dict(usage_bytes=int((self.memory / "memory.current").read_text()),
                    swap_bytes=int(swap_file.read_text()) if swap_file.exists() else 0)

    def peak_usage_bytes(self) -> int | None:
        name = "memory.max_usage_in_bytes" if self.memory_version == "v1" else "memory.peak"
        path = self.memory / name
        return int(path.read_text()) if path.exists() else None

    def drop_model_cache(self):
        """Drops the model files' clean pages from the page cache: the next read comes from the disk."""
        for path in self.model_files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def remove_stale_swap_files(folder: Path):
    """Swap files named ram_short_PID.swap in `folder` whose bench (PID) has gone (killed before it
    could clean up): swapped off and deleted. Another bench's live one is left alone."""
    active = {line.split()[0] for line in Path("/proc/swaps").read_text().splitlines()[1:] if line.split()}
    for path in Path(folder).glob("ram_short_*.swap"):
        pid = path.stem.rsplit("_", 1)[1]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        if str(path.resolve()) in active:
            subprocess.run(["swapoff", str(path.resolve())], capture_output=True)
        path.unlink(missing_ok=True)


def differences(before: dict, after: dict) -> dict:
    return {k: (after[k] - before[k] if after.get(k) is not None and before.get(k) is not None else None) for k in before}


# ---- the neighbour --------------------------------------------------------------------------------
class Neighbour:
    """tests/neighbour.py as a process inside the machine. `burst()` asks for a burst and waits
    until its block is freed again; `stop()` returns its record (with `killed`)."""

    def __init__(self, machine: RamShortMachine, hot_bytes: int, burst_bytes: int, record: Path,
                 burst_every: str = "20,30", burst_hold: float = 1.0, period: float = 0.1, seed: int = 0):
        self.record = Path(record)
        self.record.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("neighbour.py")), "--hot-bytes", str(hot_bytes),
             "--burst-bytes", str(burst_bytes), "--record", str(record), "--burst-every", burst_every,
             "--burst-hold", str(burst_hold), "--period", str(period), "--seed", str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=machine.join)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the neighbour did not start (it said {line!r}, exit {self.proc.wait()})")

    @property
    def pid(self):
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def burst(self, timeout: float = 300) -> float | None:
        """Seconds the asked burst took (allocate, touch, hold, free), or None if the neighbour is gone."""
        if not self.alive():
            return None
        try:
            self.proc.stdin.write("burst\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                return None
            if line.startswith("burst done"):
                return float(line.split()[2])
        return None

    def stop(self, timeout: float = 60) -> dict:
        if self.alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        record = {}
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(self.record.read_text())
        return dict(record, exit_code=code, killed=code == -9)


# ---- the workload's schedule and the bar (pure) ---------------------------------------------------
KINDS = ("first", "warm", "after_switch", "after_burst", "after_free")

# Which model each prompt samples and what comes before it: two models taking turns, a burst of
# the neighbour, a /free. The first six prompts have every kind; longer runs go round again.
_OPENING = [("base", "first"), ("base", "warm"), ("refiner", "after_switch"), ("refiner", "after_burst"),
            ("refiner", "after_free"), ("base", "after_switch")]
_ROUND = [("base", "warm"), ("refiner", "after_switch"), ("refiner", "warm"), ("base", "after_switch"),
          ("base", "after_burst"), ("refiner", "after_switch"), ("refiner", "after_free"), ("base", "after_switch")]


def schedule(prompts: int) -> list[tuple[str, str]]:
    """(model, kind) of each of `prompts` prompts: "after_burst" follows a burst of the
    neighbour, "after_free" a POST /free, "after_switch" a prompt of the other model."""
    steps = list(_OPENING)
    while len(steps) < prompts:
        steps += _ROUND
    return steps[:prompts]


SLOWER_BAR = 1.0            # no kind of prompt slower than ComfyUI alone
FASTER_BAR = 0.5            # after a switch or a burst: 2x faster where ComfyUI alone swaps or re-reads
NEIGHBOUR_P95_BAR = 1.10    # the neighbour's p95 touch latency at most 10% above alone's
SWAP_IN_SIGNIFICANT = 16 * MIB


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def seconds_by_kind(run: dict) -> dict:
    """The median seconds of each kind of prompt of a run."""
    kinds = {}
    for prompt in run.get("prompts", []):
        kinds.setdefault(prompt["kind"], []).append(prompt.get("seconds"))
    return {kind: median(values) for kind, values in kinds.items()}


def alone_swaps_or_rereads(alone: dict, model_files_bytes: int) -> bool:
    """Whether ComfyUI alone swapped its memory in again or read its model files more than once."""
    return (alone.get("swap_in_bytes") or 0) >= SWAP_IN_SIGNIFICANT or (alone.get("file_read_bytes") or 0) > model_files_bytes


def _check(what: str, value, bar: str, ok) -> dict:
    return dict(what=what, value=value, bar=bar, ok=bool(ok) if value is not None else False)


def _ratio(numerator, denominator):
    return round(numerator / denominator, 3) if numerator is not None and denominator else None


def verdict(alone: dict, run: dict, model_files_bytes: int) -> dict:
    """One mode against ComfyUI alone in the same run (issue 61's bar): each kind of prompt no
    slower; after a switch or a burst 2x faster where alone swaps or re-reads; no OOM kill alone
    does not have; the neighbour's p95 at most 10% above alone's; PSI full no higher."""
    checks, ratios = [], {}
    alone_kinds, kinds = seconds_by_kind(alone), seconds_by_kind(run)
    must_gain = alone_swaps_or_rereads(alone, model_files_bytes)
    for kind in KINDS:
        if kind not in kinds or kind not in alone_kinds:
            continue
        ratios[kind] = _ratio(kinds[kind], alone_kinds[kind])
        bar = FASTER_BAR if must_gain and kind in ("after_switch", "after_burst") else SLOWER_BAR
        checks.append(_check(f"{kind} prompt seconds / alone's", ratios[kind], f"<= {bar}",
                             ratios[kind] is not None and ratios[kind] <= bar))
    oom_run = (run.get("oom_kills") or 0) + bool(run.get("neighbour", {}).get("killed"))
    oom_alone = (alone.get("oom_kills") or 0) + bool(alone.get("neighbour", {}).get("killed"))
    checks.append(_check("OOM kills (cgroup's, with the neighbour's)", oom_run, f"<= alone's {oom_alone}", oom_run <= oom_alone))
    p95 = _ratio(run.get("neighbour", {}).get("p95_ms"), alone.get("neighbour", {}).get("p95_ms"))
    checks.append(_check("neighbour p95 touch latency / alone's", p95, f"<= {NEIGHBOUR_P95_BAR}", p95 is not None and p95 <= NEIGHBOUR_P95_BAR))
    full, full_alone = run.get("psi_full_us"), alone.get("psi_full_us")
    psi = _ratio(full, full_alone) if full_alone else (0.0 if full == 0 else None)
    checks.append(_check("PSI full stall time / alone's", psi if full_alone else full,
                         "<= 1.0" if full_alone else "alone stalled 0 us: 0 us",
                         full is not None and full_alone is not None and full <= full_alone))
    if run.get("error"):
        checks.append(_check("the run completed", run["error"], "no error", False))
    return dict(mode=run["mode"], comfy=run["comfy"], alone_swaps_or_rereads=must_gain, ratios=ratios,
                checks=checks, ok=all(c["ok"] for c in checks))


def hash_agreement(runs: list[dict]) -> dict:
    """Per ComfyUI (version and mode): whether every mode's image of each prompt is
    bit-identical to ComfyUI alone's, and the prompts where not."""
    by_comfy = {}
    for run in runs:
        by_comfy.setdefault(comfy_label(run["comfy"]), []).append(run)
    agreement = {}
    for label, group in by_comfy.items():
        reference = next((r for r in group if r["mode"] == "alone"), group[0])
        expected = {p["index"]: p.get("hash") for p in reference.get("prompts", [])}
        differing = [dict(mode=r["mode"], prompt=p["index"]) for r in group if r is not reference
                     for p in r.get("prompts", []) if p["index"] in expected and p.get("hash") != expected[p["index"]]]
        compared = sum(1 for r in group if r is not reference for p in r.get("prompts", []) if p["index"] in expected)
        agreement[label] = dict(identical=(not differing) if compared else None, compared=compared, differing=differing)
    return agreement


def comfy_label(comfy: dict) -> str:
    return f"{comfy['version']} {comfy['vram_mode']}"
