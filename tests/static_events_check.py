"""ComfyUI's events that move nothing cost Viking no native reconcile (static mode, the CPU,
ComfyUI's real ModelPatcher in this process), and the skip never hides a change: a weight
replaced, another model's reconcile that took this model's pins, another model's release. On
ComfyUI 0.33 also: the walk reads a comfy-kitchen QuantizedTensor weight as it is, so two walks
find the same storages, the model's own scales among them (a `.data` of such a weight is a
copy with cloned scales: new storages at each event, pinned in place of the model's own).
Prints one JSON object of named checks; exits 1 if one fails. Run by tests/test_static_events.py
under each ComfyUI version's Python.

usage: python tests/static_events_check.py COMFY_DIR
"""

import json
import sys

from in_process import start_comfy

comfy_dir = sys.argv[1]
start_comfy(comfy_dir, "--cpu")

import torch  # noqa: E402

import comfy.model_patcher  # noqa: E402
import comfy.ops  # noqa: E402

from comfy_node import comfy as comfy_seam  # noqa: E402
from comfy_node import home, lifecycle, models  # noqa: E402
from comfy_node.native import require  # noqa: E402
from comfy_node.weights import module_tensors, storage_parts  # noqa: E402

MIB = 1 << 20
native = require()
checks = {}


class CountingNative:
    """The native module, counting its reconcile calls (what this check is about)."""

    def __init__(self, inner):
        self.inner, self.reconciles = inner, 0

    def reconcile(self, *args, **kwargs):
        try:
            return self.inner.reconcile(*args, **kwargs)
        finally:  # counted once done: a check that waits for the watcher's call then reads its result
            self.reconciles += 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


counting = CountingNative(native)
lifecycle.require = lambda: counting
walks = {"count": 0}
read_storages = lifecycle.host_ranges


def counted_walk(*args, **kwargs):
    walks["count"] += 1
    return read_storages(*args, **kwargs)


lifecycle.host_ranges = counted_walk  # the walk that reads every weight's storages


def model(layers: int, seed: int):
    """`layers` 1 MiB fp32 linear layers that ComfyUI casts, in a ModelPatcher on the CPU."""
    net = torch.nn.Sequential(*[comfy.ops.disable_weight_init.Linear(512, 512, bias=False) for _ in range(layers)])
    for index, layer in enumerate(net):
        torch.nn.init.normal_(layer.weight, generator=torch.Generator().manual_seed(seed + index))
    return comfy.model_patcher.ModelPatcher(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))


def owner_pinned(patcher) -> int:
    owner = lifecycle.owner_of(patcher)
    return next((o["pinned_bytes"] for o in json.loads(native.status_json())["owners"] if o["owner"] == owner), 0)


def settings(label, priority=0):
    return lifecycle.PinSettings(label=label, backend="os-lock", headroom_gib=0.0, priority=priority, pinned_home=False,
                                 prefetch=False)


native.configure(budget_gib=12 / 1024, headroom_gib=0.0)  # a 12 MiB shared budget
low = model(8, seed=0)
first = lifecycle.attach(low, settings("low", priority=0))
checks["the first reconcile pins the model's 8 MiB"] = first["pinned_bytes"] == 8 * MIB

before, walked = counting.reconciles, walks["count"]
reports = [lifecycle.reconcile(low) for _ in range(5)]
checks["five events that move nothing make no native reconcile"] = counting.reconciles == before
checks["and read no weight's storages"] = walks["count"] == walked
checks["their reports say what is pinned and that nothing was done"] = all(
    r["pinned_bytes"] == 8 * MIB == owner_pinned(low) and r["newly_pinned_bytes"] == 0 and r["released_bytes"] == 0
    for r in reports)

layer = low.model[0]
layer.weight = torch.nn.Parameter(torch.randn(512, 512), requires_grad=False)  # a weight replaced
before = counting.reconciles
moved = lifecycle.reconcile(low)
checks["a replaced weight makes the next event reconcile and pin it"] = (
    counting.reconciles == before + 1 and moved["pinned_bytes"] == 8 * MIB == owner_pinned(low)
    and moved["newly_pinned_bytes"] == 1 * MIB and moved["released_bytes"] == 1 * MIB)

layer = low.model[1]
layer.weight.data = torch.randn(512, 512)  # the same parameter, pointed at new memory
before = counting.reconciles
repointed = lifecycle.reconcile(low)
checks["a weight whose .data was set anew makes the next event reconcile and pin it"] = (
    counting.reconciles == before + 1 and repointed["pinned_bytes"] == 8 * MIB == owner_pinned(low)
    and repointed["newly_pinned_bytes"] == 1 * MIB and repointed["released_bytes"] == 1 * MIB)

# A higher-priority model takes 4 MiB of the low one's pins: the low one's ranges did not change,
# and its next event must still see that it lost them.
high = model(8, seed=100)
lifecycle.attach(high, settings("high", priority=10))
lost = owner_pinned(low)
before = counting.reconciles
after_eviction = lifecycle.reconcile(low)
checks["after another model took its pins, the next event reconciles and reports the truth"] = (
    lost == 4 * MIB and counting.reconciles == before + 1 and after_eviction["pinned_bytes"] == lost)
before = counting.reconciles
lifecycle.reconcile(low)
checks["and the event after that skips again"] = counting.reconciles == before

lifecycle.unpin(high)
before = counting.reconciles
regained = lifecycle.reconcile(low)
checks["after another model's release, the next event pins what now fits"] = (
    counting.reconciles == before + 1 and regained["pinned_bytes"] == 8 * MIB == owner_pinned(low))

try:
    import comfy.quant_ops as quant_ops

    quantized_layout = getattr(quant_ops, "TensorCoreFP8E4M3Layout", None) and "TensorCoreFP8E4M3Layout"
except ImportError:
    quantized_layout = None
if quantized_layout:  # ComfyUI 0.33: comfy-kitchen's QuantizedTensor weights
    net = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False))
    weight = quant_ops.QuantizedTensor.from_float(torch.randn(64, 64, generator=torch.Generator().manual_seed(7)),
                                                  quantized_layout)
    net[0].weight = torch.nn.Parameter(weight, requires_grad=False)
    own = {part.untyped_storage().data_ptr() for part in storage_parts(net[0].weight)}

    def walk():
        return {part.untyped_storage().data_ptr() for t in module_tensors(net) for part in storage_parts(t)}

    checks["a quantized weight is walked as it is: its own data and scale storages"] = walk() == own and len(own) == 2
    checks["two walks of a quantized weight find the same storages"] = walk() == walk()

    # A pinned model whose quantized weight's contents are swapped in place (how module.to()
    # moves a wrapper subclass): the same object, other storages; the next event must pin them.
    def quantized_weight(seed):  # 1 MiB of fp8: large enough to be pinned
        values = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(seed))
        return torch.nn.Parameter(quant_ops.QuantizedTensor.from_float(values, quantized_layout), requires_grad=False)

    wide = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False))
    wide[0].weight = quantized_weight(8)
    quantized = comfy.model_patcher.ModelPatcher(wide, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
    first_quantized = lifecycle.attach(quantized, settings("quantized"))
    own = {part.untyped_storage().data_ptr() for part in storage_parts(wide[0].weight)}
    before = counting.reconciles
    torch.utils.swap_tensors(wide[0].weight, quantized_weight(9))
    swapped = lifecycle.reconcile(quantized)
    now = {part.untyped_storage().data_ptr() for part in storage_parts(wide[0].weight)}
    checks["a quantized weight swapped in place makes the next event reconcile and pin its new storages"] = (
        first_quantized["pinned_bytes"] >= MIB and counting.reconciles == before + 1 and now != own
        and swapped["newly_pinned_bytes"] >= MIB and swapped["released_bytes"] >= MIB
        and swapped["pinned_bytes"] == owner_pinned(quantized))

    # A layer ComfyUI streams with a quantized weight: ComfyUI copies it through its own buffers,
    # so no prefetcher may take those over; and its plain bias gets no home (the module moves
    # the ComfyUI way), so the pinned home's watch is set on the model and the plain layer only.
    mixed = torch.nn.Sequential(comfy.ops.disable_weight_init.Linear(1024, 1024, bias=True),
                                comfy.ops.disable_weight_init.Linear(64, 64, bias=True))
    mixed[0].weight = quantized_weight(10)
    for layer in mixed:
        layer.comfy_cast_weights = True  # as ComfyUI marks the layers it streams in a lowvram load
    plain_streamed, comfy_streamed = comfy_seam.streamed_modules(mixed)
    checks["a streamed quantized layer is ComfyUI's to copy: the prefetcher would get the plain one only"] = (
        plain_streamed == [mixed[1]] and comfy_streamed == 1)
    mixed_patcher = comfy.model_patcher.ModelPatcher(mixed, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
    record = models.ModelRecord(owner=-1, settings=settings("mixed"))
    small_home_bytes, home.SMALL_HOME_BYTES = home.SMALL_HOME_BYTES, 0  # as if its plain layer were large
    home.update(mixed_patcher, record)
    home.SMALL_HOME_BYTES = small_home_bytes
    with home.watching(mixed_patcher, record):
        watched = [name for name, module in mixed.named_modules() if "to" in vars(module)]
    checks["a quantized layer's plain bias has no home, and only homed layers are watched"] = (
        sorted(record.home.tensors) == ["1.bias", "1.weight"] and watched == ["", "1"]
        and not any("to" in vars(module) for module in mixed.modules()))
    home.update(mixed_patcher, record)  # its plain weights as they are: 17 KB
    with home.watching(mixed_patcher, record):
        watched = [name for name, module in mixed.named_modules() if "to" in vars(module)]
    checks["a quantized model with a few KB of plain weights gets no home, and says why"] = (
        record.home.tensors == {} and watched == [] and "no pinned home: only 0.0 MiB" in (record.home.note or ""))

# ComfyUI's own pins change while a prompt runs (0.33's static mode pins offloaded weights at
# each partial load): the plan waits for the end of the prompt, unless they grew past the room
# the last plan left. Whether a prompt runs is what ComfyUI's server queue says; its server
# module cannot be imported outside main.py's set-up, so a stand-in module holds ComfyUI's own
# PromptQueue here (a whole server drives it in the GPU check's part staticfp8).
import time  # noqa: E402
import types  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import comfy.model_management as mm  # noqa: E402

from comfy_node import gate  # noqa: E402

import execution  # noqa: E402

gate.start(watch=True)
queue = execution.PromptQueue(SimpleNamespace(queue_updated=lambda: None))  # ComfyUI's own queue, no server
sys.modules["server"] = types.ModuleType("server")
sys.modules["server"].PromptServer = SimpleNamespace(instance=SimpleNamespace(prompt_queue=queue))
elsewhere = torch.empty(8 * MIB, dtype=torch.uint8)  # memory ComfyUI registered, as its PINNED_MEMORY lists it


# The gate's watcher tells an idle queue by its mark: none while a prompt waits or runs, and a
# new one once a prompt has started since (ComfyUI's PromptQueue, as its server drives it).
idle = comfy_seam.queue_mark()
queue.put((0, "first", {}, {}, []))
queued = comfy_seam.queue_mark()
_item, item_id = queue.get()
running = comfy_seam.queue_mark()
queue.task_done(item_id, {}, None)
done = comfy_seam.queue_mark()
checks["ComfyUI's queue: no idle mark while a prompt waits or runs, a new one after it"] = (
    idle is not None and queued is None and running is None and done is not None and done != idle
    and comfy_seam.queue_mark() == done and not gate.prompt_running())


def comfy_pins(nbytes):
    mm.PINNED_MEMORY = {elsewhere.data_ptr(): nbytes} if nbytes else {}
    mm.TOTAL_PINNED_MEMORY = nbytes


def wait_for_reconciles(count):
    deadline = time.time() + 10
    while counting.reconciles < count and time.time() < deadline:
        time.sleep(0.01)
    return counting.reconciles


lifecycle.reconcile(low)  # up to date with the ledger after the other models' reconciles
queue.currently_running = {1: "a prompt"}
comfy_pins(1 * MIB)
before, walked = counting.reconciles, walks["count"]
during = lifecycle.reconcile(low)
checks["ComfyUI's pins alone changed during a prompt: no walk, no plan until it ends"] = (
    counting.reconciles == before and walks["count"] == walked and during["newly_pinned_bytes"] == 0
    and any("after a prompt" in what for what, _change, _shown in gate._after_prompt.values())
    and not gate.deferred())  # routine work: not among the status's deferred changes
queue.currently_running = {}
checks["the gate's watcher plans once the prompt is over, with ComfyUI's pins counted"] = (
    wait_for_reconciles(before + 1) == before + 1 and owner_pinned(low) == 8 * MIB
    and json.loads(native.status_json())["memory"]["pinned_by_others"] == 1 * MIB)
queue.currently_running = {1: "a prompt"}
before = counting.reconciles
comfy_pins(8 * MIB)  # 7 MiB more: past the 4 MiB the 12 MiB budget had left
grown = lifecycle.reconcile(low)
checks["ComfyUI's pins grown past the room left: planned at once"] = (
    counting.reconciles == before + 1 and json.loads(native.status_json())["memory"]["pinned_by_others"] == 8 * MIB
    and grown["pinned_bytes"] <= grown["budget"]["limit_bytes"])
comfy_pins(0)
queue.currently_running = {}
wait_for_reconciles(before + 2)

# During a prompt, an event after which ComfyUI's own record of the model (its VRAM share,
# patches, the torch model) is unchanged reads no weight; a weight replaced some other way is
# pinned once the prompt has ended, by the gate's watcher.
lifecycle.reconcile(low)
queue.currently_running = {1: "a prompt"}
before = counting.reconciles
replacement = torch.nn.Parameter(torch.randn(512, 512), requires_grad=False)
low.model[2].weight = replacement
during = lifecycle.reconcile(low)
checks["during a prompt, an event ComfyUI moved nothing for reads no weight"] = (
    counting.reconciles == before and during["newly_pinned_bytes"] == 0
    and replacement.data_ptr() not in lifecycle.record_of(low).registered_ptrs)
queue.currently_running = {}
checks["a weight replaced during the prompt is pinned once it has ended"] = (
    wait_for_reconciles(before + 1) == before + 1 and replacement.data_ptr() in lifecycle.record_of(low).registered_ptrs
    and owner_pinned(low) == 8 * MIB)

# A model Viking holds nothing of (here its own limit leaves every weight unpinned; on a GPU, a
# quantized model in 0.33's static mode, whose offloaded weights ComfyUI pins itself): even an
# event after which ComfyUI's record of the model changed leaves the walk and the plan to the
# end of the prompt, while a model Viking pins is reconciled at once.
def holding_nothing(label, prefetch):
    patcher = model(2, seed=200)
    report = lifecycle.attach(patcher, lifecycle.PinSettings(label=label, backend="os-lock", headroom_gib=0.0,
                                                             model_limit_gib=1e-9, pinned_home=False, prefetch=prefetch))
    return patcher, report


spare, held_nothing = holding_nothing("spare", prefetch=False)
prefetching, _ = holding_nothing("prefetching", prefetch=True)  # a later load could start its prefetcher
lifecycle.reconcile(low)
queue.currently_running = {1: "a prompt"}
before, walked = counting.reconciles, walks["count"]
for patcher, index in ((spare, 0), (prefetching, 0), (low, 3)):
    patcher.model.model_loaded_weight_memory = 1 * MIB  # ComfyUI's record: part of it moved
    patcher.model[index].weight = torch.nn.Parameter(torch.randn(512, 512), requires_grad=False)
lifecycle.reconcile(spare)
checks["a model Viking holds nothing of: an event that saw weights move reads none during a prompt"] = (
    held_nothing["pinned_bytes"] == 0 and counting.reconciles == before and walks["count"] == walked)
lifecycle.reconcile(prefetching)
lifecycle.reconcile(low)
checks["a model Viking pins, or one a load could give a prefetcher: the same event is reconciled at once"] = (
    counting.reconciles == before + 2 and walks["count"] == walked + 2 and owner_pinned(low) == 8 * MIB)
queue.currently_running = {}
checks["the model Viking holds nothing of is walked and planned once the prompt has ended"] = (
    wait_for_reconciles(before + 3) == before + 3 and walks["count"] == walked + 3)

lifecycle.unpin()
print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
