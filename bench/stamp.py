"""Puts where a result came from at the top of its file: the commit it measured, whether the
tree was dirty, the device and the command. The GPU machine has no git, so this runs here, on
the files brought back (and on CPU results whose bench does not record it). Every result file
in bench/results/ carries these fields (tests/test_figures.py checks it); scripts/figures.py
renders the docs' figures from them.

usage: python bench/stamp.py IN.json OUT.json COMMIT "COMMAND" [--dirty] [--note TEXT] [--device TEXT]
"""
import datetime
import json
import sys

DEVICE = "NVIDIA H200 (PCIe), driver 580.159.04, torch 2.11.0+cu130, CUDA 13"

source, target, commit, command = sys.argv[1:5]
note = sys.argv[sys.argv.index("--note") + 1] if "--note" in sys.argv else None
device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else DEVICE
data = json.load(open(source))
stamp = {"commit": commit, "dirty": "--dirty" in sys.argv, "device": f"{device}, {data.get('date') or datetime.date.today().isoformat()}",
         "command": command}
if note:
    stamp["note"] = note
with open(target, "w") as out:
    json.dump({**stamp, **{k: v for k, v in data.items() if k not in stamp}}, out, indent=1)
    out.write("\n")
print(target, commit)
