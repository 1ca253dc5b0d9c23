"""The written contract of what the native module returns (JSON) and what lifecycle.status()
adds, as TypedDicts. The Rust side is src/status.rs, src/engine/mod.rs (Report) and
src/budget.rs; viking_native.pyi types the functions. tests/test_contract.py checks real
output against these, key by key, both ways: a field renamed on one side fails there instead
of printing nothing."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, TypedDict

# --- native: reconcile() -----------------------------------------------------------------------


class Budget(TypedDict):
    limit_bytes: int
    pinned_bytes: int
    room_bytes: int
    excess_bytes: int
    headroom_bytes: int
    bound_by: str  # user, os_cap, headroom, pressure
    terms: List[Tuple[str, int]]
    reason: str


class SkipSummary(TypedDict):
    reason: str  # over_budget, not_host_memory, read_only_file_mapping, pinned_by_other, ... failed
    description: str
    bytes: int
    count: int


class Report(TypedDict):
    owner: int
    backend: Optional[str]
    wanted_bytes: int
    pinned_bytes: int
    pending_bytes: int  # of pinned_bytes: read-only file pages still being locked off ComfyUI's thread
    newly_pinned_bytes: int
    released_bytes: int
    regions_registered: int
    failures: List[str]
    skipped: List[SkipSummary]
    evicted: List[Tuple[int, int]]
    budget: Budget


class ModelReport(Report, total=False):
    """What lifecycle.reconcile returns: the native report and what the Python side adds."""
    home_bytes: int
    home_note: Optional[str]
    notes: List[str]
    prefetch: Optional[dict]
    standing_aside: str


# --- native: status_json() ---------------------------------------------------------------------


class Memory(TypedDict):
    total_ram: int
    available_ram: int
    swap_total: int
    swap_used: int
    container_limit: Optional[int]
    pinned_by_us: int
    pinned_by_others: int
    commit_limit: Optional[int]
    commit_available: Optional[int]
    os: str


class Policy(TypedDict):
    limit: dict  # {"mode": "auto"} or {"mode": "bytes" | "share_of_ram", "value": ...}
    headroom_bytes: Optional[int]


class OwnerStatus(TypedDict):
    owner: int
    label: str
    priority: int
    wanted_bytes: int
    pinned_bytes: int
    pending_bytes: int
    file_page_bytes: int  # of pinned_bytes: a copy-on-write file mapping held as its file's pages (OS lock)
    # of pinned_bytes: registrations mapped views hold (the GPU reads them in place); they
    # cannot end, and stay counted, until the last view is gone (viking_native.MappedView)
    mapped_view_bytes: int
    regions: int
    by_backend: dict  # backend name -> bytes
    skipped: List[SkipSummary]
    resident_bytes: Optional[int]
    swapped_bytes: Optional[int]
    pinned_swapped_bytes: Optional[int]


class Cuda(TypedDict):
    available: bool
    reason: Optional[str]
    device: Optional[dict]
    free_bytes: Optional[int]
    total_bytes: Optional[int]


class Paging(TypedDict):
    swap_total: int
    swap_used: int
    process_swapped_bytes: Optional[int]
    swapped_in_since_start: Optional[int]
    swapped_out_since_start: Optional[int]
    swapped_in_since_last_run: Optional[int]
    swapped_out_since_last_run: Optional[int]
    process_page_faults: Optional[int]
    commit_limit: Optional[int]
    commit_available: Optional[int]
    working_set_minimum: Optional[int]


class Counters(TypedDict):
    registrations: int
    releases: int
    failures: int


class PressureEvent(TypedDict):
    unix_time: float
    bytes: int  # given back (0 for a take-back)
    reason: str  # "the machine stalled 23% of the last 1.5 s"; a take-back: "calm for 31 s"


class Pressure(TypedDict):
    """The pressure governor (src/pressure.rs): pins go back while the machine stalls for
    memory, and are made again only after it stayed calm for the hold."""
    # "psi:/proc/pressure/memory", "psi:cgroup" (the cgroup v2 memory.pressure); without PSI
    # "available-ram" or "windows-available-ram"
    source: str
    some_stalled: Optional[float]  # share of the last window some task waited for memory
    full_stalled: Optional[float]  # ... every task did (the machine did no work)
    window_seconds: Optional[float]
    state: str  # calm, stalling, holding (a ceiling, no stall: waiting for the hold)
    ceiling_bytes: Optional[int]  # on Viking's pins; None: the pressure sets none
    hold_seconds: float  # calm needed before the ceiling lifts
    last_give_back: Optional[PressureEvent]
    last_take_back: Optional[PressureEvent]


class NativeStatus(TypedDict):
    version: str
    memory: Memory
    policy: Policy
    budget: Budget
    pinned_bytes: int
    pending_bytes: int
    registrations: int
    owners: List[OwnerStatus]
    cuda: Cuda
    os_lock_available: bool
    os_lock_limit_bytes: Optional[int]  # RLIMIT_MEMLOCK without CAP_IPC_LOCK; None: no limit
    monitor_releases: bool  # the native monitor thread releases pins itself (False inside ComfyUI)
    pressure: "Pressure"
    paging: Paging
    counters: Counters
    release_failures: int
    last_release_error: Optional[str]
    events: List[str]


# --- lifecycle.status(): the native status and what the Python side adds ----------------------


class ModelStatus(OwnerStatus):
    vram_cap_bytes: int
    vram_bytes: Optional[int]
    home_bytes: int
    pinned_home: bool
    home_note: Optional[str]
    prefetch: Optional[dict]
    notes: List[str]
    standing_aside: Optional[str]
    dynamic: Optional["DynamicModel"]
    weights: "WeightKinds"
    zero_copy: Optional["ZeroCopy"]  # None: the option is off for this model


class ZeroCopy(TypedDict):
    """Pin CLIP's zero-copy embeddings (zero_copy.py): token-embedding tables the GPU reads in
    place from the model's pins (mapped views), or why not."""
    mapped_bytes: int  # read in place: not in VRAM, not copied at load or at each call
    tables: int
    notes: List[str]  # what was mapped, and why anything was not (the CPU, dynamic mode, a patch)


class WeightKinds(TypedDict, total=False):
    """What the last reconcile found of the model's weights in RAM (weights.host_ranges); empty
    before the first."""
    bytes_by_kind: dict  # "plain" / "quantized" / "gguf" -> bytes
    left_to_comfyui: List[dict]  # {"what": type and reason, "weights": count, "bytes": claimed bytes}


class DynamicModel(TypedDict):
    """Per model in ComfyUI's dynamic VRAM mode (dynamic.summary)."""
    staged_bytes: int  # RAM of ComfyUI's staging copies of this model
    staged_pinned_bytes: int  # ... of it registered
    file_view_bytes: int  # Viking's shared views of the checkpoint (mapped; what they lock is in the pins)
    file_view_resident_bytes: Optional[int]  # these three: from the residency sample (None before the first)
    checkpoint_resident_bytes: Optional[int]  # of the model's mapped weights, in RAM now (page cache)
    checkpoint_bytes: Optional[int]
    kept_in_current_prompt: bool
    pin_ceiling_bytes: int
    file_residency: bool  # the node's file_residency: Viking keeps the file pages this model reads
    fast_disk: Optional[bool]  # ComfyUI reads its weights with a VRAM slot from the file at each step (None: outside ComfyUI)


class ComfyHost(TypedDict):
    version: Optional[str]
    mode: str  # static, dynamic, cpu, none
    notes: List[str]
    pinned_bytes: int
    pinned_tensors: int
    pin_ceiling_bytes: int  # ComfyUI's MAX_PINNED_MEMORY now (Viking's budget in dynamic mode)


class Status(NativeStatus):
    owners: List[ModelStatus]  # type: ignore[misc]
    comfy: ComfyHost
    native: dict  # native.build_info(): where the module came from, and whether it matches the source
    time_in_viking: dict  # kind ("event", "watch", "event/walk", ...) -> {"calls", "seconds"} since start
    deferred_changes: List[str]
    applied_changes: List[dict]
    pressure_relief: str  # gate.relief(): "gate watcher", "execution thread" or "native monitor"
    headroom_source: str  # "auto", "settings dialog", "VIKING_HEADROOM_GIB" or "node #N"
    residency: "ResidencySample"


class ResidencySample(TypedDict):
    """Where the owners' resident / swapped figures come from (residency.py): read for this
    status (age 0), or the sampler's last sample, made off ComfyUI's execution thread."""
    sampled_at: Optional[float]  # epoch seconds; None: no sample yet (the figures are None)
    age_seconds: Optional[float]
    sample_seconds: Optional[float]  # what the sample took
    min_interval_seconds: float
    sampler_thread: Optional[int]  # the sampler's OS thread id (None until it first ran)


def key_mismatches(value: Any, typed, where: str = "") -> list[str]:
    """Keys of `value` (JSON data) that `typed` (a TypedDict) lacks, and keys it requires that
    `value` lacks, through nested TypedDicts and lists of them."""
    import typing

    hints = typing.get_type_hints(typed)
    problems = [f"{where}{k}: not in {typed.__name__}" for k in value if k not in hints]
    problems += [f"{where}{k}: missing" for k in getattr(typed, "__required_keys__", hints) if k not in value]
    for key, hint in hints.items():
        if key not in value or value[key] is None:
            continue
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Union:
            hint = next(a for a in args if a is not type(None))
            origin, args = typing.get_origin(hint), typing.get_args(hint)
        if isinstance(hint, type) and hasattr(hint, "__required_keys__"):
            problems += key_mismatches(value[key], hint, f"{where}{key}.")
        elif origin in (list, List) and args and hasattr(args[0], "__required_keys__"):
            for index, item in enumerate(value[key]):
                problems += key_mismatches(item, args[0], f"{where}{key}[{index}].")
    return problems
