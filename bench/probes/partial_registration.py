"""Which host->device copies work when a tensor's storage is registered with CUDA only in
part (the pinned-home fallback crash of issue 15). Each case runs in its own process, so a
CUDA error in one cannot poison the next. Writes one JSON line per case.

usage: python bench/probes/partial_registration.py OUT.json
"""
import json
from _lasterr import cuda_last_error
import subprocess
import sys

CASES = {
    "whole": [(0, 1)],
    "first_half": [(0, 0.5)],
    "second_half": [(0.5, 1)],
    "two_adjacent_halves": [(0, 0.5), (0.5, 1)],
    "middle_quarter": [(0.25, 0.75)],
}


def run_case(name):
    import ctypes
    import torch

    mib = 64 << 20
    t = torch.randint(0, 255, (mib,), dtype=torch.uint8)
    rt = torch.cuda.cudart()
    torch.cuda.init()
    base = t.data_ptr()
    registered = []
    for lo, hi in CASES[name]:
        start, stop = int(lo * mib) // 4096 * 4096, int(hi * mib) // 4096 * 4096
        code = int(rt.cudaHostRegister(base + start, stop - start, 1))
        registered.append((start, stop, code))
    out = {"case": name, "registered": registered, "is_pinned": bool(t.is_pinned())}
    for mode in ("blocking", "non_blocking"):
        try:
            g = t.to("cuda", non_blocking=(mode == "non_blocking"))
            torch.cuda.synchronize()
            out[mode] = "ok" if torch.equal(g.cpu(), t) else "copied, but the bytes differ"
        except Exception as error:  # noqa: BLE001
            out[mode] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    # a view that lies wholly inside the first registration
    lo, hi = CASES[name][0]
    start = int(lo * mib) // 4096 * 4096
    try:
        v = t[start:start + (1 << 20)]
        g = v.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        out["view_inside_registration"] = "ok" if torch.equal(g.cpu(), v) else "differ"
    except Exception as error:  # noqa: BLE001
        out["view_inside_registration"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    out["last_error_after"] = cuda_last_error()
    for start, stop, code in registered:
        if code == 0:
            rt.cudaHostUnregister(base + start)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        run_case(sys.argv[2])
        sys.exit(0)
    rows = []
    for name in CASES:
        run = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, timeout=120)
        line = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else json.dumps({"case": name, "crashed": run.stderr[-800:]})
        rows.append(json.loads(line))
        print(line, flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"probe": "partial_registration", "rows": rows}, f, indent=1)
