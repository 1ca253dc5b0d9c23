"""From torch modules and tensors to the host ranges the native engine pins: one
(data_ptr, nbytes, storage) per distinct CPU storage. The storage object rides along so the
engine holds a reference to the memory for as long as it is pinned."""

from __future__ import annotations

import array
from dataclasses import dataclass, field
from typing import Callable, Iterable


# Kinds of weight, as the status counts them.
PLAIN, QUANTIZED, GGUF = "plain", "quantized", "gguf"


def storage_parts(tensor) -> list:
    """The plain tensors that hold `tensor`'s bytes. A plain tensor (or a subclass with storage
    of its own, like ComfyUI-GGUF's GGMLTensor) is its own part. A wrapper subclass, whose
    storage is a placeholder (comfy-kitchen's QuantizedTensor: fp8, nvfp4, mxfp8, int8
    layouts), names its inner tensors through torch's flatten protocol (`__tensor_flatten__`,
    what torch.compile uses): the quantized data and its scales; nested wrappers are followed.
    Anything else raises, and the caller leaves it to ComfyUI."""
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _context = tensor.__tensor_flatten__()
    parts = []
    for name in names:
        inner = getattr(tensor, name)
        if isinstance(inner, torch.Tensor):
            parts += storage_parts(inner)
    return parts


_KIND_OF_TYPE: dict = {}  # tensor type -> kind: the test reads only the type (~1 us a weight saved per walk)


def weight_kind(tensor) -> str:
    """plain, quantized (a wrapper subclass: its inner tensors hold the bytes) or gguf
    (ComfyUI-GGUF's tensor subclass, whose storage holds the packed blocks)."""
    kind = _KIND_OF_TYPE.get(type(tensor))
    if kind is None:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        if is_traceable_wrapper_subclass(tensor):
            kind = QUANTIZED
        elif type(tensor).__name__ == "GGMLTensor":
            kind = GGUF
        else:
            kind = PLAIN
        _KIND_OF_TYPE[type(tensor)] = kind
    return kind


def _claimed_bytes(tensor) -> int:
    """What a weight says it holds, for the status of one Viking cannot read (0 if even that fails)."""
    try:
        return int(tensor.nelement()) * int(tensor.element_size())
    except Exception:  # noqa: BLE001 - a tensor that cannot say: 0
        return 0


@dataclass
class HostRanges:
    """The host memory behind a set of weights, for the native engine and the status."""
    ranges: list = field(default_factory=list)            # (data_ptr, nbytes, storage), one per storage
    pinned_elsewhere: list = field(default_factory=list)  # (data_ptr, nbytes) CUDA reports pinned already
    bytes_by_kind: dict = field(default_factory=dict)     # plain / quantized / gguf -> bytes in RAM
    # "<type> (<reason>)" -> [weights, bytes] of weights left to ComfyUI as they are
    left_to_comfyui: dict = field(default_factory=dict)


def host_ranges(tensors: Iterable, skip_storage: Callable | None = None) -> HostRanges:
    """One (data_ptr, nbytes, storage) per distinct CPU storage behind `tensors`. Skips GPU,
    meta and empty tensors, and a weight any of whose storages `skip_storage` accepts (memory
    ComfyUI manages itself: each weight's parts are read once, here); views of one storage count once. A weight whose memory cannot be
    read (a tensor type nobody here knows) is left to ComfyUI and counted, never raised:
    nothing about a weight may fail the user's prompt. `pinned_elsewhere` lists storages CUDA
    already reports as pinned (by ComfyUI, by `pin_memory()`, or by Viking itself: the engine
    takes its own out): the engine never registers those twice."""
    found, seen = HostRanges(), set()
    for tensor in tensors:
        if tensor is None:
            continue
        try:
            if tensor.device.type != "cpu" or tensor.is_meta:
                continue
            kind = weight_kind(tensor)
            parts = [(p.untyped_storage(), p) for p in storage_parts(tensor)]
        except Exception as error:  # noqa: BLE001 - an unknown weight type: ComfyUI keeps it as it is
            key = f"{type(tensor).__module__}.{type(tensor).__name__} ({_short(error)})"
            count = found.left_to_comfyui.setdefault(key, [0, 0])
            count[0] += 1
            count[1] += _claimed_bytes(tensor)
            continue
        if skip_storage is not None and any(skip_storage(storage) for storage, _part in parts):
            continue
        for storage, part in parts:
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if ptr == 0 or nbytes == 0 or ptr in seen or part.device.type != "cpu":
                continue
            seen.add(ptr)
            found.ranges.append((ptr, nbytes, storage))
            found.bytes_by_kind[kind] = found.bytes_by_kind.get(kind, 0) + nbytes
            if part.is_pinned():
                found.pinned_elsewhere.append((ptr, nbytes))
    return found


def _short(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:120]


def cpu_storage_ranges(tensors: Iterable) -> tuple[list[tuple[int, int, object]], list[tuple[int, int]]]:
    """(ranges, pinned_elsewhere) of host_ranges(tensors)."""
    found = host_ranges(tensors)
    return found.ranges, found.pinned_elsewhere


def own_tensors(module) -> list:
    """A module's own parameters and buffers (not its children's), read from its two tables:
    walks over every module run at every ComfyUI event, and torch's parameters() generators
    were most of such a walk (bench/probes/event_cost.py)."""
    own, found = vars(module), []
    for table in (own.get("_parameters"), own.get("_buffers")):
        if table:  # most modules have no buffers, and containers no parameters
            found += [t for t in table.values() if t is not None]
    return found


def as_read(tensor):
    """A weight as the walk reads it: a plain parameter's `.data` (the same storage, no autograd);
    any other weight as it is. `.data` of a wrapper subclass is a detach, and comfy-kitchen's
    QuantizedTensor answers that with a copy whose scales are cloned: new storages at every
    walk, which the engine would pin while the model's own scales stayed unpinned."""
    from torch.nn import Parameter

    return tensor.data if issubclass(type(tensor), Parameter) else tensor


def tree_tensors(module) -> list:
    """The parameter and buffer objects of a torch module and its children, as the modules hold
    them (no `.data` views)."""
    return [t for current in module.modules() for t in own_tensors(current)]


def named_tree_tensors(model):
    """(name, tensor) of a torch module's parameters and buffers as its modules hold them, each
    tensor once (as named_parameters / named_buffers give them). One pass over the modules'
    own tables: the walks that run at every ComfyUI event need names for the pinned home, and
    torch's two named generators were most of such a walk (~5 us a weight)."""
    seen = set()
    for prefix, module in model.named_modules():
        dot = prefix + "." if prefix else ""
        own = vars(module)
        for table in (own.get("_parameters"), own.get("_buffers")):
            if not table:
                continue
            for leaf, tensor in table.items():
                if tensor is None or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                yield dot + leaf, tensor


def module_tensors(module) -> list:
    """Parameters and buffers of a torch module and its children (a tensor two modules share
    comes twice: cpu_storage_ranges counts each storage once)."""
    return [as_read(t) for t in tree_tensors(module)]


def identity_key(tensors: Iterable) -> bytes:
    """A key that changes when any of `tensors` is replaced or pointed at other memory: a new
    object, `.data` set, a wrapper whose contents were swapped (torch.utils.swap_tensors, how
    `module.to()` moves wrapper subclasses) or whose inner tensors were set again. About 1 us a
    weight, against ~20 us for reading its storages (host_ranges): how a ComfyUI event that
    moved nothing is told from one that did. Packed as one bytes object, not a tuple a weight:
    the key outlives the event, and hundreds of tuples kept at each event would count towards
    the process's next full garbage collection (timing.py's note). Each tensor's record starts
    with its length, so two different lists of tensors never pack to the same bytes."""
    import torch

    plain_types = (torch.Tensor, torch.nn.Parameter)
    key = array.array("q")
    for tensor in tensors:
        if tensor is None:
            continue
        try:
            address = tensor.data_ptr()
            if address >= 1 << 63:
                address -= 1 << 64  # the same bits, as the signed 64-bit number the array holds
        except Exception:  # noqa: BLE001 - a wrapper without storage of its own: its parts below
            address = -1
        if type(tensor) in plain_types:
            key.extend((2, id(tensor), address))
        else:
            inner = vars(tensor)
            key.extend((3 + len(inner), id(tensor), address, id(inner)))
            key.extend(map(id, inner.values()))
    return key.tobytes()


def range_key(ranges: Iterable) -> bytes:
    """The (address, size) pairs of `ranges` packed for a comparison kept between events (one
    object, for the reason identity_key gives)."""
    return array.array("q", [number for start, size, *_ in ranges for number in (start, size)]).tobytes()
