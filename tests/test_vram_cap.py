"""The per-model VRAM cap through ComfyUI's real model management (CPU here: ComfyUI's load
device is the CPU, but the partial-load path is the same): at each cap the weights ComfyUI
loads stay under it, and the forward pass gives the same bits as with no cap."""

import json
import subprocess
import sys

import pytest

from comfy_server import COMFY_DIR, REPO_ROOT


@pytest.mark.skipif(not (COMFY_DIR / "main.py").exists(), reason="no ComfyUI tree: run scripts/setup_env.sh")
def test_cap_holds_and_outputs_are_bit_identical(tmp_path):
    out = tmp_path / "cap.json"
    run = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "comfy_vram_cap.py"), str(COMFY_DIR), str(out), "--cpu"],
                         capture_output=True, text=True, timeout=600)
    assert out.exists(), run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"] and run.returncode == 0, result["rows"]
    for row in result["rows"]:
        assert 0 < row["loaded_bytes"] <= row["cap_gib"] * (1 << 30) < result["model_bytes"]
        assert row["streamed_bytes"] > 0 and row["identical"]
