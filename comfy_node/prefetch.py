"""Prefetch for streamed (lowvram) weights: copies run ahead of the layers that need them.

Why (ComfyUI 0.3.75, comfy/ops.py cast_bias_weight and comfy/model_management.py
get_offload_stream): ComfyUI copies a streamed layer's weights when that layer runs, on one of
two offload streams, and each copy waits for the compute queued two layers back. With hundreds
of streamed layers between resident ones, the PCIe link idles whenever a copy waits on compute,
and steps run well above bytes / bandwidth.

Here, one copy stream runs up to `window_bytes` ahead, in the order the layers ran in the last
step (recorded by the hooks themselves), and on into the next step's first layers: where a step
has a compute-heavy stretch (layers resident in VRAM), the link fills it with the copies the
next, copy-heavy stretch will need. A layer whose copy is ready gets its weights pointed at
the VRAM copy for its forward (ComfyUI's cast then finds them on the device and copies nothing)
and back at RAM right after. The copy stream waits for each layer's compute before it reuses
that layer's memory, so at most `window_bytes` of copies are in VRAM at once.

The copies live in one block of `window_bytes`, taken at a sampling run's first copy and let go
when the run ends (`Ring` hands out its bytes in order, each layer's copy given back when its
forward ends). Why one block: with a tensor per copy, every layer's copy went back to PyTorch's
pool as the next was made, on another stream than the compute's. ComfyUI counts a pool's
unused memory as free VRAM, and under `cudaMallocAsync` (ComfyUI 0.33's default with CUDA 13)
an allocation the pool cannot serve fails at once, without the retry PyTorch's own allocator
makes. With the copies made one by one, the pool holds hundreds of MB more unused than with
ComfyUI alone.

VRAM accounting: the window takes the place of the buffer ComfyUI reserves for streaming this
model (`model_offload_buffer_memory`; its own copies are no longer made, and the buffers 0.33
keeps for them are freed once the prefetcher has a plan: comfy.release_cast_buffers). It grows beyond that
only out of VRAM ComfyUI had granted this model's weights and a Viking VRAM cap held back (the
"surplus"), and only if that much is free: never out of the room ComfyUI keeps for activations
(taking free VRAM at load time instead runs the step out of memory when VRAM is tight). Same bytes, same kernels: outputs are bit-identical.

Only the diffusion model gets one, and only while ComfyUI has it loaded in part: Viking must
not change how much VRAM ComfyUI finds free when it decides how to split a model (a LoRA's
weights are computed differently for a layer in VRAM and a streamed one), so nothing here
takes device memory outside a sampling step, and ComfyUI's cleanup after sampling drops the
copies queued ahead.

A model with streamed layers that are not plain tensors (quantized, fp8-scaled, GGUF) gets none:
ComfyUI copies those through its own buffers, which the prefetcher frees at each step.

Hooks are PyTorch's per-module forward hooks, on the streamed modules of one model only, and
removed when the model stops streaming. A model with hook patches (which rewrite weights in
place per step) gets no prefetcher, and a step that begins while hook patches are registered
streams the ComfyUI way: a copy queued ahead would carry stale bits and race the host write.
The Prefetcher lives in the model's record (models.py).
"""

from __future__ import annotations

import collections
import logging
import weakref

from . import comfy

log = logging.getLogger("viking_engine")


ALIGN = 512  # bytes: each copy starts at a multiple, as CUDA's own allocations do


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def block_bytes(module) -> int:
    """Bytes a module's copy takes in the block: its weight, then its bias at the next ALIGN."""
    bias = getattr(module, "bias", None)
    return aligned(module.weight.nbytes) + (bias.nbytes if bias is not None else 0)


def place(block, tensor, offset: int):
    """Queues a copy of `tensor` into `block` at `offset` (on the current stream); the copy."""
    view = block[offset:offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
    view.copy_(tensor, non_blocking=True)
    return view


class Ring:
    """Offsets in a block of `capacity` bytes: taken in order, given back in any order (a
    layer's copy when its forward ends, a copy a step did not use when the step moves past it).
    The bytes from the oldest slot still held to the newest are held, so a slot given back
    early is reused once the slots before it are given back too."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.slots = collections.deque()  # [offset, size, held], in the order taken

    def take(self, nbytes: int) -> int | None:
        """The offset of `nbytes` (rounded up to ALIGN) after the newest slot, or at 0 when
        the end of the block is reached; None while the held slots leave no such room."""
        size = aligned(nbytes)
        if not self.slots:
            return self._push(0, size) if size <= self.capacity else None
        oldest, (newest, newest_size, _) = self.slots[0][0], self.slots[-1]
        end = newest + newest_size
        if newest >= oldest:  # held: [oldest, end)
            if end + size <= self.capacity:
                return self._push(end, size)
            return self._push(0, size) if size <= oldest else None
        return self._push(end, size) if end + size <= oldest else None  # held: [oldest, capacity) and [0, end)

    def give(self, offset: int):
        slot = next(slot for slot in self.slots if slot[0] == offset and slot[2])
        slot[2] = False
        while self.slots and not self.slots[0][2]:
            self.slots.popleft()
        while self.slots and not self.slots[-1][2]:
            self.slots.pop()

    def held_bytes(self) -> int:
        return sum(size for _, size, held in self.slots if held)

    def _push(self, offset: int, size: int) -> int:
        self.slots.append([offset, size, True])
        return offset


class CudaCopies:
    """The CUDA operations the prefetcher needs, in one place (tests put a CPU stand-in here to
    check the bookkeeping without a GPU; tests/vram_cap_check.py runs it on a GPU)."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device
        # Made at the first copy, inside a sampling step, not here: PyTorch's first stream sets up
        # its pool of streams, which takes device memory (measured on an H200: 70 MB) and would
        # shrink what ComfyUI finds free for the next model it loads, so it splits that model
        # between VRAM and RAM otherwise and the image changes (bench/probes/clip_free_vram.py).
        self.stream = None
        self.block = None  # the copies' device memory, while a sampling run has copies

    def copy(self, weight, bias, offset: int, capacity: int):
        """Queues a copy of a module's weight (and bias) into the block at `offset` on the copy
        stream, the block (`capacity` bytes) taken first if need be: (weight, bias, ready event)."""
        torch = self.torch
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=self.device)
        if self.block is None:
            # Taken on the compute stream, so that its memory goes back there when the run ends
            # (where ComfyUI's next allocations are made). That memory may still be in use by
            # compute already queued, so the copy stream waits for it once; and the block is let
            # go only after the copy stream's work queued by then (record_stream).
            compute = torch.cuda.current_stream(self.device)
            self.block = torch.empty(capacity, dtype=torch.uint8, device=self.device)
            self.block.record_stream(self.stream)
            self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            weight_copy = place(self.block, weight, offset)
            bias_copy = place(self.block, bias, offset + aligned(weight.nbytes)) if bias is not None else None
            event = torch.cuda.Event()
            event.record(self.stream)
        return weight_copy, bias_copy, event

    def release_block(self):
        """Lets the block go (no copy is held: between sampling runs)."""
        self.block = None

    def compute_waits_for(self, event):
        self.torch.cuda.current_stream(self.device).wait_event(event)

    def take_over_streaming(self) -> int:
        """Frees ComfyUI's own streaming buffers (its copies are no longer made); bytes freed."""
        return comfy.release_cast_buffers(self.device)

    def copies_wait_for_compute(self):
        """Later copies start only after the compute queued so far."""
        if self.stream is None:
            return  # no copy made yet
        done = self.torch.cuda.Event()
        done.record(self.torch.cuda.current_stream(self.device))
        self.stream.wait_event(done)


class Prefetcher:
    def __init__(self, root, modules: list, device, window_bytes: int, copies=None, extra_bytes: int = 0,
                 stand_aside=lambda: False):
        self.device = device
        self.window_bytes = int(window_bytes)
        self.modules = modules
        self.index = {id(m): i for i, m in enumerate(modules)}
        self.plan: list[int] = []  # module indices in the order the last step ran them
        self.trace: list[int] = []
        self.position = 0  # next place in `plan`
        self.issued = 0  # plan[:issued] have copies issued this step
        self.in_flight = 0  # bytes issued and not yet consumed
        self.ready: dict[int, tuple] = {}  # module index -> (weight copy, bias copy, event, nbytes, offset)
        self.swapped: dict[int, tuple] = {}  # module index -> (cpu weight, cpu bias, nbytes, offset)
        self.ring = Ring(self.window_bytes)  # where in the copies' block each copy sits
        self.copies = copies or CudaCopies(device)
        self.copied_bytes = 0
        self.released_bytes = 0  # of ComfyUI's own streaming buffers, freed while prefetching
        self.failed = None
        self.extra_bytes = extra_bytes  # of window_bytes, beyond ComfyUI's own streaming buffer
        self.stand_aside = stand_aside  # asked at each step: True lets ComfyUI stream alone
        self.standing_aside = False
        self.handles = [root.register_forward_pre_hook(self._guarded(self._begin_step)),
                        root.register_forward_hook(self._guarded(self._end_step), always_call=True)]
        for module in modules:
            self.handles.append(module.register_forward_pre_hook(self._guarded(self._before)))
            self.handles.append(module.register_forward_hook(self._guarded(self._after), always_call=True))

    def _guarded(self, hook):
        """A failure here must never break sampling: put every weight back, stop prefetching
        (ComfyUI's own streaming carries on) and say so once."""
        def run(*args):
            if self.failed is not None:
                return None
            try:
                hook(*args)
            except Exception as error:  # noqa: BLE001
                self.failed = str(error)
                log.warning("Viking Engine: prefetch stopped for this model: %s", error)
                try:
                    self._restore_all()
                    self.idle()
                except Exception:  # noqa: BLE001 - already reported
                    pass
            return None
        return run

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self._restore_all()
        self.idle()

    @staticmethod
    def _nbytes(module) -> int:
        bias = getattr(module, "bias", None)
        return module.weight.nbytes + (bias.nbytes if bias is not None else 0)

    # -- one step: the root module's forward -----------------------------------------------------
    # Positions count along the plan; positions past its end belong to the next step: once this
    # step's copies are all queued, the link keeps going with the next step's first layers
    # (sampling runs the same layers step after step), within the same window.
    def _begin_step(self, _root, _args):
        self._restore_all()
        self.position, self.trace = 0, []
        self.standing_aside = bool(self.stand_aside())
        if self.standing_aside:
            self.idle()
            return
        if self.plan:
            # Every streamed layer is copied here from now on: ComfyUI's buffers for its own
            # copies (made in a step without a plan) give their VRAM back to the window.
            self.released_bytes += self.copies.take_over_streaming()
        self._issue()

    def _end_step(self, _root, _args, _output):
        self._restore_all()
        if self.standing_aside:
            return
        if self.trace == self.plan:
            self.issued = max(0, self.issued - len(self.plan))  # copies already queued for the next step
        else:
            self.plan = self.trace
            self.idle()
        self.trace = []

    def idle(self):
        """Drops the copies queued ahead (only the copy stream ever touched them), and the
        block once no layer uses a copy."""
        for copy in self.ready.values():
            self.ring.give(copy[4])
        self.ready.clear()
        self.issued, self.in_flight = 0, sum(saved[2] for saved in self.swapped.values())
        if not self.swapped:
            self.copies.release_block()

    def _issue(self):
        """Queues copies along the plan (and on into the next step) while the block has room."""
        steps = len(self.plan)
        while self.issued < 2 * steps:
            index = self.plan[self.issued % steps]
            if index in self.ready or index in self.swapped:
                if self.issued >= steps:
                    return  # next step's copy of a layer still in use this step: wait for it
                self.issued += 1  # the plan runs a module twice: one copy serves both
                continue
            module = self.modules[index]
            if not _contiguous(module):
                self.issued += 1  # a copy into the block would change its strides: ComfyUI copies it
                continue
            offset = self.ring.take(block_bytes(module))
            if offset is None:
                return
            self.issued += 1
            nbytes = self._nbytes(module)
            weight, bias, event = self.copies.copy(module.weight, module.bias, offset, self.ring.capacity)
            self.ready[index] = (weight, bias, event, nbytes, offset)
            self.in_flight += nbytes
            self.copied_bytes += nbytes

    # -- one streamed module -----------------------------------------------------------------------
    def _before(self, module, _args):
        if self.standing_aside:
            return
        index = self.index[id(module)]
        self.trace.append(index)
        if self.position < len(self.plan) and self.plan[self.position] == index:
            self.position += 1
        elif index in self.plan[self.position:]:
            self._skip_to(self.plan.index(index, self.position) + 1)  # this step differs: follow it
        self._issue()
        copy = self.ready.pop(index, None)
        if copy is None:
            return  # not prefetched: ComfyUI copies it as usual
        weight, bias, event, nbytes, offset = copy
        if module.weight.device.type != "cpu" or module.weight.shape != weight.shape or module.weight.dtype != weight.dtype:
            self.in_flight -= nbytes  # moved or changed since the copy was queued: unused
            self.ring.give(offset)
            return
        self.copies.compute_waits_for(event)
        self.swapped[index] = (module.weight.data, module.bias.data if module.bias is not None else None, nbytes, offset)
        module.weight.data = weight
        if bias is not None:
            module.bias.data = bias

    def _skip_to(self, position: int):
        """The step ran past planned layers: their queued copies will not be used."""
        for index in self.plan[self.position:position - 1]:
            copy = self.ready.pop(index, None)
            if copy is not None:
                self.in_flight -= copy[3]
                self.ring.give(copy[4])
        self.position = position
        self.issued = max(self.issued, position)

    def _after(self, module, _args, _output):
        self._restore(self.index[id(module)])

    def _restore(self, index: int):
        saved = self.swapped.pop(index, None)
        if saved is None:
            return
        module = self.modules[index]
        cpu_weight, cpu_bias, nbytes, offset = saved
        # The copy stream may reuse this memory only after this layer's compute is done: queue
        # that wait before the slot is given back.
        self.copies.copies_wait_for_compute()
        module.weight.data = cpu_weight
        if cpu_bias is not None:
            module.bias.data = cpu_bias
        self.in_flight -= nbytes
        self.ring.give(offset)
        self._issue()

    def _restore_all(self):
        for index in list(self.swapped):
            self._restore(index)


DEFAULT_WINDOW_BYTES = 2 << 30  # enough to bridge a Flux-shaped model's resident stretches
SAFETY_BYTES = 1 << 30  # never take the last GiB of free VRAM for copies ahead


def update(patcher, record, enabled: bool, window_bytes: int = 0) -> dict | None:
    """After a load or unload: streams through a prefetcher while the model has streamed
    layers on a CUDA device, and through nothing otherwise. The window grows beyond ComfyUI's
    own streaming buffer only out of VRAM the model's cap held back (`record.cap_surplus_bytes`)
    and only if that much is free. Returns a summary for the status."""
    current = record.prefetcher
    device = comfy.load_device(patcher)
    # Only a sampled model that ComfyUI loaded in part (the module docstring says why).
    streams = (enabled and getattr(device, "type", None) == "cuda" and comfy.sampled_in_steps(patcher)
               and comfy.loaded_in_part(patcher))
    modules, comfy_streams = comfy.streamed_modules(comfy.torch_model(patcher)) if streams else ([], 0)
    if comfy_streams:
        # ComfyUI copies these layers itself, through the buffers a prefetcher takes over at each
        # step (freed after a device sync): it would make them again per layer. For an fp8-scaled
        # Flux-shaped model in 0.33 static mode, 64 plain layers prefetched beside the quantized
        # ones cost tens of milliseconds a prompt.
        modules = []
        record.set_note(MIXED_MARKER, MIXED_NOTE.format(count=comfy_streams))
    if current is not None and [id(m) for m in current.modules] == [id(m) for m in modules]:
        current.idle()  # between runs, no VRAM held for copies ahead
        return summary(record)
    drop(record)
    if not modules:
        return None
    import torch

    largest = max(block_bytes(m) for m in modules)  # the block holds the two largest copies at least
    reserved = max(comfy.offload_buffer_bytes(patcher), 2 * largest)
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    extra = min(max(0, (window_bytes or DEFAULT_WINDOW_BYTES) - reserved), record.cap_surplus_bytes, max(0, free - SAFETY_BYTES))
    model_ref = weakref.ref(comfy.torch_model(patcher))
    record.prefetcher = Prefetcher(comfy.diffusion_root(patcher), modules, device, reserved + extra, extra_bytes=extra,
                                   stand_aside=lambda: _hook_patched(model_ref))
    log.info("Viking Engine: prefetching %d streamed layers, %.0f MiB ahead", len(modules), (reserved + extra) / 2**20)
    return summary(record)


MIXED_MARKER = "hold quantized or GGUF weights that ComfyUI copies"
MIXED_NOTE = ("no prefetch: {count} streamed layer(s) " + MIXED_MARKER +
              " through its own streaming buffers, which a prefetcher would take over")


def may_start(record, enabled: bool) -> bool:
    """Whether a later load could give the model a prefetcher (update): prefetch is enabled
    and its streamed layers were not found to be ComfyUI's own to copy (quantized, GGUF)."""
    return enabled and not any(MIXED_MARKER in note for note in record.notes)


def between_runs(record) -> dict | None:
    """An event that moved no weight: the prefetcher (if any) holds no VRAM for copies ahead
    until the next run starts, as update does when the streamed layers are the same."""
    if record.prefetcher is not None:
        record.prefetcher.idle()
    return summary(record)


def _contiguous(module) -> bool:
    bias = module.bias
    return module.weight.is_contiguous() and (bias is None or bias.is_contiguous())


def _hook_patched(model_ref) -> bool:
    """Whether the patcher now sampling this model holds hook patches."""
    model = model_ref()
    patcher = comfy.sampling_patcher(model) if model is not None else None
    return patcher is not None and comfy.weight_hooks(patcher)


def summary(record) -> dict | None:
    current = record.prefetcher
    if current is None:
        return None
    return {"streamed_layers": len(current.modules), "window_bytes": current.window_bytes, "extra_bytes": current.extra_bytes,
            "copied_bytes": current.copied_bytes, "planned_layers": len(current.plan), "failed": current.failed,
            "released_comfy_buffer_bytes": current.released_bytes}


def drop(record):
    current, record.prefetcher = record.prefetcher, None
    if current is not None:
        current.remove()
