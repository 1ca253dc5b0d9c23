"""One record per model (comfy_node/models.py) and one forget: tests/records_check.py drives a
real ModelPatcher of each ComfyUI version through every path that ends a model and checks that
nothing of it is left and its VRAM cap is gone (before: after an unpin the cap kept trimming
what ComfyUI loaded, and the cap tables kept the model)."""

from conftest import run_checks


def test_every_ending_forgets_the_whole_model(comfy_env):
    run_checks(comfy_env, "records_check.py", expected=15)
