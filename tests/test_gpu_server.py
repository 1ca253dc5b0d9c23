"""A real ComfyUI server on a CUDA GPU (skipped, with the reason, elsewhere), per ComfyUI version
(0.3.75; 0.33 with --disable-dynamic-vram, and 0.33 in its default dynamic VRAM mode, where
Viking governs ComfyUI's staging), VRAM held down so the model streams: the example
low-VRAM workflow with the pin nodes, a LoRA and a hook LoRA, then /free cycles.
bench/gpu_server.py does the work and the checks: images bit-identical to ComfyUI alone, no CUDA
error / "Pin error" / "Tried to unpin" in the log, every registration released after /free, RSS
flat. With VIKING_GPU_RESULTS=DIR the result files are kept there (bench/results/ figures)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from comfy_server import REPO_ROOT


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


pytestmark = pytest.mark.skipif(not _cuda(), reason="no CUDA GPU on this machine: this runs on the GPU machine "
                                                    "(figures in bench/results/gpu_server_*.json)")


def results_dir(tmp_path) -> Path:
    return Path(os.environ.get("VIKING_GPU_RESULTS") or tmp_path)


def run_server_bench(comfy_env, tmp_path, name: str, *args: str):
    out = results_dir(tmp_path) / name
    run = subprocess.run([str(comfy_env.python), str(REPO_ROOT / "bench" / "gpu_server.py"), comfy_env.version, str(out), *args],
                         capture_output=True, text=True, timeout=1500)
    assert out.exists(), run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    failed = [c["what"] for c in result["checks"] if not c["ok"]]
    assert not failed and run.returncode == 0, failed or run.stderr[-3000:]


def test_real_server_on_gpu(comfy_env, tmp_path):
    run_server_bench(comfy_env, tmp_path, f"gpu_server_{comfy_env.version.replace('.', '_')}.json")


def test_real_server_dynamic_vram_on_gpu(comfy_env, tmp_path):
    if comfy_env.version == "0.3.75":
        pytest.skip("ComfyUI 0.3.75 has no dynamic VRAM mode")
    run_server_bench(comfy_env, tmp_path, f"gpu_server_{comfy_env.version.replace('.', '_')}_dynamic.json", "--dynamic")
