"""The figures the docs quote, rendered from the result files in bench/results/.

Every result file is declared below (BENCHMARKS): what it measures, the code it exercises (the
paths whose change makes its figures older than their code) and the command that measures it
again. From the files this renders docs/benchmarks.md whole (a table per result file, each with
the commit and the command that made it) and the README's first table, between its markers.
tests/test_figures.py renders both again and compares them with what is committed, so a figure
in the docs is always the one in its file.

usage: python scripts/figures.py render   (write docs/benchmarks.md and the README's table)
       python scripts/figures.py check    (exit 1 if either differs from what the files give)
       python scripts/figures.py age      (each file older than its code, with its command)
"""

import json
import statistics
import textwrap
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
README = REPO / "README.md"
BENCHMARKS_PAGE = REPO / "docs" / "benchmarks.md"
TABLE_BEGIN = "<!-- figures: rendered by scripts/figures.py from bench/results/; do not edit by hand -->"
TABLE_END = "<!-- figures: end -->"

# --- What each benchmark exercises -------------------------------------------------------------
# Files and folders, or ":(exclude)" ones (the most specific entry decides: exercises()). The
# Rust core every figure runs through: the engine, the budget and its reading
# of the machine (sys/os.rs also reads /proc/meminfo and the cgroup files for every budget), the
# plan and the status. The two backends are apart: a change to the OS lock does not age a
# figure that pinned through CUDA only, nor the reverse. Unit tests change no figure.
RUST_CORE = ["src", "Cargo.toml", "build.rs", ":(exclude)src/engine/tests.rs", ":(exclude)src/sys/cuda.rs",
             ":(exclude)src/backend/cuda.rs", ":(exclude)src/backend/oslock.rs", ":(exclude)src/backend/file_view.rs"]
CUDA = ["src/sys/cuda.rs", "src/backend/cuda.rs"]
OS_LOCK = ["src/backend/oslock.rs", "src/backend/file_view.rs"]
# The Python node, as a real server runs it; the harness that starts servers and builds models.
NODE = ["comfy_node", "__init__.py"]
HARNESS = ["tests/comfy_server.py", "tests/synthetic_checkpoint.py", "tests/server_tools.py"]
# comfy_node/dynamic.py runs only in ComfyUI 0.33's dynamic VRAM mode: a figure measured
# without that mode did not run it.
NOT_DYNAMIC = [":(exclude)comfy_node/dynamic.py"]
STREAMING = ["comfy_node/lifecycle.py", "comfy_node/weights.py", "comfy_node/comfy.py", "comfy_node/prefetch.py",
             "comfy_node/vram_cap.py", "comfy_node/home.py", "comfy_node/models.py", "tests/flux_model.py"]
DYNAMIC_BENCH = RUST_CORE + CUDA + OS_LOCK + NODE + HARNESS + ["bench/gpu_dynamic.py", "tests/flux_model.py"]
NODE_TIMES = DYNAMIC_BENCH + ["bench/probes/node_times.py"]
CPU_BENCH = RUST_CORE + OS_LOCK


@dataclass
class Benchmark:
    file: str
    title: str
    paths: list          # what it exercises (files and folders; exercises() reads them)
    remeasure: str       # the command that measures it again
    table: Optional[Callable] = None  # data -> (header, rows); None: every figure of the file
    notes: list = field(default_factory=list)


def gpu(part):
    return f"bash scripts/gpu_check.sh parts {part}"


def cpu(step):
    return f"bash scripts/cpu_figures.sh {step}"


# --- Formatting ----------------------------------------------------------------------------------
def speed(alone, viking):
    """One convention for every ratio of times: "2.4x faster" / "1.06x slower" / "as fast"."""
    ratio = viking / alone
    if round(ratio, 2) == 1.0:
        return "as fast (1.00x)"
    if ratio < 1:
        return f"{alone / viking:.1f}x faster" if alone / viking >= 1.5 else f"{alone / viking:.2f}x faster"
    return f"{ratio:.2f}x slower"


def number(value):
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "-"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value).replace("|", "/").replace("\n", " ")
    return text if len(text) <= 120 else text[:117] + "..."


STAMP = {"commit", "dirty", "device", "command", "date", "note", "machine", "bench", "probe"}
# Records of how a run went rather than figures: logs, traces, tracebacks (kept in the file).
NOT_FIGURES = {"log", "trace", "split_lines", "tracebacks", "traceback", "stderr", "stdout", "lines", "error"}
MOST_ROWS = 40


def leaves(value, path=""):
    """Every figure of a result file as (path, value): dicts flattened, lists of records keyed by
    their mode (or name), short lists of numbers joined."""
    if path.count(".") + path.count("[") > 4:
        return
    if isinstance(value, dict):
        for key, inner in value.items():
            if (path == "" and key in STAMP) or key in NOT_FIGURES:
                continue
            if key == "checks" and isinstance(inner, list):
                passed = sum(1 for c in inner if not isinstance(c, dict) or c.get("ok", c.get("passed", True)))
                yield (f"{path}.checks" if path else "checks"), f"{passed} of {len(inner)} passed"
                continue
            yield from leaves(inner, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and len(value) <= 12:
            yield path, ", ".join(number(v) for v in value)
        elif all(isinstance(v, dict) for v in value) and len(value) <= 40:
            for index, item in enumerate(value):
                label = next((str(item[k]) for k in ("mode", "name", "what", "scenario", "case") if k in item), str(index))
                if "swap_device" in item:
                    label = f"{item['swap_device']}, {label}"
                yield from leaves({k: v for k, v in item.items() if k not in ("mode", "name")}, f"{path}[{label}]")
        elif all(isinstance(v, str) for v in value) and len(value) <= 12:
            for index, text in enumerate(value):
                yield f"{path}[{index}]", text
        else:
            yield path, f"({len(value)} entries)"
    else:
        yield path, value


def every_figure(data):
    """A file without a table of its own: its figures by their place in the file (the first
    MOST_ROWS of them; the file holds the rest)."""
    figures = [(path, value) for path, value in leaves(data) if not (isinstance(value, str) and len(value) > 80)]
    rows = [[f"`{path}`", number(value)] for path, value in figures[:MOST_ROWS]]
    if len(figures) > MOST_ROWS:
        rows.append([f"({len(figures) - MOST_ROWS} more in the file)", ""])
    return ["figure", "value"], rows


# --- Tables of the benches whose shape is shared -------------------------------------------------
def dynamic_rows(data):
    """Per mode of a gpu_dynamic-style bench: cold, warm (median), after-pressure seconds, bytes read
    from storage after pressure, peak RSS and Viking's pins at the last prompt."""
    rows = {}
    for mode, r in data["modes"].items():
        if "error" in r:
            rows[mode] = None
            continue
        prompts = r["prompts"]
        warm = sorted(p["seconds"] for p in prompts if p.get("stage") == "warm") or [prompts[0]["seconds"]]
        rows[mode] = dict(cold=prompts[0]["seconds"], warm=warm[len(warm) // 2], pressure=prompts[-1]["seconds"],
                          read=prompts[-1].get("storage_read_bytes"), rss=r.get("peak_rss_bytes"),
                          pinned=prompts[-1].get("viking_pinned_bytes"))
    return rows


def gigabytes(nbytes):
    return "-" if nbytes is None else f"{nbytes / 1e9:.2f} GB"


def dynamic_table(data):
    header = ["mode (server)", "first prompt", "warm (median)", "after pressure", "read after pressure", "peak RSS",
              "Viking's pins"]
    rows = []
    for mode, r in dynamic_rows(data).items():
        if r is None:
            error = data["modes"][mode]["error"].splitlines()
            rows.append([f"`{mode}`", f"failed: {number(error[1] if len(error) > 1 else error[0])}", "", "", "", "", ""])
            continue
        rows.append([f"`{mode}`", f"{r['cold']:.2f} s", f"{r['warm']:.3f} s", f"{r['pressure']:.3f} s",
                     "-" if r["read"] is None else f"{r['read'] / 1e6:.0f} MB", gigabytes(r["rss"]), gigabytes(r["pinned"])])
    return header, rows


def stage_median(data, base, stage):
    """The median of every prompt of one stage over every server of a mode ("dynamic", "dynamic#2"...)."""
    return statistics.median(p["seconds"] for m, r in data["modes"].items() if m.split("#")[0] == base and "error" not in r
                             for p in r["prompts"] if p.get("stage") == stage)


def rounds_table(alone, viking):
    def table(data):
        header, rows = dynamic_table(data)
        for stage in ("cold start", "warm", "after pressure"):
            rows.append([f"{stage}: `{viking}` against `{alone}`, medians of every server's prompts",
                         speed(stage_median(data, alone, stage), stage_median(data, viking, stage)), "", "", "", "", ""])
        return header, rows
    return table


def node_times_table(data):
    header = ["mode (server)", "prompt", "seconds", "loaders", "samplers"]
    rows, count = [], {}
    for prompt in data["prompts"]:
        count[prompt["mode"]] = count.get(prompt["mode"], 0) + 1
        kinds = {}
        for node in prompt["nodes"]:
            kinds.setdefault(node["class_type"], []).append(node["seconds"])
        loaders = [s for c, v in kinds.items() if "Loader" in c for s in v]
        samplers = [s for c, v in kinds.items() if "Sampler" in c for s in v]
        rows.append([f"`{prompt['mode']}`", str(count[prompt["mode"]]), f"{prompt['seconds']:.2f}",
                     " / ".join(f"{s:.2f}" for s in loaders) or "-", " / ".join(f"{s:.2f}" for s in samplers) or "-"])
    return header, rows


def home_table(data):
    timing, turns = data["parts"]["timing"], data["parts"]["alternate"]
    comfy, viking = timing["rows"]
    alone_turns, viking_turns = turns["rows"]
    return ["what", "ComfyUI alone", "with Viking (pinned home)", "Viking"], [
        ["unload a model from VRAM", f"{comfy['unload_s']:.2f} s", f"{viking['unload_s']:.3f} s",
         speed(comfy["unload_s"], viking["unload_s"])],
        ["load it again", f"{comfy['reload_s']:.2f} s ({comfy['reload_gbps']} GB/s)",
         f"{viking['reload_s']:.3f} s ({viking['reload_gbps']} GB/s)", speed(comfy["reload_s"], viking["reload_s"])],
        [f"two models taking turns, {turns['switches']} switches", f"{alone_turns['total_s']:.1f} s",
         f"{viking_turns['total_s']:.2f} s", speed(alone_turns["total_s"], viking_turns["total_s"])],
        ["RSS, one model", gigabytes(comfy["rss_bytes"]), gigabytes(viking["rss_bytes"]), ""],
        ["RSS, two models", gigabytes(alone_turns["rss_bytes"]), gigabytes(viking_turns["rss_bytes"]), ""],
    ]


def swap_table(data):
    rows = []
    for device, ratios in data["ratios"].items():
        alone, viking = (next(x for x in data["scenarios"] if x["swap_device"] == device and x["scenario"] == name)
                         for name in ("unpinned", "viking"))
        a, v = alone["median"], viking["median"]
        rows.append([device, f"{a['process_swapped_bytes'] / 1e9:.2f} GB / {v['process_swapped_bytes'] / 1e9:.2f} GB",
                     f"{v['pinned_weights_swapped_bytes']} B", f"{int(viking['pinned_bytes'] / 2**20)} MiB",
                     speed(ratios["next_run_seconds_unpinned_over_viking"], 1.0)])
    return ["swap device", "process swapped out: alone / Viking", "pinned weights swapped out", "pinned",
            "next run with Viking"], rows


def cpu_cold_start_table(data):
    alone, pin = data["medians"]["alone"], data["medians"]["pin_model"]
    return ["prompt (medians of the servers)", "ComfyUI alone", "Pin Model", "Pin Model"], [
        [stage, f"{alone[stage]:.2f} s", f"{pin[stage]:.2f} s", speed(alone[stage], pin[stage])]
        for stage in ("cold start", "warm", "after pressure")]


def container_table(data):
    a, v = data["median"]["alone"], data["median"]["viking"]
    viking = data["runs"]["viking"][0]
    return ["what (medians)", "ComfyUI alone", "with Viking"], [
        ["warm run", f"{a['warm_seconds']:.3f} s", f"{v['warm_seconds']:.3f} s ({speed(a['warm_seconds'], v['warm_seconds'])})"],
        ["the checkpoint in RAM after another file's reads", f"{a['resident_share']:.0%}", f"{v['resident_share']:.0%}"],
        ["next run", f"{a['next_seconds']:.3f} s", f"{v['next_seconds']:.3f} s ({speed(a['next_seconds'], v['next_seconds'])})"],
        ["read from storage in the next run", f"{a['next_read_bytes'] / 1e6:.0f} MB", f"{v['next_read_bytes'] / 1e6:.0f} MB"],
        ["Viking's pins, budget", "-", f"{viking['pinned_bytes'] / 1e6:.0f} MB of a {viking['budget']['limit_bytes'] / 2**30:.1f} GiB "
                                       f"budget in a {data['limit_bytes'] / 2**30:.0f} GiB container"]]


def perf_table(data):
    d = data["cases"]
    pin, bw = d["pin"]["pin"], d["pin"]["bandwidth"]
    rows = [[f"pin the model's {d['pin']['tensors']} tensors: {label}", f"{pin[k]['seconds_median']:.2f} s",
             f"{pin[k]['gb_per_s']:.1f} GB/s", f"+{pin[k]['peak_extra_ram_bytes'] / 1e9:.1f} GB RAM"]
            for k, label in (("viking", "Viking, in place"), ("per_tensor", "per tensor, in place"),
                             ("pin_memory", "torch pin_memory() (a copy)"), ("pin_memory_warm", "pin_memory(), warm"))]
    rows += [["copy to the GPU from pinned weights", "", f"{bw['pinned_weights_gb_per_s']:.1f} GB/s",
              f"{100 * bw['pinned_weights_gb_per_s'] / bw['cuda_host_alloc_gb_per_s']:.1f}% of the link"],
             ["copy to the GPU from pageable weights", "", f"{bw['pageable_weights_gb_per_s']:.1f} GB/s", ""],
             ["full load, pinned", f"{d['full_viking']['load_s']:.2f} s", "", f"+{d['full_viking']['pin_s']:.2f} s pinning"],
             ["full load, pageable", f"{d['full_none']['load_s']:.2f} s", "", speed(d['full_none']['load_s'], d['full_viking']['load_s'])],
             ["low-VRAM step, Viking", f"{d['low_viking']['step_s_median']:.3f} s", "", f"{d['low_viking']['over_floor']:.2f}x the floor"],
             ["low-VRAM step, ComfyUI's built-in pinning", f"{d['low_builtin']['step_s_median']:.3f} s", "",
              f"{d['low_builtin']['over_floor']:.2f}x the floor"],
             ["low-VRAM step, pinning off", f"{d['low_none']['step_s_median']:.3f} s", "", ""]]
    return ["what", "seconds", "rate", ""], rows


def vram_cap_table(data):
    return ["mode", "VRAM cap", "seconds a step", "over the PCIe floor", "peak VRAM"], [
        [r["mode"], f"{r['cap_gib']} GiB", f"{r['step_s']:.3f} s", f"{r['over_floor']:.2f}x",
         gigabytes(r.get("peak_vram_bytes"))] for r in data["rows"]]


def gpu_tests_table(data):
    return ["what", "value"], [["tests", f"{data['passed']} passed, {data['failed']} failed, {data['skipped']} skipped"]] + [
        ["printed", number(line)] for line in data["printed"]]


def server_table(data):
    rows = [[c["what"] if isinstance(c, dict) else number(c), "passed" if not isinstance(c, dict) or c.get("ok", True) else "FAILED"]
            for c in data["checks"]]
    counters = data["modes"]["viking"]["after_free"]["counters"]
    rows += [["registrations = releases, failures", f"{counters['registrations']} = {counters['releases']}, {counters['failures']} failed"],
             ["VRAM of Viking's page tables", f"{data['viking_vram_page_tables_mib']:.2f} MiB"],
             ["images identical to ComfyUI alone at the same start", f"{data['identical_to_comfy_alone_at_the_same_start']} of 8"]]
    return ["check", "result"], rows


def memlock_table(data):
    return ["backend", "asked to pin", "pinned", "locked memory grew"], [
        [backend, gigabytes(data[backend]["wanted_bytes"]), f"{data[backend]['pinned_bytes'] / 2**20:.0f} MiB",
         f"{data[backend]['vm_locked_grew_bytes'] / 2**20:.0f} MiB"] for backend in ("cuda", "os-lock")]


def ram_short_table(data):
    header = ["mode", "ComfyUI", "prompt kind", "seconds (median)", "swap in / out", "file reads", "OOM kills",
              "neighbour p95", "PSI full"]
    rows = []
    for run in data["runs"]:
        kinds = {}
        for prompt in run["prompts"]:
            kinds.setdefault(prompt["kind"], []).append(prompt["seconds"])
        for kind, seconds in kinds.items():
            comfy = run.get("comfy")
            comfy_text = ", ".join(" ".join(map(str, v)) if isinstance(v, list) else str(v) for v in comfy.values()) \
                if isinstance(comfy, dict) else number(comfy)
            rows.append([run["mode"], comfy_text, kind, f"{statistics.median(seconds):.2f} s",
                         f"{gigabytes(run.get('swap_in_bytes'))} / {gigabytes(run.get('swap_out_bytes'))}",
                         gigabytes(run.get("file_read_bytes")), number(run.get("oom_kills")),
                         f"{number(run.get('neighbour', {}).get('p95_ms'))} ms", f"{number(run.get('psi_full_us'))} us"])
    return header, rows


# --- Every result file ---------------------------------------------------------------------------
def _declare():
    b = []

    def add(file, title, paths, remeasure, table=None):
        b.append(Benchmark(file, title, paths, remeasure, table))

    static_gpu = RUST_CORE + CUDA + NODE + HARNESS + NOT_DYNAMIC
    add("gpu_home_timing.json", "Pinned home: unload, reload and two models taking turns (0.3.75, static)",
        RUST_CORE + CUDA + STREAMING + ["tests/home_check.py"], gpu("home"), home_table)
    add("gpu_home_correctness.json", "Pinned home: the weights that come back are the ones that left",
        RUST_CORE + CUDA + STREAMING + ["tests/home_check.py"], gpu("tests"))
    add("gpu_vram_cap.json", "VRAM cap: seconds a step above the PCIe floor, Viking and ComfyUI alone",
        RUST_CORE + CUDA + STREAMING + ["tests/vram_cap_check.py"], gpu("cap"), vram_cap_table)
    add("gpu_prefetch_cap_test.json", "VRAM cap and prefetch, the GPU test's small run",
        RUST_CORE + CUDA + STREAMING + ["tests/vram_cap_check.py"], gpu("tests"))
    add("gpu_perf.json", "Pinning and copy speed, loads and low-VRAM steps (0.3.75)",
        RUST_CORE + CUDA + STREAMING + ["bench/gpu_perf.py"], gpu("perf"), perf_table)
    add("gpu_tests.json", "The GPU tests of the suite", RUST_CORE + CUDA + OS_LOCK + NODE + NOT_DYNAMIC +
        ["tests/test_native.py", "tests/test_reliability.py", "tests/test_gpu_streaming.py", "tests/home_check.py",
         "tests/vram_cap_check.py"], gpu("tests"), gpu_tests_table)
    add("gpu_server_0_3_75.json", "A real ComfyUI 0.3.75 server on the GPU", static_gpu + ["tests/gpu_server_check.py"],
        gpu("servers375"), server_table)
    add("gpu_server_0_33.json", "A real ComfyUI 0.33 server, --disable-dynamic-vram", static_gpu + ["tests/gpu_server_check.py"],
        gpu("servers033"), server_table)
    add("gpu_server_0_33_dynamic.json", "A real ComfyUI 0.33 server in its default dynamic VRAM mode",
        RUST_CORE + CUDA + OS_LOCK + NODE + HARNESS + ["tests/gpu_server_check.py"], gpu("servers033dyn"), server_table)
    add("gpu_cpu_flag_0_3_75.json", "--cpu beside a GPU, 0.3.75: no CUDA context, the OS lock",
        CPU_BENCH + NODE + HARNESS + ["tests/test_gpu_server.py"], gpu("platforms"))
    add("gpu_cpu_flag_0_33.json", "--cpu beside a GPU, 0.33: no CUDA context, the OS lock",
        CPU_BENCH + NODE + HARNESS + ["tests/test_gpu_server.py"], gpu("platforms"))
    add("gpu_memlock.json", "The locked-memory limit without CAP_IPC_LOCK: CUDA pins and the OS lock",
        RUST_CORE + CUDA + OS_LOCK + ["comfy_node/weights.py", "tests/memlock_check.py"], gpu("platforms"), memlock_table)
    add("gpu_dynamic.json", "0.33 dynamic VRAM mode, bf16 Flux-shaped model: alone, Pin Model, clone, engine, static",
        DYNAMIC_BENCH, gpu("dynamic"), dynamic_table)
    add("gpu_dynamic_fastdisk.json", "0.33 dynamic VRAM mode with --fast-disk", DYNAMIC_BENCH, gpu("fastdisk"), dynamic_table)
    add("gpu_dynamic_fp8_scaled.json", "0.33, fp8-scaled model: dynamic and static, alone and with Viking",
        DYNAMIC_BENCH, gpu("fp8"), dynamic_table)
    add("gpu_dynamic_comfy_quant.json", "0.33, comfy_quant model: dynamic and static, alone and with Viking",
        DYNAMIC_BENCH, gpu("cquant"), dynamic_table)
    add("gpu_dynamic_gguf.json", "0.33, GGUF model (ComfyUI-GGUF): dynamic and static, alone and with Viking",
        DYNAMIC_BENCH, gpu("gguf"), dynamic_table)
    add("gpu_dynamic_rounds.json", "Two models taking turns, --fast-disk, three servers each",
        DYNAMIC_BENCH, gpu("rounds"), rounds_table("dynamic_fastdisk_two", "dynamic_fastdisk_two_nodes"))
    add("gpu_dynamic_rounds_one.json", "One model, default dynamic mode, three servers each",
        DYNAMIC_BENCH, gpu("rounds1"), rounds_table("dynamic", "dynamic_nodes"))
    add("gpu_dynamic_rounds_two_default.json", "Two models taking turns, default dynamic mode, three servers each",
        DYNAMIC_BENCH, gpu("rounds2"), rounds_table("dynamic_two", "dynamic_two_nodes"))
    add("gpu_dynamic_rounds_fp8_scaled.json", "fp8-scaled model, default dynamic mode, three servers each",
        DYNAMIC_BENCH, gpu("roundsfp8"), rounds_table("dynamic", "dynamic_nodes"))
    add("gpu_dynamic_rounds_comfy_quant.json", "comfy_quant model, default dynamic mode, three servers each",
        DYNAMIC_BENCH, gpu("roundscquant"), rounds_table("dynamic", "dynamic_nodes"))
    add("gpu_dynamic_rounds_gguf.json", "GGUF model, default dynamic mode, three servers each",
        DYNAMIC_BENCH, gpu("roundsgguf"), rounds_table("dynamic", "dynamic_nodes"))
    add("gpu_dynamic_cold_fp8_scaled.json", "fp8-scaled cold start: seconds per node, three servers per mode",
        NODE_TIMES, gpu("coldfp8"), node_times_table)
    add("gpu_dynamic_cold_fp8_scaled.bench.json", "fp8-scaled cold start: the bench's own file",
        NODE_TIMES, gpu("coldfp8"), dynamic_table)
    add("gpu_probe_static_fp8_node_times.json", "0.33 static mode, fp8-scaled: seconds per node",
        NODE_TIMES, gpu("staticfp8"), node_times_table)
    add("gpu_probe_static_fp8_node_times.bench.json", "0.33 static mode, fp8-scaled: alone and Pin Model, three servers each",
        NODE_TIMES, gpu("staticfp8"), rounds_table("static", "static_nodes"))
    add("gpu_probe_static_fp8_split.json", "0.33 static mode, fp8-scaled: the cold start split, seconds per node",
        NODE_TIMES, gpu("staticsplit"), node_times_table)
    add("gpu_probe_static_fp8_split.bench.json", "0.33 static mode, fp8-scaled: the cold start split, the bench's file",
        NODE_TIMES, gpu("staticsplit"), dynamic_table)
    add("gpu_probe_static_fp8_gc.json", "0.33 static mode, fp8-scaled: full garbage collections per prompt",
        NODE_TIMES + ["bench/probes/gc_times.py", "tests/gc_log.py"], gpu("staticgc"))
    add("gpu_probe_node_times.json", "Two models, default dynamic mode: seconds per node of every prompt",
        NODE_TIMES, gpu("twocold"), node_times_table)
    add("gpu_probe_static_vram.json", "Where the VRAM goes in 0.33 static mode, alone and with the Pin Model",
        DYNAMIC_BENCH + ["bench/probes/static_vram.py"], gpu("staticvram"))
    add("gpu_probe_static_event_breakdown.json", "Where Viking's event time goes in 0.33 static mode",
        RUST_CORE + CUDA + NODE + ["bench/probes/static_event_breakdown.py", "bench/probes/static_event_cost.py",
                                   "tests/flux_model.py"], gpu("staticbreak"))
    add("gpu_probe_fp8_clone.json", "fp8-scaled model, a clone node against the Pin Model", DYNAMIC_BENCH, gpu("coldfp8"),
        dynamic_table)
    add("gpu_probe_registration_vram.json", "VRAM a CUDA registration takes (page tables)",
        RUST_CORE + CUDA + ["bench/probes/registration_vram.py"], "python3 bench/probes/registration_vram.py OUT")
    add("gpu_probe_partial_registration.json", "CUDA: registering part of an allocation",
        ["bench/probes/partial_registration.py"], "python3 bench/probes/partial_registration.py OUT")
    add("gpu_probe_file_mapping.json", "CUDA: registering a file mapping", ["bench/probes/file_mapping.py"],
        "python3 bench/probes/file_mapping.py OUT")
    add("status_stall_24gib.json", "What a status read costs the execution thread, 24 GiB pinned",
        RUST_CORE + CUDA + ["bench/status_stall.py"], gpu("statusstall"))
    add("first_prompt_gpu.json", "The first prompt after a load and warm prompts, with and without the status node",
        DYNAMIC_BENCH + ["bench/first_prompt.py"], gpu("firstprompt"))
    add("first_prompt_cpu.json", "The first prompt after a load and warm prompts, --cpu (the bench's check, fewer cases)",
        CPU_BENCH + NODE + HARNESS + ["bench/first_prompt.py", "tests/flux_model.py"],
        cpu("firstprompt"))
    add("zero_copy_gpu.json", "Text encoders read from pinned RAM without a copy (zero-copy)",
        RUST_CORE + CUDA + NODE + HARNESS + ["bench/zero_copy.py"], gpu("zerocopy"))
    add("ram_short_gpu.json", "A machine short of RAM, swap in use: the GPU machine", DYNAMIC_BENCH + ["bench/ram_short.py",
        "tests/memory_cgroup.py"], gpu("ramshort"), ram_short_table)
    # The development machine: no GPU, the OS lock.
    add("ram_short_cpu.json", "A machine short of RAM, swap in use: --cpu", CPU_BENCH + NODE + HARNESS +
        ["bench/ram_short.py", "tests/memory_cgroup.py"], cpu("ramshort"), ram_short_table)
    add("swap_cpu.json", "Memory paged out between two runs: swap file and zram",
        CPU_BENCH + ["comfy_node/lifecycle.py", "comfy_node/weights.py", "tests/swap_pressure.py"], cpu("swap"), swap_table)
    add("cpu_cold_start.json", "--cpu, 0.33: first, warm and after-pressure prompts, three servers each",
        CPU_BENCH + NODE + HARNESS + ["bench/gpu_dynamic.py", "bench/cpu_cold_start.py"], cpu("coldstart"),
        cpu_cold_start_table)
    add("cpu_cold_start.bench.json", "--cpu, 0.33: the bench's own file",
        CPU_BENCH + NODE + HARNESS + ["bench/gpu_dynamic.py", "bench/cpu_cold_start.py"], cpu("coldstart"), dynamic_table)
    add("container_residency_cpu.json", "0.33 dynamic mode in a 4 GiB container: the checkpoint's pages kept",
        CPU_BENCH + NODE + ["tests/container_check.py", "tests/dynamic_cpu.py", "tests/memory_cgroup.py"],
        cpu("container"), container_table)
    add("event_cost_cpu.json", "What one of ComfyUI's events costs Viking, dynamic mode",
        CPU_BENCH + NODE + ["bench/probes/event_cost.py", "tests/dynamic_cpu.py"], cpu("events"))
    add("static_event_cost_cpu.json", "What one of ComfyUI's events costs Viking, static mode",
        CPU_BENCH + NODE + ["bench/probes/static_event_cost.py"], cpu("events"))
    add("kept_objects_cpu.json", "Python objects Viking keeps per event",
        CPU_BENCH + NODE + ["bench/probes/kept_objects.py", "bench/probes/static_event_cost.py"], cpu("events"))
    add("watcher_gc_cpu.json", "The gate's watcher and the garbage collector",
        ["comfy_node/gate.py", "comfy_node/timing.py", "bench/probes/watcher_gc.py"], cpu("watcher"))
    add("watch_rate_cpu.json", "What the gate's watcher costs a sampling step",
        ["comfy_node/gate.py", "comfy_node/comfy.py", "comfy_node/timing.py", "bench/probes/watch_rate.py"], cpu("watcher"))
    add("status_stall_cpu.json", "What a status read costs the execution thread, 16 GiB pinned",
        CPU_BENCH + ["bench/status_stall.py", "tests/flux_model.py"], cpu("stall"))
    add("status_stall_one_pass_cpu.json", "The same, the status read in one pass of /proc/self/pagemap",
        CPU_BENCH + ["bench/status_stall.py"], cpu("stall"))
    add("plan.json", "The plan over 10,000 ranges (cargo bench)", ["src/plan.rs", "src/spans.rs", "benches/plan.rs"],
        cpu("benches"))
    add("maps_parse.json", "Reading /proc/self/maps: 5,000 lines parsed (cargo bench)", ["src/memmap.rs", "benches/maps.rs"],
        cpu("benches"))
    return {x.file: x for x in b}


BENCHMARKS = _declare()
# Probes of the code before a fix, kept as the evidence of its cause: their age is not checked.
OF_OLDER_CODE = {"gpu_probe_lora_variants_0_3_75.json": "LoRA variants before the fix, 0.3.75",
                 "gpu_probe_lora_variants_0_33.json": "LoRA variants before the fix, 0.33",
                 "gpu_probe_clip_free_vram.json": "CLIP and free VRAM before the fix"}


def recorded(name, results=RESULTS):
    return json.loads((results / name).read_text())


# --- Age -----------------------------------------------------------------------------------------
class AgeUnknown(Exception):
    """The ages cannot be told here: no git history, or a recorded commit is not in this clone."""


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def older_than_their_code(results=RESULTS, repo=REPO, benchmarks=None):
    """{result file: the commit it measured} for each file whose exercised code changed since."""
    benchmarks = BENCHMARKS if benchmarks is None else benchmarks
    if git(repo, "rev-parse", "HEAD").returncode != 0:
        raise AgeUnknown("no git history here: the age of the result files cannot be checked")
    shallow = git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    older, changed = {}, {}
    for name, bench in benchmarks.items():
        if not (results / name).exists():
            continue
        commit = recorded(name, results).get("commit")
        if commit is None:
            older[name] = "(no commit recorded)"  # nothing shows which code it measured
            continue
        if git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            if shallow:
                raise AgeUnknown(f"commit {commit} ({name}) is not in this shallow clone: ages cannot be checked")
            older[name] = commit  # never in the project's history: nothing shows it measured this code
            continue
        if commit not in changed:
            changed[commit] = git(repo, "diff", "--name-only", "--no-renames", commit).stdout.split()
        if any(exercises(bench.paths, path) for path in changed[commit]):
            older[name] = commit
    return older


def exercises(declared, path):
    """Whether a benchmark that declares `declared` exercises the file `path`: the most specific
    entry that covers it decides (a file or folder, or ":(exclude)" one), and where an exclusion
    and an inclusion name the same path the inclusion wins. So RUST_CORE's exclusion of the OS
    lock keeps it out of a CUDA figure, while OS_LOCK, declared beside it, brings it back."""
    best = None  # (length of the entry, whether it includes)
    for entry in declared:
        include = not entry.startswith(":(exclude)")
        name = entry if include else entry[len(":(exclude)"):]
        if path == name or path.startswith(name.rstrip("/") + "/"):
            rank = (len(name), include)
            best = rank if best is None or rank > best else best
    return best is not None and best[1]


# --- Rendering -----------------------------------------------------------------------------------
def paragraph(text):
    return textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def readme_rows(results=RESULTS):
    """The README's first table: one figure per setup, each naming its file."""
    def have(name):
        return (results / name).exists()

    rows = []
    if have("gpu_dynamic_rounds_gguf.json"):
        d = recorded("gpu_dynamic_rounds_gguf.json", results)
        rows.append(["0.33 or newer, NVIDIA GPU, default settings (\"dynamic VRAM\")",
                     "ComfyUI stages weights through its own pinned buffers; Viking hands it a RAM budget that keeps the "
                     "machine healthy, keeps pinned models' checkpoint pages in RAM, and pins what ComfyUI leaves pageable",
                     f"GGUF model, the prompt after memory pressure: **{speed(stage_median(d, 'dynamic', 'after pressure'), stage_median(d, 'dynamic_nodes', 'after pressure'))}** "
                     f"(`gpu_dynamic_rounds_gguf.json`)"])
    if have("gpu_home_timing.json"):
        d = recorded("gpu_home_timing.json", results)["parts"]["alternate"]
        alone, viking = (next(r for r in d["rows"] if r["mode"] == m)["total_s"] for m in ("comfy", "viking"))
        rows.append(["0.33 with `--disable-dynamic-vram`, or 0.3.x, NVIDIA GPU",
                     "pins the weights in RAM (CUDA), keeps a pinned RAM copy while a model is in VRAM (\"pinned home\"), "
                     "can cap a model's VRAM and prefetch the rest",
                     f"two models taking turns: **{speed(alone, viking)}** (`gpu_home_timing.json`)"])
    if have("swap_cpu.json"):
        d = recorded("swap_cpu.json", results)
        rows.append(["`--cpu`, or no GPU", "the OS page lock (`mlock`) keeps the weights out of swap",
                     f"the next run after memory was paged out to a swap file: "
                     f"**{speed(d['ratios']['swap file']['next_run_seconds_unpinned_over_viking'], 1.0)}** (`swap_cpu.json`)"])
    for name in ("ram_short_gpu.json", "ram_short_cpu.json"):
        if have(name):
            rows.append(ram_short_row(recorded(name, results), name))
    if have("first_prompt_gpu.json"):
        rows.append(first_prompt_row(recorded("first_prompt_gpu.json", results), "first_prompt_gpu.json"))
    if have("zero_copy_gpu.json"):
        rows.append(headline_row(recorded("zero_copy_gpu.json", results), "zero_copy_gpu.json",
                                 "a large text encoder beside a diffusion model, VRAM short"))
    if have("gpu_memlock.json"):
        d = recorded("gpu_memlock.json", results)
        rows.append(["Docker without `--cap-add IPC_LOCK`, or a normal user",
                     "GPU pins are not limited; the OS lock (CPU, dynamic-mode residency) stays within `ulimit -l` and says so",
                     f"locked-memory limit at {d['rlimit_memlock'] / 2**20:.0f} MiB: {d['cuda']['pinned_bytes'] / 2**20:.0f} MiB pinned "
                     f"through CUDA, {d['os-lock']['pinned_bytes'] / 2**20:.0f} MiB by the OS lock (`gpu_memlock.json`)"])
    rows.append(["Windows", "the same logic (`VirtualLock` for the OS lock, 40% of RAM at most)",
                 "built and unit-tested under Wine only: **not yet run on a real Windows machine**"])
    return rows


def ram_short_row(data, name):
    """The RAM-short machine: the Pin Model against ComfyUI alone, same ComfyUI. The prompt after
    a model switch (the kind the OS swaps or re-reads for), unless a kind of prompt is slower with
    the Pin Model: then the slowest, so the row never reads better than the run was."""
    runs = data["runs"]
    pinned = next((r for r in runs if r["mode"] == "pin_model"), None)
    alone = next((r for r in runs if r["mode"] == "alone" and (pinned is None or r.get("comfy") == pinned.get("comfy"))), None)
    setup = "a machine short of RAM (swap or pagefile in use)" + (", NVIDIA GPU" if name.endswith("_gpu.json") else ", `--cpu`")
    what = "pins within a budget that follows the memory pressure, and gives pins back when the machine stalls"
    if pinned is None or alone is None:
        return [setup, what, f"no run of both ComfyUI alone and the Pin Model in `{name}`"]

    def median(run, kind):
        return statistics.median(p["seconds"] for p in run["prompts"] if p["kind"] == kind)
    kinds = [k for k in dict.fromkeys(p["kind"] for p in alone["prompts"]) if any(p["kind"] == k for p in pinned["prompts"])]
    ratio = {k: median(pinned, k) / median(alone, k) for k in kinds}
    slowest = max(kinds, key=ratio.get)
    if round(ratio[slowest], 2) > 1.0:
        label = f"the slowest kind of prompt, {slowest.replace('_', ' ')}"
        kind = slowest
    else:
        kind = next((k for k in kinds if "switch" in k), slowest)
        label = f"the prompt {kind.replace('_', ' ')}"
    return [setup, what, f"{label}: **{speed(median(alone, kind), median(pinned, kind))}** (`{name}`)"]


def first_prompt_row(data, name):
    """The first prompt after a model loads, the Pin Model against ComfyUI alone: the slowest of
    the file's cases (format and ComfyUI mode), so no case is better than the row says."""
    setup, what = "the first prompt after a model loads, NVIDIA GPU", "attaches to the model without delaying its first prompt"
    ratios = {case: entry["over_alone"]["pin"]["first"] for case, entry in data.get("cases", {}).items()
              if entry.get("over_alone", {}).get("pin", {}).get("first")}
    if not ratios:
        return [setup, what, f"no case of `{name}` has the Pin Model's first prompt against ComfyUI alone"]
    case = max(ratios, key=ratios.get)
    return [setup, what, f"the slowest of {len(ratios)} cases ({case.replace('/', ', ')}): "
                         f"**{speed(1.0, ratios[case])}** (`{name}`)"]


def headline_row(data, name, setup):
    """A row from a result file's own headline: {"what", "alone_seconds", "viking_seconds", "viking"}."""
    head = data.get("headline")
    if not head:
        return [setup, "", f"`{name}` has no `headline` (what, alone_seconds, viking_seconds)"]
    return [setup, head.get("viking", ""),
            f"{head['what']}: **{speed(head['alone_seconds'], head['viking_seconds'])}** (`{name}`)"]


def readme_table(results=RESULTS):
    return "\n".join([TABLE_BEGIN, markdown_table(["your setup", "what Viking does", "what you get"], readme_rows(results)),
                      TABLE_END])


def render_readme(text, results=RESULTS):
    start, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no table markers ({TABLE_BEGIN} ... {TABLE_END})")
    return text[:start] + readme_table(results) + text[end + len(TABLE_END):]


def render_benchmarks(results=RESULTS, older=None):
    names = sorted(p.name for p in results.glob("*.json"))
    out = ["# Benchmarks", "",
           paragraph("Rendered by `python scripts/figures.py render` from the result files in `bench/results/`; "
           "do not edit by hand. Each table is one file: the commit it measured, the machine, the command "
           "that made it and the one that measures it again. Ratios are time with Viking over time "
           "without, in the same run, said as \"2.4x faster\" or \"1.06x slower\". Every benchmark that "
           "samples checks that images (or latents) are bit-identical with and without Viking."), "",
           paragraph("Measure again on the GPU machine: `bash scripts/gpu_check.sh all` (it lists its calls); "
                     "on a Linux machine without a GPU: `bash scripts/cpu_figures.sh`."), ""]
    if older is None:
        out += ["The age of the files could not be checked here (no git history).", ""]
    elif older:
        out += [paragraph("Older than the code they exercise, to measure again: "
                          + ", ".join(f"`{n}`" for n in sorted(older)) + "."), ""]
    else:
        out += ["Every file measured the code it exercises as it is now.", ""]
    for name in names:
        bench = BENCHMARKS.get(name)
        data = recorded(name, results)
        title = bench.title if bench else OF_OLDER_CODE.get(name, "(not declared in scripts/figures.py)")
        out += [f"## {name}", "", f"{title}.", ""]
        out.append(f"- commit `{data.get('commit', '?')}`{' (tree not clean)' if data.get('dirty') else ''}; "
                   f"{data.get('device') or data.get('machine') or 'machine not recorded'}")
        out.append(f"- made by: `{data['command']}`" if data.get("command") else "- made by: (not recorded)")
        if bench:
            out.append(f"- measure again: `{bench.remeasure}`" + (" (older than its code)" if older and name in older else ""))
        else:
            out.append("- measured the code before a fix on purpose: the evidence of its cause")
        if data.get("note"):
            out.append(f"- note: {number(data['note'])}")
        out.append("")
        try:
            header, rows = (bench.table if bench and bench.table else every_figure)(data)
        except (KeyError, IndexError, TypeError, ValueError, statistics.StatisticsError) as error:
            header, rows = every_figure(data)
            rows.insert(0, [f"(this file's own table failed: {type(error).__name__} {error})", ""])
        out += [markdown_table(header, rows), ""]
    return "\n".join(out).rstrip() + "\n"


def rendered(results=RESULTS, repo=REPO):
    """{path: text as rendered}."""
    try:
        older = older_than_their_code(results, repo)
    except AgeUnknown:
        older = None
    return {BENCHMARKS_PAGE: render_benchmarks(results, older), README: render_readme(README.read_text(), results)}


def main(argv):
    command = argv[1] if len(argv) > 1 else ""
    if command == "render":
        for path, text in rendered().items():
            if path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path.relative_to(REPO)}")
    elif command == "check":
        stale = [str(p.relative_to(REPO)) for p, text in rendered().items() if p.read_text() != text]
        if stale:
            sys.exit(f"not as the result files give them: {', '.join(stale)} (python scripts/figures.py render)")
        print("the docs' figures are the result files'")
    elif command == "age":
        try:
            older = older_than_their_code()
        except AgeUnknown as reason:
            sys.exit(str(reason))
        for name, commit in sorted(older.items()):
            print(f"{name} (measured at {commit}): {BENCHMARKS[name].remeasure}")
        if not older:
            print("every result file measured the code it exercises as it is now")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
