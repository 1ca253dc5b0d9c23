"""The pins through a model's life in ComfyUI's real model management, in-process (CPU here, the
OS-lock backend): tests/lifecycle_check.py checks each stage and exits non-zero on any failure.
On a GPU machine the same script runs with the CUDA backend (see README, Measurements)."""

import json
import subprocess
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent


def test_pins_follow_load_unload_partial_load_and_drop(comfy_env, tmp_path):
    out = tmp_path / "lifecycle.json"
    run = subprocess.run([str(comfy_env.python), str(REPO / "tests" / "lifecycle_check.py"), str(comfy_env.tree), str(out), "--cpu"],
                         capture_output=True, text=True, timeout=600)
    assert out.exists(), run.stdout + run.stderr
    result = json.loads(out.read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed and run.returncode == 0, failed or run.stderr[-3000:]
    assert {s["stage"] for s in result["stages"]} >= {"pinned at rest", "full load", "unloaded", "partial load", "reloaded"}
    assert result["stages"][0]["pinned_bytes"] > 0
