"""Pins that follow ComfyUI's weights. One idempotent `reconcile(patcher)` is called after every
event that can move weights between RAM and VRAM; ComfyUI-version differences live here only.

Why these events (ComfyUI 0.3.75, comfy/model_patcher.py): no callback runs *before* ComfyUI
frees or replaces a CPU weight (load to GPU, unload to fresh CPU tensors, partial unload, LoRA
backups). So the native ledger holds a reference to every storage it pins (the memory cannot be
freed while registered), and we reconcile *after*:
- ON_LOAD: end of a (full or partial) load: the CPU-resident layers of a partial load;
- ON_DETACH: after an unload back to RAM (fresh CPU storages), and on every re-use;
- ON_INJECT_MODEL: end of load / partially_load / partially_unload / detach, via a no-op
  injection (partially_unload has no callback of its own);
- ON_CLEANUP: after each sampling run, when the model is idle;
- a weakref finalizer on the torch module: ComfyUI dropped the model -> release everything.

Two steering points have no callback at all: `partially_load` (the VRAM cap) and the moments
ComfyUI copies weights between RAM and VRAM (the pinned home, see home.py). Both are thin
wrappers on the patcher instance (`_install_wrappers`) and act only for models Viking pins.
"""

from __future__ import annotations

import json
import logging
import weakref
from dataclasses import dataclass

from . import home, prefetch
from .native import require
from .weights import cpu_storage_ranges, module_tensors

KEY = "viking_engine"
log = logging.getLogger("viking_engine")


@dataclass
class PinSettings:
    label: str
    budget_gib: float = 0.0  # at most this much of this model; 0: as the shared budget allows
    headroom_gib: float | None = 0.0  # shared: RAM kept un-pinned; 0: auto; None: leave as set
    backend: str = "auto"
    priority: int = 0
    node_id: str = ""
    vram_cap_gib: float = 0.0  # at most this much of the model's weights in VRAM; 0: ComfyUI decides
    pinned_home: bool = True  # keep the pinned RAM copy while the weights are in VRAM (home.py)
    prefetch: bool = True  # copy streamed (lowvram) layers ahead of use (prefetch.py)
    prefetch_window_mib: int = 0  # VRAM for copies in flight; 0: the buffer ComfyUI reserves


_settings: dict[int, PinSettings] = {}  # owner -> settings
_vram_caps: dict[int, int] = {}  # owner -> bytes of weights allowed in VRAM
_cap_surplus: dict[int, int] = {}  # owner -> VRAM ComfyUI offered its weights beyond the cap
_patchers: dict[int, weakref.ref] = {}  # owner -> the last patcher seen (for the status)
_finalizers: dict[int, weakref.finalize] = {}
_last_reports: dict[int, dict] = {}
_unpin_count = 0  # bumped by every unpin: pin nodes re-run after one


def unpin_generation() -> int:
    return _unpin_count


def owner_of(patcher) -> int:
    """Clones of a ModelPatcher share one torch module: that module is the owner of the pins."""
    return id(patcher.model)


def is_pinned(patcher) -> bool:
    return owner_of(patcher) in _settings


def settings_of(patcher) -> PinSettings | None:
    return _settings.get(owner_of(patcher))


def last_report(owner: int) -> dict | None:
    return _last_reports.get(owner)


def labels() -> dict[int, str]:
    return {owner: s.label for owner, s in _settings.items()}


# --- ComfyUI facts, each guarded so older and newer ComfyUI both work --------------------------

def comfy_pins() -> tuple[list[tuple[int, int]], int]:
    """ComfyUI's own registrations (ptr, size) and their total: never touched, counted in the budget."""
    try:
        import comfy.model_management as mm
    except ImportError:
        return [], 0
    pinned = dict(getattr(mm, "PINNED_MEMORY", {}) or {})
    return [(int(p), int(n)) for p, n in pinned.items() if p and n], int(getattr(mm, "TOTAL_PINNED_MEMORY", 0) or 0)


def dynamic_vram_enabled() -> bool:
    """Newer ComfyUI's dynamic VRAM (comfy-aimdo) keeps weights in read-only file mappings and
    pins its own host buffers: Viking must stand aside there."""
    try:
        import comfy.memory_management as memory_management
    except ImportError:
        return False
    return bool(getattr(memory_management, "aimdo_enabled", False))


def _is_dynamic(patcher) -> bool:
    is_dynamic = getattr(patcher, "is_dynamic", None)
    return bool(is_dynamic()) if callable(is_dynamic) else False


def _aimdo_storage(tensor) -> bool:
    storage = tensor.untyped_storage()
    return hasattr(storage, "_comfy_tensor_file_slice") or hasattr(storage, "_comfy_hostbuf")


def patcher_tensors(patcher) -> list:
    """The weights of a patcher that can sit in host RAM: the module's parameters and buffers,
    the original weights ComfyUI keeps in `backup` while LoRA patches are applied, and the
    pinned home of the weights in VRAM."""
    tensors = module_tensors(patcher.model) + home.held_tensors(owner_of(patcher))
    for backup in getattr(patcher, "backup", {}).values():
        weight = getattr(backup, "weight", None)
        if weight is not None:
            tensors.append(weight)
    return [t for t in tensors if not _aimdo_storage(t)]


# --- the one entry point -----------------------------------------------------------------------

def reconcile(patcher) -> dict | None:
    """Makes the pins of `patcher`'s model match what is in host RAM now. Idempotent."""
    owner = owner_of(patcher)
    settings = _settings.get(owner)
    if settings is None:
        return None
    native = require()
    if _is_dynamic(patcher) or dynamic_vram_enabled():
        _drop_streaming(owner)
        native.release(owner)
        report = {"owner": owner, "pinned_bytes": 0, "wanted_bytes": 0, "standing_aside": "ComfyUI dynamic VRAM mode pins these weights itself (read-only file mappings): Viking leaves them alone"}
        _last_reports[owner] = report
        return report
    if settings.pinned_home and _home_useful(patcher):
        home.update(patcher, owner)
    else:
        home.drop(owner)
    report = _reconcile_ranges(native, patcher, settings)
    if home.held_bytes(owner) and skipped_for(report, "over_budget", "failed"):
        # All or nothing: a model whose home does not fit gets ComfyUI's ordinary unload.
        home.drop_held(owner, "no pinned home: the budget has no room for a RAM copy of the weights in VRAM; "
                              "they unload the ordinary way")
        report = _reconcile_ranges(native, patcher, settings)
    report["home_bytes"] = home.held_bytes(owner)
    report["home_note"] = home.note(owner)
    report["prefetch"] = prefetch.update(patcher, owner, settings.prefetch, settings.prefetch_window_mib << 20,
                                         _cap_surplus.get(owner, 0))
    _last_reports[owner] = report
    for failure in report["failures"]:
        log.warning("Viking Engine: a pin failed for %s: %s", settings.label, failure)
    return report


def _reconcile_ranges(native, patcher, settings: PinSettings) -> dict:
    owner = owner_of(patcher)
    ranges, pinned_elsewhere = cpu_storage_ranges(patcher_tensors(patcher))
    comfy_ranges, comfy_total = comfy_pins()
    _wait_for_copies()
    return json.loads(native.reconcile(
        owner, ranges,
        priority=settings.priority,
        backend=settings.backend,
        label=settings.label,
        owner_cap_gib=settings.budget_gib,
        foreign=pinned_elsewhere + comfy_ranges,
        others_pinned_bytes=comfy_total,
    ))


def skipped_for(report: dict, *reasons: str) -> bool:
    """Some of the model's weights were left unpinned for one of `reasons` (e.g. over_budget)."""
    return any(skip["reason"] in reasons for skip in report["skipped"])


def _runs_on_gpu(patcher) -> bool:
    return getattr(getattr(patcher, "load_device", None), "type", "cpu") != "cpu"


def _home_useful(patcher) -> bool:
    """A home only saves work when weights move between a GPU and RAM (not in --cpu or
    --gpu-only mode)."""
    return getattr(getattr(patcher, "offload_device", None), "type", None) == "cpu" and _runs_on_gpu(patcher)


def _drop_streaming(owner: int):
    """Drops the model's pinned home and prefetch (before its pins go)."""
    home.drop(owner)
    prefetch.drop(owner)


def _wait_for_copies():
    """Lowvram streaming copies from host weights asynchronously; a storage must not be
    unregistered while a copy from it may still run."""
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # no CUDA build, or no device: nothing in flight
        pass


def _on_event(patcher, *_args):
    # Runs inside ComfyUI's load/unload: an exception here would abort the load, so never raise.
    try:
        reconcile(patcher)
    except Exception as error:  # noqa: BLE001 - logged, never propagated into ComfyUI
        log.warning("Viking Engine: reconcile after a ComfyUI event failed: %s", error)


def _noop(_patcher):
    pass


GIB = 1 << 30


def _install_wrappers(patcher):
    """Thin wrappers on this one patcher instance, for what ComfyUI has no option or callback
    for. Clones get them again through ON_CLONE (instance attributes do not survive clone()).
    Each does nothing for a model Viking does not pin.

    - `partially_load(device, extra_memory)` is where ComfyUI decides how much of a model goes
      to VRAM (every load path: load_models_gpu -> LoadedModel.model_load / model_use_more_vram).
      The VRAM cap trims `extra_memory`; ComfyUI's own lowvram machinery streams the rest.
    - `load`, `unpatch_model` and `partially_unload` move weights between RAM and VRAM; while
      they run, home.watching lets the pinned home see the copies made and send weights home."""
    if "partially_load" in vars(patcher):
        return
    cls, owner, weak = type(patcher), owner_of(patcher), weakref.ref(patcher)

    def partially_load(device_to, extra_memory=0, force_patch_weights=False):
        this = weak()
        cap = _vram_caps.get(owner)
        if cap:
            loaded = this.model.model_loaded_weight_memory
            offered = extra_memory
            extra_memory = min(extra_memory, cap - loaded)
            if loaded == 0 and extra_memory <= 0:
                extra_memory = 1  # load nothing: every weight streams (0 would mean "no limit")
            _cap_surplus[owner] = int(max(0, min(offered, 1 << 50) - extra_memory))  # the prefetch may use it
        else:
            _cap_surplus.pop(owner, None)
        return cls.partially_load(this, device_to, extra_memory, force_patch_weights=force_patch_weights)

    def watched(name):
        method = getattr(cls, name)

        def call(*args, **kwargs):
            this = weak()
            with home.watching(this.model, owner):
                return method(this, *args, **kwargs)

        call.__name__ = name
        return call

    patcher.partially_load = partially_load
    for name in ("load", "unpatch_model", "partially_unload"):
        setattr(patcher, name, watched(name))


def _on_clone(original, clone):
    if owner_of(original) in _settings:
        _install_wrappers(clone)


def set_vram_cap(patcher, cap_gib: float):
    """At most `cap_gib` GiB of this model's weights in VRAM (0: ComfyUI decides)."""
    owner = owner_of(patcher)
    if cap_gib > 0:
        _vram_caps[owner] = int(cap_gib * GIB)
        _install_wrappers(patcher)
    else:
        _vram_caps.pop(owner, None)


def annotate(status: dict) -> dict:
    """Adds what only the Python side knows to each owner of the native status: the VRAM its
    weights take (and the cap), and the RAM its pinned home holds for them."""
    for entry in status.get("owners", []):
        owner = entry["owner"]
        usage = vram_usage(owner)
        entry["vram_cap_bytes"], entry["vram_bytes"] = usage if usage is not None else (0, None)
        entry["home_bytes"] = home.held_bytes(owner)
        entry["pinned_home"] = home.has_home(owner)
        entry["home_note"] = home.note(owner)
        entry["prefetch"] = prefetch.summary(owner)
    return status


def vram_usage(owner: int) -> tuple[int, int | None] | None:
    """(VRAM cap in bytes or 0, bytes of the model's weights in VRAM now), while it lives. The
    bytes are None when the model runs on the CPU: "loaded" there means loaded into RAM."""
    patcher = _patchers[owner]() if owner in _patchers else None
    if patcher is None:
        return None
    return _vram_caps.get(owner, 0), int(patcher.loaded_size()) if _runs_on_gpu(patcher) else None


def attach(patcher, settings: PinSettings) -> dict | None:
    """Makes `patcher` (and clones made from it later) keep its model's weights pinned."""
    import comfy.patcher_extension as ext

    if settings.headroom_gib is not None:
        require().configure(headroom_gib=settings.headroom_gib if settings.headroom_gib > 0 else -1.0)
    owner = owner_of(patcher)
    _settings[owner] = settings
    _patchers[owner] = weakref.ref(patcher)
    for event in (ext.CallbacksMP.ON_LOAD, ext.CallbacksMP.ON_DETACH, ext.CallbacksMP.ON_CLEANUP, ext.CallbacksMP.ON_INJECT_MODEL):
        if not patcher.get_callbacks(event, KEY):
            patcher.add_callback_with_key(event, KEY, _on_event)
    if not patcher.get_callbacks(ext.CallbacksMP.ON_CLONE, KEY):
        patcher.add_callback_with_key(ext.CallbacksMP.ON_CLONE, KEY, _on_clone)
    _install_wrappers(patcher)
    set_vram_cap(patcher, settings.vram_cap_gib)
    if hasattr(patcher, "set_injections") and KEY not in getattr(patcher, "injections", {}):
        patcher.set_injections(KEY, [ext.PatcherInjection(inject=_noop, eject=_noop)])
    if owner not in _finalizers or not _finalizers[owner].alive:
        _finalizers[owner] = weakref.finalize(patcher.model, _forget, owner)
    return reconcile(patcher)


def _forget(owner: int):
    """The model is gone (ComfyUI dropped it): release every pin it had."""
    _settings.pop(owner, None)
    _vram_caps.pop(owner, None)
    _cap_surplus.pop(owner, None)
    _patchers.pop(owner, None)
    _last_reports.pop(owner, None)
    _finalizers.pop(owner, None)
    _drop_streaming(owner)
    try:
        require().release(owner)
    except Exception as error:  # noqa: BLE001 - runs from a finalizer: must not raise
        log.warning("Viking Engine: releasing a dropped model failed: %s", error)


def unpin(patcher=None) -> int:
    """Releases one model's pins (its callbacks then do nothing), or every pin. Returns bytes."""
    global _unpin_count
    if patcher is not None:
        return unpin_owner(owner_of(patcher))
    _unpin_count += 1
    _wait_for_copies()
    for owner in list(_settings):
        _drop_streaming(owner)
    _settings.clear()
    _last_reports.clear()
    return require().release_all()


def unpin_owner(owner: int) -> int:
    """Releases the pins of one owner (a model), known by its id in the status."""
    global _unpin_count
    _unpin_count += 1
    _wait_for_copies()
    _settings.pop(owner, None)
    _last_reports.pop(owner, None)
    _drop_streaming(owner)
    return require().release(owner)
