"""The GPU paths of the pinned home and the prefetch, on a CUDA GPU (skipped, with the reason,
elsewhere): the same check scripts whose GPU figures are in bench/results/, at a small size.
- home_check.py: forward passes bit-identical to ComfyUI alone across load / partial unload /
  unload / LoRA load / reload; weights come home in their original storage; fallback cases.
- vram_cap_check.py: at each cap the weights stay under it, the prefetch ran (copies made along
  a recorded plan) and every output is bit-identical to the uncapped one.
- cast_buffers_check.py: ComfyUI 0.33's own streaming buffers, freed by the seam once the
  prefetch serves every streamed layer, and made again by ComfyUI after.
- prefetch_block_check.py: the prefetch's one block of device memory, with PyTorch's own
  allocator and with cudaMallocAsync: outputs bit-identical, one block a run, its memory back."""

import json
import os
from pathlib import Path
import subprocess
import sys
from types import SimpleNamespace

import pytest

from comfy_server import COMFY_DIR, REPO_ROOT, comfy_install
from conftest import run_checks


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


pytestmark = [
    pytest.mark.host("0.3.75"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA GPU on this machine: these paths run on the GPU machine "
                                           "(figures in bench/results/gpu_home*.json, gpu_vram_cap*.json)"),
]


def run_bench(script, out, *args):
    out = Path(os.environ["VIKING_GPU_RESULTS"]) / out.name if os.environ.get("VIKING_GPU_RESULTS") else out
    run = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / script), str(COMFY_DIR), str(out), *args],
                         capture_output=True, text=True, timeout=900)
    assert out.exists(), run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run


def test_pinned_home_on_gpu(tmp_path):
    result, run = run_bench("home_check.py", tmp_path / "gpu_home_correctness.json", "--parts", "correctness,fallback")
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed and run.returncode == 0, failed or run.stderr[-3000:]
    assert result["parts"]["correctness"]["stages_identical"] == result["parts"]["correctness"]["stages_compared"] > 0


def test_prefetch_under_a_cap_on_gpu(tmp_path):
    result, run = run_bench("vram_cap_check.py", tmp_path / "gpu_prefetch_cap_test.json", "--depth", "2", "--caps", "0.5,1",
                            "--modes", "comfy,viking", "--reps", "2")
    assert result["ok"] and run.returncode == 0, result["rows"]
    viking = [r for r in result["rows"] if r["mode"] == "viking"]
    assert viking and all(r["prefetch"]["copied_bytes"] > 0 and r["prefetch"]["failed"] is None for r in viking), viking


@pytest.mark.parametrize("allocator", ["native", "backend:cudaMallocAsync"])
def test_prefetch_block_on_gpu(allocator):
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if allocator != "native":
        env["PYTORCH_CUDA_ALLOC_CONF"] = allocator
    # This project's tree in the place of ComfyUI's: the check needs torch and comfy_node only.
    run_checks(SimpleNamespace(python=sys.executable, tree=REPO_ROOT), "prefetch_block_check.py", expected=8, env=env)


@pytest.mark.host("0.33")
def test_comfy_033_cast_buffers_released_on_gpu():
    run_checks(comfy_install("0.33"), "cast_buffers_check.py", expected=10)
