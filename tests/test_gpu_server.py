"""A real ComfyUI server on a CUDA GPU (skipped, with the reason, elsewhere), per ComfyUI version
(0.3.75; 0.33 with --disable-dynamic-vram, and 0.33 in its default dynamic VRAM mode, where
Viking governs ComfyUI's staging), VRAM held down so the model streams: the example
low-VRAM workflow with the pin nodes, a LoRA and a hook LoRA, then /free cycles.
tests/gpu_server_check.py does the work and the checks: images bit-identical to ComfyUI alone, no CUDA
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
    run = subprocess.run([str(comfy_env.python), str(REPO_ROOT / "tests" / "gpu_server_check.py"), comfy_env.version, str(out), *args],
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


def gpu_memory_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_cpu_flag_beside_a_gpu_pins_with_the_os_lock_and_makes_no_cuda_context(comfy_version, tmp_path):
    """ComfyUI started with --cpu on a machine with a GPU: the Pin nodes' `auto` is the OS lock
    (ComfyUI computes on the CPU), no CUDA context appears on the GPU (a context alone takes
    hundreds of MiB there), and the status says CUDA was not opened."""
    from comfy_server import ComfyServer, api_prompt_from_ui_workflow, cached_checkpoint, prepare_base_dir

    base = prepare_base_dir(tmp_path / "base", checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO_ROOT})
    (base / "frontend").mkdir(exist_ok=True)  # the API is all this needs: no UI package on the GPU machine
    before = gpu_memory_used_mib()
    with ComfyServer(base, ["--front-end-root", str(base / "frontend")], version=comfy_version) as server:  # --cpu
        ui = json.loads((REPO_ROOT / "workflows" / "viking_pin_checkpoint.json").read_text())
        server.run_prompt(api_prompt_from_ui_workflow(ui, server.object_info()))
        status = server.get("/viking/status?probe_cuda=1")
        grew = gpu_memory_used_mib() - before
        backends = {name for owner in status["owners"] for name in owner["by_backend"]}
        print(f"\n--cpu beside a GPU, ComfyUI {comfy_version}: backends {backends}, GPU memory +{grew} MiB, "
              f"cuda status {status['cuda']}")
        out = results_dir(tmp_path) / f"gpu_cpu_flag_{comfy_version.replace('.', '_')}.json"
        out.write_text(json.dumps({"bench": "cpu_flag_beside_gpu", "comfy": comfy_version, "backends": sorted(backends),
                                   "gpu_memory_grew_mib": grew, "cuda": status["cuda"],
                                   "pinned_bytes": status["pinned_bytes"]}, indent=1))
        assert backends == {"os-lock"} and status["pinned_bytes"] > 300e6, status["owners"]
        assert not status["cuda"]["available"], status["cuda"]
        assert grew < 200, f"GPU memory grew by {grew} MiB: a CUDA context was made"


def test_cuda_pins_ignore_the_lock_limit_that_the_os_lock_keeps(tmp_path):
    """As a process without CAP_IPC_LOCK and an 8 MiB `ulimit -l` (a user, a default container):
    CUDA registers all of 256 MiB, the OS lock stays within the limit and names it
    (tests/memlock_check.py)."""
    import shutil
    import sys

    if not (shutil.which("setpriv") and shutil.which("prlimit")):
        pytest.skip("needs setpriv and prlimit (util-linux) to drop CAP_IPC_LOCK and set the limit")
    out = results_dir(tmp_path) / "gpu_memlock.json"
    run = subprocess.run(["prlimit", "--memlock=8388608:8388608", "setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock",
                          sys.executable, str(REPO_ROOT / "tests" / "memlock_check.py"), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert out.exists(), run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"], [c["what"] for c in result["checks"] if not c["ok"]]
