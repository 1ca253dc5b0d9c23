"""The per-model VRAM cap through ComfyUI's real model management, on the CPU: ComfyUI's load
device is the CPU here, but its partial-load path is the same. What can be seen without a GPU:
at each cap the weights ComfyUI loads stay under it and the rest streams; after an unpin the
cap is gone with the model's record (before, it kept capping a model Viking no longer pinned).
Bit-identity of the outputs needs weights that really leave RAM: it is checked on the GPU
(tests/test_gpu_streaming.py runs the same bench there)."""

import json
import subprocess


from comfy_server import REPO_ROOT


def test_cap_holds_and_is_gone_after_unpin(comfy_env, tmp_path):
    out = tmp_path / "cap.json"
    run = subprocess.run([str(comfy_env.python), str(REPO_ROOT / "tests" / "vram_cap_check.py"), str(comfy_env.tree), str(out), "--cpu"],
                         capture_output=True, text=True, timeout=600)
    assert out.exists(), run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert run.returncode == 0, result["rows"]
    assert [row["cap_gib"] for row in result["rows"]] == [0.002, 0.005]
    for row in result["rows"]:
        assert 0 < row["loaded_bytes"] <= row["weights_cap_bytes"] < result["model_bytes"], row
        assert row["streamed_bytes"] == result["model_bytes"] - row["loaded_bytes"] > 0, row
        assert row["viking_pinned_bytes"] > 0, row
    assert result["after_unpin_loaded_bytes"] > max(r["weights_cap_bytes"] for r in result["rows"]), result
