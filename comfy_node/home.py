"""Pinned home: the pinned RAM copy of each weight stays alive while the weight sits in VRAM.

Why (ComfyUI 0.3.75, comfy/model_patcher.py): loading moves a weight with `module.to(gpu)`, which
swaps `param.data` for a GPU tensor and frees the CPU one; unloading (`unpatch_model`, and
`partially_unload` when another model needs the room) calls `.to(cpu)`, which allocates fresh
pageable memory and copies every byte back. With a home, the CPU tensor is kept (and stays
pinned in the ledger), and just before ComfyUI moves a weight back to the CPU we point the
weight at its home again: `.to(cpu)` then finds it already there and copies nothing. The next
load reads from pinned memory at DMA speed.

A home always holds the *unpatched* weight. LoRA and other weight patches go through
`patcher.backup` (ComfyUI restores those keys itself; their originals are the homes) and hook
patches through `patcher.hook_backup`: such keys are never redirected. A VRAM copy is only
replaced by its home when it is the very tensor a load made from the home (same data pointer;
same version counter where torch tracks one: not for inference tensors), and when the Viking
patcher that loaded it confirmed, at ON_LOAD, that it carries no patch. Anything else takes
ComfyUI's ordinary path.
Where the redirect hooks in: see `watching`.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain


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


_homes: dict[int, Home] = {}  # owner -> its home


def _named_weights(module, prefix=""):
    return chain(module.named_parameters(prefix=prefix), module.named_buffers(prefix=prefix))


def _patched_names(patcher) -> tuple[dict, dict]:
    return getattr(patcher, "backup", {}) or {}, getattr(patcher, "hook_backup", {}) or {}


def update(patcher, owner: int):
    """Brings `owner`'s home up to date with where its weights are now. The home tensors of
    weights in VRAM (`held`) are extra RAM, pinned along with the rest."""
    home = _homes.setdefault(owner, Home())
    backup, hook_backup = _patched_names(patcher)
    held, seen, all_in_ram = [], set(), True
    for name, weight in _named_weights(patcher.model):
        seen.add(name)
        all_in_ram = all_in_ram and weight.device.type == "cpu"
        if name in hook_backup:
            continue  # hook-patched now; the home (if any) was taken before the hook applied
        current = backup[name].weight if name in backup else weight
        if current.device.type == "cpu":
            home.tensors[name] = current.data
            home.stamps.pop(name, None)
            home.pending.pop(name, None)
            continue
        stamp = _stamp(weight)
        pending = home.pending.pop(name, None)
        patched_in_place = getattr(patcher, "weight_inplace_update", False) and name in getattr(patcher, "patches", {})
        if pending == stamp and name not in backup and not patched_in_place:
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


def note(owner: int) -> str | None:
    home = _homes.get(owner)
    return home.note if home is not None else None


def _stamp(weight) -> tuple:
    """What identifies one VRAM copy: its address and, where torch tracks it, its version
    counter (any in-place write bumps it; inference tensors have none)."""
    try:
        version = weight._version
    except RuntimeError:
        version = None
    return weight.data_ptr(), version


def held_tensors(owner: int) -> list:
    home = _homes.get(owner)
    return list(home.held) if home is not None else []


def held_bytes(owner: int) -> int:
    home = _homes.get(owner)
    return home.held_bytes() if home is not None else 0


def has_home(owner: int) -> bool:
    return owner in _homes


def drop(owner: int):
    _homes.pop(owner, None)


def drop_held(owner: int, why: str):
    """Gives up the copies kept for weights in VRAM (the budget has no room for them); the
    model falls back to ComfyUI's ordinary unload."""
    home = _homes.get(owner)
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

    if torch._has_compatible_shallow_copy_type(weight, saved):
        weight.data = saved
        return
    path, _, leaf = name.rpartition(".")
    module = model.get_submodule(path) if path else model
    if leaf in module._parameters:
        module._parameters[leaf] = torch.nn.Parameter(saved, requires_grad=weight.requires_grad)
    else:
        module._buffers[leaf] = saved


def _send_home(module, home: Home, prefix: str, weights) -> int:
    """Points each VRAM weight of `weights` ((name in `module`, tensor)) back at its home when
    it is still the very tensor the load made, never written since. ComfyUI has restored its
    patch backups before it moves weights back, so such a weight holds the unpatched value."""
    moved = 0
    for name, weight in weights:
        key = prefix + name
        if weight.device.type == "cpu":
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


def _target(args, kwargs):
    """The device of a Module.to(...) call, or None (a dtype-only call)."""
    import torch

    return torch._C._nn._parse_to(*args, **kwargs)[0]


@contextmanager
def watching(model, owner: int):
    """For the duration of one ComfyUI call that moves weights (ModelPatcher.load,
    unpatch_model, partially_unload), the torch module `model` and each of its submodules that
    holds weights get an instance-level `to` that records VRAM copies made from a home and, when
    the target is the CPU, first points the weights that have a home back at it. Why there:
    ComfyUI moves weights with `model.to(...)` and `module.to(...)`, and restores its patch
    backups before it moves them back; no callback runs in between. Nothing stays on the
    modules after the call (so they still deep-copy and pickle as usual)."""
    installed = []
    if owner in _homes and _homes[owner].tensors:  # nothing at home: nothing to record or send
        for prefix, module in list(model.named_modules()):
            holds_weights = next(_named_weights_here(module), None) is not None
            if (module is model or holds_weights) and "to" not in vars(module):
                module.to = _home_first_to(weakref.ref(module), prefix, owner)
                installed.append(module)
    try:
        yield
    finally:
        for module in installed:
            del module.to


def _named_weights_here(module):
    return chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False))


def _home_first_to(module_ref, prefix: str, owner: int):
    full = (prefix + ".") if prefix else ""

    def to(*args, **kwargs):
        module, home, target = module_ref(), _homes.get(owner), _target(args, kwargs)
        if home is None or target is None:
            return type(module).to(module, *args, **kwargs)
        if target.type == "cpu":
            if home.stamps:
                _send_home(module, home, full, list(_named_weights(module)))
            moved = type(module).to(module, *args, **kwargs)
            for name, weight in _named_weights(module):
                home.stamps.pop(full + name, None)  # in RAM now, whichever way it came
                home.pending.pop(full + name, None)
            return moved
        # Towards a device: remember which VRAM copies are copies of a home.
        from_home = set()
        for name, weight in _named_weights(module):
            saved = home.tensors.get(full + name)
            if weight.device.type == "cpu" and saved is not None and saved.data_ptr() == weight.data_ptr():
                from_home.add(name)
        moved = type(module).to(module, *args, **kwargs)
        for name, weight in _named_weights(module):
            if name in from_home and weight.device.type != "cpu":
                home.pending[full + name] = _stamp(weight)
        return moved

    return to
