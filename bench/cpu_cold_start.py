"""The first prompt after a model is loaded, on a ComfyUI 0.33 server started with --cpu (or on
a machine with no GPU), alone and with the Viking Pin Model: bench/gpu_dynamic.py --cpu
(unchanged, in-process) with its static modes, fresh servers taking turns (alone, Pin Model,
then the reverse order), the model file's pages dropped from the page cache before each server.

Why: there the Pin Model locks the weights with the OS page lock while the first prompt runs.
ComfyUI maps a safetensors file copy-on-write, so the lock reads every page of it in and copies
it; ComfyUI alone reads the pages as it computes. The figures here: each server's cold, warm and
after-pressure seconds, Viking's seconds inside the cold prompt's native reconcile, the ratios
(Viking's median over alone's) and whether every latent is bit-identical to alone's.

usage: python bench/cpu_cold_start.py OUT.json [--depth 3] [--rounds 3] [--format fp8_scaled]
       (ComfyUI 0.33's Python; writes OUT.json and the bench's own file beside it as OUT.bench.json)
"""
import json
import runpy
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent / "tests"), str(BENCH)]

from flux_model import arg  # noqa: E402
from server_tools import Results  # noqa: E402

STAGES = ("cold start", "warm", "after pressure")


def round_modes(rounds: int) -> list[str]:
    """alone, Pin Model; then Pin Model, alone; ... (a later server is never always the same mode)."""
    modes = []
    for n in range(1, rounds + 1):
        suffix = "" if n == 1 else f"#{n}"
        pair = ["static", "static_nodes"] if n % 2 else ["static_nodes", "static"]
        modes += [mode + suffix for mode in pair]
    return modes


def per_server(row: dict) -> dict:
    """One server's seconds per stage (warm: the median of its warm prompts), and the seconds
    Viking's native reconciles took up to the end of its cold prompt."""
    seconds = {stage: [p["seconds"] for p in row["prompts"] if p["stage"] == stage] for stage in STAGES}
    out = {stage: round(statistics.median(values), 3) for stage, values in seconds.items() if values}
    cold = next((p for p in row["prompts"] if p["stage"] == "cold start"), {})
    native = (cold.get("time_in_viking") or {}).get("event/native")
    if native is not None:
        out["viking_native_seconds_in_cold_prompt"] = round(native["seconds"], 3)
    return out


def main():
    out_path = Path(sys.argv[1])
    depth, rounds, weight_format = arg("--depth", 3, int), arg("--rounds", 3, int), arg("--format", "fp8_scaled", str)
    bench_path = out_path.with_suffix(".bench.json")
    modes = round_modes(rounds)
    sys.argv = [str(BENCH / "gpu_dynamic.py"), str(bench_path), "--cpu", "--format", weight_format, "--depth", str(depth),
                "--size", "256", "--steps", "1", "--modes", ",".join(modes)]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit:
        pass  # its own checks compare with dynamic-mode alone, which --cpu has not: ours follow
    bench = json.loads(bench_path.read_text())
    results = Results(out_path, bench="cpu_cold_start", date=bench["date"], depth=depth, format=weight_format,
                      model_bytes=bench["model_bytes"], steps=bench["steps"], size=bench["size"], modes=modes)
    rows = bench["modes"]
    for mode in modes:
        results.check("error" not in rows.get(mode, {"error": "did not run"}), f"{mode}: every prompt ran")
    alone_latents = [p["latent"] for p in rows.get("static", {}).get("prompts", [])]
    for mode in modes:
        latents = [p["latent"] for p in rows.get(mode, {}).get("prompts", [])]
        results.check(latents == alone_latents and None not in latents and len(latents) == 7,
                      f"{mode}: latents bit-identical to the first server's (ComfyUI alone)")
        results.check(not rows.get(mode, {}).get("bad_log_lines"), f"{mode}: no Pin error or traceback in the log")
    servers = {mode: per_server(rows[mode]) for mode in modes if rows.get(mode, {}).get("prompts")}
    by_kind = {"alone": [s for m, s in servers.items() if not m.startswith("static_nodes")],
               "pin_model": [s for m, s in servers.items() if m.startswith("static_nodes")]}
    medians = {kind: {stage: round(statistics.median(s[stage] for s in found), 3) for stage in STAGES if all(stage in s for s in found)}
               for kind, found in by_kind.items() if found}
    results.data.update(servers=servers, medians=medians)
    if len(medians) == 2:
        results.data["pin_model_over_alone"] = {stage: round(medians["pin_model"][stage] / medians["alone"][stage], 3)
                                                for stage in medians["alone"] if stage in medians["pin_model"]}
    results.save()
    print(json.dumps({k: results.data.get(k) for k in ("servers", "medians", "pin_model_over_alone")}, indent=1))
    sys.exit(0 if results.data["ok"] else 1)


if __name__ == "__main__":
    main()
