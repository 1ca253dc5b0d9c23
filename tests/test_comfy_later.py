"""The seam against the shapes of ComfyUI after 0.33 (no whole tree of those releases can be run
here): small stand-ins that copy only the names the seam reads, each citing the file and commit of
Comfy-Org/ComfyUI it mirrors. The real 0.3.75 and 0.33 trees are what every other test runs."""
import sys
import types

import pytest

from comfy_node import comfy


@pytest.fixture
def model_management(monkeypatch):
    """A stand-in comfy.model_management module, put where the seam imports it from."""
    package = types.ModuleType("comfy")
    mm = types.ModuleType("comfy.model_management")
    memory = types.ModuleType("comfy.memory_management")
    memory.aimdo_enabled = True  # dynamic VRAM mode
    mm.CPUState = types.SimpleNamespace(CPU="cpu")
    mm.cpu_state = "gpu"
    mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY, mm.PINNED_MEMORY = 1 << 34, 0, {}
    package.model_management, package.memory_management = mm, memory
    for name, module in (("comfy", package), ("comfy.model_management", mm), ("comfy.memory_management", memory)):
        monkeypatch.setitem(sys.modules, name, module)
    yield mm
    comfy._partially_load_signature.cache_clear()  # what the seam cached from the stand-in goes with it


def test_0_33_shape_has_no_note(model_management):
    # model_management.py of 0.33.0 (0f1fa67): no FAST_PIN_SUBSETS.
    assert comfy.host().mode == "dynamic"
    assert not any("available RAM only" in note for note in comfy.host().notes)


def test_fast_disk_pin_budget_is_noted(model_management):
    # model_management.py at Comfy-Org/ComfyUI 02b2b38 (after PR 16333): FAST_PIN_SUBSETS, and
    # ensure_pin_budget compares available RAM only.
    model_management.FAST_PIN_SUBSETS = ["weights-fast", "patches-fast"]
    assert any("available RAM only" in note for note in comfy.host().notes)


def test_a_module_staged_under_the_fast_subset_counts_as_staged():
    # pinned_memory.py at Comfy-Org/ComfyUI 40bf8f7: module._pins[subset]["pin"], subsets
    # weights, weights-loaded and weights-fast (a fast-disk model's staged module).
    module = types.SimpleNamespace(_pins={"weights-fast": {"pin": object(), "registered": True}})
    assert comfy.staged(module)
    assert not comfy.staged(types.SimpleNamespace(_pins={"weights-fast": {"registered": False}}))
