"""Which pins the locked-memory limit (RLIMIT_MEMLOCK) applies to, in a process without
CAP_IPC_LOCK (a normal user, a default Docker container): 256 MiB through the CUDA backend
(cuMemHostRegister) and through the OS lock (mlock), with the limit given by the caller.
Expected: CUDA pins all of it (the driver does not count its pins against the limit); the OS
lock pins within the limit and names it for the rest; nothing fails.

usage: prlimit --memlock=8388608:8388608 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \\
           python tests/memlock_check.py OUT.json
"""
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import viking_native as vn  # noqa: E402
from comfy_node.weights import cpu_storage_ranges  # noqa: E402

MIB = 1 << 20


def vm_locked() -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmLck:"))


def cap_ipc_lock() -> bool:
    eff = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:"))
    return bool(int(eff, 16) >> 14 & 1)


result = {"probe": "memlock_cuda", "date": time.strftime("%Y-%m-%d"), "cap_ipc_lock": cap_ipc_lock(),
          "rlimit_memlock": resource.getrlimit(resource.RLIMIT_MEMLOCK)[0], "checks": []}
torch.cuda.init()
vn.configure(headroom_gib=0.0)
status = json.loads(vn.status_json())
result["os_lock_limit_bytes"] = status["os_lock_limit_bytes"]
for backend, owner in (("cuda", 1), ("os-lock", 2)):
    tensors = [torch.ones(MIB // 4) + i for i in range(256)]  # 256 storages of 1 MiB
    before = vm_locked()
    report = json.loads(vn.reconcile(owner, cpu_storage_ranges(tensors)[0], backend=backend))
    result[backend] = {"wanted_bytes": report["wanted_bytes"], "pinned_bytes": report["pinned_bytes"],
                       "failures": report["failures"], "skipped": report["skipped"],
                       "vm_locked_grew_bytes": vm_locked() - before,
                       "pinned_tensors": sum(t.is_pinned() for t in tensors)}
    vn.release(owner)
limit = result["os_lock_limit_bytes"]
cuda, lock = result["cuda"], result["os-lock"]
checks = [
    (not result["cap_ipc_lock"] and limit is not None and limit <= 64 * MIB, "the process has a small lock limit and no CAP_IPC_LOCK"),
    (cuda["pinned_bytes"] == cuda["wanted_bytes"] == 256 * MIB and not cuda["failures"], "CUDA pinned all 256 MiB: the limit does not apply"),
    (cuda["pinned_tensors"] == 256, "torch sees every CUDA-pinned tensor pinned"),
    (0 < lock["pinned_bytes"] <= limit and not lock["failures"], "the OS lock pinned within the limit, with no failure"),
    (any(s["reason"] == "lock_limit" for s in lock["skipped"]), "the OS lock named the limit for the rest"),
    (lock["vm_locked_grew_bytes"] >= lock["pinned_bytes"], "what the OS lock counts is locked (VmLck)"),
]
result["checks"] = [{"ok": bool(ok), "what": what} for ok, what in checks]
result["ok"] = all(ok for ok, _ in checks)
with open(sys.argv[1], "w") as out:
    json.dump(result, out, indent=1)
print(json.dumps(result, indent=1))
sys.exit(0 if result["ok"] else 1)
