"""Where a prompt's seconds go, node by node: bench/gpu_dynamic.py (unchanged, in-process) with
the time ComfyUI starts each node, read from ComfyUI's own "executing" messages on its websocket,
a sampler's steps from its "progress" messages (the seconds to the first step done, which hold
the model's load and ComfyUI's events, apart from the mean step, which only streams weights), and
ComfyUI's log lines about loading and staging, per prompt.

Why: with two models in ComfyUI 0.33's default dynamic mode, the cold start took 1.13x as long
with the Pin Model on each (gpu_dynamic_rounds_two_default.json at 1a26994, all three Viking
servers slower), while Viking's own time in ComfyUI's callbacks was 10-12 ms. On the CPU this
probe found why it could be: any node between loader and sampler (the Pin Model then, a plain
clone node, a LoRA loader) made ComfyUI load the second model only after the first had sampled,
where ComfyUI alone loads both first; an output node gives alone's order back
(ux_friendly_pick_node). Since then the Pin nodes are output nodes. Per-node times, next to
modes that take one piece away each, say what the order costs:
  dynamic_two            ComfyUI alone
  dynamic_two_nodes      the Pin Model on each model (output nodes, as shipped)
  dynamic_two_nodes#inline  the same with the Pin nodes not output nodes (as before: their spec's
                         output_node cleared in this server's copy of the pack)
  dynamic_two_engine     engine mode: Viking on every model, no node, no clone
  dynamic_two_clone      a plain clone node, no Viking
  dynamic_two_clone#output  the same clone node declared an output node
  dynamic_two#installed  the node pack installed and loaded, no node in the graph, engine mode off

usage: python bench/probes/node_times.py OUT.json [gpu_dynamic.py's options, --modes with any of its
       modes; a mode ending in #installed gets the pack installed but unused, one ending in #output
       its clone node as an output node, one ending in #inline the Pin nodes as plain nodes]
       (run by ComfyUI 0.33's Python; writes OUT.json, the bench's own file beside it as OUT.bench.json)
"""
import json
import re
import runpy
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "tests"), str(BENCH)]

import comfy_server  # noqa: E402
from flux_model import arg  # noqa: E402

DEFAULT_MODES = "dynamic_two,dynamic_two_nodes,dynamic_two_nodes#inline,dynamic_two_clone,dynamic_two_clone#output,dynamic_two_engine"
LOAD_LINES = re.compile(r"Requested to load|prepared for dynamic VRAM|loaded completely|loaded partially|Unloaded"
                        r"|models unloaded|Prompt executed|Viking Engine")


def node_seconds(events, graph: dict) -> list[dict]:
    """Each node that ran, in order, with the seconds until the next node (or the prompt's end)
    started: ComfyUI announces a node when it starts it."""
    out = []
    for (started, node), (ended, _) in zip(events, events[1:]):
        if node is not None:
            out.append(dict(node=node, class_type=graph.get(node, {}).get("class_type"), seconds=round(ended - started, 4)))
    return out


def with_steps(nodes: list[dict], events, steps) -> list[dict]:
    """`nodes` (node_seconds) with, for a node that reported sampler steps ("progress"), the
    seconds from its start to its first step done (the model's load and ComfyUI's events, where
    Viking's callbacks run, with one step) and the mean seconds of a later step (the streaming).
    ComfyUI 0.33 sends a step's progress at most every 100 ms (PROGRESS_THROTTLE_MIN_INTERVAL),
    the first and last always: the mean is taken between those two."""
    starts = {node: started for started, node in events if node is not None}
    for row in nodes:
        done = [(at, value) for at, node, value in steps if node == row["node"]]
        if done and row["node"] in starts:
            (first, first_value), (last, last_value) = done[0], done[-1]
            row["to_first_step"] = round(first - starts[row["node"]], 4)
            row["steps"] = last_value
            if last_value > first_value:
                row["step_seconds_mean"] = round((last - first) / (last_value - first_value), 4)
    return nodes


def append_line(source: Path, line: str):
    """Appends `line` to this server's copy of a node pack's source (the bench's clone node; the
    Viking pack, copied per server): how a mode flags a node class as an output node or not."""
    if source.exists():
        source.write_text(source.read_text() + "\n" + line + "\n")


def mode_of(base_dir: Path, modes: list[str]) -> str:
    """gpu_dynamic names each server's base folder gpu_dynamic_<mode, '#' as '_'>_<random>."""
    name = base_dir.name.removeprefix("gpu_dynamic_")
    return next(m for m in sorted(modes, key=len, reverse=True) if name.startswith(m.replace("#", "_") + "_"))


def main():
    out = sys.argv[1]
    modes = arg("--modes", DEFAULT_MODES, str).split(",")
    passed = sys.argv[2:]
    if "--modes" in passed:
        at = passed.index("--modes")
        del passed[at:at + 2]
    trace = []
    result = dict(probe="node_times", date=time.strftime("%Y-%m-%d"), args=passed, modes=modes, prompts=trace)
    prepare, start, run_prompt = comfy_server.prepare_base_dir, comfy_server.ComfyServer.start, comfy_server.ComfyServer.run_prompt
    log_offsets = {}

    def prepare_base_dir(base, custom_nodes=None, **kwargs):
        if mode_of(Path(base), modes).endswith("#installed"):
            custom_nodes = {**(custom_nodes or {}), "viking_engine": REPO}
        return prepare(base, custom_nodes=custom_nodes, **kwargs)

    def traced_start(server):
        mode = mode_of(server.base_dir, modes)
        if mode.endswith("#output"):
            append_line(server.base_dir / "custom_nodes" / "viking_bench_nodes" / "__init__.py",
                        "VikingBenchClone.OUTPUT_NODE = True")
        if mode.endswith("#inline"):
            append_line(server.base_dir / "custom_nodes" / "viking_engine" / "comfy_node" / "nodes.py",
                        "for _spec in SPECS:\n    _spec.output_node = _spec.output_node and not _spec.node_id.startswith('VikingPin')")
        start(server)
        server.node_clock = comfy_server.NodeClock(server.url)

    def traced_run_prompt(server, api_graph, timeout=300):
        server.node_clock.take(), server.node_clock.take_steps()
        try:
            return run_prompt(server, api_graph, timeout)
        finally:
            time.sleep(0.2)  # the last messages of the prompt
            text = server.log_text()
            new, log_offsets[server.port] = text[log_offsets.get(server.port, 0):], len(text)
            events = server.node_clock.take()
            nodes = with_steps(node_seconds(events, api_graph), events, server.node_clock.take_steps())
            trace.append(dict(mode=mode_of(server.base_dir, modes), nodes=nodes, seconds=round(sum(n["seconds"] for n in nodes), 3),
                              log=[line.strip() for line in new.splitlines() if LOAD_LINES.search(line)]))
            json.dump(result, open(out, "w"), indent=1)

    # gpu_dynamic.py imports these names when it runs, so it gets the traced ones.
    comfy_server.prepare_base_dir = prepare_base_dir
    comfy_server.ComfyServer.start, comfy_server.ComfyServer.run_prompt = traced_start, traced_run_prompt
    sys.argv = [str(BENCH / "gpu_dynamic.py"), out.removesuffix(".json") + ".bench.json", "--modes", ",".join(modes), *passed]
    try:
        runpy.run_path(str(BENCH / "gpu_dynamic.py"), run_name="__main__")
    except SystemExit:
        pass  # gpu_dynamic exits 1 when a check fails: its checks are in its own file
    for mode in modes:
        rows = [p for p in trace if p["mode"] == mode]
        if rows:
            print(mode, "cold:", ", ".join(f"{n['class_type']} {n['seconds']:.2f} s" for n in rows[0]["nodes"]), flush=True)


if __name__ == "__main__":
    main()
