"""What Viking does in ComfyUI 0.33's dynamic VRAM mode (comfy-aimdo), the default on NVIDIA.

There ComfyUI keeps a model's weights in its own private read-only mapping of the checkpoint
and, at each forward, reads each module's weights from the file into a slice of its own pinned
host buffer ("staging") and copies them to the GPU (comfy.py has the details). Viking brings:

1. Governance. Viking's live budget (headroom, container limit, pressure) is
   ComfyUI's ceiling on staging registrations (MAX_PINNED_MEMORY, read at call time), less what
   Viking holds itself, updated while the server runs (`govern`). Pinned models of higher
   priority keep their staging first: ComfyUI's per-model eviction calls are refused for them
   while a lower-priority model still has staging to give (`refuses`), and a model with a
   positive priority is marked one of "the current prompt's" models at each of its events
   (ComfyUI evicts those last; Viking never clears ComfyUI's own mark). A
   node's budget_gib also bounds the model's staging RAM (given back at its next event).
2. Residency. The checkpoint pages of the weights a pinned model's forward reads from the file
   (those ComfyUI's staging does not hold; the rest it reads from its own pinned copy) stay in
   RAM: Viking maps those file ranges shared and read-only (backend/file_view.rs) and locks them
   within the budget, from the model's first sampling on. Memory pressure can no longer evict
   them, so a run after pressure reads from RAM, not disk. (Never aimdo's own mapping: a private
   read-only file mapping registered with CUDA hung.) A node's file_residency switches it off:
   with one model, the weights in VRAM slots are hardly read again, and their pages cost RAM.
3. In place: not shipped. ComfyUI's staging never reads the mapping (it preads the file into
   its buffer); making it read Viking's registered pages would mean writing its private
   per-module pin slots. README.md says what was measured and why.
A ComfyUI whose dynamic internals differ from 0.33's makes Viking stand aside for those models
with the reason (comfy.dynamic_internals_problem).
"""

from __future__ import annotations

import json
import logging

from . import comfy, models, timing
from .native import native

log = logging.getLogger("viking_engine")
UNGOVERNED_PRIORITY = -(10**6)  # a model no Viking node or engine mode pins
CAP_NOTE = ("vram_cap_gib does nothing in dynamic VRAM mode: ComfyUI's dynamic loader takes no budget "
            "for the weights (ModelPatcherDynamic.partially_load ignores it)")


def ceiling_for_comfy(budget: dict, memory: dict) -> int:
    """ComfyUI's share of the budget, less Viking's own pins. Viking's limit leaves out what
    others hold for the OS cap, headroom and pressure terms (so ComfyUI's own pins
    are added back), not for the user's budget, which here covers ComfyUI's staging too."""
    others = 0 if budget["bound_by"] == "user" else memory["pinned_by_others"]
    return max(1, budget["limit_bytes"] + others - budget["pinned_bytes"])


def govern():
    """Hands Viking's live budget to ComfyUI as its pin ceiling. Cheap; any thread (one
    assignment that ComfyUI reads at call time); no-op outside dynamic VRAM mode."""
    if native is None or not comfy.dynamic_vram_enabled() or not comfy.pinning_enabled():
        return
    native.note_foreign_pins(comfy.comfy_pinned_total())
    snapshot = json.loads(native.budget_json())
    comfy.set_pin_ceiling(ceiling_for_comfy(snapshot["budget"], snapshot["memory"]))


def refuses(priority: int, others: list[tuple[int, int]]) -> bool:
    """Whether a model of `priority` should keep its staging now: some model of lower priority
    still has staging (bytes > 0) to give. `others`: (priority, bytes) of the other models."""
    return any(other_priority < priority and nbytes > 0 for other_priority, nbytes in others)


def _priority_of(patcher) -> int:
    record = models.get(comfy.owner_of(patcher))
    return record.settings.priority if record is not None else UNGOVERNED_PRIORITY


def _refuse_for(owner: int):
    @timing.holds_collector
    def refuse(kind: str) -> bool:
        record = models.get(owner)
        if record is None:
            return False
        with timing.timed("eviction_check"):
            others = []
            for patcher in comfy.loaded_dynamic_patchers():
                if comfy.owner_of(patcher) != owner:
                    nbytes = (comfy.staged_bytes(patcher)[0] if kind == "ram"
                              else comfy.releasable_registrations(patcher))
                    others.append((_priority_of(patcher), nbytes))
            return refuses(record.settings.priority, others)
    return refuse


def attach(patcher, record):
    """Viking's hold on a dynamic patcher's staging (instance wrappers; clones get them again)."""
    comfy.guard_staging_eviction(patcher, _refuse_for(record.owner))


def after_event(patcher, record):
    """On the execution thread after a ComfyUI event: the priority flag, the model's own limit
    on its staging RAM, and the ceiling."""
    if record.settings.priority > 0:  # only ever set: clearing ComfyUI's own mark would hand its
        comfy.keep_in_current_prompt(patcher, True)  # current model's staging to eviction first
    limit = int(record.settings.model_limit_gib * (1 << 30))
    if limit:
        staged, _ = comfy.staged_bytes(patcher)
        if staged > limit:
            comfy.drop_staging(patcher, staged - limit)
    govern()


def file_ranges(patcher, record) -> list[tuple[int, int, object]]:
    """(address, bytes, keepalive) of the checkpoint pages of the model's weights that ComfyUI's
    staging does not hold (what a forward reads from the file), through Viking's own shared
    read-only views (one per file, spanning at least those slices), for the native pins. Nothing before
    the model has sampled once: until then staging is not decided, and pinning the whole file
    would hold the model twice while ComfyUI stages it. A file that cannot be mapped (shorter
    than ComfyUI's slices: replaced or truncated on disk; an OS error; a platform without file
    views) gets a note and no residency; none either with the node's file_residency off."""
    page = 4096
    by_file: dict[int, list[tuple[int, int]]] = {}
    if record.sampled and record.settings.file_residency:
        for fd, offset, size in comfy.checkpoint_slices(patcher, unstaged_only=True):
            by_file.setdefault(fd, []).append((offset, size))
    # A view no longer needed goes (the native ledger keeps it mapped until its pins are released).
    record.file_views = {fd: view for fd, view in record.file_views.items() if fd in by_file}
    ranges = []
    for fd, slices in by_file.items():
        start = min(offset for offset, _ in slices) // page * page
        end = max(offset + size for offset, size in slices)
        view = record.file_views.get(fd)
        # A view that still spans the slices stays: staging one module more moves no other range
        # (a new view would lock every page again); only a span that grew needs a new one.
        if view is None or start < view[1] or end > view[1] + view[0].len:
            try:
                view = (native.map_file(comfy.native_file(fd), start, end - start), start)
            except Exception as error:  # noqa: BLE001 - a file or platform without views: no residency, never a failed event
                # A truncated file (ValueError), an OS error from mmap / fstat, a platform with no
                # views (BackendUnavailableError): said once per model and reason.
                note = f"no residency for one checkpoint file: {error}"
                if note not in record.notes:
                    record.notes.append(note)
                    log.warning("Viking Engine: %s", note)
                record.file_views.pop(fd, None)
                continue
            record.file_views[fd] = view
        mapping, base = view
        ranges += [(mapping.addr + offset - base, size, mapping) for offset, size in slices]
    return ranges


def summary(patcher, record, read_residency: bool = True) -> dict:
    """What the status shows per model in dynamic mode. `read_residency`: also read the page
    cache's residency of the model's file spans (a walk of its weights and a mincore of each);
    otherwise those figures are None and the residency sampler's last ones go in their place."""
    staged, staged_pinned = comfy.staged_bytes(patcher)
    figures = residency(patcher, record) if read_residency else dict.fromkeys(RESIDENCY_FIELDS)
    return {"staged_bytes": staged, "staged_pinned_bytes": staged_pinned,
            "file_view_bytes": sum(view.len for view, _ in record.file_views.values()), **figures,
            "kept_in_current_prompt": record.settings.priority > 0, "pin_ceiling_bytes": comfy.pin_ceiling(),
            "file_residency": record.settings.file_residency, "fast_disk": comfy.fast_disk(patcher)}


RESIDENCY_FIELDS = ("file_view_resident_bytes", "checkpoint_resident_bytes", "checkpoint_bytes")


def residency(patcher, record) -> dict:
    """The page cache's residency of the model's checkpoint: of Viking's file views, and of the
    spans ComfyUI maps (RESIDENCY_FIELDS)."""
    spans = comfy.mapped_storage_spans(patcher)
    return {"file_view_resident_bytes": sum(view.resident_bytes() or 0 for view, _ in list(record.file_views.values())),
            "checkpoint_resident_bytes": sum(native.resident_bytes(addr, length) or 0 for addr, length in spans),
            "checkpoint_bytes": sum(length for _, length in spans)}
