"""The prefetcher's bookkeeping (comfy_node/prefetch.py), on the CPU: the real Prefetcher and its
forward hooks on a real torch model, with a CPU stand-in for the CUDA operations (a copy is
written into a real CPU block at the offset the prefetcher's Ring gave, so two copies held at
once in the same bytes would change the outputs; the stream waits are recorded). What only a GPU can show (overlap, speed, VRAM) is
measured in tests/vram_cap_check.py and checked by tests/test_gpu_streaming.py there."""

import random

import pytest
import torch

from comfy_node.comfy import streamed_modules
from comfy_node.prefetch import ALIGN, CudaCopies, Prefetcher, Ring, aligned, block_bytes, place

WIDTH = 64


class Streamed(torch.nn.Linear):
    comfy_cast_weights = True  # as ComfyUI marks a layer it streams in a lowvram load


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(Streamed(WIDTH, WIDTH) for _ in range(8))
        self.resident = torch.nn.Linear(WIDTH, WIDTH)  # a layer that sits in VRAM: not streamed
        self.skip, self.fail_at = None, None

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i == self.skip:
                continue
            if i == self.fail_at:
                raise RuntimeError("interrupted")
            x = torch.tanh(layer(x))
            if i == 3:
                x = self.resident(x)
        return x


class CpuCopies:
    """Stand-in for CudaCopies: same calls, a CPU block, and a log of what was asked."""

    def __init__(self):
        self.copies, self.compute_waits, self.copy_waits, self.takeovers = 0, 0, 0, 0
        self.block, self.blocks_taken = None, 0

    def take_over_streaming(self):
        self.takeovers += 1
        return 1000  # bytes of ComfyUI's streaming buffers freed

    def copy(self, weight, bias, offset, capacity):
        if self.block is None:
            self.block, self.blocks_taken = torch.empty(capacity, dtype=torch.uint8), self.blocks_taken + 1
        assert offset % ALIGN == 0 and offset + aligned(weight.nbytes) + (bias.nbytes if bias is not None else 0) <= capacity
        self.copies += 1
        weight_copy = place(self.block, weight.detach(), offset)
        bias_copy = place(self.block, bias.detach(), offset + aligned(weight.nbytes)) if bias is not None else None
        return weight_copy, bias_copy, object()

    def release_block(self):
        self.block = None

    def compute_waits_for(self, event):
        assert event is not None
        self.compute_waits += 1

    def copies_wait_for_compute(self):
        self.copy_waits += 1


def layer_bytes(layer):
    return layer.weight.nbytes + layer.bias.nbytes


def make(window_layers=3):
    net = Net()
    modules, _ = streamed_modules(net)
    copies = CpuCopies()
    prefetcher = Prefetcher(net, modules, "cpu", window_layers * aligned(block_bytes(modules[0])), copies=copies)
    originals = {id(m): m.weight.data_ptr() for m in modules}
    seen = {"swapped": 0, "max_in_flight": 0}

    def watch(module, _args):  # runs after the prefetcher's own pre-hook
        if module.weight.data_ptr() != originals[id(module)]:
            seen["swapped"] += 1
        seen["max_in_flight"] = max(seen["max_in_flight"], prefetcher.in_flight)

    for m in modules:
        m.register_forward_pre_hook(watch)
    return net, modules, prefetcher, copies, originals, seen


def warmed(window_layers=3):
    """make(), then two steps: the first records the order, the second prefetches along it."""
    parts = make(window_layers)
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        parts[0](x)
        parts[0](x)
    return parts + (x,)


def all_home(modules, originals):
    return all(m.weight.data_ptr() == originals[id(m)] for m in modules)


def test_streamed_layers_are_the_marked_ones():
    net = Net()
    assert streamed_modules(net) == (list(net.layers), 0)


def test_copies_run_ahead_within_the_window_and_outputs_are_identical():
    net, modules, prefetcher, copies, originals, seen = make(window_layers=3)
    x = torch.randn(4, WIDTH)
    reference = Net()(x)
    with torch.no_grad():
        first = net(x)
        assert copies.copies == 0 and seen["swapped"] == 0  # step 1 records the order only
        assert copies.takeovers == 0  # ComfyUI streamed that step: its buffers are in use
        second = net(x)
        # Step 2 copies every layer here: ComfyUI's streaming buffers were freed as it began.
        assert copies.takeovers == 1 and prefetcher.released_bytes == 1000
        assert seen["swapped"] == 8 and copies.compute_waits == 8  # every layer used its copy
        assert copies.copy_waits == 8  # and the copy stream waited for each layer's compute
        # The copy stream went on into the next step within the window: its first layers are queued.
        assert len(prefetcher.ready) == 3 and prefetcher.issued == 3
        third = net(x)
    assert seen["swapped"] == 16 and prefetcher.failed is None
    assert torch.equal(first, reference) and torch.equal(second, reference) and torch.equal(third, reference)
    assert seen["max_in_flight"] <= prefetcher.window_bytes
    assert all_home(modules, originals) and not prefetcher.swapped


def test_a_step_that_runs_other_layers_falls_back_and_replans():
    net, modules, prefetcher, copies, originals, seen, x = warmed()
    with torch.no_grad():
        net.skip = 2  # this step skips a planned layer
        expected = Net()
        expected.skip = 2
        assert torch.equal(net(x), expected(x))
        assert prefetcher.plan == [0, 1, 3, 4, 5, 6, 7]  # the next steps follow the new order
        assert torch.equal(net(x), expected(x))
    assert all_home(modules, originals) and prefetcher.in_flight == sum(
        layer_bytes(modules[i]) for i in prefetcher.ready)


def test_an_interrupted_step_puts_every_weight_back():
    net, modules, prefetcher, copies, originals, seen, x = warmed()
    with torch.no_grad():
        net.fail_at = 5
        try:
            net(x)
        except RuntimeError:
            pass
        assert all_home(modules, originals) and not prefetcher.swapped
        net.fail_at = None
        assert torch.equal(net(x), Net()(x))


def test_idle_and_remove_let_go_of_everything():
    net, modules, prefetcher, copies, originals, seen, x = warmed()
    assert prefetcher.ready and prefetcher.in_flight > 0 and copies.block is not None
    prefetcher.idle()  # between sampling runs
    assert not prefetcher.ready and prefetcher.in_flight == 0
    assert copies.block is None and not prefetcher.ring.slots  # the block goes back with the copies
    prefetcher.remove()
    assert not any(len(m._forward_pre_hooks) > 1 for m in modules)  # only the test's own watcher is left
    assert not net._forward_pre_hooks and not net._forward_hooks


def test_cuda_copies_take_nothing_until_the_first_copy():
    """No CUDA stream (PyTorch's first one sets up a pool that takes 70 MB of VRAM on an H200)
    until a copy is made inside a sampling step; before that, nothing to wait for."""
    copies = CudaCopies(torch.device("cuda", 0))
    assert copies.stream is None
    copies.copies_wait_for_compute()
    assert copies.stream is None


def test_one_block_serves_a_whole_run():
    net, modules, prefetcher, copies, originals, seen, x = warmed(window_layers=2)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(net(x), Net()(x))
    # Step 1 made no copy; every later step wrapped around the block (8 layers, room for 2).
    assert copies.blocks_taken == 1 and copies.copies >= 8 * 4
    assert prefetcher.ring.held_bytes() == sum(aligned(block_bytes(modules[i])) for i in prefetcher.ready)


def test_a_non_contiguous_weight_is_left_to_comfyui():
    net, modules, prefetcher, copies, originals, seen = make()
    layer = modules[2]
    layer.weight.data = layer.weight.data.t().contiguous().t()  # same values, transposed strides
    originals[id(layer)] = layer.weight.data_ptr()
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        reference = net(x)
        assert torch.equal(net(x), reference) and torch.equal(net(x), reference)
    assert seen["swapped"] == 7 * 2  # the other seven layers used their copies in steps 2 and 3
    assert 2 not in prefetcher.ready and all_home(modules, originals)


def test_ring_takes_in_order_wraps_and_reuses_what_was_given_back():
    ring = Ring(4 * ALIGN)
    a, b, c = ring.take(ALIGN), ring.take(ALIGN - 1), ring.take(2 * ALIGN)
    assert (a, b, c) == (0, ALIGN, 2 * ALIGN)  # sizes round up to ALIGN
    assert ring.take(1) is None  # full
    ring.give(b)  # out of order: its bytes wait for the older slot
    assert ring.take(1) is None
    ring.give(a)
    assert ring.take(2 * ALIGN) == 0  # wrapped to the start, in front of c
    assert ring.take(1) is None
    ring.give(c)
    assert ring.take(2 * ALIGN) == 2 * ALIGN
    assert ring.take(5 * ALIGN) is None  # larger than the block: never


@pytest.mark.parametrize("seed", range(20))
def test_ring_never_hands_out_held_bytes(seed):
    """Random takes and gives (in any order): held slots never overlap, stay inside the block,
    and an empty ring always has room for anything the block can hold."""
    rng = random.Random(seed)
    capacity = rng.randrange(4, 40) * ALIGN + rng.randrange(ALIGN)
    ring, held = Ring(capacity), {}
    for _ in range(2000):
        if held and rng.random() < 0.45:
            offset = rng.choice(list(held))
            ring.give(offset)
            del held[offset]
        else:
            nbytes = rng.randrange(1, capacity // 3 + 1)
            offset = ring.take(nbytes)
            if offset is None:
                assert held, "an empty ring refused what fits the block"
                continue
            assert offset % ALIGN == 0 and offset + nbytes <= capacity
            for other, size in held.items():
                assert offset + nbytes <= other or other + size <= offset, "two held slots share bytes"
            held[offset] = nbytes
        assert ring.held_bytes() == sum(aligned(n) for n in held.values())
    for offset in list(held):
        ring.give(offset)
    assert not ring.slots
