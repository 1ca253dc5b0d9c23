"""The prefetch's one block of device memory (comfy_node/prefetch.py: Ring, CudaCopies), on a CUDA
GPU, with the allocator PyTorch was started with (PYTORCH_CUDA_ALLOC_CONF: its own caching
allocator, or backend:cudaMallocAsync as ComfyUI 0.33 sets it on CUDA 13). A model of streamed
layers with pinned weights in RAM, cast to the GPU in their forward as ComfyUI's ops do, and
compute-heavy resident layers between them so the copy stream runs ahead and wraps around the
block. Prints named checks as JSON; exits 1 if one fails. Run by tests/test_gpu_streaming.py.

usage: python tests/prefetch_block_check.py REPO_DIR
"""

import json
import os
import sys

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from comfy_node.prefetch import CudaCopies, Prefetcher, aligned, block_bytes  # noqa: E402

device = torch.device("cuda", 0)
WIDTH, STREAMED, STEPS = 1024, 12, 6
checks = {}


class Streamed(torch.nn.Linear):
    comfy_cast_weights = True

    def forward(self, x):  # ComfyUI's cast: a no-op for a weight the prefetcher put on the device
        return F.linear(x, self.weight.to(x.device, non_blocking=True), self.bias.to(x.device, non_blocking=True))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # every layer's weights differ
        self.layers = torch.nn.ModuleList(Streamed(WIDTH, WIDTH) for _ in range(STREAMED))
        for layer in self.layers:
            layer.weight.data = layer.weight.data.pin_memory()
            layer.bias.data = layer.bias.data.pin_memory()
        self.resident = torch.nn.Linear(WIDTH, WIDTH).to(device)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if i % 3 == 2:  # a compute-heavy stretch: the copy stream runs ahead here
                for _ in range(8):
                    x = torch.tanh(self.resident(x))
        return x


class Copies(CudaCopies):
    def take_over_streaming(self):
        return 0  # no ComfyUI here: its own buffers are cast_buffers_check.py's part


def run(net, x, prefetcher=None):
    outputs, blocks, allocated = [], set(), []
    for _ in range(STEPS):
        out = net(x)
        torch.cuda.synchronize(device)
        outputs.append(out.cpu())
        if prefetcher is not None and prefetcher.copies.block is not None:
            blocks.add(prefetcher.copies.block.data_ptr())
        allocated.append(torch.cuda.memory_allocated(device))
    return outputs, blocks, allocated


with torch.no_grad():
    net = Net()
    x = torch.randn(512, WIDTH, device=device)
    reference, _, _ = run(net, x)
    base = torch.cuda.memory_allocated(device)
    modules = list(net.layers)
    capacity = 3 * aligned(block_bytes(modules[0]))  # room for 3 of 12 layers: every step wraps
    swaps = [0]

    def count(module, _args):  # registered after the prefetcher's own pre-hook: runs after it
        swaps[0] += module.weight.device.type == "cuda"

    prefetcher = Prefetcher(net, modules, device, capacity, copies=Copies(device))
    for module in modules:
        module.register_forward_pre_hook(count)
    outputs, blocks, allocated = run(net, x, prefetcher)
    checks[f"outputs bit-identical to ComfyUI's own cast at each of {STEPS} steps"] = all(
        torch.equal(a, b) for a, b in zip(reference, outputs))
    checks["every streamed layer ran on its copy from the second step on"] = swaps[0] == STREAMED * (STEPS - 1)
    checks["one block for the whole run"] = len(blocks) == 1 and prefetcher.failed is None
    checks["between steps, the device holds the block and nothing more of the prefetcher's"] = all(
        used - base <= capacity + x.nbytes for used in allocated)  # x.nbytes: the step's output
    prefetcher.idle()  # ComfyUI's cleanup after sampling
    torch.cuda.synchronize(device)
    checks["after the run the block's memory is back"] = (prefetcher.copies.block is None
                                                         and torch.cuda.memory_allocated(device) <= base)
    prefetcher.remove()
    checks["every weight is home in RAM"] = all(m.weight.device.type == "cpu" and m.weight.is_pinned() for m in modules)
    try:
        torch.cuda.synchronize(device)  # a CUDA error left behind raises here
        checks["no CUDA error"] = True
    except RuntimeError as error:
        checks[f"no CUDA error: {error}"] = False
    asked = "cudaMallocAsync" if "cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else "native"
    checks[f"PyTorch's allocator is the one asked for ({asked})"] = torch.cuda.get_allocator_backend() == asked

print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
