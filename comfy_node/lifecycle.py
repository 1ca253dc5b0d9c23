"""Pins that follow ComfyUI's weights. One idempotent `reconcile(patcher)` runs after every
event that can move weights between RAM and VRAM; one `forget(owner)` ends everything Viking
keeps for a model (its record, home, prefetcher, pins), whichever path ends it.

Why these events: no callback runs *before* ComfyUI frees or replaces a CPU weight (load to the
GPU, unload to fresh CPU tensors, partial unload, LoRA backups). So the native ledger holds a
reference to every storage it pins (the memory cannot be freed while registered), and Viking
reconciles *after*: ON_LOAD, ON_DETACH, ON_CLEANUP, ON_INJECT_MODEL (see comfy.attach_callbacks),
and a weakref finalizer on the torch module when ComfyUI drops the model. ON_PRE_RUN, at the
start of sampling, checks for hook patches. The two steering points with no callback at all
are thin wrappers on the patcher instance: `partially_load` (vram_cap.py) and the calls that
move weights (`load`, `unpatch_model`, `partially_unload`: home.watching).
ComfyUI's internals are read in comfy.py only; changes from other threads go through gate.py.
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import TYPE_CHECKING

from . import comfy, dynamic, gate, home, models, prefetch, residency, shared_settings, timing, vram_cap, zero_copy
from . import native as native_module
from .models import ModelRecord, PinSettings
from .native import require
from .weights import PLAIN, as_read, host_ranges, identity_key, range_key, tree_tensors

if TYPE_CHECKING:
    from . import contract

__all__ = ["PinSettings", "attach", "reconcile", "forget", "unpin", "unpin_owner", "status"]

KEY = "viking_engine"
log = logging.getLogger("viking_engine")
_unpin_count = 0  # bumped by every unpin: pin nodes re-run after one
# Bumped by every native call that can change the ledger (a reconcile, a release): a model's
# pins may have gone to another model's reconcile, so its unchanged ranges alone do not show
# that nothing is left to do (_reconcile_ranges).
_ledger_changes = 0

HOOKS_NOTE = ("no pinned home and no prefetch: hook patches (CreateHookLora, SetClipHooks, scheduled hooks) "
              "rewrite these weights in place during sampling; ComfyUI's own paths carry them")


KINDS_NOTE = ("quantized / GGUF weights: pinned in RAM like the others; their loads, unloads and streaming "
              "take ComfyUI's own paths (no pinned home, no prefetch for them)")


def unpin_generation() -> int:
    return _unpin_count


def owner_of(patcher) -> int:
    return comfy.owner_of(patcher)


def record_of(patcher) -> ModelRecord | None:
    return models.get(comfy.owner_of(patcher))


def is_pinned(patcher) -> bool:
    return record_of(patcher) is not None


def settings_of(patcher) -> PinSettings | None:
    record = record_of(patcher)
    return record.settings if record is not None else None


def labels() -> dict[int, str]:
    return {record.owner: record.settings.label for record in models.all_records()}


def settings_by_owner() -> dict[int, PinSettings]:
    return {record.owner: record.settings for record in models.all_records()}


# --- the one entry point -----------------------------------------------------------------------

def reconcile(patcher) -> dict | None:
    """Makes the pins of `patcher`'s model match what is in host RAM now. Idempotent."""
    record = record_of(patcher)
    if record is None:
        return None
    native = require()
    record.patcher = weakref.ref(patcher)
    if comfy.is_dynamic(patcher):
        problem = comfy.dynamic_internals_problem(patcher)
        if problem is not None:
            _drop_streaming(record)
            _release(native, record.owner)
            record.last_report = {"owner": record.owner, "pinned_bytes": 0, "wanted_bytes": 0, "standing_aside": problem}
            return record.last_report
        # Weights stay in ComfyUI's mapping and stream through its own staging: no home, no
        # prefetch; Viking pins in place the checkpoint pages staging does not hold (dynamic.py),
        # from the first sampling on (ON_PRE_RUN sets record.sampled). ComfyUI fires about six
        # events a prompt that move nothing here, so the model is walked only when ComfyUI's
        # staging totals (two numbers it keeps) or the model changed, and pinned again only when
        # the mapped ranges did (measured on an H200: reconciling, with the status figures, at
        # every event cost up to 0.2 s a prompt; the walk alone took ~3 ms for 780 weights here).
        _drop_streaming(record)
        if record.vram_cap_bytes and dynamic.CAP_NOTE not in record.notes:
            record.notes.append(dynamic.CAP_NOTE)
        dynamic.attach(patcher, record)
        # Pins given back under pressure, or a lock that failed off ComfyUI's thread (the native
        # side locks file pages on its own thread): the next reconcile pins again / reports it.
        lost = (gate.pressure_releases, native.deferred_failures())
        state = lost + (record.sampled, comfy.staged_bytes(patcher), id(comfy.torch_model(patcher)))
        more_fits = _budget_may_fit_more(native, record.last_report)
        if more_fits or state != record.dynamic_state:
            ranges = dynamic.file_ranges(patcher, record)
            signature = lost + (range_key(ranges),)
            if more_fits or signature != record.dynamic_signature:
                record.last_report = _reconcile_ranges(native, patcher, record, ranges)
                record.dynamic_signature = signature
            record.dynamic_state = state
        dynamic.after_event(patcher, record)
        record.last_report["notes"] = list(record.notes)
        return record.last_report
    settings = record.settings
    _note_hooks(record, patcher)
    # ComfyUI fires several events a prompt; in static mode most move nothing. The home and the
    # prefetcher follow where the weights are, so they are brought up to date only when the
    # model's weights (objects and addresses), its share in VRAM or its patches changed
    # (measured on an H100, fp8-scaled Flux-shaped model: ~6 ms an event for the two otherwise,
    # bench/probes/static_event_breakdown.py).
    model = comfy.torch_model(patcher)
    comfy_state = (id(model), comfy.loaded_weight_bytes(patcher), comfy.loaded_in_part(patcher),
                   tuple(comfy.patch_backups(patcher)), tuple(comfy.hook_patched_keys(patcher)), record.hooks_seen,
                   id(settings), bool(record.home is not None and record.home.pending))
    if _prompt_moved_nothing(record, comfy_state) or _holds_nothing_during_prompt(record):
        # Reading the weights waits for the end of the prompt (the gate's watcher); the
        # prefetcher still lets go of its copies at the end of each sampling run.
        ref = weakref.ref(patcher)
        gate.after_prompt((record.owner, "weights"), f"checking {settings.label or record.owner}'s weights after a prompt",
                          lambda: _reconcile_if_alive(ref), shown=False)
        record.last_report["prefetch"] = prefetch.between_runs(record)
        return record.last_report
    tree = tree_tensors(model)
    tree_key = identity_key(tree)
    state = (tree_key,) + comfy_state
    moved = state != record.static_state
    may_wait = comfy.offloads_to_ram(patcher)  # ComfyUI moves the model between RAM and VRAM
    if settings.pinned_home and may_wait and not record.hooks_seen:
        if moved or record.home is None:
            with timing.timed("event/home"):
                home.update(patcher, record)
    else:
        record.home = None
    report = _reconcile_ranges(native, patcher, record, tree=(tree, tree_key), may_wait=may_wait)
    if home.held_bytes(record) and skipped_for(report, "over_budget", "failed"):
        # All or nothing: a model whose home does not fit gets ComfyUI's ordinary unload.
        home.drop_held(record, "no pinned home: the budget has no room for a RAM copy of the weights in VRAM; "
                               "they unload the ordinary way")
        report = _reconcile_ranges(native, patcher, record, tree=(tree, tree_key), may_wait=may_wait)
    report["home_bytes"] = home.held_bytes(record)
    report["home_note"] = record.home.note if record.home is not None else None
    report["notes"] = list(record.notes)
    if moved:
        with timing.timed("event/prefetch"):
            report["prefetch"] = prefetch.update(patcher, record, _prefetch_enabled(record),
                                                 settings.prefetch_window_mib << 20)
    else:
        report["prefetch"] = prefetch.between_runs(record)
    record.static_state, record.static_ledger = state, (_ledger_changes, gate.pressure_releases)
    record.last_report = report
    for failure in report["failures"]:
        warn_once(record, f"a pin failed: {failure}")
    return report


def _prompt_moved_nothing(record: ModelRecord, comfy_state: tuple) -> bool:
    """Whether a static-mode event during a running prompt may skip reading the model's weights:
    ComfyUI moves weights between RAM and VRAM, and patches them, only through the calls whose
    effects `comfy_state` holds (its VRAM share, patch backups, hook patches, the torch model),
    and none of those changed since the last event. Reading the weights' identity costs ~1 us a
    weight, and six or seven such events a prompt cost an fp8-scaled Flux-shaped model ~15 ms of
    each prompt. A weight
    replaced some other way during the prompt is found by the check the gate's watcher makes
    once the prompt has ended (Viking's pins keep the replaced memory alive until then)."""
    return (record.last_report is not None and record.static_state[1:] == comfy_state
            and record.static_ledger == (_ledger_changes, gate.pressure_releases)
            and _plan_may_wait(record, comfy.comfy_pinned_total()))


def _holds_nothing_during_prompt(record: ModelRecord) -> bool:
    """Whether a static-mode event during a running prompt may leave the whole reconcile to the
    prompt's end even though ComfyUI moved weights: Viking holds nothing of this model (no
    registration, nothing waiting, no home, no prefetcher, and none that a load could start), so
    no pin of Viking's keeps freed memory alive and nothing of its goes stale meanwhile, and new
    memory in RAM would mostly wait for the prompt's end anyway (_registrations_now). The case:
    a quantized model in 0.33's static mode, whose offloaded weights ComfyUI pins itself.
    Walking, planning and the home's update there cost several milliseconds of each prompt, for
    nothing: the whole of Viking's gap to ComfyUI alone's warm prompt."""
    last = record.last_report
    return (last is not None and record.native_report is not None and last.get("pinned_bytes") == 0
            and not last.get("pending_bytes") and not last.get("waiting_bytes")
            and (record.home is None or not record.home.tensors) and record.prefetcher is None
            and not prefetch.may_start(record, _prefetch_enabled(record))
            and gate.watching() and gate.prompt_running())


def _prefetch_enabled(record: ModelRecord) -> bool:
    """Prefetch is switched on for the model and no hook patches were met (they change weights
    per step, which a copy made ahead would miss)."""
    return record.settings.prefetch and not record.hooks_seen


# A model the budget left incomplete is planned again only once the shared budget has this much
# more room than at its last plan (one read-only region; src/plan.rs): the budget follows
# available RAM, which drifts a little between any two events.
ROOM_STEP_BYTES = 64 << 20


def _budget_may_fit_more(native, last: dict | None) -> bool:
    """Whether a plan now could pin more of a model than its last one (`last`, its last native
    report): never planned, or left incomplete and the budget has grown (or is exceeded) since."""
    if last is None or "budget" not in last:
        return True
    if last.get("pinned_bytes") == last.get("wanted_bytes"):
        return False
    budget = json.loads(native.budget_json())["budget"]
    return budget["excess_bytes"] > 0 or budget["room_bytes"] >= last["budget"]["room_bytes"] + ROOM_STEP_BYTES


def _note_hooks(record: ModelRecord, patcher):
    """Hook patches met once: home and prefetch stand aside for this model from now on."""
    if record.hooks_seen or not comfy.weight_hooks(patcher):
        return
    record.hooks_seen = True
    record.notes.append(HOOKS_NOTE)
    _drop_streaming(record)


def _reconcile_ranges(native, patcher, record: ModelRecord, extra_ranges=(), tree=None, may_wait=False) -> dict:
    """The native reconcile of the model's host ranges now; skipped (its last report, nothing
    done) when the model's weights are the same objects pointing at the same memory, the ledger
    is as at its last call and the budget has no room for more. ComfyUI fires about seven events
    a prompt that move nothing; the native call reads the process's memory map, RAM figures and
    lock count, and reading every weight's storages costs ~20 us a weight (a tenth of a second or
    more a prompt for a 5 GB fp8-scaled model in static mode if each event did both), so an event
    first compares a key that costs ~1 us a weight.
    A plan that only ComfyUI's own pins or more budget room call for waits for the end of a
    running prompt (_plan_may_wait). `tree`: the model's own tensors and their identity key,
    when the caller has them already; `may_wait`: new registrations may wait for the end of a
    running prompt (_registrations_now)."""
    global _ledger_changes
    settings = record.settings
    if tree is None:
        own = tree_tensors(comfy.torch_model(patcher))
        tree = (own, identity_key(own))
    others = _weights_beside_the_model(patcher)
    tensors = tree[0] + others
    comfy_ranges, comfy_total = comfy.foreign_pins()
    backend = backend_for(settings.backend, patcher)
    signature = (gate.pressure_releases, native.deferred_failures(), backend, settings.priority, settings.label,
                 settings.model_limit_gib, tree[1] + identity_key(others), range_key(extra_ranges))
    comfy_pins = (comfy_total, range_key(comfy_ranges))
    last = record.native_report
    if last is not None and record.native_signature[:2] == (_ledger_changes, signature) and not last["pending_bytes"]:
        nothing_done = {**last, "newly_pinned_bytes": 0, "released_bytes": 0, "regions_registered": 0, "failures": [],
                        "evicted": []}
        if record.native_signature[2] == comfy_pins and not _budget_may_fit_more(native, last):
            return nothing_done
        if _plan_may_wait(record, comfy_total):
            ref = weakref.ref(patcher)
            gate.after_prompt(record.owner, f"planning {settings.label or record.owner}'s pins again after a prompt",
                              lambda: _reconcile_after_prompt(ref), shown=False)
            return nothing_done
    with timing.timed("event/walk"):
        found = host_ranges([as_read(t) for t in tensors], skip_storage=comfy.comfy_owned)
    _note_weights_left(record, found.left_to_comfyui)
    ranges, waiting_bytes = found.ranges, 0
    if may_wait and gate.watching():
        ranges, waiting_bytes = _registrations_now(patcher, record, found.ranges, found.pinned_elsewhere)
    record.registered_ptrs, record.registered_after = {r[0] for r in ranges}, gate.pressure_releases
    _note_waiting(record, waiting_bytes)
    with timing.timed("event/native"):
        report = json.loads(native.reconcile(
            record.owner, ranges + list(extra_ranges),
            priority=settings.priority,
            backend=backend,
            label=settings.label,
            model_limit_gib=settings.model_limit_gib,
            foreign=found.pinned_elsewhere + comfy_ranges,
            others_pinned_bytes=comfy_total,
        ))
    _ledger_changes += 1
    record.native_report, record.native_signature = dict(report), (_ledger_changes, signature, comfy_pins)
    if set(found.bytes_by_kind) - {PLAIN} and KINDS_NOTE not in record.notes:
        record.notes.append(KINDS_NOTE)
    record.weight_kinds = {"bytes_by_kind": found.bytes_by_kind,
                           "left_to_comfyui": [{"what": what, "weights": n, "bytes": b}
                                               for what, (n, b) in sorted(found.left_to_comfyui.items())]}
    report["waiting_bytes"] = waiting_bytes
    return report


def _plan_may_wait(record: ModelRecord, comfy_total: int) -> bool:
    """Whether a plan of a model whose own weights did not change can wait for the end of the
    running prompt: what calls for it is ComfyUI's own pinned set (its static mode pins and
    unpins offloaded weights at each partial load) or room in the budget for more. An
    fp8-scaled Flux-shaped model's walk and plan cost ~5 ms. ComfyUI's pins never overlap
    Viking's (CUDA registers a range once) and stay within its own ceiling; what they grew by
    must also fit the room the last plan left. A server's watcher plans once the queue is idle."""
    return gate.watching() and gate.prompt_running() and _comfy_pins_fit(record, comfy_total)


def _comfy_pins_fit(record: ModelRecord, comfy_total: int) -> bool:
    """ComfyUI's own pins have grown (to `comfy_total`) by no more than the room the model's
    last plan left: Viking's pins and ComfyUI's together stay within the budget."""
    last = record.native_report
    return (last is not None and len(record.native_signature) == 3 and "budget" in last
            and comfy_total - record.native_signature[2][0] <= last["budget"]["room_bytes"])


# New host memory a running prompt registers at once (about 5 ms of cuMemHostRegister on an
# H100); more waits for the prompt to end, and is then registered in steps of IDLE_STEP_BYTES
# (~20 ms each), each step only while no prompt runs.
REGISTER_DURING_PROMPT_BYTES = 64 << 20
IDLE_STEP_BYTES = 256 << 20
WAITING_NOTE = "more to pin once the running prompt ends"


def _registrations_now(patcher, record: ModelRecord, ranges: list, pinned_elsewhere=()) -> tuple[list, int]:
    """The ranges to give the native reconcile now, and the new bytes that wait.
    In static mode ComfyUI's loads of a GPU model leave new host memory behind (the weights it
    moved back to RAM, a loader's buffer replaced by per-weight storages at the first load):
    registering gigabytes of it costs a prompt ~80 ms a GB, time ComfyUI alone never spends. So a running
    prompt registers at most REGISTER_DURING_PROMPT_BYTES of new memory; the ranges registered
    already are kept (and released as usual), and the rest is registered by the gate's watcher
    once no prompt runs, a step at a time, so a prompt queued meanwhile waits one step at most.
    Memory CUDA reports pinned already (`pinned_elsewhere`, from the walk: 0.33's static mode
    pins the weights it moves back to RAM) is not new: the plan leaves it as it is. Counted as new, the
    3 GB of a ComfyUI-pinned fp8-scaled model would send the watcher through a walk and a plan
    that pin nothing at every look after its cold prompt."""
    if record.registered_after != gate.pressure_releases:
        record.registered_ptrs = set()  # pressure relief gave pins back since: not registered now
    held = {ptr for ptr, _nbytes in pinned_elsewhere}
    new = [r for r in ranges if r[0] not in record.registered_ptrs and r[0] not in held]
    new_bytes = sum(r[1] for r in new)
    running = gate.prompt_running()
    if new_bytes <= (REGISTER_DURING_PROMPT_BYTES if running else IDLE_STEP_BYTES):
        return ranges, 0
    taken, step = set(), 0
    for ptr, nbytes, _storage in ([] if running else new):
        if step and step + nbytes > IDLE_STEP_BYTES:
            break
        taken.add(ptr)
        step += nbytes
    ref = weakref.ref(patcher)
    gate.after_prompt(record.owner, f"pinning {record.settings.label or record.owner}'s weights after a prompt",
                      lambda: _reconcile_after_prompt(ref))
    return [r for r in ranges if r[0] in record.registered_ptrs or r[0] in held or r[0] in taken], new_bytes - step


def _reconcile_after_prompt(ref):
    patcher = ref()
    record = record_of(patcher) if patcher is not None else None
    if record is None:
        return None
    record.native_signature = ()  # the last call held registrations or a plan back: walk and plan again
    return reconcile(patcher)


def _note_waiting(record: ModelRecord, waiting_bytes: int):
    record.set_note(WAITING_NOTE, waiting_bytes and (
        f"{waiting_bytes / 2**30:.2f} GiB {WAITING_NOTE}: registering it now would cost the prompt "
        "time (ComfyUI moves this model between RAM and VRAM)"))


def _note_weights_left(record: ModelRecord, left: dict):
    """Weights of a type Viking cannot read stay with ComfyUI: said once per model and type, in
    the log and the model's notes, never again at each event."""
    for what, (count, nbytes) in left.items():
        if what in record.warnings_said:
            continue
        record.warnings_said.add(what)
        note = (f"left to ComfyUI: {count} weight(s) of type {what}, {nbytes / 2**20:.1f} MiB "
                f"(Viking cannot read their memory)")
        record.notes.append(note)
        log.warning("Viking Engine: %s: %s", record.settings.label, note)


def backend_for(choice: str, patcher) -> str:
    """The backend a model's pins use: "auto" is the OS lock for a model ComfyUI computes on the
    CPU (--cpu, a CPU-only text encoder), so no CUDA context is made for it even where a GPU
    is present; otherwise the native side's auto (CUDA when it starts, else the OS lock)."""
    return "os-lock" if choice == "auto" and not comfy.runs_on_gpu(patcher) else choice


def host_weights(patcher) -> list:
    """The weights of a patcher that can sit in host RAM: the module's parameters and buffers,
    the original weights ComfyUI keeps while LoRA patches are applied, and the pinned home of
    the weights in VRAM, as their owners hold them (weights.as_read gives what to walk;
    host_ranges leaves out the storages ComfyUI's dynamic mode owns)."""
    return tree_tensors(comfy.torch_model(patcher)) + _weights_beside_the_model(patcher)


def _weights_beside_the_model(patcher) -> list:
    """The host weights a patcher keeps outside its module: LoRA backups and the home's held copies."""
    record = record_of(patcher)
    held = home.held_tensors(record) if record is not None else []
    return comfy.backup_weights(patcher) + held


def skipped_for(report: dict, *reasons: str) -> bool:
    """Some of the model's weights were left unpinned for one of `reasons` (e.g. over_budget)."""
    return any(skip["reason"] in reasons for skip in report["skipped"])


def _drop_streaming(record: ModelRecord):
    """Drops the model's pinned home and prefetch (before its pins go)."""
    record.home = None
    prefetch.drop(record)


# --- ComfyUI events (execution thread) ---------------------------------------------------------

@timing.holds_collector
def _on_event(patcher, *_args):
    # Runs inside ComfyUI's load/unload: an exception here would abort the load, so never raise.
    try:
        if gate.on_another_thread():
            # Off the execution thread (a patcher's __del__ on a collector's thread): now when no
            # prompt runs, else by the execution thread at its next Viking callback (a release
            # here could pull pages from under copies the running prompt has queued).
            ref = weakref.ref(patcher)
            gate.submit("reconcile after a ComfyUI event on another thread", lambda: _reconcile_if_alive(ref))
            return
        with timing.timed("event"), gate.lock:
            gate.on_execution_thread()
            reconcile(patcher)
    except Exception as error:  # noqa: BLE001 - logged, never propagated into ComfyUI
        warn_once(record_of(patcher), f"reconcile after a ComfyUI event failed: {error}")


def _reconcile_if_alive(ref):
    patcher = ref()
    return reconcile(patcher) if patcher is not None else None


def warn_once(record: ModelRecord | None, text: str):
    """Logs a failure of Viking's own work on a ComfyUI event once per model and text (ComfyUI
    fires several events a prompt: the same warning each time helps nobody); the model's notes
    keep it for the status."""
    key = text[:300]
    if record is not None:
        if key in record.warnings_said:
            return
        record.warnings_said.add(key)
        record.notes.append(f"Viking failed here and left it to ComfyUI: {text}")
    log.warning("Viking Engine: %s%s", f"{record.settings.label}: " if record is not None else "", text)


@timing.holds_collector
def _on_pre_run(patcher, *_args):
    """Start of sampling: deferred changes go in now, and hook patches registered for this
    run switch home and prefetch off before the first step."""
    try:
        with timing.timed("event"), gate.lock:
            gate.note_execution_thread()  # sampling runs on ComfyUI's execution thread
            gate.on_execution_thread()
            record = record_of(patcher)
            if record is not None:
                record.sampled = True
                _note_hooks(record, patcher)
    except Exception as error:  # noqa: BLE001
        warn_once(record_of(patcher), f"sampling-start check failed: {error}")


@timing.holds_collector
def _on_clone(original, clone):
    if is_pinned(original):
        _install_wrappers(clone)


def _install_wrappers(patcher):
    """The instance wrappers of a pinned patcher (each does nothing for a model Viking does not
    pin): the VRAM cap on partially_load, and the pinned home's watch over the calls that move
    weights. Both wait for `gate.lock` first, so no change from another thread runs during them."""
    vram_cap.install(patcher)
    owner = comfy.owner_of(patcher)

    def watched(inner):
        def call(this, *args, **kwargs):
            record = models.get(owner)
            with gate.lock:
                if record is None:
                    return inner(this, *args, **kwargs)
                with home.watching(this, record):
                    return inner(this, *args, **kwargs)
        return call

    for name in ("load", "unpatch_model", "partially_unload"):
        comfy.wrap_instance_method(patcher, name, watched)


@timing.holds_collector
def attach(patcher, settings: PinSettings) -> dict | None:
    """Makes `patcher` (and clones made from it later) keep its model's weights pinned."""
    native = require()
    # The headroom is shared by every model (its home: the settings dialog): a node that asks
    # for one sets it, unless VIKING_HEADROOM_GIB fixes it; a node left at 0 leaves it as it is,
    # so it never undoes another's or the dialog's.
    if settings.headroom_gib and not shared_settings.headroom_fixed():
        shared_settings.set_headroom(settings.headroom_gib, f"node #{settings.node_id}")
    vram_cap_bytes = native.gib_to_bytes("vram_cap_gib", settings.vram_cap_gib)
    owner = comfy.owner_of(patcher)
    with gate.lock:
        record = models.get(owner)
        if record is None:
            record = models.put(ModelRecord(owner=owner, settings=settings))
            record.finalizer = weakref.finalize(comfy.torch_model(patcher), _forget_dropped, owner)
        record.settings = settings
        record.dynamic_state = record.dynamic_signature = ()  # new settings: dynamic mode plans again
        record.static_state = ()
        record.patcher = weakref.ref(patcher)
        record.vram_cap_bytes = vram_cap_bytes
        comfy.attach_callbacks(patcher, KEY, _on_event, _on_clone, _on_pre_run)
        _install_wrappers(patcher)
        try:
            return reconcile(patcher)
        except (ValueError, native.BackendUnavailableError):
            raise  # the node's inputs: its message says what to change
        except Exception as error:  # noqa: BLE001 - a model Viking does not understand is left to ComfyUI
            return _stand_aside(native, record, f"Viking stands aside for this model and leaves it to ComfyUI: {error}")


def _stand_aside(native, record: ModelRecord, why: str) -> dict:
    """Nothing of this model stays pinned; the status and the node's text say why (the prompt
    goes on as ComfyUI alone would run it). Later events try again, and say a failure once."""
    _drop_streaming(record)
    _release(native, record.owner)
    warn_once(record, why)
    record.last_report = {"owner": record.owner, "pinned_bytes": 0, "wanted_bytes": 0, "standing_aside": why}
    return record.last_report


def set_vram_cap(patcher, cap_gib: float):
    """At most `cap_gib` GiB of this pinned model's weights in VRAM from its next load (0: no cap)."""
    record = record_of(patcher)
    if record is None:
        raise ValueError("set_vram_cap needs a model Viking pins: attach it first")
    record.vram_cap_bytes = require().gib_to_bytes("vram_cap_gib", cap_gib)
    record.settings.vram_cap_gib = cap_gib


# --- ending a model ------------------------------------------------------------------------------

def forget(owner: int) -> int:
    """Ends everything Viking keeps for one model: its prefetcher, home, record and pins. Every
    path that ends a model comes here. Returns the bytes released."""
    with gate.lock:
        record = models.take(owner)
        if record is not None:
            _drop_streaming(record)
            if record.finalizer is not None:
                record.finalizer.detach()
        return _release(require(), owner)


def _release(native, owner: int) -> int:
    """Releases one owner's pins (the ledger changes: see _ledger_changes)."""
    global _ledger_changes
    _ledger_changes += 1
    record = models.get(owner)
    if record is not None:
        record.registered_ptrs = set()
    return native.release(owner)


def _forget_dropped(owner: int):
    """ComfyUI dropped the model: nothing can copy from its weights any more."""
    try:
        forget(owner)
    except Exception as error:  # noqa: BLE001 - runs from a finalizer: must not raise
        log.warning("Viking Engine: releasing a dropped model failed: %s", error)


def unpin(patcher=None) -> int:
    """Releases one model's pins and forgets it (its callbacks then do nothing), or every
    model's. For the execution thread (the Unpin node); other threads go through gate.submit.
    Returns bytes released."""
    global _unpin_count, _ledger_changes
    _unpin_count += 1
    if patcher is not None:
        return forget(comfy.owner_of(patcher))
    with gate.lock:
        released = sum(forget(owner) for owner in models.owners())
        _ledger_changes += 1
        return released + require().release_all()


def unpin_owner(owner: int) -> int:
    """Releases the pins of one owner (a model), known by its id in the status."""
    global _unpin_count
    _unpin_count += 1
    return forget(owner)


# --- the status ------------------------------------------------------------------------------

def status(probe_cuda: bool = False, mark_run: bool = False, read_residency: bool = True) -> "contract.Status":
    """The one status the node, the HTTP route and the panel read: the native snapshot, plus
    what only the Python side knows per model (VRAM, home, prefetch, notes, last report), which
    ComfyUI this is, ComfyUI's own pins and the changes waiting for the execution thread.
    `read_residency`: read every pinned page's residency now (page tables, ~24 ms per GiB, and
    the checkpoint's page cache in dynamic mode); off, the figures are the residency sampler's
    last, with their age (residency.py), and the status costs its caller a few milliseconds."""
    # ComfyUI on the CPU (--cpu) gets no CUDA context from a status either.
    probe_cuda = probe_cuda and comfy.host().mode != "cpu"
    snapshot = json.loads(require().status_json(probe_cuda=probe_cuda, mark_run=mark_run, residency=read_residency))
    listed = {entry["owner"] for entry in snapshot["owners"]}
    # A model with nothing pinned (Viking stands aside for it, or its budget holds nothing yet)
    # is still a model Viking looks after: the status lists it with its reason.
    snapshot["owners"] += [_unpinned_entry(record) for record in models.all_records() if record.owner not in listed]
    for entry in snapshot["owners"]:
        record = models.get(entry["owner"])
        usage = vram_cap.usage(record) if record is not None else None
        entry["vram_cap_bytes"], entry["vram_bytes"] = usage if usage is not None else (0, None)
        entry["home_bytes"] = home.held_bytes(record) if record is not None else 0
        entry["pinned_home"] = record is not None and record.home is not None
        entry["home_note"] = record.home.note if record is not None and record.home is not None else None
        entry["prefetch"] = prefetch.summary(record) if record is not None else None
        entry["notes"] = list(record.notes) if record is not None else []
        entry["weights"] = dict(record.weight_kinds) if record is not None else {}
        entry["zero_copy"] = zero_copy.summary().get(str(entry["owner"]))
        report = (record.last_report if record is not None else None) or {}
        entry["standing_aside"] = report.get("standing_aside")
        patcher = record.live_patcher() if record is not None else None
        entry["dynamic"] = (dynamic.summary(patcher, record, read_residency)
                            if patcher is not None and comfy.is_dynamic(patcher) else None)
    comfy_ranges, comfy_total = comfy.foreign_pins()
    snapshot["comfy"] = {**comfy.host().as_dict(), "pinned_bytes": comfy.comfy_pinned_total() or comfy_total,
                         "pinned_tensors": len(comfy_ranges), "pin_ceiling_bytes": comfy.pin_ceiling()}
    snapshot["native"] = native_module.build_info() if hasattr(native_module, "build_info") else {}
    snapshot["time_in_viking"] = timing.totals()
    snapshot["deferred_changes"] = gate.deferred()
    snapshot["applied_changes"] = gate.applied()
    snapshot["pressure_relief"] = gate.relief()
    snapshot["headroom_source"] = shared_settings.headroom_source()
    if read_residency:
        snapshot["residency"] = residency.read_now_note()
    else:
        residency.overlay(snapshot)
        residency.request()
    return snapshot


def _unpinned_entry(record: ModelRecord) -> dict:
    """The native status's fields for a model that holds no pins."""
    settings = record.settings
    return {"owner": record.owner, "label": settings.label, "priority": settings.priority, "wanted_bytes": 0,
            "pinned_bytes": 0, "file_page_bytes": 0, "mapped_view_bytes": 0, "regions": 0, "by_backend": {}, "skipped": [], "resident_bytes": None,
            "swapped_bytes": None, "pinned_swapped_bytes": None}
