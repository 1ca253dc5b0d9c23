"""Callbacks that ComfyUI fires off its execution thread (ModelPatcher.__del__ detaches a model on
whichever thread drops it or runs the cyclic collector) go through the gate: while a prompt runs
they wait for the execution thread, so no release pulls pages from under queued copies."""
import threading

from comfy_node import comfy, gate, lifecycle


class Patcher:  # only its identity matters here (held weakly)
    pass


def test_an_event_on_another_thread_waits_for_the_execution_thread(monkeypatch):
    reconciled = []
    monkeypatch.setattr(lifecycle, "reconcile", lambda patcher: reconciled.append(threading.get_ident()))
    running = [True]
    monkeypatch.setattr(comfy, "prompt_running", lambda: running[0])
    monkeypatch.setattr(gate, "_execution_thread", None)
    patcher = Patcher()
    gate.note_execution_thread()  # this thread plays ComfyUI's execution thread

    collector = threading.Thread(target=lifecycle._on_event, args=(patcher,))
    collector.start()
    collector.join()
    assert reconciled == [] and gate.deferred() == ["reconcile after a ComfyUI event on another thread"]
    with gate.lock:
        gate.on_execution_thread()  # the execution thread's next Viking callback applies it
    assert reconciled == [threading.get_ident()] and gate.deferred() == []

    # No prompt running: the other thread's event is applied at once, under the gate's lock.
    running[0] = False
    collector = threading.Thread(target=lifecycle._on_event, args=(patcher,))
    collector.start()
    collector.join()
    assert len(reconciled) == 2 and reconciled[1] == collector.ident

    # On the execution thread itself: at once, as always.
    running[0] = True
    lifecycle._on_event(patcher)
    assert len(reconciled) == 3 and reconciled[2] == threading.get_ident()


def test_an_instance_wrapper_calls_the_class_method_as_it_is_at_call_time():
    """Another node that patches ModelPatcher's class after Viking wrapped an instance is
    composed, not bypassed (the wrapper looks the class method up when it is called)."""
    class Patcher:
        def load(self, x):
            return ["original", x]

    patcher = Patcher()
    comfy.wrap_instance_method(patcher, "load", lambda inner: lambda this, x: ["viking"] + inner(this, x))
    assert patcher.load(1) == ["viking", "original", 1]
    original = Patcher.load
    Patcher.load = lambda self, x: ["other node"] + original(self, x)  # a later class-level patch
    assert patcher.load(2) == ["viking", "other node", "original", 2]


def test_a_copy_of_a_wrapped_patcher_is_a_patcher_of_its_own():
    """copy.copy / deepcopy of a pinned patcher: the copy gets no wrapper bound to the original
    (its calls act on itself, as ComfyUI's own method), another pack's instance wrapper under
    Viking's is kept, and the original keeps Viking's wrappers."""
    import copy
    import gc
    import weakref

    class Patcher:
        def __init__(self, name):
            self.name = name

        def load(self, x):
            return [self.name, x]

        def unload(self, x):
            return ["unload", self.name, x]

    patcher = Patcher("original")
    patcher.unload = lambda x: ["other pack"] + Patcher.unload(patcher, x)  # an instance wrapper of another pack
    for name in ("load", "unload"):
        comfy.wrap_instance_method(patcher, name, lambda inner: lambda this, x: ["viking"] + inner(this, x))
    for copied in (copy.copy(patcher), copy.deepcopy(patcher)):
        copied.name = "copy"
        assert copied.load(1) == ["copy", 1]  # before: ["viking", "original", 1], the original's call
        assert copied.unload(2)[0] == "other pack"
        assert "__getstate__" not in vars(copied)
    assert patcher.load(3) == ["viking", "original", 3]
    # No reference cycle: the patcher goes with its last reference, as without Viking.
    gone = weakref.ref(patcher)
    gc.disable()
    try:
        del patcher, copied
        assert gone() is None
    finally:
        gc.enable()


def test_a_running_prompt_registers_little_and_the_rest_waits_for_the_queue_to_be_idle(monkeypatch):
    """Static mode on a GPU: new host memory over 64 MiB is not registered during a prompt
    (it would cost the prompt ~80 ms a GB); the watcher registers it once no prompt runs, a step
    of at most 256 MiB at a time, and stops as soon as a prompt starts."""
    from comfy_node.models import ModelRecord, PinSettings

    mib = 1 << 20
    running = [True]
    monkeypatch.setattr(comfy, "prompt_running", lambda: running[0])
    monkeypatch.setattr(gate, "_after_prompt", {})
    record = ModelRecord(owner=7, settings=PinSettings(label="model"))
    record.registered_ptrs = {1}
    patcher = Patcher()
    ranges = [(1, 500 * mib, None), (2, 200 * mib, None), (3, 200 * mib, None)]

    now, waiting = lifecycle._registrations_now(patcher, record, ranges)
    assert now == ranges[:1] and waiting == 400 * mib  # what is registered already stays
    assert gate.deferred() == ["pinning model's weights after a prompt"]
    now, waiting = lifecycle._registrations_now(patcher, record, ranges[:1] + [(4, 32 * mib, None)])
    assert waiting == 0 and len(now) == 2  # a little more: at once

    running[0] = False
    now, waiting = lifecycle._registrations_now(patcher, record, ranges)
    assert now == ranges[:2] and waiting == 200 * mib  # idle: one step

    steps = []

    def step():
        steps.append(len(steps))
        if len(steps) == 2:
            running[0] = True  # a prompt arrives: the rest waits for the next idle moment
        gate.after_prompt("model", "a step", step)

    gate._after_prompt.clear()
    gate.after_prompt("model", "a step", step)
    running[0] = True
    gate._run_after_prompt()
    assert steps == []  # nothing while a prompt runs
    running[0] = False
    gate._run_after_prompt()
    assert steps == [0, 1] and gate.deferred() == ["a step"]


def test_pins_given_back_under_pressure_count_as_new_again(monkeypatch):
    """After pressure relief released the pins, the ranges a model had are new memory again: a
    running prompt does not register them all at once (they wait for the queue to be idle)."""
    from comfy_node.models import ModelRecord, PinSettings

    mib = 1 << 20
    monkeypatch.setattr(comfy, "prompt_running", lambda: True)
    monkeypatch.setattr(gate, "_after_prompt", {})
    record = ModelRecord(owner=8, settings=PinSettings(label="model"))
    record.registered_ptrs, record.registered_after = {1}, gate.pressure_releases
    ranges = [(1, 500 * mib, None)]
    assert lifecycle._registrations_now(Patcher(), record, ranges) == (ranges, 0)
    monkeypatch.setattr(gate, "pressure_releases", gate.pressure_releases + 1)
    assert lifecycle._registrations_now(Patcher(), record, ranges) == ([], 500 * mib)


def test_the_watcher_never_runs_a_garbage_collection(monkeypatch):
    """A collection finalizes whatever garbage the process holds, some of it only safe on the
    thread that made it (ComfyUI 0.3.75's database connections). The watcher's work, however
    much it allocates, sets none off on its own thread, and leaves collection switched on."""
    import gc

    monkeypatch.setattr(comfy, "prompt_running", lambda: False)
    monkeypatch.setattr(gate, "_after_prompt", {})
    monkeypatch.setattr(gate, "_deferred", [])
    monkeypatch.setattr(gate, "native", None)
    monkeypatch.setattr(gate.dynamic, "govern", lambda: None)
    kept = []
    gate.after_prompt("model", "allocating", lambda: kept.extend([[i] for i in range(20000)]))
    here = threading.get_ident()
    collections_here = []

    def note(phase, info):
        if phase == "start" and threading.get_ident() == here:
            collections_here.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.callbacks.append(note)
    try:
        gc.set_threshold(10)
        gate._watch_once()
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(note)
    assert len(kept) == 20000 and gate.deferred() == []
    assert collections_here == [] and gc.isenabled()


def test_memory_comfyui_pins_itself_never_waits_for_the_watcher(monkeypatch):
    """ComfyUI 0.33's static mode pins the weights it moves back to RAM: memory CUDA reports
    pinned already (the walk's pinned_elsewhere) is not new memory for Viking, so it neither
    waits nor sends the watcher through steps after the prompt; memory beside it still does."""
    from comfy_node.models import ModelRecord, PinSettings

    mib = 1 << 20
    monkeypatch.setattr(comfy, "prompt_running", lambda: True)
    monkeypatch.setattr(gate, "_after_prompt", {})
    record = ModelRecord(owner=9, settings=PinSettings(label="model"))
    ranges = [(100 * mib, 300 * mib, None), (500 * mib, 200 * mib, None), (900 * mib, 32 * mib, None)]
    pinned = [(100 * mib, 300 * mib), (500 * mib, 200 * mib)]  # the first two, by ComfyUI
    now, waiting = lifecycle._registrations_now(Patcher(), record, ranges, pinned)
    assert now == ranges and waiting == 0 and not gate._after_prompt  # 32 MiB new: within a prompt's 64 MiB
    record = ModelRecord(owner=10, settings=PinSettings(label="model"))
    now, waiting = lifecycle._registrations_now(Patcher(), record, ranges, pinned[:1])
    assert now == ranges[:1] and waiting == 232 * mib and gate.deferred() == ["pinning model's weights after a prompt"]


def test_a_watcher_waiting_for_the_lock_leaves_collection_on(monkeypatch):
    """ComfyUI's execution thread holds the gate's lock through a whole model load (the pinned
    home's watch): a look of the watcher that waits for it meanwhile must not have switched the
    process's garbage collection off, or the load's collections pile up and fall due later, in
    whatever code allocates next."""
    import gc
    import time

    monkeypatch.setattr(comfy, "prompt_running", lambda: True)
    seen = []
    with gate.lock:  # as the execution thread holds it through a load
        look = threading.Thread(target=gate._watch_once)
        look.start()
        deadline = time.time() + 5
        while look.is_alive() and time.time() < deadline and len(seen) < 20:
            seen.append(gc.isenabled())
            time.sleep(0.01)
        waiting = look.is_alive()
    look.join(5)
    assert waiting and all(seen) and not look.is_alive() and gc.isenabled()


def test_routine_checks_wait_for_a_queue_idle_between_two_looks(monkeypatch):
    """A routine check after a prompt (shown=False) runs only once the queue stayed idle from one
    look of the watcher to the next: a prompt a client sends right after the last one never
    waits for it. Pins held back from a prompt (shown) go at the first look with no prompt. While
    only routine checks wait, the watcher keeps its slow pace (each look costs a prompt a GIL switch)."""
    queue = {"running": True, "started": 1}
    monkeypatch.setattr(comfy, "prompt_running", lambda: queue["running"])
    monkeypatch.setattr(comfy, "queue_mark", lambda: None if queue["running"] else (queue["started"],))
    monkeypatch.setattr(gate, "_after_prompt", {})
    monkeypatch.setattr(gate, "_deferred", [])
    monkeypatch.setattr(gate, "_idle_mark", None)
    monkeypatch.setattr(gate, "native", None)
    monkeypatch.setattr(gate.dynamic, "govern", lambda: None)
    ran = []
    gate.after_prompt("check", "a routine check", lambda: ran.append("check"), shown=False)
    gate._watch_once()
    assert ran == [] and gate._next_look_seconds == gate.WATCH_SECONDS  # a prompt runs: looked at slowly
    queue["running"] = False
    gate._watch_once()
    assert ran == []  # idle at this look only: the client may send its next prompt now
    queue["running"], queue["started"] = True, 2
    gate._watch_once()
    queue["running"] = False
    gate._watch_once()
    assert ran == []  # another prompt ran in between: still not idle for a whole interval
    gate.after_prompt("pins", "pinning a model's weights after a prompt", lambda: ran.append("pins"))
    queue["running"] = True
    gate._watch_once()
    assert gate._next_look_seconds == gate.AFTER_PROMPT_WATCH_SECONDS  # held-back pins: looked at often
    queue["running"], queue["started"] = False, 3  # another prompt, started and finished between two looks
    gate._watch_once()
    assert ran == ["pins"] and gate.deferred() == []  # held-back pins: at the first look without a prompt
    gate._watch_once()
    assert ran == ["pins", "check"] and not gate._after_prompt  # idle since the last look
