"""Which result files in bench/results/ are older than the code they measured, and the command
that measures each again. A result file is older than its code when a file it measured
(SOURCES) changed since the commit it records; tests/test_readme_figures.py holds the README's
"Older than their code" line to exactly these files. Run it to plan a GPU session:

usage: python bench/results_age.py    (each older file, the commit it measured, its command)
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

NATIVE = ["src", "Cargo.toml", "build.rs"]
STREAMING = ["comfy_node/lifecycle.py", "comfy_node/weights.py", "comfy_node/comfy.py", "comfy_node/prefetch.py",
             "comfy_node/vram_cap.py", "comfy_node/home.py", "bench/flux_model.py"]
SERVER = ["comfy_node", "bench/server_tools.py", "tests/comfy_server.py", "tests/synthetic_checkpoint.py"]
# comfy_node/dynamic.py runs only in ComfyUI 0.33's dynamic VRAM mode (lifecycle's dynamic
# branch; gate's govern() returns at once elsewhere): a result measured without that mode did
# not measure it.
NOT_DYNAMIC = [":(exclude)comfy_node/dynamic.py"]
DYNAMIC_BENCH = NATIVE + SERVER + ["bench/gpu_dynamic.py", "bench/flux_model.py"]
NODE_TIMES = DYNAMIC_BENCH + ["bench/probes/node_times.py"]  # bench/probes/node_times.py runs gpu_dynamic.py in-process
# What each result file measured: the code whose change makes its figures old.
SOURCES = {
    "gpu_perf.json": NATIVE + STREAMING + ["bench/gpu_perf.py"],
    "gpu_vram_cap.json": NATIVE + STREAMING + ["bench/comfy_vram_cap.py"],
    "gpu_prefetch_cap_test.json": NATIVE + STREAMING + ["bench/comfy_vram_cap.py"],
    "gpu_home_timing.json": NATIVE + STREAMING + ["bench/comfy_home.py"],
    "gpu_home_correctness.json": NATIVE + STREAMING + ["bench/comfy_home.py"],
    "gpu_tests.json": NATIVE + NOT_DYNAMIC + ["comfy_node", "tests/test_native.py", "tests/test_reliability.py",
                                              "tests/test_gpu_streaming.py", "bench/comfy_home.py", "bench/comfy_vram_cap.py"],
    "gpu_server_0_3_75.json": NATIVE + SERVER + NOT_DYNAMIC + ["bench/gpu_server.py"],
    "gpu_server_0_33.json": NATIVE + SERVER + NOT_DYNAMIC + ["bench/gpu_server.py"],  # --disable-dynamic-vram
    "gpu_dynamic.json": DYNAMIC_BENCH,
    "gpu_dynamic_fastdisk.json": DYNAMIC_BENCH,
    "gpu_dynamic_rounds_two_default.json": DYNAMIC_BENCH,
    "gpu_dynamic_rounds.json": DYNAMIC_BENCH,
    "gpu_dynamic_rounds_one.json": DYNAMIC_BENCH,
    "gpu_server_0_33_dynamic.json": NATIVE + SERVER + ["bench/gpu_server.py"],  # the default dynamic VRAM mode
    "container_residency_cpu.json": NATIVE + ["comfy_node", "bench/container_residency.py", "tests/dynamic_cpu.py",
                                              "tests/memory_cgroup.py"],
    "gpu_probe_registration_vram.json": NATIVE + ["bench/probes/registration_vram.py"],
    "gpu_probe_static_vram.json": DYNAMIC_BENCH + ["bench/probes/static_vram.py"],  # runs gpu_dynamic.py in-process
    "gpu_probe_node_times.json": NODE_TIMES,  # likewise
    "event_cost_cpu.json": NATIVE + ["comfy_node", "bench/probes/event_cost.py", "tests/dynamic_cpu.py"],
    "static_event_cost_cpu.json": NATIVE + ["comfy_node", "bench/probes/static_event_cost.py"],
    "kept_objects_cpu.json": NATIVE + ["comfy_node", "bench/probes/kept_objects.py", "bench/probes/static_event_cost.py"],
    "gpu_probe_partial_registration.json": ["bench/probes/partial_registration.py"],
    "gpu_probe_file_mapping.json": ["bench/probes/file_mapping.py"],
    "plan.json": ["src/plan.rs", "src/spans.rs", "benches/plan.rs"],
    "swap_cpu.json": NATIVE + ["comfy_node/lifecycle.py", "comfy_node/weights.py", "bench/swap_pressure.py"],
    "status_stall_cpu.json": NATIVE + ["bench/status_stall.py"],
    "status_stall_one_pass_cpu.json": NATIVE + ["bench/status_stall.py"],
    "gpu_dynamic_fp8_scaled.json": DYNAMIC_BENCH,
    "gpu_dynamic_gguf.json": DYNAMIC_BENCH,
    "gpu_probe_fp8_clone.json": DYNAMIC_BENCH,
    "cpu_cold_start.json": DYNAMIC_BENCH + ["bench/cpu_cold_start.py"],  # runs gpu_dynamic.py --cpu in-process
    "cpu_cold_start.bench.json": DYNAMIC_BENCH + ["bench/cpu_cold_start.py"],
    "gpu_memlock.json": NATIVE + ["comfy_node/weights.py", "bench/probes/memlock_cuda.py"],
    "gpu_cpu_flag_0_3_75.json": NATIVE + SERVER + ["tests/test_gpu_server.py"],
    "gpu_cpu_flag_0_33.json": NATIVE + SERVER + ["tests/test_gpu_server.py"],
    "gpu_dynamic_comfy_quant.json": DYNAMIC_BENCH,
    "gpu_dynamic_rounds_fp8_scaled.json": DYNAMIC_BENCH,
    "gpu_dynamic_rounds_comfy_quant.json": DYNAMIC_BENCH,
    "gpu_dynamic_rounds_gguf.json": DYNAMIC_BENCH,
    "gpu_dynamic_cold_fp8_scaled.json": NODE_TIMES,  # node times of its prompts
    "gpu_dynamic_cold_fp8_scaled.bench.json": NODE_TIMES,  # the bench's own file beside it
    "gpu_probe_static_fp8_node_times.json": NODE_TIMES,  # 0.33 static mode, fp8-scaled (part staticfp8)
    "gpu_probe_static_fp8_node_times.bench.json": NODE_TIMES,
    "gpu_probe_static_fp8_split.json": NODE_TIMES,  # the static cold start split (part staticsplit)
    "gpu_probe_static_fp8_split.bench.json": NODE_TIMES,
    "gpu_probe_static_fp8_gc.json": NODE_TIMES + ["bench/probes/gc_times.py"],  # full collections per prompt (part staticgc)
    "status_stall_24gib.json": NATIVE + ["bench/status_stall.py"],
    "watcher_gc_cpu.json": ["comfy_node/gate.py", "comfy_node/timing.py", "bench/probes/watcher_gc.py"],
    "watch_rate_cpu.json": ["comfy_node/gate.py", "comfy_node/comfy.py", "comfy_node/timing.py", "bench/probes/watch_rate.py"],
    "gpu_probe_static_event_breakdown.json": NATIVE + ["comfy_node", "bench/probes/static_event_breakdown.py",
                                                        "bench/probes/static_event_cost.py", "bench/flux_model.py"],
}
# Probes of the code before a fix, kept on purpose as the evidence of its cause (the README says so).
OF_OLDER_CODE = {"gpu_probe_lora_variants_0_3_75.json", "gpu_probe_lora_variants_0_33.json",
                 "gpu_probe_clip_free_vram.json"}


class AgeUnknown(Exception):
    """The ages cannot be told here: no git history, or a recorded commit is not in this clone."""


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def recorded(name):
    """What a result file records (commit, command, ... and its figures)."""
    return json.loads((RESULTS / name).read_text())


def older_than_their_code():
    """{result file: the commit it measured} for each file whose measured code changed since."""
    if git("rev-parse", "HEAD").returncode != 0:
        raise AgeUnknown("no git history here: the age of the result files cannot be checked")
    shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    older = {}
    for name, sources in SOURCES.items():
        commit = recorded(name)["commit"]
        if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            if shallow:
                raise AgeUnknown(f"commit {commit} ({name}) is not in this shallow clone: ages cannot be checked")
            # Not in the project's history at all (work that never landed): nothing shows that
            # the code it measured is the code here, so it is measured again like an old one.
            older[name] = commit
            continue
        existing = [s for s in sources if s.startswith(":") or (REPO / s).exists()]  # ":(exclude)..." pathspecs
        if git("diff", "--quiet", commit, "--", *existing).returncode != 0:
            older[name] = commit
    return older


if __name__ == "__main__":
    try:
        older = older_than_their_code()
    except AgeUnknown as reason:
        sys.exit(str(reason))
    for name, commit in sorted(older.items()):
        print(f"{name} (measured at {commit}): {recorded(name).get('command', '(no command recorded)')}")
    if not older:
        print("every result file measured the code as it is")
