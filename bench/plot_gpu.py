"""Plots bench/results/gpu_perf.json into bench/results/gpu_perf.png (the two-GPU panel is from
bench/results/history/gpu_two.json: two GPUs were not lent since, so it describes older code).
usage: python bench/plot_gpu.py"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
perf = json.loads((RESULTS / "gpu_perf.json").read_text())
two = json.loads((RESULTS / "history" / "gpu_two.json").read_text())
cases, pin = perf["cases"], perf["cases"]["pin"]
gb = pin["model_bytes"] / 1e9

fig, axes = plt.subplots(2, 3, figsize=(15, 8))
fig.suptitle(f"Viking Engine on {perf['device']} (driver {perf['driver']}, torch {perf['torch']}, {perf['date']}, "
             f"commit {perf.get('commit', '?')}): Flux-shaped model, {gb:.1f} GB bf16 in {pin['tensors']} tensors; "
             f"medians of {perf['reps']}")


def bars(ax, labels, values, title, unit, colors=None):
    ax.bar(labels, values, color=colors or ["#4c72b0"] * len(values))
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.3g}", ha="center", va="bottom")
    ax.set_title(title)
    ax.set_ylabel(unit)


p = pin["pin"]
bars(axes[0][0], ["Viking plan", "per tensor\n(ComfyUI's way)", "pin_memory()\ncold", "pin_memory()\nwarm"],
     [p["viking"]["gb_per_s"], p["per_tensor"]["gb_per_s"], p["pin_memory"]["gb_per_s"], p["pin_memory_warm"]["gb_per_s"]],
     "Pin throughput", "GB/s", ["#c44e52", "#4c72b0", "#8c8c8c", "#bcbcbc"])
bars(axes[0][1], ["extra RAM\nViking", "per tensor", "pin_memory()\n(cold; warm keeps it)"],
     [p["viking"]["peak_extra_ram_bytes"] / 1e9, p["per_tensor"]["peak_extra_ram_bytes"] / 1e9, p["pin_memory"]["peak_extra_ram_bytes"] / 1e9],
     "Peak extra RAM while pinning", "GB", ["#c44e52", "#4c72b0", "#8c8c8c"])
b = pin["bandwidth"]
bars(axes[0][2], ["weights pinned\nby Viking", "same weights\npageable", "cudaHostAlloc\n(PCIe limit)"],
     [b["pinned_weights_gb_per_s"], b["pageable_weights_gb_per_s"], b["cuda_host_alloc_gb_per_s"]],
     "Host -> device copy", "GB/s", ["#c44e52", "#8c8c8c", "#4c72b0"])
low = [cases[m] for m in ("low_none", "low_builtin", "low_viking")]
ax = axes[1][0]
bars(ax, ["pinning off", "ComfyUI built-in", "Viking"], [c["step_s_median"] for c in low],
     f"lowvram step, {low[2]['streamed_bytes_per_step'] / 1e9:.1f} GB streamed", "s / step", ["#8c8c8c", "#4c72b0", "#c44e52"])
ax.axhline(low[2]["floor_s"], color="k", linestyle="--", label=f"floor {low[2]['floor_s']:.3f} s")
ax.legend()
bars(axes[1][1], ["pageable", "Viking pinned"], [cases["full_none"]["load_s"], cases["full_viking"]["load_s"]],
     "Full load RAM -> VRAM", "s", ["#8c8c8c", "#c44e52"])
t = two["pinned"]
bars(axes[1][2], ["GPU0 alone", "GPU1 alone", "GPU0 both", "GPU1 both"],
     [t["gpu0_alone_gb_per_s"], t["gpu1_alone_gb_per_s"], t["gpu0_together_gb_per_s"], t["gpu1_together_gb_per_s"]],
     f"One registration, two GPUs ({two.get('date', 'older code')}, older code)", "GB/s", ["#c44e52"] * 4)
fig.tight_layout()
fig.savefig(RESULTS / "gpu_perf.png", dpi=80)
print(f"wrote {RESULTS / 'gpu_perf.png'}")
