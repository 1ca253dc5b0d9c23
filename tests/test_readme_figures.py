"""The README's figures against the result files they cite, so that a figure and its file cannot
drift apart, and the files older than the code they measured named in the README, so that no
figure passes for today's code when it is not.

Each figure is rebuilt from its JSON file in the README's own wording and must appear there.
A result file is older than its code when a file it measured (SOURCES, in bench/results_age.py)
changed since the commit it records; the README's line "Older than their code, ..." must name
exactly those files."""

import functools
import re
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The figures live in the README and in docs/ (benchmarks.md holds most): checked wherever they are.
README = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])

sys.path.insert(0, str(REPO / "bench"))
from results_age import OF_OLDER_CODE, RESULTS, SOURCES, AgeUnknown, older_than_their_code, recorded  # noqa: E402

sys.path.insert(0, str(REPO))
from comfy_node.timing import total_seconds  # noqa: E402

# A result file, read once per test run by the extractors.
load = functools.cache(recorded)


def test_every_result_file_is_known_and_records_its_commit():
    for path in sorted(RESULTS.glob("*.json")):
        assert path.name in SOURCES or path.name in OF_OLDER_CODE, \
            f"{path.name}: add it to SOURCES in bench/results_age.py (what it measured) so its age is checked"
        assert re.fullmatch(r"[0-9a-f]{7,40}", load(path.name).get("commit", "")), f"{path.name} records no commit"


def test_readme_names_exactly_the_files_older_than_their_code():
    try:
        older = set(older_than_their_code())
    except AgeUnknown as reason:
        pytest.skip(str(reason))
    line = next((line for line in README.splitlines() if line.startswith("Older than their code")), "")
    named = set(re.findall(r"`([\w.]+\.json)`", line))
    assert named == older, (f"the README's 'Older than their code' line names {sorted(named)}; older than their "
                            f"code now: {sorted(older)} (python bench/results_age.py)")


def f(value, digits):
    return f"{value:.{digits}f}"


def card(data) -> str:
    """The GPU a result file was measured on, as the README names it ("H200", "H100")."""
    return re.search(r"NVIDIA (H\d+)", data["device"]).group(1)


def perf():
    d = load("gpu_perf.json")["cases"]
    pin, bw, low = d["pin"]["pin"], d["pin"]["bandwidth"], d["low_viking"]
    return [
        f"{f(pin['viking']['seconds_median'], 2)} s = {f(pin['viking']['gb_per_s'], 1)} GB/s",
        f"per tensor (ComfyUI's way): {f(pin['per_tensor']['seconds_median'], 2)} s = {f(pin['per_tensor']['gb_per_s'], 1)} GB/s",
        f"{f(pin['pin_memory']['seconds_median'], 1)} s = {f(pin['pin_memory']['gb_per_s'], 1)} GB/s, "
        f"+{pin['pin_memory']['peak_extra_ram_bytes'] / 1e9:.0f} GB RAM",
        f"{f(pin['pin_memory_warm']['seconds_median'], 2)} s = {f(pin['pin_memory_warm']['gb_per_s'], 0)} GB/s",
        f"pinned {f(bw['pinned_weights_gb_per_s'], 1)} GB/s | pageable {f(bw['pageable_weights_gb_per_s'], 1)} GB/s",
        f"**{f(100 * bw['pinned_weights_gb_per_s'] / bw['cuda_host_alloc_gb_per_s'], 1)}%** of the link",
        f"{f(d['full_viking']['load_s'], 2)} s (+{f(d['full_viking']['pin_s'], 2)} s pinning",
        f"pageable {f(d['full_none']['load_s'], 2)} s",
        f"**{f(low['step_s_median'], 3)} s** | ComfyUI's built-in pinning {f(d['low_builtin']['step_s_median'], 3)} s; "
        f"pinning off {f(d['low_none']['step_s_median'], 3)} s",
        f"Viking {f(low['over_floor'], 2)}x, built-in {f(d['low_builtin']['over_floor'], 2)}x the floor",
    ]


def vram_cap():
    d = load("gpu_vram_cap.json")
    rows = {(r["mode"], r["cap_gib"]): r for r in d["rows"]}
    out = []
    for (mode, cap), r in rows.items():
        text = f"{f(r['step_s'], 3)} s, {f(r['over_floor'], 2)}x"
        if mode == "viking":
            text += f", {r['peak_vram_bytes'] / 1e9:.1f} GB"
        out.append(text)
    viking = sorted(r["over_floor"] for r in d["rows"] if r["mode"] == "viking")
    alone = sorted(r["over_floor"] for r in d["rows"] if r["mode"] == "comfy")
    out.append(f"{round(100 * viking[0] - 100)}-{round(100 * viking[-1] - 100)}% above the PCIe\n  floor on an {card(d)} "
               f"(ComfyUI alone at the same cap: {round(100 * alone[0] - 100)}-{round(100 * alone[-1] - 100)}% above it)")
    return out


def home():
    d = load("gpu_home_timing.json")["parts"]
    comfy, viking = d["timing"]["rows"]
    turns = {r["mode"]: r for r in d["alternate"]["rows"]}
    return [
        f"| {f(comfy['unload_s'], 2)} s | {f(viking['unload_s'], 3)} s | **{f(d['timing']['unload_speedup'], 0)}x** |",
        f"| {f(comfy['reload_s'], 2)} s ({comfy['reload_gbps']} GB/s) | {f(viking['reload_s'], 3)} s ({viking['reload_gbps']} GB/s) "
        f"| **{f(d['timing']['reload_speedup'], 1)}x** |",
        f"| {f(turns['comfy']['total_s'], 1)} s ({f(turns['comfy']['median_turn_s'], 1)} s a turn) | "
        f"{f(turns['viking']['total_s'], 2)} s ({f(turns['viking']['median_turn_s'], 2)} s a turn) | **{f(d['alternate']['speedup'], 1)}x** |",
        f"| {comfy['rss_bytes'] / 1e9:.1f} GB | {viking['rss_bytes'] / 1e9:.1f} GB |",
        f"| {turns['comfy']['rss_bytes'] / 1e9:.1f} GB | {turns['viking']['rss_bytes'] / 1e9:.1f} GB |",
        f"ran {f(d['alternate']['speedup'], 1)}x faster on an {card(load('gpu_home_timing.json'))}",
    ]


def gpu_tests():
    d = load("gpu_tests.json")
    pinned = next(p for p in d["printed"] if p.startswith("cuda: pinned"))
    seconds, rate, h2d, pageable, ratio = re.search(
        r"pinned 4 GiB in ([\d.]+) s \(([\d.]+) GiB/s\); H2D pinned ([\d.]+) GB/s vs pageable ([\d.]+) GB/s = ([\d.]+)x", pinned).groups()
    portable = re.search(r"H2D ([\d.]+) GB/s", next(p for p in d["printed"] if "PORTABLE only: H2D" in p)).group(1)
    counted = f"{d['passed']} passed" + (f", {d['skipped']} skipped" if d.get("skipped") else "")
    return [f"| {counted} |", f"{seconds} s ({rate} GiB/s)",
            f"{h2d} vs {pageable} GB/s = **{ratio}x**; PORTABLE only {portable} GB/s"]


def servers():
    out, same_cells = [], []
    for name in ("gpu_server_0_3_75.json", "gpu_server_0_33.json"):
        d = load(name)
        c = d["modes"]["viking"]["after_free"]["counters"]
        same = next(x["what"] for x in d["checks"] if x["what"].startswith("images bit-identical with Viking"))
        out += [f"{c['registrations']} = {c['releases']}, {c['failures']} failed", f"{d['viking_vram_page_tables_mib']:.2f} MiB",
                f"{d['identical_to_comfy_alone_at_the_same_start']} of 8"]
        count = re.search(r"(\d+ of \d+)$", same).group(1)
        same_cells.append(f"**{count}**" if count == "8 of 8" else count)  # bold only where all are identical
    # The row of the server table, 0.3.75's cell then 0.33's (a cell may go on with why).
    out.append(f"| images bit-identical to ComfyUI alone with the same free VRAM | {same_cells[0]} | {same_cells[1]}")
    return out


def dynamic_rows(name):
    """Per mode of a gpu_dynamic bench: cold, warm (median), after-pressure seconds, bytes read
    from storage after pressure, peak RSS, largest PSS, Viking's pins at the last prompt."""
    rows = {}
    for mode, r in load(name)["modes"].items():
        if "error" in r:
            continue  # a mode whose prompt failed: failed_modes()
        prompts = r["prompts"]
        warm = sorted(p["seconds"] for p in prompts if p["stage"] == "warm")
        rows[mode] = dict(cold=prompts[0]["seconds"], warm=warm[len(warm) // 2], pressure=prompts[-1]["seconds"],
                          read=prompts[-1]["storage_read_bytes"], rss=r["peak_rss_bytes"],
                          pss=max(p["pss_bytes"] for p in prompts), pinned=prompts[-1].get("viking_pinned_bytes"))
    return rows


def failed_modes(name):
    """Each mode of a gpu_dynamic bench whose prompt failed, with its node's exception."""
    out = []
    for mode, r in load(name)["modes"].items():
        if "error" in r:
            node_line = r["error"].splitlines()[1]  # "node N (Class): Exception: message"
            out.append(f"`{mode}` failed: {node_line}")
    return out


def megabytes(nbytes):
    return f"{nbytes / 1e6:.0f} MB"


def dynamic_table(name, alone, others):
    rows = dynamic_rows(name)
    a = rows[alone]

    def cells(key, text):
        return " | ".join(f"{text(rows[m][key])} ({f(rows[m][key] / a[key], 2)}x)" for m in others)
    return [f"| {f(a['cold'], 2)} s | {cells('cold', lambda v: f(v, 2) + ' s')} |",
            f"| {f(a['warm'], 3)} s | {cells('warm', lambda v: f(v, 3) + ' s')} |",
            f"| {f(a['pressure'], 3)} s | {cells('pressure', lambda v: f(v, 3) + ' s')} |",
            f"| {megabytes(a['read'])} | " + " | ".join(megabytes(rows[m]["read"]) for m in others) + " |",
            f"| {f(a['rss'] / 1e9, 1)} GB | {cells('rss', lambda v: f(v / 1e9, 1) + ' GB')} |",
            f"| {f(a['pss'] / 1e9, 1)} GB | {cells('pss', lambda v: f(v / 1e9, 1) + ' GB')} |",
            "| - | " + " | ".join("-" if rows[m]["pinned"] is None else f"{rows[m]['pinned'] / 1e9:.1f} GB" for m in others) + " |"]


def dynamic():
    return dynamic_table("gpu_dynamic.json", "dynamic",
                         ["dynamic#2", "dynamic_nodes", "dynamic_clone", "dynamic_engine", "static"]) + failed_modes("gpu_dynamic.json")


def dynamic_fastdisk():
    return dynamic_table("gpu_dynamic_fastdisk.json", "dynamic_fastdisk", ["dynamic_fastdisk_nodes", "dynamic_fastdisk_engine"])


def viking_ms_per_prompt(prompts) -> list[float]:
    """Milliseconds Viking spent inside ComfyUI's calls in each prompt (the status's
    `time_in_viking` counts since the server started)."""
    totals = [total_seconds(p["time_in_viking"]) for p in prompts]
    return [1000 * (now - before) for before, now in zip([0.0] + totals, totals)]


def dynamic_rounds(name, alone, viking):
    """Three fresh servers per mode, interleaved: per server the cold, warm (median) and
    after-pressure seconds, and Viking over alone as the ratio of the medians of every prompt of
    that stage; bytes read after pressure, peak RSS, and Viking's own time per prompt."""
    modes, rows = load(name)["modes"], dynamic_rows(name)

    def servers(base):
        return [m for m in modes if m.split("#")[0] == base]

    def median(values):
        return sorted(values)[len(values) // 2]

    def stage_median(base, stage):
        return median([p["seconds"] for m in servers(base) for p in modes[m]["prompts"] if p["stage"] == stage])

    def per_server(base, key, text):
        return " / ".join(text(rows[m][key]) for m in servers(base))
    out = []
    for key, label, stage, digits in (("cold", "first prompt, cold start", "cold start", 2),
                                      ("warm", "warm prompt (median of 5 a server)", "warm", 3),
                                      ("pressure", "after pressure", "after pressure", 3)):
        ratio = stage_median(viking, stage) / stage_median(alone, stage)
        out.append(f"| {label} | {per_server(alone, key, lambda v: f(v, digits))} s | "
                   f"{per_server(viking, key, lambda v: f(v, digits))} s | {f(ratio, 2)}x |")
    out.append(f"| read from storage after pressure | {per_server(alone, 'read', lambda v: f(v / 1e6, 0))} MB | "
               f"{per_server(viking, 'read', lambda v: f(v / 1e6, 0))} MB | |")
    rss = median([rows[m]["rss"] for m in servers(viking)]) / median([rows[m]["rss"] for m in servers(alone)])
    out.append(f"| peak RSS | {per_server(alone, 'rss', lambda v: f(v / 1e9, 1))} GB | "
               f"{per_server(viking, 'rss', lambda v: f(v / 1e9, 1))} GB | {f(rss, 2)}x |")
    ms = [viking_ms_per_prompt(modes[m]["prompts"]) for m in servers(viking)]
    out.append(f"| Viking's own time in ComfyUI's calls: first prompt; later prompts, largest | - | "
               f"{' / '.join(f(first, 0) for first, *_ in ms)} ms; {f(max(max(later) for _, *later in ms), 0)} ms | |")
    return out


def dynamic_rounds_one():
    return dynamic_rounds("gpu_dynamic_rounds_one.json", "dynamic", "dynamic_nodes")


def dynamic_rounds_fastdisk_two():
    return dynamic_rounds("gpu_dynamic_rounds.json", "dynamic_fastdisk_two", "dynamic_fastdisk_two_nodes")


def dynamic_rounds_two_default():
    return dynamic_rounds("gpu_dynamic_rounds_two_default.json", "dynamic_two", "dynamic_two_nodes")


def container():
    d = load("container_residency_cpu.json")
    a, v = d["median"]["alone"], d["median"]["viking"]
    viking = d["runs"]["viking"][0]
    gib = 1 << 30
    return [f"limited to {d['limit_bytes'] / gib:.0f} GiB", f"another {d['other_file_bytes'] / gib:.0f} GiB file {d['other_file_reads']} times",
            f"a {viking['model_bytes'] >> 20} MiB model",
            f"| warm run (median of 5) | {f(a['warm_seconds'], 3)} s | {f(v['warm_seconds'], 3)} s ({f(d['warm_viking_over_alone'], 2)}x) |",
            f"| the model's checkpoint in RAM after the other file's reads | {a['resident_share']:.0%} | {v['resident_share']:.0%} |",
            f"| next run | {f(a['next_seconds'], 3)} s | {f(v['next_seconds'], 3)} s (**{f(d['next_run_alone_over_viking'], 1)}x** faster) |",
            f"| read from storage in the next run | {megabytes(a['next_read_bytes'])} | {megabytes(v['next_read_bytes'])} |",
            f"| Viking's pins | - | {megabytes(viking['pinned_bytes'])}, within a {viking['budget']['limit_bytes'] / gib:.1f} GiB budget "
            f"(auto headroom: {viking['budget']['headroom_bytes'] / gib:.1f} GiB of the limit stays free) |"]


def server_dynamic():
    d = load("gpu_server_0_33_dynamic.json")
    c = d["modes"]["viking"]["after_free"]["counters"]
    return [f"{d['identical_to_comfy_alone_at_the_same_start']} of 8 as is", f"{c['registrations']} = {c['releases']}, {c['failures']} failed"]


def swap():
    d = load("swap_cpu.json")
    out = []
    for device in ("swap file", "zram"):
        alone, viking = (next(x for x in d["scenarios"] if x["swap_device"] == device and x["scenario"] == name)
                         for name in ("unpinned", "viking"))
        ratios = d["ratios"][device]
        a, v = alone["median"], viking["median"]
        out += [f"| {device} | without Viking | 0 | - | {a['process_swapped_bytes'] / 1e9:.2f} GB | "
                f"{ratios['page_faults_unpinned_over_viking']:.1f}x Viking's | {int(a['swapped_in_during_next_run_bytes'] / 2**20)} MB | "
                f"{ratios['next_run_seconds_unpinned_over_viking']:.1f}x Viking's |",
                f"| {device} | Viking | {int(viking['pinned_bytes'] / 2**20)} MiB | **{v['pinned_weights_swapped_bytes']} B** | "
                f"{v['process_swapped_bytes'] / 1e9:.2f} GB | | {int(v['swapped_in_during_next_run_bytes'] / 2**20)} MB | |"]
    return out


def event_cost():
    d = load("event_cost_cpu.json")
    return [f"{f(d['reconcile_ms_all_staged'], 1)} ms with ComfyUI's staging holding every module, "
            f"{f(d['reconcile_ms_none_staged'], 1)} ms with residency for all {d['weights']} weights",
            f"an event with one module more staged {f(d['reconcile_ms_one_more_staged'], 1)} ms, of it Viking's native call "
            f"{f(d['native_reconcile_ms_one_range_fewer'], 1)} ms",
            f"the event that first locks its file pages {f(d['residency_first_lock_ms'], 1)} ms"]


STATIC_VRAM_RUNS = {"default": "as is", "no_prefetch": "prefetch off", "no_cuda_malloc": "`--disable-cuda-malloc`"}


def static_vram(name, label=None):
    """Per run of the static cross-check probe: prompts that ran, ComfyUI's loaded share at its
    first and last partial load, and the most PyTorch's pool held unused after a prompt; each
    alone / with the Pin Model."""
    out = []
    for variant, v in load(name)["variants"].items():
        def trace(mode):
            return [t for t in v["trace"] if t["mode"] == mode and t["when"] == "after prompt"]

        def loaded(mode):
            mbs = [float(m) for t in trace(mode) for line in t["split_lines"]
                   for m in re.findall(r"loaded partially; [\d.]+ MB usable, ([\d.]+) MB loaded", line)]
            return f"{mbs[0]:.0f} -> {mbs[-1]:.0f} MB"

        def unused(mode):
            return f"{max(t['torch_unused_bytes'] for t in trace(mode)) / 2**20:.0f}"

        def ran(mode):
            return str(len(v["modes"][mode]["prompts"]))
        out.append(f"| {label or STATIC_VRAM_RUNS[variant]} | {ran('static')} / {ran('static_nodes')} | "
                   f"{loaded('static')} / {loaded('static_nodes')} | {unused('static')} / {unused('static_nodes')} MiB |")
    return out


NODE_TIMES_MODES = {"dynamic_two": "ComfyUI alone", "dynamic_two_nodes": "Pin Model, output nodes (as shipped)",
                    "dynamic_two_nodes#inline": "Pin Model as plain nodes (before)"}


def node_times():
    """Per mode, the cold prompt: the order of the loaders (L) and samplers (S), their seconds, the
    prompt's seconds."""
    out = []
    for mode, label in NODE_TIMES_MODES.items():
        cold = next(p for p in load("gpu_probe_node_times.json")["prompts"] if p["mode"] == mode)
        work = [n for n in cold["nodes"] if n["class_type"] in ("UNETLoader", "KSampler")]

        def seconds(kind):
            return " / ".join(f(n["seconds"], 2) for n in work if n["class_type"] == kind)
        order = " ".join("L" if n["class_type"] == "UNETLoader" else "S" for n in work)
        out.append(f"| {label} | {order} | {seconds('UNETLoader')} s | {seconds('KSampler')} s | {f(cold['seconds'], 2)} s |")
    return out


def static_fp8_rounds():
    """0.33 static mode, fp8-scaled, fresh servers per mode: per mode the cold start (mean and
    range of the servers), the warm prompt (each server's median: mean and range), and the Pin
    Model over alone at each stage."""
    modes = load("gpu_probe_static_fp8_node_times.bench.json")["modes"]

    def stage(base, index):
        servers = [m for m in modes if m.split("#")[0] == base]
        if index == "warm":
            return [statistics.median(p["seconds"] for p in modes[m]["prompts"] if p["stage"] == "warm") for m in servers]
        return [modes[m]["prompts"][index]["seconds"] for m in servers]

    def spread(values, digits):
        return f"{f(statistics.mean(values), digits)} s ({f(min(values), digits)}-{f(max(values), digits)})"

    def ratio(index):
        return f(statistics.mean(stage("static_nodes", index)) / statistics.mean(stage("static", index)), 2) + "x"
    return [f"cold start {spread(stage('static', 0), 2)} against {spread(stage('static_nodes', 0), 2)}: {ratio(0)}",
            f"warm {spread(stage('static', 'warm'), 3)} against {spread(stage('static_nodes', 'warm'), 3)}: **{ratio('warm')}**",
            f"after pressure {ratio(-1)}",
            f"{ratio(0)} cold, **{ratio('warm')} warm**"]


def static_event_cost():
    d = load("static_event_cost_cpu.json")
    moved = d["moved_median_ms"]
    return [f"{f(d['median_ms']['this'], 2)} ms (no native reconcile)",
            f"{f(d['median_ms']['baseline'], 2)} ms at `{d['baseline_commit']}` (a native reconcile at every event): "
            f"{f(d['baseline_over_this'], 1)}x",
            f"{f(moved['during_prompt'], 3)} ms during a prompt against {f(moved['no_prompt'], 1)} ms"]


def watcher_gc():
    d = load("watcher_gc_cpu.json")
    this, base = d["median"]["this"], d["median"]["baseline"]
    return [f"{this['share_with_collection_off']:.0%} against {base['share_with_collection_off']:.0%} at `{d['baseline_commit']}`",
            f"{f(this['longest_pause_ms'], 1)} ms against {f(base['longest_pause_ms'], 1)} ms"]


def kept_objects():
    d = load("kept_objects_cpu.json")
    this, base = d["median"]["this"], d["median"]["baseline"]
    return [f"the first attach {f(this['first_attach_kept'], 0)} against {f(base['first_attach_kept'], 0)} at "
            f"`{d['baseline_commit']}`",
            f"an event that moves nothing {f(this['event_moved_nothing_kept'], 0)} against "
            f"{f(base['event_moved_nothing_kept'], 0)}",
            f"an event after a weight moved {f(this['event_weight_moved_kept'], 0)} against "
            f"{f(base['event_weight_moved_kept'], 0)}"]


def plan():
    return [f"{f(load('plan.json')['median_ms'], 1)} ms median"]


def cpu_cold_start():
    d = load("cpu_cold_start.json")
    alone, pin, ratio = d["medians"]["alone"], d["medians"]["pin_model"], d["pin_model_over_alone"]
    rows = [f"| {label} | {alone[stage]:.2f} s | {pin[stage]:.2f} s | {'**' if stage == 'cold start' else ''}"
            f"{ratio[stage]:.2f}x{'**' if stage == 'cold start' else ''} |"
            for stage, label in (("cold start", "first prompt (medians of three servers)"), ("warm", "warm prompt"),
                                 ("after pressure", "after memory pressure"))]
    native = [s["viking_native_seconds_in_cold_prompt"] for s in d["servers"].values() if "viking_native_seconds_in_cold_prompt" in s]
    low, high = f"{min(native) * 1000:.0f}", f"{max(native) * 1000:.0f}"
    return rows + [f"{ratio['cold start']:.2f}x on a 2-core machine without a GPU ({pin['cold start']:.1f} s against "
                   f"{alone['cold start']:.1f} s", f"({low if low == high else f'{low}-{high}'} ms of native reconcile in the first prompt here)"]


FIGURES = {"gpu_perf.json": perf, "gpu_vram_cap.json": vram_cap, "gpu_home_timing.json": home, "gpu_tests.json": gpu_tests,
           "gpu_server_0_3_75.json": servers, "gpu_dynamic.json": dynamic, "gpu_dynamic_fastdisk.json": dynamic_fastdisk,
           "gpu_server_0_33_dynamic.json": server_dynamic,
           "gpu_dynamic_rounds_one.json": dynamic_rounds_one, "gpu_dynamic_rounds.json": dynamic_rounds_fastdisk_two,
           "gpu_dynamic_rounds_two_default.json": dynamic_rounds_two_default,
           "container_residency_cpu.json": container,
           "event_cost_cpu.json": event_cost, "plan.json": plan, "static_event_cost_cpu.json": static_event_cost,
           "gpu_probe_static_vram.json": lambda: static_vram("gpu_probe_static_vram.json"),
           "gpu_probe_node_times.json": node_times,
           "gpu_probe_static_fp8_node_times.bench.json": static_fp8_rounds,
           "swap_cpu.json": swap, "watcher_gc_cpu.json": watcher_gc, "kept_objects_cpu.json": kept_objects,
           "cpu_cold_start.json": cpu_cold_start}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_readme_figures_are_the_files_figures(name):
    missing = [text for text in FIGURES[name]() if text not in README]
    assert not missing, f"the README does not quote these figures of {name} as the file has them: {missing}"
    assert f"`{load(name)['commit']}`" in README, f"the README does not say which commit {name} measured"


def test_every_relative_link_of_the_docs_resolves():
    """Links and pictures in the README and docs/ point at files that exist (a path relative to
    the page, as GitHub and the registry resolve it)."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "web" / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken
