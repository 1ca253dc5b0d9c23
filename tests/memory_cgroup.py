"""A real memory cgroup with a limit, for a test or a bench: what Docker, Kubernetes or a systemd
`MemoryMax=` gives ComfyUI. Made under this process's own memory cgroup (v1 or v2); needs root
and a writable cgroup tree, else `Unavailable` says why (the callers skip with that reason)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path


class Unavailable(Exception):
    """No memory cgroup with a limit can be made here; the text says why."""


def own_memory_cgroup():
    """(version, directory) of this process's memory cgroup, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return "v1", Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            return "v2", Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


class LimitedCgroup:
    def __init__(self, path: Path):
        self.path = path

    def join(self):
        """For subprocess's preexec_fn: the child joins the cgroup before it execs, so all it
        touches (its heap, the page cache it reads) is charged there."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))


@contextlib.contextmanager
def limited_cgroup(limit_bytes: int, name: str):
    """A child cgroup of this process's own, limited to `limit_bytes`; removed afterwards."""
    found = own_memory_cgroup()
    if not sys.platform.startswith("linux") or found is None or not found[1].is_dir():
        raise Unavailable("no memory cgroup found for this process (Linux with cgroups only)")
    version, parent = found
    child = parent / f"{name}_{os.getpid()}"
    try:
        child.mkdir()
        (child / ("memory.limit_in_bytes" if version == "v1" else "memory.max")).write_text(str(limit_bytes))
    except OSError as error:
        if child.is_dir():
            child.rmdir()
        raise Unavailable(f"cannot make a memory cgroup with a limit here ({error}): needs root and a writable "
                          "cgroup tree") from error
    cgroup = LimitedCgroup(child)
    try:  # cgroup v2 refuses processes in some places (the "no internal processes" rule)
        subprocess.run(["true"], preexec_fn=cgroup.join, check=True)
    except (subprocess.SubprocessError, OSError) as error:
        child.rmdir()
        raise Unavailable(f"cannot move a process into a memory cgroup here ({error})") from error
    try:
        yield cgroup
    finally:
        try:
            child.rmdir()
        except OSError as error:  # an empty cgroup left behind harms nothing; say so
            print(f"could not remove {child}: {error}")
