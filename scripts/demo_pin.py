"""Pins a real torch model's weights with the best backend this machine has (CUDA registration
with a GPU, mlock without) and prints the status JSON. Usage: python scripts/demo_pin.py [MiB]"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from comfy_node.weights import cpu_storage_ranges, module_tensors  # noqa: E402
from comfy_node.native import require  # noqa: E402

native = require()
megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 256
width = int((megabytes * (1 << 20) / 4 / 8) ** 0.5)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)])
ranges, foreign = cpu_storage_ranges(module_tensors(model))
report = json.loads(native.reconcile(1, ranges, label=f"demo model ({megabytes} MiB)", foreign=foreign))
print(f"pinned {report['pinned_bytes'] / 2**20:.1f} MiB of {report['wanted_bytes'] / 2**20:.1f} MiB "
      f"with the {report['backend']} backend; budget {report['budget']['reason']}", file=sys.stderr)
print(json.dumps(json.loads(native.status_json(probe_cuda=True)), indent=2))
native.release_all()
