"""One record per model (comfy_node/models.py) and one forget: tests/records_check.py drives a
real ModelPatcher of each ComfyUI version through every path that ends a model and checks that
nothing of it is left and its VRAM cap is gone (before: after an unpin the cap kept trimming
what ComfyUI loaded, and the cap tables kept the model)."""

import json
import subprocess

from conftest import TESTS


def test_every_ending_forgets_the_whole_model(comfy_env):
    run = subprocess.run([str(comfy_env.python), f"{TESTS}/records_check.py", str(comfy_env.tree)],
                         capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-3000:]
    checks = json.loads(run.stdout[run.stdout.index("{"):])
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed and run.returncode == 0, (failed, run.stderr[-2000:])
    assert len(checks) == 15
