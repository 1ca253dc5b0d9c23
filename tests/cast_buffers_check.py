"""ComfyUI 0.33's own streaming cast buffers and comfy_node.comfy.release_cast_buffers, on a CUDA
GPU, with ComfyUI's real model_management (static mode): buffers made by its get_cast_buffer on
its own offload streams, freed by the seam, and made again by ComfyUI afterwards. Prints named
checks as JSON; exits 1 if one fails. Run by tests/test_gpu_streaming.py under 0.33's Python.

usage: python tests/cast_buffers_check.py COMFY_0_33_DIR
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [sys.argv[1], ROOT]
sys.argv = [sys.argv[0], "--disable-dynamic-vram"]
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402

from comfy_node import comfy as seam  # noqa: E402

MIB = 1 << 20
device = torch.device("cuda", 0)
checks = {}


def comfy_buffers(sizes):
    """What ComfyUI's cast does for streamed layers of these sizes: a buffer per offload stream,
    grown to the largest layer that stream copied; `refs` stand in for the layers."""
    refs = [object() for _ in sizes]
    for ref, size in zip(refs, sizes):
        stream = mm.get_offload_stream(device)
        buffer = mm.get_cast_buffer(stream, device, size, ref)
        if buffer is None:  # ComfyUI's cast retries on the other stream
            buffer = mm.get_cast_buffer(mm.get_offload_stream(device), device, size, ref)
        assert buffer is not None
    torch.cuda.synchronize(device)
    return refs


checks["offload streams on"] = mm.NUM_STREAMS > 0
refs = comfy_buffers([64 * MIB, 96 * MIB, 32 * MIB])
held = sum(b.nbytes for b in mm.STREAM_CAST_BUFFERS.values())
checks["ComfyUI made its buffers"] = held >= 96 * MIB and mm.LARGEST_CASTED_WEIGHT[0] is refs[1]
checks["a CPU device frees nothing"] = seam.release_cast_buffers(torch.device("cpu")) == 0 and bool(mm.STREAM_CAST_BUFFERS)

reserved_before = torch.cuda.memory_reserved(device)
freed = seam.release_cast_buffers(device)
checks["freed what ComfyUI held"] = freed == held and not mm.STREAM_CAST_BUFFERS
checks["given back to the device (not cached on the offload streams)"] = reserved_before - torch.cuda.memory_reserved(device) >= held
checks["the largest-weight marker cleared"] = mm.LARGEST_CASTED_WEIGHT == (None, 0)
checks["nothing left to free"] = seam.release_cast_buffers(device) == 0

# ComfyUI copies again afterwards: its next casts, the largest layer first, get buffers.
comfy_buffers([96 * MIB, 64 * MIB])
checks["ComfyUI makes new buffers after"] = sum(b.nbytes for b in mm.STREAM_CAST_BUFFERS.values()) >= 96 * MIB

# Why the marker is cleared too: the buffers dropped without it, ComfyUI refuses the marked
# layer a buffer on either stream (its cast would then fail).
marked = mm.LARGEST_CASTED_WEIGHT[0]
mm.STREAM_CAST_BUFFERS.clear()
torch.cuda.empty_cache()
refused = [mm.get_cast_buffer(mm.get_offload_stream(device), device, 96 * MIB, marked) for _ in range(2)]
checks["without clearing the marker ComfyUI refuses that layer (control)"] = refused == [None, None]

try:
    torch.cuda.synchronize(device)
    checks["no CUDA error left behind"] = True
except RuntimeError:
    checks["no CUDA error left behind"] = False
print(json.dumps(checks, indent=1))
sys.exit(0 if all(checks.values()) else 1)
