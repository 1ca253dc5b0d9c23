"""The seam: the one module that reads or wraps ComfyUI's internals (model management, the
ModelPatcher, ops, memory management, the prompt queue) and torch's private helpers.

Everything that differs between ComfyUI versions and modes is decided here, once, and the rest
of Viking asks in its own words: "which weights of this model sit in RAM", "which ones does
ComfyUI pin itself", "is this model hook-patched", "is a prompt running". `host()` says which
ComfyUI this is (version, mode) and the status reports it. A ComfyUI whose internals lack what
a feature needs makes that feature stand aside with the reason, never guess.

Versions seen: 0.3.75 (Nov 2025) and 0.33 (Aug 2026), static ModelPatcher path and --cpu;
0.33's dynamic VRAM mode (comfy-aimdo) is detected and reported.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field

from .weights import as_read, own_tensors, storage_parts

log = logging.getLogger("viking_engine")


# --- which ComfyUI ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    """The ComfyUI Viking runs in, as found at start."""
    version: str | None  # comfyui_version.__version__; None outside ComfyUI
    mode: str  # "static" (ModelPatcher moves weights), "dynamic" (comfy-aimdo), "cpu", "none"
    notes: tuple[str, ...] = field(default_factory=tuple)  # what stands aside, and why

    def as_dict(self) -> dict:
        return {"version": self.version, "mode": self.mode, "notes": list(self.notes)}


def _model_management():
    try:
        import comfy.model_management as mm
    except ImportError:
        return None
    return mm


def _memory_management():
    try:
        import comfy.memory_management as memory_management
    except ImportError:
        return None
    return memory_management


def dynamic_vram_enabled() -> bool:
    """ComfyUI 0.33's dynamic VRAM (comfy-aimdo): weights stay in read-only file mappings and
    ComfyUI pins copies of them in its own host buffers."""
    memory_management = _memory_management()
    return bool(getattr(memory_management, "aimdo_enabled", False))


@functools.lru_cache(maxsize=1)
def _version() -> str | None:
    try:
        import comfyui_version
    except ImportError:
        return None
    return str(getattr(comfyui_version, "__version__", None) or "unknown")


def host() -> Host:
    """Which ComfyUI and mode this is. Cheap: called for every status."""
    mm = _model_management()
    if mm is None:
        return Host(version=None, mode="none", notes=("not inside ComfyUI",))
    notes = []
    if dynamic_vram_enabled():
        mode = "dynamic"
        bounds = ("which bounds the RAM its staging takes (--fast-disk)" if _ceiling_bounds_staging_ram(mm) else
                  "which bounds its registrations; the RAM its staging takes is bounded by ComfyUI's own check "
                  "of available RAM")
        notes.append("dynamic VRAM mode: ComfyUI stages the weights itself from read-only file mappings; Viking "
                     f"sets its pin ceiling from the budget, {bounds}, and keeps pinned models' checkpoint pages "
                     "in RAM")
    elif getattr(mm, "cpu_state", None) == getattr(getattr(mm, "CPUState", None), "CPU", object()):
        mode = "cpu"
    else:
        mode = "static"
    if not _partially_load_takes_extra_memory():
        notes.append("ModelPatcher.partially_load has no extra_memory parameter: the VRAM cap stands aside")
    return Host(version=_version(), mode=mode, notes=tuple(notes))


def _ceiling_bounds_staging_ram(mm) -> bool:
    """Whether ComfyUI checks the RAM its staging takes against its pin ceiling: 0.33's
    ensure_pin_budget does under --fast-disk only (otherwise it checks available RAM); after
    0.35 it never does (model_management.py at Comfy-Org/ComfyUI 02b2b38). Decided from what
    the function reads, not from a version number."""
    code = getattr(getattr(mm, "ensure_pin_budget", None), "__code__", None)
    if code is None or not {"MAX_PINNED_MEMORY", "fast_disk"} <= set(code.co_names):
        return False
    return bool(_cli_flag("fast_disk"))


def _cli_flag(name: str):
    """One of ComfyUI's command-line flags (comfy.cli_args.args), or None outside ComfyUI."""
    try:
        from comfy.cli_args import args
    except ImportError:
        return None
    return getattr(args, name, None)


# --- models and their weights -------------------------------------------------------------------

def patcher_of(value, kind: str):
    """The ModelPatcher behind a MODEL / CLIP / VAE input, or a ValueError that says what to do."""
    from comfy.model_patcher import ModelPatcher

    patcher = value if kind == "MODEL" else getattr(value, "patcher", None)
    if not isinstance(patcher, ModelPatcher):
        what = type(value).__module__ + "." + type(value).__name__
        raise ValueError(
            f"Viking Pin {kind.title()} needs a ComfyUI {kind} input backed by a ModelPatcher, "
            f"but the connected node gave a {what}. Connect the {kind} output of a loader node "
            f"(e.g. Load Checkpoint) instead."
        )
    return patcher


def owner_of(patcher) -> int:
    """Clones of a ModelPatcher share one torch module: that module owns the pins."""
    return id(patcher.model)


def torch_model(patcher):
    return patcher.model


def is_dynamic(patcher) -> bool:
    """A patcher of ComfyUI's dynamic VRAM mode (its weights are ComfyUI's own pinned copies)."""
    is_dynamic_method = getattr(patcher, "is_dynamic", None)
    return bool(is_dynamic_method()) if callable(is_dynamic_method) else False


def _storages(tensor) -> list:
    """The storages behind a weight (a quantized weight's inner tensors' too); none for a weight
    whose memory cannot be read (weights.host_ranges reports those)."""
    try:
        return [part.untyped_storage() for part in storage_parts(tensor)]
    except Exception:  # noqa: BLE001 - an unknown weight type
        return []


def comfy_owned(storage) -> bool:
    """Storage that ComfyUI's dynamic mode maps or pins itself (a file slice or a host buffer)."""
    return hasattr(storage, "_comfy_tensor_file_slice") or hasattr(storage, "_comfy_hostbuf")


def named_weights(module):
    """(name, tensor) of a torch module's parameters and buffers."""
    from itertools import chain

    return chain(module.named_parameters(), module.named_buffers())


def patch_backups(patcher) -> dict:
    """Weight name -> the original weight ComfyUI keeps while a LoRA-style patch is applied."""
    return getattr(patcher, "backup", {}) or {}


def backup_weights(patcher) -> list:
    return [w for w in (getattr(b, "weight", None) for b in patch_backups(patcher).values()) if w is not None]


def hook_patched_keys(patcher) -> set:
    """Weights a hook patch (CreateHookLora, SetClipHooks, scheduled hooks) holds patched now."""
    return set(getattr(patcher, "hook_backup", {}) or {})


def weight_hooks(patcher) -> bool:
    """Whether hook patches may write this model's weights in place during sampling (per cond
    group and per step): registered on the patcher, or applied right now."""
    return bool(getattr(patcher, "hook_patches", None)) or bool(getattr(patcher, "hook_backup", None))


def sampling_patcher(model):
    """The patcher that last started sampling with this torch model (ModelPatcher.pre_run sets
    `current_patcher`), or None."""
    return getattr(model, "current_patcher", None)


def patched_in_place(patcher, name: str) -> bool:
    """ComfyUI patches this weight by writing into it (weight_inplace_update)."""
    return bool(getattr(patcher, "weight_inplace_update", False)) and name in (getattr(patcher, "patches", {}) or {})


def load_device_type(patcher) -> str:
    return getattr(getattr(patcher, "load_device", None), "type", "cpu")


def load_device(patcher):
    return getattr(patcher, "load_device", None)


def runs_on_gpu(patcher) -> bool:
    return load_device_type(patcher) != "cpu"


def offloads_to_ram(patcher) -> bool:
    """Weights go back to RAM when unloaded (not --gpu-only, not --cpu)."""
    return getattr(getattr(patcher, "offload_device", None), "type", None) == "cpu" and runs_on_gpu(patcher)


def weights_in_vram_bytes(patcher) -> int | None:
    """Bytes of the model's weights in VRAM now; None when it runs on the CPU ("loaded" there
    means loaded into RAM)."""
    return int(patcher.loaded_size()) if runs_on_gpu(patcher) else None


def loaded_weight_bytes(patcher) -> int:
    """What ComfyUI counts as loaded to the load device (the VRAM cap's measure)."""
    return int(getattr(patcher.model, "model_loaded_weight_memory", 0) or 0)


def model_bytes(patcher) -> int:
    return int(patcher.model_size())


def offload_buffer_bytes(patcher) -> int:
    """The VRAM ComfyUI reserves for streaming this model's offloaded weights (0 if unknown)."""
    return int(getattr(patcher.model, "model_offload_buffer_memory", 0) or 0)


def release_cast_buffers(device) -> int:
    """Frees the VRAM ComfyUI's own streaming copies land in on `device`, while a prefetcher
    serves every streamed layer; returns the bytes freed.

    ComfyUI 0.33 keeps one cast buffer per offload stream (model_management.STREAM_CAST_BUFFERS),
    grown to the largest layer it copied; in static mode nothing frees them between steps or
    prompts. Its lowvram split reserves room for one streaming buffer, so the prefetch window
    beside them would be that room twice over. Freed as ComfyUI frees them itself after each
    node in dynamic mode (reset_cast_buffers): the device idle first, the largest-weight marker
    cleared with them (get_cast_buffer refuses a buffer for the marked weight otherwise); a
    layer ComfyUI copies later gets a new one. 0.3.75 has no such buffers: 0."""
    mm = _model_management()
    buffers = getattr(mm, "STREAM_CAST_BUFFERS", None)
    if not isinstance(buffers, dict) or not buffers or not isinstance(getattr(mm, "LARGEST_CASTED_WEIGHT", None), tuple):
        return 0
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    held = [stream for stream, buffer in buffers.items() if buffer.device == torch.device("cuda", index)]
    if not held:
        return 0
    torch.cuda.synchronize(index)  # their last copies, and the compute that read them, are done
    freed = sum(buffers.pop(stream).nbytes for stream in held)
    mm.LARGEST_CASTED_WEIGHT = (None, 0)
    torch.cuda.empty_cache()  # cached in the offload streams' pools, the compute stream cannot use it
    return freed


def streamed_modules(model) -> tuple[list, int]:
    """(modules whose weights ComfyUI casts (streams) to the device at each use, with plain CPU
    tensors for weight and bias; the number of other streamed modules, whose CPU weight is not
    a plain tensor: quantized / fp8-scaled / GGUF, copied by ComfyUI through its own buffers).
    Read from each module's own tables: this runs at every event of a model ComfyUI loaded in
    part, and nn.Module's attribute lookup was most of it."""
    import torch

    def on_cpu(tensor):
        try:
            return tensor is not None and tensor.device.type == "cpu"
        except Exception:  # noqa: BLE001 - a weight type nobody here knows: counted as ComfyUI's
            return True

    def plain(tensor):
        return on_cpu(tensor) and type(as_read(tensor)) is torch.Tensor

    found, others = [], 0
    for module in model.modules():
        own = vars(module)
        if not own.get("comfy_cast_weights", getattr(type(module), "comfy_cast_weights", False)):
            continue
        parameters = own.get("_parameters") or {}
        weight, bias = parameters.get("weight"), parameters.get("bias")
        if plain(weight) and (bias is None or plain(bias)):
            found.append(module)
        elif on_cpu(weight) or on_cpu(bias):
            others += 1
    return found, others


def sampled_in_steps(patcher) -> bool:
    """A diffusion model (ComfyUI's BaseModel): sampling runs its forward once per step."""
    return hasattr(patcher.model, "diffusion_model")


def loaded_in_part(patcher) -> bool:
    """ComfyUI loaded this model in part (lowvram): some weights stay in RAM and are copied to
    the device at each use. Set by load / partially_unload, cleared when the model unloads."""
    return bool(getattr(patcher.model, "model_lowvram", False))


def diffusion_root(patcher):
    """The module whose forward is one sampling step."""
    return patcher.model.diffusion_model if sampled_in_steps(patcher) else patcher.model


def module_to_target(args, kwargs):
    """The device of a Module.to(...) call, or None (a dtype-only call)."""
    import torch

    return torch._C._nn._parse_to(*args, **kwargs)[0]


def compatible_for_data_swap(weight, saved) -> bool:
    """Whether `weight.data = saved` works (Module.to's own test)."""
    import torch

    return torch._has_compatible_shallow_copy_type(weight, saved)


# --- ComfyUI's own pinning ----------------------------------------------------------------------

def foreign_pins() -> tuple[list[tuple[int, int]], int]:
    """ComfyUI's own registrations (ptr, size) and their total: never touched, counted in the
    budget. 0.3.75 and 0.33 static keep them in PINNED_MEMORY / TOTAL_PINNED_MEMORY."""
    mm = _model_management()
    if mm is None:
        return [], 0
    pinned = dict(getattr(mm, "PINNED_MEMORY", {}) or {})
    ranges = [(int(ptr), int(size)) for ptr, size in pinned.items() if ptr and size]
    return ranges, int(getattr(mm, "TOTAL_PINNED_MEMORY", 0) or 0)


# --- callbacks and instance wrappers ------------------------------------------------------------

def _extension():
    import comfy.patcher_extension as ext

    return ext


def attach_callbacks(patcher, key: str, on_event, on_clone, on_pre_run):
    """Viking's keyed callbacks on one patcher (once). Events after which weights may have
    moved: ON_LOAD (end of a load), ON_DETACH (unload back to RAM, and on re-use), ON_CLEANUP
    (after sampling), ON_INJECT_MODEL (end of load / partially_load / partially_unload / detach,
    through a no-op injection: partially_unload has no callback of its own). ON_PRE_RUN (start
    of sampling) and ON_CLONE (clones get the instance wrappers again)."""
    ext = _extension()
    events = {ext.CallbacksMP.ON_LOAD: on_event, ext.CallbacksMP.ON_DETACH: on_event,
              ext.CallbacksMP.ON_CLEANUP: on_event, ext.CallbacksMP.ON_INJECT_MODEL: on_event,
              ext.CallbacksMP.ON_PRE_RUN: on_pre_run, ext.CallbacksMP.ON_CLONE: on_clone}
    for event, callback in events.items():
        if not patcher.get_callbacks(event, key):
            patcher.add_callback_with_key(event, key, callback)
    if hasattr(patcher, "set_injections") and key not in (getattr(patcher, "injections", {}) or {}):
        noop = _noop
        patcher.set_injections(key, [ext.PatcherInjection(inject=noop, eject=noop)])


def _noop(_patcher):
    pass


def wrap_instance_method(patcher, name: str, make_body) -> bool:
    """Puts a wrapper on this one patcher instance as `name`, over whatever is there now:
    another node's instance wrapper is composed, not replaced, and Viking's own is never
    stacked twice. `make_body(inner)` returns `body(this, *args, **kwargs)`, which calls
    `inner(this, *args, **kwargs)` to go on; the wrapper holds the patcher only weakly. Returns
    False when the patcher has no such method."""
    current = vars(patcher).get(name)
    if current is not None and getattr(current, "_viking", False):
        return True
    if current is not None:
        def inner(_this, *args, **kwargs):
            return current(*args, **kwargs)
    else:
        if getattr(type(patcher), name, None) is None:
            return False

        def inner(this, *args, **kwargs):
            # The class's method as it is at call time: another node that patches the class
            # later is composed, not bypassed.
            return getattr(type(this), name)(this, *args, **kwargs)
    weak = weakref.ref(patcher)
    body = make_body(inner)

    def wrapper(*args, **kwargs):
        this = weak()
        if this is None:  # the garbage collector is finalizing the patcher: ComfyUI's own call, as is
            return inner(_finalizing_patcher(name, wrapper), *args, **kwargs)
        return body(this, *args, **kwargs)

    wrapper._viking = True
    wrapper._viking_previous = current  # another pack's instance wrapper under Viking's, if any
    wrapper.__name__ = name
    setattr(patcher, name, wrapper)
    _leave_wrappers_out_of_copies(patcher)
    return True


def _leave_wrappers_out_of_copies(patcher):
    """A copy of the patcher (copy.copy, deepcopy, pickle) is another patcher, which Viking does
    not know: it gets the instance dict without Viking's wrappers (each bound to the original),
    with any other pack's wrapper under them put back. copy reads __getstate__ through the
    instance, so this stays on the one patcher; ComfyUI's clone() makes a new patcher instead
    and gets Viking's wrappers through ON_CLONE."""
    if getattr(vars(patcher).get("__getstate__"), "_viking", False):
        return
    weak = weakref.ref(patcher)  # weakly, as the wrappers: no reference cycle keeps a patcher alive

    def __getstate__():
        state = {}
        for key, value in vars(weak()).items():
            if key == "__getstate__":
                continue
            while getattr(value, "_viking", False):
                value = value._viking_previous
            if value is not None:
                state[key] = value
        return state

    __getstate__._viking = True
    __getstate__._viking_previous = None
    patcher.__getstate__ = __getstate__


def _finalizing_patcher(name: str, wrapper):
    """The patcher whose `name` is `wrapper`, for a call made while the garbage collector
    finalizes it: the collector clears weak references before it runs finalizers, and 0.33's
    dynamic patcher releases its staging in its own __del__ (self.partially_unload_ram(1e32),
    self.detach), where `self` is a local of a calling frame."""
    frame = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if wrapper is getattr(candidate, "__dict__", {}).get(name):
            return candidate
        frame = frame.f_back
    raise ReferenceError(f"Viking's wrapper of {name} was called for a patcher that is gone")


@functools.lru_cache(maxsize=1)
def _partially_load_signature():
    try:
        from comfy.model_patcher import ModelPatcher
    except ImportError:
        return None
    try:
        return inspect.signature(ModelPatcher.partially_load)
    except (TypeError, ValueError):
        return None


def _partially_load_takes_extra_memory() -> bool:
    signature = _partially_load_signature()
    return signature is None or "extra_memory" in signature.parameters


def with_extra_memory(args: tuple, kwargs: dict, adjust):
    """Arguments of a `partially_load(device_to, extra_memory, ...)` call (without self) with
    `extra_memory` replaced by `adjust(offered)`. ComfyUI passes it by position or by name;
    any other parameters ride along unchanged. None when this ComfyUI has no such parameter."""
    signature = _partially_load_signature()
    if signature is None or "extra_memory" not in signature.parameters:
        return None
    names = [n for n in signature.parameters if n != "self"]
    position = names.index("extra_memory")
    args, kwargs = list(args), dict(kwargs)
    if len(args) > position:
        args[position] = adjust(args[position])
    else:
        default = signature.parameters["extra_memory"].default
        kwargs["extra_memory"] = adjust(kwargs.get("extra_memory", 0 if default is inspect.Parameter.empty else default))
    return tuple(args), kwargs


# --- ComfyUI's model management and server ------------------------------------------------------

def loaded_patchers():
    """The ModelPatchers ComfyUI has loaded now."""
    mm = _model_management()
    for loaded in list(getattr(mm, "current_loaded_models", []) or []):
        patcher = getattr(loaded, "model", None)
        if patcher is not None and hasattr(patcher, "add_callback_with_key"):
            yield patcher


_after_load_callbacks: list = []


def call_after_models_load(callback):
    """Calls `callback()` after each `load_models_gpu` (every model ComfyUI manages loads
    through it). ComfyUI has no global "a model was loaded" callback, and ModelPatcher callbacks
    need the instance first, so this is the one function of ComfyUI's that Viking wraps (engine
    mode only; installed once, on first use)."""
    mm = _model_management()
    if callback in _after_load_callbacks:
        return
    _after_load_callbacks.append(callback)
    if getattr(mm.load_models_gpu, "_viking", False):
        return
    original = mm.load_models_gpu

    @functools.wraps(original)
    def load_models_gpu(*args, **kwargs):
        result = original(*args, **kwargs)
        for after in list(_after_load_callbacks):
            after()
        return result

    load_models_gpu._viking = True
    mm.load_models_gpu = load_models_gpu


def _prompt_queue():
    try:
        from server import PromptServer
    except ImportError:
        return None
    return getattr(getattr(PromptServer, "instance", None), "prompt_queue", None)


def prompt_running() -> bool:
    """Whether ComfyUI's execution thread is running a prompt now."""
    return bool(getattr(_prompt_queue(), "currently_running", None))


def flags_waiting() -> bool:
    """Whether a request to ComfyUI's worker (POST /free's unload_models / free_memory) waits
    for it to wake, with no prompt running or queued."""
    queue = _prompt_queue()
    return bool(getattr(queue, "flags", None)) and not getattr(queue, "currently_running", None) \
        and not getattr(queue, "queue", None)


def worker_wanted() -> bool:
    """Whether ComfyUI's worker has something to do: a prompt running or queued, or flags
    (a /free) to apply. Viking's work between prompts stops for it (gate.py)."""
    queue = _prompt_queue()
    return prompt_running() or bool(getattr(queue, "queue", None) or getattr(queue, "flags", None))


def wake_worker() -> bool:
    """Wakes ComfyUI's worker from its wait for work, so that it applies the flags waiting.
    PromptQueue.set_flag notifies the worker once; a /free that lands while the worker is not
    waiting (its garbage collection after a prompt, which holds the GIL for seconds on a busy
    machine, so a client polling for the prompt's end sends its /free right after it) wakes
    nobody, and main.py's prompt_worker then waits for the next prompt or up to 1000 s. The
    worker applies flags after every wake (its get() returns None on an empty queue), so a
    second notify is what set_flag's would have been. Never blocks: False if the queue's lock
    is held (the worker is busy and reads the flags on its own)."""
    queue = _prompt_queue()
    mutex, condition = getattr(queue, "mutex", None), getattr(queue, "not_empty", None)
    if mutex is None or condition is None or not mutex.acquire(blocking=False):
        return False
    try:
        condition.notify()
        return True
    finally:
        mutex.release()


def queue_mark() -> tuple | None:
    """What ComfyUI's queue looks like when it is idle (None while a prompt runs or waits): the
    count of prompts it has started, so that two equal marks taken some time apart mean no
    prompt started in between."""
    queue = _prompt_queue()
    if getattr(queue, "currently_running", None) or getattr(queue, "queue", None):
        return None
    return (getattr(queue, "task_counter", None),)


def user_settings_path() -> str | None:
    """The default user's comfy.settings.json, where the UI saves settings."""
    try:
        import folder_paths
        return os.path.join(folder_paths.get_user_directory(), "default", "comfy.settings.json")
    except (ImportError, AttributeError):
        return None


# --- ComfyUI 0.33's dynamic VRAM mode (comfy-aimdo) ---------------------------------------------
# Its weights stay in aimdo's private read-only mapping of the checkpoint; at each forward a
# module's weights are read from the file (pread) into a slice of ComfyUI's own pinned host
# buffer ("staging") and copied to the GPU. MAX_PINNED_MEMORY caps the staging registrations,
# read at call time; free RAM caps the staging copies. Eviction goes through each loaded
# patcher's partially_unload_ram / unregister_inactive_pins (mm.free_model_pins).

_DYNAMIC_NEEDS = ("loaded_ram_size", "pinned_memory_size", "partially_unload_ram", "unregister_inactive_pins",
                  "set_in_use_by_current_prompt")


def dynamic_internals_problem(patcher) -> str | None:
    """Why Viking cannot govern this dynamic patcher's staging (this ComfyUI's internals differ
    from 0.33's), or None."""
    mm = _model_management()
    for name in ("MAX_PINNED_MEMORY", "TOTAL_PINNED_MEMORY", "free_model_pins"):
        if not hasattr(mm, name):
            return f"this ComfyUI has no model_management.{name}: Viking stands aside in dynamic VRAM mode"
    missing = [name for name in _DYNAMIC_NEEDS if not callable(getattr(patcher, name, None))]
    if missing:
        return f"this ComfyUI's dynamic patcher lacks {', '.join(missing)}: Viking stands aside in dynamic VRAM mode"
    return None


def pin_ceiling() -> int:
    """ComfyUI's ceiling on its registered (pinned) bytes."""
    return int(getattr(_model_management(), "MAX_PINNED_MEMORY", -1))


def pinning_enabled() -> bool:
    """ComfyUI pins at all (its ceiling starts above 0: not --disable-pinned-memory, not CPU)."""
    return _initial_ceiling() > 0


@functools.lru_cache(maxsize=1)
def _initial_ceiling() -> int:
    return pin_ceiling()


def set_pin_ceiling(nbytes: int):
    """Sets ComfyUI's ceiling on registered bytes (read at call time by its pin and eviction
    functions). Never to 0 or below: 0.33 then stops unpinning what it pinned, and leaks it."""
    mm = _model_management()
    if pinning_enabled():
        mm.MAX_PINNED_MEMORY = max(1, int(nbytes))


def comfy_pinned_total() -> int:
    """All bytes ComfyUI holds registered now (static and dynamic pins)."""
    return int(getattr(_model_management(), "TOTAL_PINNED_MEMORY", 0) or 0)


def staged_bytes(patcher) -> tuple[int, int]:
    """(RAM of ComfyUI's staging copies of this model, the part of it registered)."""
    return int(patcher.loaded_ram_size()), int(patcher.pinned_memory_size())


def _pin_state(patcher):
    """The dynamic patcher's pin state for its load device ({subset: (hostbuf, stack,
    stack_split, [registered bytes], ...)} in model_patcher.py of 0.33.0), or None."""
    try:
        state = patcher.model.dynamic_pins[patcher.load_device]
    except (AttributeError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None


def fast_disk(patcher):
    """Whether ComfyUI reads this model's weights that have a VRAM slot from the file at each
    use instead of staging them: per model after 0.35 (the pin state's "fast_disk" that ops
    reads, else the patcher's flag: comfy/storage.py and model_patcher.py at Comfy-Org/ComfyUI
    2d656ac / 08d0e51), for every model under 0.33's --fast-disk. None outside ComfyUI."""
    state = _pin_state(patcher)
    if state is not None and "fast_disk" in state:
        return bool(state["fast_disk"])
    flag = getattr(patcher, "__dict__", {}).get("fast_disk")
    if flag is None:
        flag = _cli_flag("fast_disk")
    return None if flag is None else bool(flag)


def _default_subsets(method):
    """The default of a staging call's `subsets` parameter (the subsets ComfyUI's own callers
    act on), or None when it takes none. Cached per method: read at every eviction ComfyUI
    asks about."""
    try:
        return _cached_default_subsets(method)
    except TypeError:  # an unhashable callable in the class: read it each time
        return _cached_default_subsets.__wrapped__(method)


@functools.lru_cache(maxsize=64)
def _cached_default_subsets(method):
    try:
        default = inspect.signature(method).parameters["subsets"].default
    except (TypeError, ValueError, KeyError):
        return None
    return tuple(default) if isinstance(default, (list, tuple)) else None


def releasable_registrations(patcher) -> int:
    """Registered bytes of this model that ComfyUI's registration eviction can release: the
    subsets unregister_inactive_pins acts on by default. After 0.35 the "-fast" subsets are
    registered too (pinned_memory_size counts them) but only ever freed, never unregistered
    (model_patcher.py at Comfy-Org/ComfyUI 08d0e51): counting them would keep a model of
    higher priority refusing for ever."""
    state = _pin_state(patcher)
    subsets = _default_subsets(type(patcher).unregister_inactive_pins)
    if state is None or subsets is None:
        return int(patcher.pinned_memory_size())
    try:
        return sum(int(state[subset][3][0]) for subset in subsets if subset in state)
    except (IndexError, TypeError, ValueError):
        return int(patcher.pinned_memory_size())


_own_limit = threading.local()  # set while a model's own budget_gib gives its staging back


def drop_staging(patcher, nbytes: int) -> int:
    """Gives back up to `nbytes` of this model's staging copies (ComfyUI's own release path,
    through any other pack's wrappers). Past Viking's eviction guard: that guard keeps a model's
    staging from *other* models' needs; this is the model's own limit, which must bind whatever
    the other models hold. Execution thread only."""
    # Only the weights subsets (those loaded_ram_size counts), in ComfyUI's order: its default
    # also frees copies of LoRA patches first, which would leave the staging above the limit.
    state = _pin_state(patcher) or {}
    subsets = [s for s in _default_subsets(type(patcher).partially_unload_ram) or () if s in STAGING_SUBSETS and s in state]
    _own_limit.active = True
    try:
        if subsets:
            return int(patcher.partially_unload_ram(nbytes, subsets=subsets))
        return int(patcher.partially_unload_ram(nbytes))
    finally:
        _own_limit.active = False


def keep_in_current_prompt(patcher, keep: bool):
    """ComfyUI evicts the staging of models not in the current prompt first; this flag keeps a
    model among those of the current prompt until cleared."""
    patcher.set_in_use_by_current_prompt(keep)


EVICTION_BELOW = 1e30  # ComfyUI's own full releases (unload, cleanup) pass 1e30 or more


def guard_staging_eviction(patcher, refuse):
    """Instance wrappers on the two functions ComfyUI's eviction calls per model: an eviction
    call (fewer than 1e30 bytes) returns 0 while `refuse(kind)` is True, kind "ram" or
    "registrations", so ComfyUI takes from the next model first. ComfyUI's full releases
    always pass."""
    def make(kind):
        def make_body(inner):
            def body(this, ram_to_unload, *args, **kwargs):
                if ram_to_unload < EVICTION_BELOW and not getattr(_own_limit, "active", False) and refuse(kind):
                    return 0
                return inner(this, ram_to_unload, *args, **kwargs)
            return body
        return make_body

    wrap_instance_method(patcher, "partially_unload_ram", make("ram"))
    wrap_instance_method(patcher, "unregister_inactive_pins", make("registrations"))


def loaded_dynamic_patchers():
    return [p for p in loaded_patchers() if is_dynamic(p)]


# ComfyUI's pin subsets that hold a module's weights. "weights-fast" came with ComfyUI's per-model
# fast disk (comfy/storage.py, PR 16333, after 0.35.1): a fast-disk model's staged module may sit
# under it alone (model_patcher.py at Comfy-Org/ComfyUI 08d0e51).
STAGING_SUBSETS = ("weights", "weights-loaded", "weights-fast")


def staged(module) -> bool:
    """ComfyUI's staging holds a copy of this module's weights in its host buffer (registered or
    not): its forward reads that copy, not the file."""
    pins = vars(module).get("_pins") or {}
    return any((pins.get(subset) or {}).get("pin") is not None for subset in STAGING_SUBSETS)


def checkpoint_slices(patcher, unstaged_only: bool = False) -> list[tuple[int, int, int]]:
    """(fd, file offset, bytes) of every weight of this model that lives in a checkpoint
    mapping, from the file-slice record ComfyUI keeps on each storage; with `unstaged_only`,
    only of modules whose weights ComfyUI's staging does not hold. Views of one storage count
    once."""
    seen, slices = set(), []
    for module in patcher.model.modules():
        if unstaged_only and staged(module):
            continue
        for storage in (s for tensor in own_tensors(module) for s in _storages(tensor)):
            info = getattr(storage, "_comfy_tensor_file_slice", None)
            if info is None or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            fd, offset, size = getattr(info, "file_ref", None), getattr(info, "offset", None), getattr(info, "size", None)
            if isinstance(fd, int) and isinstance(offset, int) and isinstance(size, int) and size > 0:
                slices.append((fd, offset, size))
    return slices


def native_file(fd: int) -> int:
    """What the native side maps for a checkpoint's file descriptor: the descriptor itself, or on
    Windows the file HANDLE behind it (the native module's C runtime has its own table of
    descriptors; Python's msvcrt answers for Python's). OSError for a descriptor that is not open."""
    if os.name == "nt":
        import msvcrt

        return msvcrt.get_osfhandle(fd)
    return fd


def mapped_storage_spans(patcher) -> list[tuple[int, int]]:
    """(address, bytes) of this model's weights inside ComfyUI's checkpoint mappings."""
    seen, spans = set(), []
    for storage in (s for t in list(patcher.model.parameters()) + list(patcher.model.buffers()) for s in _storages(t)):
        if hasattr(storage, "_comfy_tensor_file_slice") and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            spans.append((storage.data_ptr(), storage.nbytes()))
    return spans


# ---- Zero-copy embeddings (zero_copy.py): a table's weight read in place from pinned RAM ----

def index_read_modules(patcher) -> list:
    """(name, module) of the modules whose weight ComfyUI reads only by index (token-embedding
    tables: torch.nn.Embedding and comfy.ops' subclasses), whose weight is still a parameter."""
    import torch

    return [(name, module) for name, module in patcher.model.named_modules()
            if isinstance(module, torch.nn.Embedding) and isinstance(module._parameters.get("weight"), torch.nn.Parameter)]


def module_weight(module):
    return module.weight


def weight_patched(patcher, key: str) -> bool:
    """Whether a LoRA-style or hook patch applies to this weight (then ComfyUI's own path reads it)."""
    return (key in (getattr(patcher, "patches", {}) or {}) or key in hook_patched_keys(patcher)
            or key in (getattr(patcher, "weight_wrapper_patches", {}) or {}) or bool(getattr(patcher, "hook_patches", None)))


def read_weight_in_place(module, tensor):
    """The module reads `tensor` (a CUDA view of its pinned weight) in place of its parameter:
    no longer a parameter, ComfyUI's loads neither count nor move nor cast it. Returns the
    parameter, for `read_weight_from_parameter`."""
    parameter = module._parameters.pop("weight")
    object.__setattr__(module, "weight", tensor)
    return parameter


def read_weight_from_parameter(module, parameter, tensor) -> bool:
    """Undoes `read_weight_in_place`, if the module still reads `tensor` (ComfyUI's patching may
    have put a parameter of its own there since: then that one stays). Returns whether it did."""
    if module.__dict__.get("weight") is not tensor:
        return False
    del module.__dict__["weight"]
    module._parameters["weight"] = parameter
    return True


def forget_model_size(patcher):
    """ComfyUI caches a model's size (ModelPatcher.size): measured again at the next load."""
    if hasattr(patcher, "size"):
        patcher.size = 0
