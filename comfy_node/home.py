"""Pinned home: the pinned RAM copy of each weight stays alive while the weight sits in VRAM.

Why (ComfyUI 0.3.75, comfy/model_patcher.py): loading moves a weight with `module.to(gpu)`, which
swaps `param.data` for a GPU tensor and frees the CPU one; unloading (`unpatch_model`, and
`partially_unload` when another model needs the room) calls `.to(cpu)`, which allocates fresh
pageable memory and copies every byte back. With a home, the CPU tensor is kept (and stays
pinned in the ledger), and just before ComfyUI moves a weight back to the CPU we point the
weight at its home again: `.to(cpu)` then finds it already there and copies nothing. The next
load reads from pinned memory at DMA speed.

A home always holds the *unpatched* weight. LoRA and other weight patches go through
`patcher.backup` (ComfyUI restores those keys itself; their originals are the homes): such keys
are never redirected. A VRAM copy is only replaced by its home when it is the very tensor a
load made from the home (same data pointer; same version counter where torch tracks one: not
for inference tensors), and when the Viking patcher that loaded it confirmed, at ON_LOAD, that
it carries no patch. Anything else takes ComfyUI's ordinary path. Hook patches (CreateHookLora,
SetClipHooks, scheduled hooks) write weights in place per cond group and per step, with no
version counter under inference mode, and 0.3.75's partially_unload restores them only for
modules with a LoRA backup: a model with hook patches gets no home at all (lifecycle.py), and
nothing is sent home while a patcher holds hook patches.
Where the redirect hooks in: see `watching`. The Home lives in the model's record (models.py).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import comfy, timing
from .weights import PLAIN, named_tree_tensors, weight_kind


@dataclass
class Home:
    tensors: dict = field(default_factory=dict)  # weight name -> CPU tensor with the unpatched value
    # weight name -> (data_ptr, version) of a VRAM copy made from the home: `pending` as the copy
    # is made (home.watching), `stamps` once the patcher that loaded it confirmed it unpatched.
    pending: dict = field(default_factory=dict)
    stamps: dict = field(default_factory=dict)
    held: list = field(default_factory=list)  # the home tensors of weights now in VRAM: extra RAM
    note: str | None = None  # why this model has no home for its weights in VRAM now

    def held_bytes(self) -> int:
        storages = (t.untyped_storage() for t in self.held)
        return sum({s.data_ptr(): s.nbytes() for s in storages}.values())


# A model of quantized layers keeps a few plain weights (norms, biases: ~1.4 MB of a 3 GB
# fp8-scaled Flux-shaped model). Copying those back at an unload takes well under a
# millisecond, while bringing a home up to date costs ~2 ms an event (H200): below this, no home.
SMALL_HOME_BYTES = 64 << 20


def _stand_aside(home: Home, why: str):
    home.tensors.clear()
    home.stamps.clear()
    home.pending.clear()
    home.held = []
    home.note = why


def update(patcher, record):
    """Brings the record's home up to date with where its weights are now. The home tensors of
    weights in VRAM (`held`) are extra RAM, pinned along with the rest."""
    if record.home is None:
        record.home = Home()
    home = record.home
    backup, hook_backup = comfy.patch_backups(patcher), comfy.hook_patched_keys(patcher)
    held, seen, all_in_ram = [], set(), True
    weights = [(name, weight, backup[name].weight if name in backup else weight)
               for name, weight in named_tree_tensors(comfy.torch_model(patcher))]
    # A quantized or GGUF weight is not one tensor a `.to` swap can point back at its home: it
    # takes ComfyUI's own paths (its bytes in RAM are pinned all the same), and so does the rest
    # of its module (a quantized layer's plain bias: a few KB, and a watch on every layer that
    # moves, home.watching, cost more than copying it).
    mixed = {name.rpartition(".")[0] for name, weight, current in weights
             if weight_kind(current) != PLAIN or weight_kind(weight) != PLAIN}
    if mixed:
        home_bytes = sum(current.nbytes for name, _weight, current in weights if name.rpartition(".")[0] not in mixed)
        if home_bytes < SMALL_HOME_BYTES:
            _stand_aside(home, f"no pinned home: only {home_bytes / 2**20:.1f} MiB of this model's weights could have "
                               "one (its quantized / GGUF layers take ComfyUI's own paths), and copying that back "
                               "costs less than keeping a home up to date")
            return
    for name, weight, current in weights:
        seen.add(name)
        if name.rpartition(".")[0] in mixed:
            if name in home.tensors or name in home.pending:
                home.tensors.pop(name, None)
                home.stamps.pop(name, None)
                home.pending.pop(name, None)
            continue
        all_in_ram = all_in_ram and weight.device.type == "cpu"
        if name in hook_backup:
            continue  # hook-patched now; the home (if any) was taken before the hook applied
        if current.device.type == "cpu":
            home.tensors[name] = current.data
            home.stamps.pop(name, None)
            home.pending.pop(name, None)
            continue
        stamp = _stamp(weight)
        pending = home.pending.pop(name, None)
        if pending == stamp and name not in backup and not comfy.patched_in_place(patcher, name):
            home.stamps[name] = stamp  # loaded from its home, unpatched: confirmed
        if name in home.tensors and home.stamps.get(name) == stamp:
            held.append(home.tensors[name])
        else:
            home.tensors.pop(name, None)
            home.stamps.pop(name, None)
    for name in set(home.tensors) - seen:
        home.tensors.pop(name)
        home.stamps.pop(name, None)
        home.pending.pop(name, None)
    home.held = held
    if all_in_ram:
        home.note = None  # the next load may get a home again


def _stamp(weight) -> tuple:
    """What identifies one VRAM copy: its address and, where torch tracks it, its version
    counter (any in-place write bumps it; inference tensors have none)."""
    try:
        version = weight._version
    except RuntimeError:
        version = None
    return weight.data_ptr(), version


def held_tensors(record) -> list:
    return list(record.home.held) if record is not None and record.home is not None else []


def held_bytes(record) -> int:
    """RAM the home holds for weights in VRAM (0 for a model Viking does not pin)."""
    return record.home.held_bytes() if record is not None and record.home is not None else 0


def drop_held(record, why: str):
    """Gives up the copies kept for weights in VRAM (the budget has no room for them); the
    model falls back to ComfyUI's ordinary unload."""
    home = record.home
    if home is None:
        return
    home.note = why
    for name in list(home.stamps):
        home.tensors.pop(name, None)
    home.stamps.clear()
    home.pending.clear()
    home.held = []


def _point_at(model, name: str, weight, saved):
    """`weight` (the model's tensor called `name`) now holds `saved`'s data, as Module.to does it:
    in place where the tensor types allow, else a new Parameter / buffer in the module."""
    import torch

    if comfy.compatible_for_data_swap(weight, saved):
        weight.data = saved
        return
    path, _, leaf = name.rpartition(".")
    module = model.get_submodule(path) if path else model
    if leaf in module._parameters:
        module._parameters[leaf] = torch.nn.Parameter(saved, requires_grad=weight.requires_grad)
    else:
        module._buffers[leaf] = saved


def _send_home(module, home: Home, prefix: str, weights, hooked: set) -> int:
    """Points each VRAM weight of `weights` ((name in `module`, tensor)) back at its home when
    it is still the very tensor the load made, never written since. ComfyUI has restored its
    patch backups before it moves weights back, so such a weight holds the unpatched value;
    a hook-patched weight (`hooked`) may not be restored yet: it takes ComfyUI's path."""
    moved = 0
    for name, weight in weights:
        key = prefix + name
        if weight.device.type == "cpu" or key in hooked:
            continue
        saved, stamp = home.tensors.get(key), home.stamps.get(key)
        if saved is None or stamp != _stamp(weight):
            continue
        if saved.shape != weight.shape or saved.dtype != weight.dtype:
            continue
        _point_at(module, name, weight, saved)
        home.stamps.pop(key)
        moved += 1
    return moved


@contextmanager
def watching(patcher, record):
    """For the duration of one ComfyUI call that moves weights (ModelPatcher.load,
    unpatch_model, partially_unload), the torch module `model` and each of its submodules that
    holds a weight with a home get an instance-level `to` that records VRAM copies made from a
    home and, when the target is the CPU, first points the weights that have a home back at it.
    Why there: ComfyUI moves weights with `model.to(...)` and `module.to(...)`, and restores its
    patch backups before it moves them back; no callback runs in between. Nothing stays on the
    modules after the call (so they still deep-copy and pickle as usual)."""
    installed = _watch(patcher, record)
    try:
        yield
    finally:
        _unwatch(installed)


@timing.holds_collector
def _watch(patcher, record) -> list:
    """Puts the instance-level `to` on the modules `watching` covers; returns them."""
    installed = []
    with timing.timed("watch"):
        model = comfy.torch_model(patcher)
        # The model itself and the modules that hold a weight with a home: nothing to record or
        # send for the others (a model of quantized layers has homes for a few norms only).
        paths = set()
        if record.home is not None and record.home.tensors:
            paths = {""} | {name.rpartition(".")[0] for name in record.home.tensors}
        for prefix in sorted(paths):
            try:
                module = model.get_submodule(prefix) if prefix else model
            except AttributeError:
                continue  # gone since the home was taken: the next event brings it up to date
            if "to" not in vars(module):
                module.to = _home_first_to(weakref.ref(module), prefix, record, weakref.ref(patcher))
                installed.append(module)
    return installed


@timing.holds_collector
def _unwatch(installed: list):
    with timing.timed("watch"):
        for module in installed:
            del module.to


def _home_first_to(module_ref, prefix: str, record, patcher_ref):
    full = (prefix + ".") if prefix else ""

    def to(*args, **kwargs):
        module, home, target = module_ref(), record.home, comfy.module_to_target(args, kwargs)
        if home is None or target is None:
            return type(module).to(module, *args, **kwargs)
        if target.type == "cpu":
            patcher = patcher_ref()
            if home.stamps and patcher is not None and not comfy.weight_hooks(patcher):
                _send_home(module, home, full, list(comfy.named_weights(module)), comfy.hook_patched_keys(patcher))
            moved = type(module).to(module, *args, **kwargs)
            for name, weight in comfy.named_weights(module):
                home.stamps.pop(full + name, None)  # in RAM now, whichever way it came
                home.pending.pop(full + name, None)
            return moved
        # Towards a device: remember which VRAM copies are copies of a home.
        from_home = set()
        for name, weight in comfy.named_weights(module):
            saved = home.tensors.get(full + name)
            if weight.device.type == "cpu" and saved is not None and saved.data_ptr() == weight.data_ptr():
                from_home.add(name)
        moved = type(module).to(module, *args, **kwargs)
        for name, weight in comfy.named_weights(module):
            if name in from_home and weight.device.type != "cpu":
                home.pending[full + name] = _stamp(weight)
        return moved

    return to
