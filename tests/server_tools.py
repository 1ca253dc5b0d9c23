"""What the real-server GPU benches share (tests/gpu_server_check.py, bench/gpu_dynamic.py): a process
holding VRAM down, a prompt's run time from ComfyUI's own timestamps, the process's memory, a
file's page cache dropped, and the log lines that must never appear (tests/container_check.py
uses the cache drop too)."""

import json
import os
import subprocess
import sys
from pathlib import Path


def drop_file_cache(path: Path):
    """Drops the file's clean pages from the page cache (charged to whoever read them last):
    the next read charges them to the reader's cgroup and comes from storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


BAD_LOG_LINES = ("Pin error", "Tried to unpin", "CUDA error", "Traceback", "cudaError", "invalid argument")


def hold_vram(keep_free_gib):
    """A process that allocates all but `keep_free_gib` of the GPU's free memory and waits
    (ComfyUI puts a model straight into VRAM when it fits in what is free). Returns it and the
    bytes it holds; hold_more() makes it take more; kill() it to give them back."""
    # PyTorch rounds a request of 1-10 MiB up to a 20 MiB segment: hold_more() gives back a
    # 64 MiB block and takes 64 MiB + n in one piece instead (rounded to 2 MiB only).
    spare = 64 << 20
    code = ("import sys, torch; free, _ = torch.cuda.mem_get_info(); "
            f"hold = [torch.empty(max(0, free - int({keep_free_gib} * 2**30) - {spare}), dtype=torch.uint8, device='cuda'), "
            f"torch.empty({spare}, dtype=torch.uint8, device='cuda')]; "
            "print('held', sum(t.numel() for t in hold), flush=True)\n"
            "for line in sys.stdin:\n"
            "    size = hold.pop().numel() + int(line); torch.cuda.empty_cache()\n"
            "    hold.append(torch.empty(size, dtype=torch.uint8, device='cuda')); print('held', int(line), flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    return proc, int(line.split()[1])


def hold_more(holder, nbytes: int) -> int:
    """The holding process takes `nbytes` more of VRAM (in its own context, made already)."""
    holder.stdin.write(f"{int(nbytes)}\n")
    holder.stdin.flush()
    return int(holder.stdout.readline().split()[1])


def status_bytes(pid, field):
    """A kB field of /proc/PID/status (VmRSS, VmHWM, VmLck), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def run_seconds(entry):
    """Seconds from execution_start to execution_success of one prompt (ComfyUI's timestamps)."""
    stamps = {kind: msg.get("timestamp") for kind, msg in entry["status"].get("messages", [])}
    start, end = stamps.get("execution_start"), stamps.get("execution_success")
    return round((end - start) / 1000, 3) if start and end else None


def bad_lines(log_text):
    """The lines that must never appear, from the first prompt on (a start-up traceback is an
    optional ComfyUI node pack failing to import, not a fault), each with the 6 lines after it."""
    lines = log_text.splitlines()
    first = next((i for i, line in enumerate(lines) if "got prompt" in line), len(lines))
    return [" | ".join(lines[i:i + 7]) for i in range(first, len(lines)) if any(bad in lines[i] for bad in BAD_LOG_LINES)][:10]


class Results:
    """A bench's result file: named checks and figures, saved after each step so that a later
    failure keeps what was measured. `data` is the JSON object."""

    def __init__(self, path, **fields):
        self.path, self.data = Path(path), dict(fields, checks=[])

    def check(self, ok, what):
        self.data["checks"].append({"ok": bool(ok), "what": what})
        print(("ok   " if ok else "FAIL ") + what, flush=True)

    def save(self):
        self.data["ok"] = all(c["ok"] for c in self.data["checks"])
        self.path.write_text(json.dumps(self.data, indent=1))
