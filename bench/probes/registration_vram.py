"""Does page-locking host memory take device memory? In a fresh process on the GPU: the free
VRAM (cudaMemGetInfo) after PyTorch's context is made, after Viking registers host tensors of
growing size (CUDA backend, PORTABLE|DEVICEMAP), and after it releases them; the same with
torch's own pin_memory() for comparison.

usage: python bench/probes/registration_vram.py OUT.json
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT]
import torch  # noqa: E402

from comfy_node.native import require  # noqa: E402

native = require()
torch.cuda.init()
torch.cuda.mem_get_info()  # the context exists from here on
steps = []


def note(what):
    steps.append(dict(step=what, free_mib=round(torch.cuda.mem_get_info()[0] / 2**20, 3)))
    print(json.dumps(steps[-1]), flush=True)


note("context")
kept = []
for owner, mib in enumerate((1, 16, 247, 1024, 4096), start=1):
    tensor = torch.empty(mib << 20, dtype=torch.uint8)
    tensor[::4096] = 1  # touch every page
    kept.append(tensor)
    report = json.loads(native.reconcile(owner, [(tensor.data_ptr(), tensor.nbytes, tensor)], backend="cuda",
                                         label=f"probe {mib} MiB"))
    note(f"registered {mib} MiB (pinned {report['pinned_bytes']})")
native.release_all()
note("all released")
for mib in (16, 1024):
    kept.append(torch.empty(mib << 20, dtype=torch.uint8).pin_memory())
    note(f"torch pin_memory {mib} MiB")
with open(sys.argv[1], "w") as f:
    json.dump(dict(steps=steps), f, indent=1)
