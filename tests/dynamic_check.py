"""ComfyUI 0.33's dynamic VRAM mode, the parts that run without a GPU (comfy_node/dynamic.py),
with real parts: a checkpoint loaded through comfy-aimdo's own read-only mapping
(comfy.utils.load_safetensors, as dynamic mode loads it), a real ModelPatcher over those
weights, real page locks and real page-cache pressure. Prints named checks as JSON; exits 1 if
one fails. Run by tests/test_dynamic.py under ComfyUI 0.33's Python.

- residency: Viking's shared views of the checkpoint, locked by the OS-lock backend, keep the
  weights' file pages in RAM under posix_fadvise(DONTNEED) + MADV_PAGEOUT of aimdo's mapping;
  without them the same pressure evicts the pages (the check can fail); the node's
  file_residency off: none of it, and the status says so;
- a file truncated on disk: a clear note, no view, nothing pinned for it;
- budget hand-over: ComfyUI's MAX_PINNED_MEMORY becomes Viking's budget less Viking's pins;
- priorities: the refusal rule of ComfyUI's per-model eviction calls;
- forget: every lock and view of the model gone.

usage: python tests/dynamic_check.py COMFY_0_33_DIR WORK_DIR
"""

import ctypes
import dataclasses
import gc
import json
import os
import sys

from in_process import start_comfy

comfy_dir, work = sys.argv[1], sys.argv[2]
start_comfy(comfy_dir, "--cpu")

import safetensors.torch  # noqa: E402
import torch  # noqa: E402

import comfy_aimdo.control  # noqa: E402

comfy_aimdo.control.init()
import comfy.memory_management  # noqa: E402
import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402

from comfy_node import comfy as seam, dynamic, lifecycle, models, nodes  # noqa: E402
from dynamic_cpu import StagingPatcher, enter_dynamic_mode, mapped_model, stage, unstage  # noqa: E402
from comfy_node.native import require  # noqa: E402
from comfy_node import contract  # noqa: E402
from comfy_node.report import status_text  # noqa: E402

native = require()
native.configure(headroom_gib=0.0)
checks = {}
MIB = 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def locked_bytes():
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmLck"))


def checkpoint(name, tensors=8, mib=8):
    path = os.path.join(work, name)
    g = torch.Generator().manual_seed(len(name))
    state = {f"{i}.weight": torch.randn(mib * MIB // 4 // 512, 512, generator=g) for i in range(tensors)}
    safetensors.torch.save_file(state, path)
    return path


def resident_share(patcher):
    spans = seam.mapped_storage_spans(patcher)
    return sum(native.resident_bytes(a, n) or 0 for a, n in spans) / sum(n for _, n in spans)


def pressure(path, patcher):
    """Page-cache pressure on the checkpoint: drop its cached pages, page out aimdo's mapping."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    for addr, length in seam.mapped_storage_spans(patcher):
        libc.madvise(ctypes.c_void_p(addr // 4096 * 4096), length + addr % 4096, 21)  # MADV_PAGEOUT


def views_of(path):
    return sum(1 for line in open("/proc/self/maps") if line.rstrip().endswith(os.path.basename(path)))


# --- residency --------------------------------------------------------------------------------
path = checkpoint("resident.safetensors")
patcher = mapped_model(path)
before = locked_bytes()
first = lifecycle.attach(patcher, lifecycle.PinSettings(label="dynamic residency", backend="os-lock", headroom_gib=0.0))
record = lifecycle.record_of(patcher)
weights_bytes = sum(n for _, n in seam.mapped_storage_spans(patcher))
checks["the model's weights live in aimdo's mapping"] = len(seam.checkpoint_slices(patcher)) == 8 and weights_bytes == 64 * MIB
checks["before the first sampling: no residency (ComfyUI's staging not decided yet)"] = (
    first["pinned_bytes"] == 0 and dynamic.file_ranges(patcher, record) == [] and locked_bytes() - before < MIB)
for tensor in patcher.model.parameters():
    tensor.sum()  # read once: in the page cache
lifecycle._on_pre_run(patcher)  # ComfyUI's ON_PRE_RUN callback: the model samples
ranges = dynamic.file_ranges(patcher, record)
report = json.loads(native.reconcile(record.owner, ranges, backend="auto", label="dynamic residency"))
checks["residency: every weight's file pages pinned"] = report["pinned_bytes"] == report["wanted_bytes"] == weights_bytes
native.settle()  # file pages are locked off the caller's thread (src/backend/deferred.rs)
checks["residency: locked by the OS lock"] = locked_bytes() - before >= weights_bytes
checks["residency: one shared view of the file beside aimdo's mapping"] = views_of(path) == 2
pressure(path, patcher)
checks["residency: the pages stay in RAM under pressure"] = resident_share(patcher) == 1.0
status = lifecycle.status()
entry = next(o for o in status["owners"] if o["owner"] == record.owner)
checks["residency: the status sees them resident"] = entry["resident_bytes"] == weights_bytes
# Staging: a module ComfyUI stages reads its pinned copy, not the file, so its file pages get no
# residency. (dynamic_cpu.stage is a stand-in for ComfyUI's per-module pin record: making real
# ones needs cudaHostRegister; the GPU bench shows the real staging.)
linears = list(patcher.model)
views_before = {fd: (view[0].addr, view[0].len) for fd, view in record.file_views.items()}  # the ledger keeps them mapped
for module in linears[:5]:
    stage(module)
staged_bytes = sum(m.weight.nbytes for m in linears[:5])
staged_ranges = dynamic.file_ranges(patcher, record)
checks["staging: the view stays (the first modules staged move no other range: no new mapping, nothing locked again)"] = (
    views_before and {fd: (view[0].addr, view[0].len) for fd, view in record.file_views.items()} == views_before)
staged_report = json.loads(native.reconcile(record.owner, staged_ranges, backend="auto", label="dynamic residency"))
del staged_ranges, ranges  # the views they keep alive: only the native ledger holds them now
checks["staging: modules ComfyUI stages get no residency, the others keep theirs"] = (
    staged_report["pinned_bytes"] == staged_report["wanted_bytes"] == weights_bytes - staged_bytes)
native.settle()
checks["staging: the locks follow (the staged modules' pages unlocked)"] = abs(locked_bytes() - before - (weights_bytes - staged_bytes)) < MIB
for module in linears:
    stage(module)
all_staged = dynamic.file_ranges(patcher, record)
all_report = json.loads(native.reconcile(record.owner, all_staged, backend="auto", label="dynamic residency"))
gc.collect()
checks["staging holds the whole model: Viking holds nothing, its view gone"] = (
    all_report["pinned_bytes"] == 0 and not record.file_views and views_of(path) == 1)
for module in linears:
    unstage(module)
ranges = dynamic.file_ranges(patcher, record)
native.reconcile(record.owner, ranges, backend="auto", label="dynamic residency")
native.release(record.owner)
record.file_views.clear()  # as forget does: Viking's view gone (a mapped page cannot be dropped)
gc.collect()
pressure(path, patcher)
evicted_share = resident_share(patcher)
checks[f"control: without Viking the same pressure evicts them ({evicted_share:.2f} left)"] = evicted_share < 0.5

# --- residency switched off (the node's file_residency) ------------------------------------------
off_path = checkpoint("no_residency.safetensors")
off = mapped_model(off_path, StagingPatcher)  # a patcher ComfyUI takes for a dynamic one
off_before = locked_bytes()
off_settings = lifecycle.PinSettings(label="no residency", backend="os-lock", headroom_gib=0.0, file_residency=False)
lifecycle.attach(off, off_settings)
lifecycle._on_pre_run(off)  # sampled: with residency on, every weight's pages would be pinned now
off_record = lifecycle.record_of(off)
off_report = lifecycle.reconcile(off)
native.settle()
off_entry = next(o for o in lifecycle.status()["owners"] if o["owner"] == off_record.owner)
checks["file_residency off: nothing pinned, no view, nothing locked"] = (
    off_report["pinned_bytes"] == 0 and not off_record.file_views and views_of(off_path) == 1
    and locked_bytes() - off_before < MIB)
checks["file_residency off: the status says so"] = (
    off_entry["dynamic"]["file_residency"] is False and "file_residency off" in status_text(lifecycle.status()))
checks["the dynamic status per model has the contract's keys; no fast disk without --fast-disk"] = (
    contract.key_mismatches(off_entry["dynamic"], contract.DynamicModel) == [] and off_entry["dynamic"]["fast_disk"] is False
    and "(fast disk)" not in status_text(lifecycle.status()))
on_report = lifecycle.attach(off, dataclasses.replace(off_settings, file_residency=True))  # the node run again, switched on
native.settle()
checks["file_residency on again: the same model's pages pinned at once"] = (
    on_report["pinned_bytes"] == on_report["wanted_bytes"] == 64 * MIB and locked_bytes() - off_before >= 64 * MIB)
off_again = lifecycle.attach(off, off_settings)  # and off again: what it locked is let go
native.settle()
gc.collect()
checks["file_residency off again: its pins, locks and view let go"] = (
    off_again["pinned_bytes"] == 0 and not off_record.file_views and views_of(off_path) == 1
    and locked_bytes() - off_before < MIB)
lifecycle.forget(off_record.owner)

# --- a file truncated on disk -----------------------------------------------------------------
short_path = checkpoint("truncated.safetensors")
short = mapped_model(short_path)
lifecycle.attach(short, lifecycle.PinSettings(label="truncated", backend="os-lock", headroom_gib=0.0))
short_record = lifecycle.record_of(short)
lifecycle._on_pre_run(short)
os.truncate(short_path, os.path.getsize(short_path) // 2)
short_ranges = dynamic.file_ranges(short, short_record)
checks["truncated file: no ranges, no view"] = short_ranges == [] and not short_record.file_views
checks["truncated file: a note that says what happened"] = any("replaced or truncated" in n for n in short_record.notes)
lifecycle.forget(short_record.owner)

# --- a platform whose build has no file views (as the Windows build answered before it had them),
# or an OS error from mmap / fstat: no residency, said once; every event still completes ------------
class NoFileViews:
    """The native module, answering map_file as a build without file views does."""
    def __getattr__(self, name):
        return getattr(native, name)

    def map_file(self, *_args):
        raise native.BackendUnavailableError("the file view backend is unavailable: file views are implemented for Unix only")


noview = mapped_model(checkpoint("no_views.safetensors"))
lifecycle.attach(noview, lifecycle.PinSettings(label="no views", backend="os-lock", headroom_gib=0.0))
noview_record = lifecycle.record_of(noview)
lifecycle._on_pre_run(noview)
real_native, dynamic.native = dynamic.native, NoFileViews()
try:
    # What each dynamic-mode event asks (lifecycle.reconcile, then dynamic.after_event): before,
    # the first raise aborted the event's reconcile and after_event, at every event.
    noview_ranges = [dynamic.file_ranges(noview, noview_record) for _ in range(3)]
finally:
    dynamic.native = real_native
noview_notes = [n for n in noview_record.notes if "no residency" in n]
checks["no file views: each event's residency step completes, with no ranges and no view"] = (
    noview_ranges == [[], [], []] and not noview_record.file_views)
checks["no file views: the reason is noted once, not at every event"] = (
    len(noview_notes) == 1 and "file views are implemented for Unix only" in noview_notes[0])
lifecycle.forget(noview_record.owner)

# --- a budget smaller than one module ----------------------------------------------------------
# The planner registers a weight's pages whole or not at all: with a 1 MiB limit and 8 MiB
# weights nothing is pinned, and the node's text says which limit left them out.
small = mapped_model(checkpoint("small_budget.safetensors"))
lifecycle.attach(small, lifecycle.PinSettings(label="small budget", backend="os-lock", headroom_gib=0.0,
                                              model_limit_gib=1 / 1024))
small_record = lifecycle.record_of(small)
lifecycle._on_pre_run(small)
small_report = json.loads(native.reconcile(small_record.owner, dynamic.file_ranges(small, small_record), backend="os-lock",
                                           label="small budget", model_limit_gib=1 / 1024))
small_text = nodes._pin_text(small_report, [], 1 << 20)
checks["budget below one module: nothing pinned, every weight accounted as over budget"] = (
    small_report["pinned_bytes"] == 0 and sum(k["bytes"] for k in small_report["skipped"] if k["reason"] == "over_budget")
    == small_report["wanted_bytes"] > 0)
checks["budget below one module: the node says this node's budget_gib left them out"] = "budget_gib" in small_text and "skipped" in small_text
lifecycle.forget(small_record.owner)

# --- a budget lowered while the model is pinned (the Pin node run again) ----------------------
# Through ComfyUI's events and the node's path: the new limit gives back what is beyond it at
# once, also when ComfyUI's staging has not changed since the last event.
enter_dynamic_mode()
lowered = mapped_model(checkpoint("lowered_budget.safetensors"), StagingPatcher)
lowered_settings = dict(label="lowered budget", backend="os-lock", headroom_gib=0.0)
lifecycle.attach(lowered, lifecycle.PinSettings(**lowered_settings))
lifecycle._on_pre_run(lowered)
whole = lifecycle.reconcile(lowered)["pinned_bytes"]
lifecycle._on_event(lowered)  # an event that changes nothing
cut = lifecycle.attach(lowered, lifecycle.PinSettings(**lowered_settings, model_limit_gib=24 / 1024))["pinned_bytes"]
checks[f"budget lowered while pinned: what is beyond it given back at once ({whole >> 20} -> {cut >> 20} MiB)"] = (
    whole == 64 * MIB and cut == 24 * MIB)
# Now incomplete (24 of 64 MiB): events that change nothing plan nothing (the budget's room has
# not grown), and a staging change still does.
plans = []
plan_for_real = lifecycle._reconcile_ranges
lifecycle._reconcile_ranges = lambda *args, **kwargs: plans.append(1) or plan_for_real(*args, **kwargs)
try:
    for _ in range(5):
        lifecycle._on_event(lowered)
    unchanged_plans = len(plans)
    stage(list(lowered.model)[-1])
    lifecycle._on_event(lowered)
finally:
    lifecycle._reconcile_ranges = plan_for_real
checks[f"an incomplete model is planned again only when something changed ({unchanged_plans} plans at 5 idle events, "
       f"{len(plans) - unchanged_plans} at a staging change)"] = unchanged_plans == 0 and len(plans) == 1
lifecycle.forget(lifecycle.owner_of(lowered))
comfy.memory_management.aimdo_enabled = False

# --- a ComfyUI whose dynamic internals differ from 0.33's -------------------------------------
# A dynamic patcher without the staging calls Viking governs (as a later ComfyUI might have):
# Viking stands aside for it with the reason, pins nothing, and ComfyUI goes on.


class OtherDynamicPatcher(comfy.model_patcher.ModelPatcher):
    def is_dynamic(self):
        return True


other_net = torch.nn.Sequential(torch.nn.Linear(512, 512, bias=False))
other = OtherDynamicPatcher(other_net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
other_report = lifecycle.attach(other, lifecycle.PinSettings(label="other dynamic", backend="os-lock", headroom_gib=0.0))
other_owner = lifecycle.owner_of(other)
checks["other dynamic internals: Viking stands aside, saying why, pinning nothing"] = (
    "stands aside in dynamic VRAM mode" in (other_report.get("standing_aside") or "") and other_report["pinned_bytes"] == 0
    and not any(o["owner"] == other_owner for o in json.loads(native.status_json())["owners"]))
checks["other dynamic internals: the node shows the reason"] = nodes._pin_text(other_report, []) == other_report["standing_aside"]
other_entry = next((o for o in lifecycle.status()["owners"] if o["owner"] == other_owner), {})
checks["other dynamic internals: the status lists the model, with the reason"] = (
    other_entry.get("standing_aside") == other_report["standing_aside"] and other_entry.get("pinned_bytes") == 0)
lifecycle.forget(lifecycle.owner_of(other))

# --- ComfyUI's own "current prompt" mark ------------------------------------------------------
# ComfyUI's prompt tracker marks the models a prompt uses; it evicts the staging of unmarked
# models first. Viking's events may add the mark (a positive priority), never clear it.


marked = {}
for priority in (0, 5):
    staging = StagingPatcher(torch.nn.Sequential(torch.nn.Linear(8, 8)), load_device=torch.device("cpu"),
                             offload_device=torch.device("cpu"))
    staging.current_prompt = False
    lifecycle.attach(staging, lifecycle.PinSettings(label=f"mark {priority}", backend="os-lock", headroom_gib=0.0,
                                                    priority=priority))
    tracker = comfy.model_patcher.PromptModelTracker()
    tracker.add(staging)  # the prompt uses it: ComfyUI marks it
    lifecycle.reconcile(staging)  # a Viking event during the prompt
    during = staging.current_prompt
    tracker.end()  # the prompt ends: ComfyUI clears its mark
    lifecycle.reconcile(staging)
    marked[priority] = (during, staging.current_prompt)
    lifecycle.forget(lifecycle.owner_of(staging))
checks[f"current-prompt mark: Viking keeps ComfyUI's mark during a prompt, priority 0 and 5 {marked}"] = (
    marked[0] == (True, False) and marked[5] == (True, True))

# --- a patcher the garbage collector finalizes ---------------------------------------------------
# 0.33's dynamic patcher releases its staging in __del__ (ModelPatcherDynamic.__del__, ComfyUI's
# own code, used here); in a reference cycle it runs after the collector has cleared weak
# references, so Viking's instance wrappers (which hold the patcher weakly) must still hand the
# call to ComfyUI's method (seen on an H200: a traceback per patcher, staging never released).


class FinalizingPatcher(StagingPatcher):
    unpin_all_weights = comfy.model_patcher.ModelPatcherDynamic.unpin_all_weights
    __del__ = comfy.model_patcher.ModelPatcherDynamic.__del__
    released = []

    def partially_unload_ram(self, ram_to_unload, subsets=None):
        self.released.append(ram_to_unload)
        return 0


unraisable = []
previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
dying = FinalizingPatcher(torch.nn.Sequential(torch.nn.Linear(8, 8)), load_device=torch.device("cpu"),
                          offload_device=torch.device("cpu"))
dying.model.dynamic_patchers = {id(dying)}
lifecycle.attach(dying, lifecycle.PinSettings(label="finalized", backend="os-lock", headroom_gib=0.0))
dying_owner = lifecycle.owner_of(dying)
dying.cycle = dying  # only the cycle collector frees it, as ComfyUI's dynamic patchers in a server
del dying
gc.collect()
sys.unraisablehook = previous_hook
checks[f"finalized patcher: its __del__ reaches ComfyUI's staging release through Viking's wrappers, no exception "
       f"{[str(u.exc_value) for u in unraisable]}"] = FinalizingPatcher.released == [1e32] and not unraisable
lifecycle.forget(dying_owner)

# --- budget hand-over -------------------------------------------------------------------------
enter_dynamic_mode()
native.configure(budget_gib=1.0, headroom_gib=0.0)  # a 1 GiB shared budget
mm.TOTAL_PINNED_MEMORY = 100 * MIB  # ComfyUI's staging holds 100 MiB registered
dynamic.govern()
ceiling_idle = mm.MAX_PINNED_MEMORY
checks[f"hand-over: ComfyUI's ceiling is the budget ({ceiling_idle >> 20} MiB)"] = ceiling_idle == 1 << 30
native.reconcile(record.owner, dynamic.file_ranges(patcher, record), backend="os-lock", label="dynamic residency")
dynamic.govern()
checks[f"hand-over: less what Viking pins ({mm.MAX_PINNED_MEMORY >> 20} MiB)"] = mm.MAX_PINNED_MEMORY == (1 << 30) - weights_bytes
mm.TOTAL_PINNED_MEMORY = 0
comfy.memory_management.aimdo_enabled = False
native.configure(headroom_gib=0.0)

# --- priorities -------------------------------------------------------------------------------
checks["priority: a model keeps its staging while a lower one has some"] = dynamic.refuses(5, [(0, MIB), (9, MIB)])
checks["priority: ... and gives when lower ones have none"] = not dynamic.refuses(5, [(0, 0), (9, MIB)])
checks["priority: the lowest model never refuses"] = not dynamic.refuses(dynamic.UNGOVERNED_PRIORITY, [(0, MIB)])


# Through ComfyUI's own calls: a pinned model of priority 5 and a model no Viking node pins, both
# in ComfyUI's list of loaded models; ComfyUI's eviction asks the pinned one for staging RAM.
class GivingPatcher(StagingPatcher):
    staged_ram = 0

    def loaded_ram_size(self):
        return self.staged_ram

    def partially_unload_ram(self, ram_to_unload, subsets=None):
        return ram_to_unload  # ComfyUI's own release: gives what it is asked for


enter_dynamic_mode()
kept, other = (GivingPatcher(torch.nn.Linear(8, 8), load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
               for _ in range(2))
lifecycle.attach(kept, lifecycle.PinSettings(label="priority 5", backend="os-lock", headroom_gib=0.0, priority=5))
loaded_before = list(mm.current_loaded_models)
mm.current_loaded_models[:0] = [mm.LoadedModel(kept), mm.LoadedModel(other)]
checks_before = lifecycle.status()["time_in_viking"].get("eviction_check", {"calls": 0, "seconds": 0.0})
other.staged_ram = MIB
refused = kept.partially_unload_ram(MIB)
other.staged_ram = 0
given = kept.partially_unload_ram(MIB)
full = kept.partially_unload_ram(1e32)
other.staged_ram = MIB
full_while_other_has_some = kept.partially_unload_ram(1e32)
checks_after = lifecycle.status()["time_in_viking"]["eviction_check"]
checks[f"priority through ComfyUI's eviction call: refused while an unpinned model has staging, given when it has none, "
       f"full releases always pass {(refused, given, full, full_while_other_has_some)}"] = (
    (refused, given, full, full_while_other_has_some) == (0, MIB, 1e32, 1e32))
checks[f"status: Viking's time in ComfyUI's eviction calls, counted per decision {checks_after}"] = (
    checks_after["calls"] == checks_before["calls"] + 2 and checks_after["seconds"] > checks_before["seconds"])
mm.current_loaded_models[:] = loaded_before
lifecycle.forget(lifecycle.owner_of(kept))


# A node's budget_gib binds the model's staging whatever the other models hold: its own limit
# goes through ComfyUI's release call past Viking's eviction guard (which refuses only evictions
# for other models). ComfyUI's release here gives what it is asked for and keeps count.
class ReleasingPatcher(GivingPatcher):
    def partially_unload_ram(self, ram_to_unload, subsets=None):
        given = min(int(ram_to_unload), self.staged_ram)
        self.staged_ram -= given
        return given


limited, unpinned = (ReleasingPatcher(torch.nn.Linear(8, 8), load_device=torch.device("cpu"),
                                      offload_device=torch.device("cpu")) for _ in range(2))
lifecycle.attach(limited, lifecycle.PinSettings(label="budget 1 GiB", backend="os-lock", headroom_gib=0.0,
                                                priority=5, model_limit_gib=1.0))
mm.current_loaded_models[:0] = [mm.LoadedModel(limited), mm.LoadedModel(unpinned)]
limited.staged_ram, unpinned.staged_ram = 3 << 30, 2 << 30  # staging above its limit; another model has some too
eviction_refused = limited.partially_unload_ram(MIB) == 0  # ComfyUI's eviction for another model: refused
dynamic.after_event(limited, models.get(lifecycle.owner_of(limited)))  # the model's next event
checks[f"budget_gib bounds staging beside a second model: eviction for others refused {eviction_refused}, "
       f"staging after its own event {limited.staged_ram >> 20} MiB (limit 1024), the other's untouched "
       f"{unpinned.staged_ram >> 20} MiB"] = (
    eviction_refused and limited.staged_ram == 1 << 30 and unpinned.staged_ram == 2 << 30)
mm.current_loaded_models[:] = loaded_before
lifecycle.forget(lifecycle.owner_of(limited))
comfy.memory_management.aimdo_enabled = False

# --- Viking's own time at ComfyUI's events (the status) ---------------------------------------
events_before = lifecycle.status()["time_in_viking"].get("event", {"calls": 0, "seconds": 0.0})
for _ in range(3):
    lifecycle._on_event(patcher)  # a ComfyUI callback (ON_LOAD, ON_CLEANUP...)
events_after = lifecycle.status()["time_in_viking"]["event"]
checks[f"status: Viking's time at ComfyUI's events, counted per call {events_after}"] = (
    events_after["calls"] == events_before["calls"] + 3 and events_after["seconds"] > events_before["seconds"])

# --- forget -----------------------------------------------------------------------------------
owner = record.owner
lifecycle.forget(owner)
del record, patcher, ranges
gc.collect()
checks["forget: no lock left"] = locked_bytes() <= before + 8 * 4096
checks["forget: Viking's view unmapped (aimdo's own stays)"] = views_of(path) == 1
checks["forget: no record"] = models.get(owner) is None

print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
