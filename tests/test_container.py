"""A real memory cgroup with a limit (what Docker, Kubernetes or a systemd MemoryMax= gives
ComfyUI): Viking reads the limit of its own cgroup, counts the cgroup's clean page cache as
available, pins within the limit, and gives pins back when the cgroup itself runs short. Needs a writable cgroup tree (root on Linux); skipped
with the reason elsewhere."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GIB = 1 << 30
LIMIT = 3 * GIB
GROW = 5 * GIB // 4  # leaves ~1.1 GiB of the cgroup: below its 1.5 GiB headroom

# Runs inside the cgroup: 1.5 GiB of clean page cache charged to it, then the status and a pin;
# then it takes argv[2] bytes more of the cgroup's memory.
CHILD = textwrap.dedent("""
    import json, os, sys, time, torch
    import viking_native as vn
    from comfy_node.weights import cpu_storage_ranges, module_tensors
    path = sys.argv[1]
    with open(path, "wb") as out:
        block = b"\\x01" * (64 << 20)
        for _ in range(24):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    with open(path, "rb") as cached:
        while cached.read(64 << 20):
            pass
    memory = json.loads(vn.status_json())["memory"]
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(4)])  # 256 MiB
    ranges, foreign = cpu_storage_ranges(module_tensors(model))
    report = json.loads(vn.reconcile(1, ranges, backend="os-lock", label="model", foreign=foreign))
    budget = json.loads(vn.status_json())["budget"]
    print(json.dumps(dict(memory=memory, report=report, budget=budget)), flush=True)
    # Then this process grows inside the cgroup until less than the headroom is left of it.
    grown = bytearray(int(sys.argv[2]))
    for i in range(0, len(grown), 4096):
        grown[i] = 1
    time.sleep(2.0)  # four rounds of the pressure monitor
    status = json.loads(vn.status_json())
    print(json.dumps(dict(pinned_bytes=status["pinned_bytes"], memory=status["memory"], events=status["events"])), flush=True)
""")


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


@pytest.fixture
def limited_cgroup():
    found = own_memory_cgroup()
    if not sys.platform.startswith("linux") or found is None or not found[1].is_dir():
        pytest.skip("no memory cgroup found for this process (Linux with cgroups only)")
    version, parent = found
    child = parent / f"viking_test_{os.getpid()}"
    try:
        child.mkdir()
        limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        (child / limit_file).write_text(str(LIMIT))
    except OSError as error:
        if child.is_dir():
            child.rmdir()
        pytest.skip(f"cannot make a memory cgroup with a limit here ({error}): needs root and a writable cgroup tree")
    try:  # cgroup v2 refuses processes in some places (the "no internal processes" rule)
        subprocess.run(["true"], preexec_fn=lambda: (child / "cgroup.procs").write_text(str(os.getpid())), check=True)
    except (subprocess.SubprocessError, OSError) as error:
        child.rmdir()
        pytest.skip(f"cannot move a process into a memory cgroup here ({error})")
    yield child
    try:
        child.rmdir()
    except OSError as error:  # an empty cgroup left behind harms nothing; say so
        print(f"could not remove {child}: {error}")


def test_pins_within_the_limit_of_its_own_cgroup(limited_cgroup, tmp_path):
    procs = limited_cgroup / "cgroup.procs"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "checkpoint.bin"), str(GROW)],
        preexec_fn=lambda: procs.write_text(str(os.getpid())),  # join the cgroup before exec
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert child.returncode == 0, child.stderr[-3000:]
    result, after_growth = (json.loads(line) for line in child.stdout.strip().splitlines()[-2:])
    memory, report, budget = result["memory"], result["report"], result["budget"]
    print(f"\ncgroup limit {LIMIT / GIB:.1f} GiB: available {memory['available_ram'] / GIB:.2f} GiB with 1.5 GiB of page cache; budget {budget['limit_bytes'] / GIB:.2f} GiB ({budget['reason']})")
    assert memory["container_limit"] == LIMIT, memory
    # The 1.5 GiB of page cache charged to the cgroup counts as available: what is left is the
    # limit less Python, torch and the model (well under 1.5 GiB), not less the cache too.
    assert LIMIT - 1.5 * GIB < memory["available_ram"] <= LIMIT, memory
    # Auto headroom on a 3 GiB container: half of it; the 256 MiB model pins within the rest.
    assert budget["headroom_bytes"] == LIMIT // 2 and budget["limit_bytes"] <= LIMIT - LIMIT // 2, budget
    assert report["pinned_bytes"] == report["wanted_bytes"] == 256 << 20, report
    assert not any(term == "pressure" for term, _ in budget["terms"]), budget

    # Pressure inside the container (the machine itself has plenty free): the monitor sees it
    # through the cgroup and gives the pins back, so the kernel can reclaim within the limit.
    assert after_growth["memory"]["available_ram"] < LIMIT // 2, after_growth["memory"]
    print(f"after growing by {GROW / GIB:.2f} GiB: {after_growth['memory']['available_ram'] / GIB:.2f} GiB available, "
          f"{after_growth['pinned_bytes']} bytes pinned")
    assert after_growth["pinned_bytes"] == 0, after_growth
    assert any("memory pressure: released" in e for e in after_growth["events"]), after_growth["events"]
