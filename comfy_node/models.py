"""One record per pinned model: everything Viking keeps about it, in one place, so that one
`forget` (lifecycle.py) leaves nothing of the model behind."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field


@dataclass
class PinSettings:
    label: str
    # This model's own limit on pinned bytes (the node input `budget_gib`); 0: as the shared
    # budget allows. The shared budget is native.configure(budget_gib=...), for all models.
    model_limit_gib: float = 0.0
    headroom_gib: float | None = 0.0  # shared: RAM kept un-pinned; 0: auto; None: leave as set
    backend: str = "auto"
    priority: int = 0
    node_id: str = ""
    vram_cap_gib: float = 0.0  # at most this much of the model's weights in VRAM; 0: ComfyUI decides
    pinned_home: bool = True  # keep the pinned RAM copy while the weights are in VRAM (home.py)
    prefetch: bool = True  # copy streamed (lowvram) layers ahead of use (prefetch.py)
    prefetch_window_mib: int = 0  # VRAM for copies in flight; 0: the default window
    file_residency: bool = True  # dynamic VRAM mode: lock the checkpoint pages staging does not hold (dynamic.py)


@dataclass
class ModelRecord:
    owner: int
    settings: PinSettings
    patcher: weakref.ref | None = None  # the last patcher seen (for the status)
    finalizer: weakref.finalize | None = None  # forgets the model when ComfyUI drops it
    vram_cap_bytes: int = 0  # weights allowed in VRAM; 0: no cap
    cap_surplus_bytes: int = 0  # VRAM the cap held back from the weights at the last load
    home: object | None = None  # home.Home, while the model has one
    prefetcher: object | None = None  # prefetch.Prefetcher, while it streams
    last_report: dict | None = None
    hooks_seen: bool = False  # hook patches met once: home and prefetch stay off for it
    file_views: dict = field(default_factory=dict)  # fd -> (native FileView, file offset): dynamic mode's residency
    dynamic_signature: tuple = ()  # the mapped ranges last reconciled (dynamic mode)
    native_report: dict | None = None  # the last native reconcile's report, and its input with the
    native_signature: tuple = ()  # ledger's change count then (lifecycle._reconcile_ranges)
    dynamic_state: tuple = ()  # ComfyUI's staging totals and the model when they were last walked
    static_state: tuple = ()  # static mode: the weights, their VRAM share and patches at the last event
    static_ledger: tuple = ()  # the ledger's change count and the pressure releases then
    registered_ptrs: set = field(default_factory=set)  # the host ranges given to the last native reconcile,
    registered_after: int = 0  # when gate.pressure_releases had this count (relief gives pins back)
    sampled: bool = False  # dynamic mode: sampled once, so ComfyUI's staging of it is decided
    notes: list[str] = field(default_factory=list)  # what stands aside for this model, and why
    # Bytes in RAM by kind of weight (plain, quantized, gguf) and the weights left to ComfyUI,
    # as the last reconcile found them (weights.host_ranges).
    weight_kinds: dict = field(default_factory=dict)
    warnings_said: set = field(default_factory=set)  # what was already said for this model (log and notes)

    def set_note(self, marker: str, text: str | None):
        """The model's one note containing `marker`, replaced by `text` (None: removed). For a
        note whose figures follow the latest event (bytes waiting, layers left to ComfyUI)."""
        self.notes[:] = [note for note in self.notes if marker not in note] + ([text] if text else [])

    def live_patcher(self):
        return self.patcher() if self.patcher is not None else None


_records: dict[int, ModelRecord] = {}


def get(owner: int) -> ModelRecord | None:
    return _records.get(owner)


def put(record: ModelRecord) -> ModelRecord:
    _records[record.owner] = record
    return record


def take(owner: int) -> ModelRecord | None:
    """Removes and returns the record (the caller releases what it holds)."""
    return _records.pop(owner, None)


def owners() -> list[int]:
    return list(_records)


def all_records() -> list[ModelRecord]:
    return list(_records.values())
