"""Plots bench/results/gpu_dynamic_rounds_one.json, gpu_dynamic_fastdisk.json,
gpu_dynamic_rounds.json and gpu_dynamic_rounds_two_default.json: seconds per prompt (cold start,
five warm, after pressure) and peak RSS / largest PSS per server, ComfyUI 0.33 dynamic VRAM alone and with Viking.
usage: python bench/plot_dynamic.py  (writes bench/results/gpu_dynamic.png)"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FILES = {"default dynamic mode, 3 servers each": "gpu_dynamic_rounds_one.json", "--fast-disk": "gpu_dynamic_fastdisk.json",
         "two models taking turns, --fast-disk, 3 servers each": "gpu_dynamic_rounds.json",
         "two models taking turns, default mode, 3 servers each": "gpu_dynamic_rounds_two_default.json"}
KINDS = {"nodes": "+ Pin Model", "engine": "+ engine mode", "clone": "clone node, no Viking"}


def label(mode: str) -> str:
    base, _, server = mode.partition("#")
    kind = next((k for k in KINDS if base.endswith("_" + k)), None)
    return (KINDS[kind] if kind else "ComfyUI alone") + (f" #{server}" if server else "")


fig, axes = plt.subplots(2, len(FILES), figsize=(6.3 * len(FILES), 8))
for column, (title, name) in enumerate(FILES.items()):
    data = json.loads((RESULTS / name).read_text())
    times, memory = axes[0][column], axes[1][column]
    modes = list(data["modes"])
    for mode in modes:
        prompts = data["modes"][mode]["prompts"]
        # the cold start is ~15x a warm prompt: plotted from the first warm prompt on, quoted in the label
        times.plot(range(1, len(prompts)), [p["seconds"] for p in prompts[1:]], marker="o",
                   label=f"{label(mode)} (cold start {prompts[0]['seconds']:.2f} s)")
    stages = [p["stage"] for p in data["modes"][modes[0]]["prompts"]][1:]
    times.set_xticks(range(1, len(stages) + 1), stages, fontsize=8)
    times.set_ylabel("seconds per prompt")
    times.set_ylim(bottom=0)
    times.set_title(f"{title}\n{'two ' if 'two' in name else ''}{data['model_bytes'] / 1e9:.1f} GB model{'s' if 'two' in name else ''}, "
                    f"{data['held_vram_bytes'] / 1e9:.1f} GB of VRAM held by another process, commit {data['commit']}", fontsize=10)
    times.legend(fontsize=8)
    width = 0.38
    for index, mode in enumerate(modes):
        row = data["modes"][mode]
        pss = max(p["pss_bytes"] for p in row["prompts"])
        memory.bar(index - width / 2, row["peak_rss_bytes"] / 1e9, width, color="tab:blue", label="peak RSS" if index == 0 else None)
        memory.bar(index + width / 2, pss / 1e9, width, color="tab:orange", label="largest PSS" if index == 0 else None)
    memory.set_xticks(range(len(modes)), [label(m) for m in modes], fontsize=7, rotation=15)
    memory.set_ylabel("GB")
    memory.legend(fontsize=8)
fig.suptitle(f"ComfyUI 0.33 dynamic VRAM on {data['device']}; latents bit-identical in every mode", fontsize=11)
fig.tight_layout()
fig.savefig(RESULTS / "gpu_dynamic.png", dpi=90)
print(RESULTS / "gpu_dynamic.png")
