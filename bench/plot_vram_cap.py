"""Plots bench/results/gpu_vram_cap.json: step time against the VRAM cap, per mode, with the
physical floor max(streamed bytes / link bandwidth, all-in-VRAM compute) drawn in.
usage: python bench/plot_vram_cap.py  (writes bench/results/gpu_vram_cap.png)"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
data = json.loads((RESULTS / "gpu_vram_cap.json").read_text())
LABELS = {"comfy": "ComfyUI alone, same cap", "comfy_same_peak": "ComfyUI alone, cap + Viking's window (same VRAM)",
          "viking": "Viking (pins + prefetch)", "viking_noprefetch": "Viking pins, no prefetch"}

fig, ax = plt.subplots(figsize=(8, 5))
for mode, label in LABELS.items():
    rows = sorted((r for r in data["rows"] if r["mode"] == mode and "step_s" in r and r["under_cap"]), key=lambda r: r["cap_gib"])
    if rows:
        ax.plot([r["cap_gib"] for r in rows], [r["step_s"] for r in rows], marker="o", label=label)
floor = sorted({(r["cap_gib"], r["floor_s"]) for r in data["rows"] if r.get("mode") == "viking" and r.get("floor_s")})
ax.plot([c for c, _ in floor], [f for _, f in floor], "k--", label="floor: max(streamed / link, all-in-VRAM compute)")
ax.axhline(data["all_in_vram_step_s"], color="grey", linewidth=0.8, linestyle=":", label="all weights in VRAM")
ax.set_xlabel("VRAM cap for the model's weights (GiB)")
ax.set_ylabel(f"seconds per step (median of {data.get('reps', 3)})")
# The stamped device already ends with the date (bench/stamp.py).
ax.set_title(f"{data['device']}, commit {data.get('commit', '?')}\n{data['model_bytes'] / 1e9:.1f} GB Flux-shaped model, 1024x1024, "
             f"link {data['link_gb_per_s']:.1f} GB/s; outputs bit-identical in every row", fontsize=9)
ax.set_ylim(bottom=0)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(RESULTS / "gpu_vram_cap.png", dpi=110)
print(RESULTS / "gpu_vram_cap.png")
