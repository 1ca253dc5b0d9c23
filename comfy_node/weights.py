"""From torch modules and tensors to the host ranges the native engine pins: one
(data_ptr, nbytes, storage) per distinct CPU storage. The storage object rides along so the
engine holds a reference to the memory for as long as it is pinned."""

from __future__ import annotations

from typing import Iterable


def cpu_storage_ranges(tensors: Iterable) -> tuple[list[tuple[int, int, object]], list[tuple[int, int]]]:
    """Returns (ranges, pinned_elsewhere). Skips GPU, meta and empty tensors; views of one
    storage count once. `pinned_elsewhere` lists storages CUDA already reports as pinned (by
    ComfyUI, by `pin_memory()`, or by Viking itself: the engine takes its own out): the engine
    never registers those twice."""
    ranges, pinned_elsewhere, seen = [], [], set()
    for tensor in tensors:
        if tensor is None or tensor.device.type != "cpu" or tensor.is_meta:
            continue
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr == 0 or nbytes == 0 or ptr in seen:
            continue
        seen.add(ptr)
        ranges.append((ptr, nbytes, storage))
        if tensor.is_pinned():
            pinned_elsewhere.append((ptr, nbytes))
    return ranges, pinned_elsewhere


def own_tensors(module) -> list:
    """A module's own parameters and buffers (not its children's), read from its two tables:
    walks over every module run at every ComfyUI event, and torch's parameters() generators
    were most of such a walk (bench/probes/event_cost.py)."""
    own = vars(module)
    return [t for table in (own.get("_parameters") or {}, own.get("_buffers") or {}) for t in table.values() if t is not None]


def module_tensors(module) -> list:
    """Parameters and buffers of a torch module and its children, as plain tensors (a tensor two
    modules share comes twice: cpu_storage_ranges counts each storage once)."""
    return [t.data if hasattr(t, "data") else t for child in module.modules() for t in own_tensors(child)]
