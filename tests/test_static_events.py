"""Events that move nothing cost no native reconcile, on each ComfyUI version's real
ModelPatcher; the skip never hides a replaced weight, pins another model took, or room another
model gave back; a quantized weight is walked as it is (tests/static_events_check.py)."""

from conftest import run_checks


def test_events_that_move_nothing_skip_the_native_reconcile(comfy_env):
    # Four more on 0.33: comfy-kitchen's QuantizedTensor weights walked as they are, and a streamed
    # quantized layer left to ComfyUI by prefetch and home.
    run_checks(comfy_env, "static_events_check.py", expected=24 if comfy_env.version == "0.33" else 18)
