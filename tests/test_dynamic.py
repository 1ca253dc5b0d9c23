"""ComfyUI 0.33's dynamic VRAM mode on the CPU: residency, a truncated checkpoint, the budget
hand-over and the priority rule (tests/dynamic_check.py). The GPU side (a real dynamic server,
staging and timings) is bench/gpu_dynamic.py on the GPU machine."""

import json
import subprocess

import pytest

from comfy_server import comfy_install, comfy_unavailable
from conftest import TESTS


def test_dynamic_mode_parts_without_a_gpu(tmp_path):
    reason = comfy_unavailable("0.33")
    if reason:
        pytest.skip(reason)
    install = comfy_install("0.33")
    run = subprocess.run([str(install.python), f"{TESTS}/dynamic_check.py", str(install.tree), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert "{" in run.stdout, run.stderr[-3000:]
    checks = json.loads(run.stdout[run.stdout.index("{"):])
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed and run.returncode == 0, (failed, run.stderr[-2000:])
    assert len(checks) == 34, checks
