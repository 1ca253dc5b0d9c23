"""ComfyUI 0.33's dynamic VRAM mode on the CPU: residency, a truncated checkpoint, the budget
hand-over and the priority rule (tests/dynamic_check.py). The GPU side (a real dynamic server,
staging and timings) is bench/gpu_dynamic.py on the GPU machine."""

import pytest

from comfy_server import comfy_install, comfy_unavailable
from conftest import run_checks


def test_dynamic_mode_parts_without_a_gpu(tmp_path):
    reason = comfy_unavailable("0.33")
    if reason:
        pytest.skip(reason)
    run_checks(comfy_install("0.33"), "dynamic_check.py", tmp_path, expected=38)
