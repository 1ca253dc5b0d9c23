"""ComfyUI 0.33's dynamic VRAM mode on the CPU: residency, a truncated checkpoint, the budget
hand-over and the priority rule (tests/dynamic_check.py). The GPU side (a real dynamic server,
staging and timings) is bench/gpu_dynamic.py on the GPU machine."""

import pytest

from comfy_server import comfy_install
from conftest import run_checks


@pytest.mark.host("0.33")
def test_dynamic_mode_parts_without_a_gpu(tmp_path):
    run_checks(comfy_install("0.33"), "dynamic_check.py", tmp_path, expected=42)
