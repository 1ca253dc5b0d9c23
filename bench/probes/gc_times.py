"""Where the garbage collector runs in each prompt, with and without Viking: bench/probes/node_times.py
(unchanged, in-process, so also gpu_dynamic.py) with a small node pack in every server that logs
each collection of the oldest generation, and any other that takes 2 ms or more, with its
duration, its thread and the frames that set it off (Python's gc.callbacks), and each prompt's
start and end as this process saw them. In a server with Viking the pack also times each look
of Viking's gate watcher (its thread's `_watch_once`, found once Viking's pack has loaded) and
places the looks in the prompts: how often the watcher woke during a prompt and how long the work
it ran after one took, which may overlap the next prompt. With
VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS set, the watcher looks that often (in place of
`gate.AFTER_PROMPT_WATCH_SECONDS`, 0.02 s) while pins held back from a prompt wait (since
43bdef6 routine checks leave it at its 0.5 s pace and wait for an idle queue).

Why: in 0.33 static mode with the fp8-scaled model (part staticfp8 at 373d631, H200), three of
four Pin Model servers counted 0.25-0.32 s of the cold prompt inside the pinned home's watch
set-up, code that only sets an attribute on a few modules. A collection of the whole heap
falling due there would take that long. This says whether it was one, and whether ComfyUI alone
pays the same collection elsewhere in its cold prompt.

usage: python bench/probes/gc_times.py OUT.json [node_times.py's options]
       (run by ComfyUI 0.33's Python; writes OUT.json, and node_times.py's files beside it as
       OUT.node_times.json and OUT.node_times.bench.json)
"""
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))
from gc_log import LOG_NAME, WATCH_LOG_NAME, add_gc_pack, in_prompts, read_log, summary, watcher_in_prompts, watcher_summary  # noqa: E402


def main():
    sys.path[:0] = [str(HERE)]
    import node_times  # sets the paths to tests/ and bench/

    comfy_server = node_times.comfy_server
    out, passed = Path(sys.argv[1]), sys.argv[2:]
    modes = node_times.arg("--modes", node_times.DEFAULT_MODES, str).split(",")
    bases, prompts = [], []
    prepare, run_prompt = comfy_server.prepare_base_dir, comfy_server.ComfyServer.run_prompt

    def prepare_base_dir(base, custom_nodes=None, **kwargs):
        made = prepare(base, custom_nodes=custom_nodes, **kwargs)
        add_gc_pack(made)
        bases.append(Path(made).resolve())
        return made

    def timed_run_prompt(server, api_graph, timeout=300):
        mode = node_times.mode_of(server.base_dir, modes)
        start = time.time()
        try:
            return run_prompt(server, api_graph, timeout)
        finally:
            here = str(Path(server.base_dir).resolve())  # the same key as the pack's folder
            index = sum(1 for p in prompts if p["server"] == here)
            prompts.append(dict(mode=mode, server=here, index=index, start=start, end=time.time()))

    # node_times wraps what it finds here, so these run inside its own wrappers.
    comfy_server.prepare_base_dir, comfy_server.ComfyServer.run_prompt = prepare_base_dir, timed_run_prompt
    sys.argv = [str(HERE / "node_times.py"), str(out.with_suffix("")) + ".node_times.json", *passed]
    node_times.main()
    collections = {}
    for base in bases:
        collections[str(base)] = read_log(base / LOG_NAME)
    rows, watcher = [], []
    for server in dict.fromkeys(p["server"] for p in prompts):
        mine = [p for p in prompts if p["server"] == server]
        rows += in_prompts(collections.get(server, []), mine)
        looks = [entry for entry in read_log(Path(server) / WATCH_LOG_NAME) if "ms" in entry]
        if looks:
            watcher += watcher_in_prompts(looks, mine)
    result = dict(probe="gc_times", date=time.strftime("%Y-%m-%d"), args=passed, modes=modes,
                  summary=summary(rows), prompts=rows, watcher_summary=watcher_summary(watcher), watcher=watcher,
                  watch_seconds=os.environ.get("VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS", "Viking's own (0.02 s)"),
                  outside_prompts={server: [c for c in found if not any(p["server"] == server and p["start"] <= c["at"] < p["end"]
                                                                           for p in prompts)]
                                   for server, found in collections.items()})
    out.write_text(json.dumps(result, indent=1) + "\n")
    for mode, entry in result["summary"].items():
        print(mode, json.dumps(entry), flush=True)
    for mode, entry in result["watcher_summary"].items():
        print(mode, "watcher", json.dumps(entry), flush=True)


if __name__ == "__main__":
    main()
