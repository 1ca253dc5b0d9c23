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


def _ensure_pin_budget_0_33(size, evict_active=False, loaded=False):
    """model_management.py of 0.33.0 (0f1fa67), ensure_pin_budget reduced to the names it reads:
    the pin ceiling under --fast-disk, available RAM otherwise. Never called: the seam reads
    which names it uses."""
    if args.fast_disk:  # noqa: F821
        return TOTAL_PINNED_MEMORY + size <= MAX_PINNED_MEMORY  # noqa: F821
    return size <= psutil.virtual_memory().available  # noqa: F821


def _ensure_pin_budget_02b2b38(size, evict_active=False, loaded=False):
    """model_management.py at Comfy-Org/ComfyUI 02b2b38 (after PR 16333), reduced the same way:
    available RAM only, through comfy/system_memory.py."""
    return size + RAM_CACHE_HEADROOM <= system_memory.virtual_memory_available()  # noqa: F821


@pytest.fixture
def cli_args(monkeypatch):
    module = types.ModuleType("comfy.cli_args")
    module.args = types.SimpleNamespace(fast_disk=False)
    monkeypatch.setitem(sys.modules, "comfy.cli_args", module)
    return module.args


def _dynamic_note(mm):
    return next(note for note in comfy.host().notes if note.startswith("dynamic VRAM mode"))


@pytest.mark.parametrize("fast_disk", [False, True])
def test_the_ceilings_reach_follows_what_ensure_pin_budget_reads(model_management, cli_args, fast_disk):
    cli_args.fast_disk = fast_disk
    model_management.ensure_pin_budget = _ensure_pin_budget_0_33
    bounds_staging = "bounds the RAM its staging takes (--fast-disk)" in _dynamic_note(model_management)
    assert bounds_staging == fast_disk
    model_management.ensure_pin_budget = _ensure_pin_budget_02b2b38  # whatever the flag says
    assert "bounds its registrations" in _dynamic_note(model_management)


class _PinState(dict):
    """A dynamic patcher's pin state: {subset: (hostbuf, stack, stack_split, [registered bytes])}
    (model_patcher.py of 0.33.0, 0f1fa67, and at Comfy-Org/ComfyUI 08d0e51)."""

    def __init__(self, subsets, registered):
        super().__init__({name: (types.SimpleNamespace(size=registered.get(name, 0)), [], [-1],
                                 [registered.get(name, 0)]) for name in subsets})


class _Patcher033:
    """ModelPatcherDynamic's staging calls of 0.33.0 (0f1fa67): their signatures and defaults."""
    SUBSETS = ["weights-loaded", "patches-loaded", "weights", "patches"]

    def __init__(self, registered):
        self.load_device = "cuda:0"
        self.model = types.SimpleNamespace(dynamic_pins={"cuda:0": _PinState(self.SUBSETS, registered)})
        self.calls = []

    def pinned_memory_size(self):
        state = self.model.dynamic_pins[self.load_device]
        return sum(state[name][3][0] for name in self.SUBSETS if name.startswith("weights"))

    def unregister_inactive_pins(self, ram_to_unload, subsets=["weights-loaded", "patches-loaded", "weights", "patches"]):
        return 0

    def partially_unload_ram(self, ram_to_unload, subsets=["weights-loaded", "patches-loaded", "weights", "patches"]):
        self.calls.append((ram_to_unload, subsets))
        return ram_to_unload


class _Patcher08d0e51(_Patcher033):
    """The same at Comfy-Org/ComfyUI 08d0e51: "-fast" subsets, counted by pinned_memory_size and
    freed by partially_unload_ram, never unregistered by unregister_inactive_pins."""
    SUBSETS = ["weights-fast", "patches-fast", "weights-loaded", "patches-loaded", "weights", "patches"]

    def unregister_inactive_pins(self, ram_to_unload, subsets=["weights-loaded", "patches-loaded", "weights", "patches"]):
        return 0

    def partially_unload_ram(self, ram_to_unload, subsets=["weights-fast", "patches-fast", "weights-loaded",
                                                           "patches-loaded", "weights", "patches"]):
        self.calls.append((ram_to_unload, subsets))
        return ram_to_unload


class _PatcherWithoutSubsets(_Patcher033):
    """Another pack's patcher whose staging release takes no subsets (as some do)."""

    def partially_unload_ram(self, ram_to_unload):
        self.calls.append((ram_to_unload, None))
        return ram_to_unload


def test_fast_pins_that_comfyui_never_unregisters_do_not_keep_a_model_refusing():
    gib = 1 << 30
    later = _Patcher08d0e51({"weights-fast": 3 * gib, "weights": gib // 2})
    assert later.pinned_memory_size() == 3 * gib + gib // 2
    assert comfy.releasable_registrations(later) == gib // 2  # what unregister_inactive_pins can give
    assert comfy.releasable_registrations(_Patcher08d0e51({"weights-fast": 3 * gib})) == 0
    # 0.33: the same subsets unregister_inactive_pins acts on, patches included.
    assert comfy.releasable_registrations(_Patcher033({"weights": gib, "patches": 4096})) == gib + 4096


@pytest.mark.parametrize("patcher_class, expected", [
    (_Patcher033, ["weights-loaded", "weights"]),
    (_Patcher08d0e51, ["weights-fast", "weights-loaded", "weights"]),
    (_PatcherWithoutSubsets, None),
])
def test_a_models_own_limit_gives_back_staged_weights_not_patch_copies(patcher_class, expected):
    patcher = patcher_class({})
    assert comfy.drop_staging(patcher, 1 << 20) == 1 << 20
    assert patcher.calls == [(1 << 20, expected)]


def test_a_module_staged_under_the_fast_subset_counts_as_staged():
    # pinned_memory.py at Comfy-Org/ComfyUI 40bf8f7: module._pins[subset]["pin"], subsets
    # weights, weights-loaded and weights-fast (a fast-disk model's staged module).
    module = types.SimpleNamespace(_pins={"weights-fast": {"pin": object(), "registered": True}})
    assert comfy.staged(module)
    assert not comfy.staged(types.SimpleNamespace(_pins={"weights-fast": {"registered": False}}))


def test_a_fast_disk_model_is_named_as_one(cli_args):
    # 08d0e51: ops reads the pin state's "fast_disk", written at the model's first load from the
    # patcher's flag (storage.state_dict_fast_disk at 2d656ac); 0.33: --fast-disk, for every model.
    later = _Patcher08d0e51({})
    later.model.dynamic_pins["cuda:0"]["fast_disk"] = True
    assert comfy.fast_disk(later) is True
    older = _Patcher033({})
    assert comfy.fast_disk(older) is False
    cli_args.fast_disk = True
    assert comfy.fast_disk(older) is True
